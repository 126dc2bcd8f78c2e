"""Bearer tokens (multiraft/metadata/auth.py): an admin makes, lists and deletes them.

A new token is drawn here (32 random bytes), its SHA-256 digest goes into the
catalog, and the token itself is in this answer only: lose it and make another.
Creating a token under an existing name replaces it (the old one stops working:
rotation). Answers wait until this node's catalog holds the change.
"""

from __future__ import annotations

from aiohttp import web

from multiraft.errors import InvalidRequest, UnknownToken
from multiraft.http.handlers.common import bounded, node_of
from multiraft.http.params import json_object
from multiraft.metadata.auth import check_rights, check_token_name, new_token, token_digest
from multiraft.metadata.commands import DeleteToken, PutToken


async def create_token(request: web.Request) -> web.Response:
    node = node_of(request)
    body = await json_object(request)
    if set(body) != {"name", "rights"}:
        raise InvalidRequest('body is {"name": NAME, "rights": ["admin" | "read:TOPIC" | "write:TOPIC", ...]}')
    check_token_name(body["name"])
    rights = check_rights(body["rights"])
    token = new_token()
    await bounded(node.propose_metadata(PutToken(name=body["name"], digest=token_digest(token), rights=rights)),
                  "token creation")
    await bounded(node.sync_catalog(), "token propagation")
    return web.json_response({"name": body["name"], "rights": list(rights), "token": token}, status=201)


async def list_tokens(request: web.Request) -> web.Response:
    node = node_of(request)
    return web.json_response({"tokens": [{"name": t.name, "rights": list(t.rights)}
                                         for _, t in sorted(node.catalog.tokens.items())]})


async def delete_token(request: web.Request) -> web.Response:
    node = node_of(request)
    name = request.match_info["name"]
    check_token_name(name)
    if name not in node.catalog.tokens:
        raise UnknownToken(f"token {name!r} does not exist")
    await bounded(node.propose_metadata(DeleteToken(name=name)), "token deletion")
    await bounded(node.sync_catalog(), "token propagation")
    return web.Response(status=204)
