"""POST /v1/admin/leadership/balance: one preferred-leader round on every node now.

Nodes balance on their own every few seconds (multiraft/node/leadership.py); this is
the operator's "now" (Kafka's kafka-leader-election --election-type preferred).
The answer counts the transfers each node started; -1 marks a node not reached.
"""

from __future__ import annotations

from aiohttp import web

from multiraft.http.handlers.common import bounded, node_of


async def balance_leadership(request: web.Request) -> web.Response:
    started = await bounded(node_of(request).balance_leaders(), "leadership balancing")
    return web.json_response({
        "transfers_started": sum(count for count in started.values() if count > 0),
        "by_node": {str(node): count for node, count in sorted(started.items())},
    })
