"""POST /v1/admin/nodes: admit a node that started with `--join` (node-to-node admin call).

The joiner names itself and its addresses; the cluster registers it in the
catalog and makes it a learner of the metadata group, and answers with the raft
addresses of the registered nodes so the joiner can dial them. Idempotent: a
restarted joiner asks again. The body must be signed with the cluster secret
(multiraft/node/admission.py), auth on or off: no HTTP client can change where the
cluster finds a node.
"""

from __future__ import annotations

import re
import time

from aiohttp import web

from multiraft.errors import InvalidRequest
from multiraft.http.handlers.common import bounded, node_of
from multiraft.http.params import is_int, json_object, read_body
from multiraft.node.api import SIGNATURE_HEADER, TIMESTAMP_HEADER, verify_admission
from raftlog.types import NodeId

_FIELDS = {"node_id", "raft_addr", "http_addr", "rack"}
_ADDRESS = re.compile(r"[A-Za-z0-9.\-\[\]:]{1,255}:\d{1,5}")


async def add_node(request: web.Request) -> web.Response:
    node = node_of(request)
    verify_admission(node.config.cluster_secret, await read_body(request),
                     request.headers.get(TIMESTAMP_HEADER), request.headers.get(SIGNATURE_HEADER), time.time())
    body = await json_object(request)
    unknown = sorted(set(body) - _FIELDS)
    if unknown:
        raise InvalidRequest(f"unknown fields {unknown}")
    node_id = body.get("node_id")
    if not is_int(node_id) or not 1 <= node_id <= 2**31 - 1:
        raise InvalidRequest("node_id must be a positive integer")
    addresses = [body.get("raft_addr"), body.get("http_addr")]
    if not all(isinstance(a, str) and _ADDRESS.fullmatch(a) for a in addresses):
        raise InvalidRequest("raft_addr and http_addr must be HOST:PORT")
    rack = body.get("rack")
    if rack is not None and (not isinstance(rack, str) or len(rack) > 255):
        raise InvalidRequest("rack must be a string of at most 255 characters")
    nodes = await bounded(node.add_node(NodeId(node_id), addresses[0], addresses[1], rack), "adding a node")
    return web.json_response({"nodes": nodes})
