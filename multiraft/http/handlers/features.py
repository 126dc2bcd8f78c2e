"""GET and POST /v1/admin/features: the cluster's feature level (multiraft/node/features.py).

`GET` asks every registered node which level it supports (a node decommissioned to the
end is listed, not asked) and shows them beside the level the cluster is finalized at.
`POST` with `{"level": N}`, or no body for the highest level every node supports, raises
the finalized level: 409 `FEATURE_LEVEL_UNSUPPORTED` naming the nodes when one did not
answer or supports less, 400 for a level below the finalized one; the answer is the `GET`
one after it (the nodes asked again once it committed), with `previous`. Both need the
admin right when auth is on (access.py).
"""

from __future__ import annotations

from aiohttp import web

from multiraft.errors import InvalidRequest
from multiraft.http.handlers.common import bounded, node_of
from multiraft.http.params import int_field, json_object
from multiraft.metadata.features import FEATURE_LEVEL_MAX


async def show(request: web.Request) -> web.Response:
    report = await bounded(node_of(request).features.report(), "asking the nodes their feature levels")
    return web.json_response(report)


async def finalize(request: web.Request) -> web.Response:
    body = await json_object(request, required=False)
    if set(body) - {"level"}:
        raise InvalidRequest('body is {"level": N} (absent: the highest level every node supports)')
    level = int_field(body, "level", low=1, high=FEATURE_LEVEL_MAX) if body.get("level") is not None else None
    report = await bounded(node_of(request).features.finalize(level), "finalizing the feature level")
    return web.json_response(report)
