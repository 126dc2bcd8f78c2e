"""POST /v1/admin/leadership/balance: one preferred-leader round on every node now.
POST /v1/admin/verify: the scrubber compares partitions' replicas (docs/mirror.md).
GET /v1/admin/scrub: this node's scheduled scrubs (docs/mirror.md "Scheduled scrubs").

Nodes balance on their own every few seconds (multiraft/node/leadership.py); this is
the operator's "now" (Kafka's kafka-leader-election --election-type preferred).
The answer counts the transfers each node started; -1 marks a node not reached.
"""

from __future__ import annotations

from aiohttp import web

from multiraft.errors import InvalidRequest
from multiraft.http.handlers.common import bounded, node_of
from multiraft.http.params import int_field, json_object

VERIFY_TOPICS_MAX = 100
VERIFY_TIMEOUT_S = 60.0  # a call verifies up to PARTITIONS_PER_CALL partitions, each a read of its log


async def balance_leadership(request: web.Request) -> web.Response:
    started = await bounded(node_of(request).balance_leaders(), "leadership balancing")
    return web.json_response({
        "transfers_started": sum(count for count in started.values() if count > 0),
        "by_node": {str(node): count for node, count in sorted(started.items())},
    })


async def verify(request: web.Request) -> web.Response:
    """Up to PARTITIONS_PER_CALL partitions (of `topics`, or every topic), from `start` on:
    each `identical`, `behind`, `different` (with the offset ranges), `leader_damaged` or
    `unreachable`; `next_start` is where the next call goes on (null: done). `deep` (the
    default): every replica reads its closed segments again, which finds rot; false: closed
    segments count by their tree sidecars (fast; rot under a sidecar is not seen)."""
    body = await json_object(request, required=False)
    unknown = set(body) - {"topics", "start", "deep"}
    if unknown:
        raise InvalidRequest(f"unknown fields: {', '.join(sorted(unknown))}")
    topics = body.get("topics")
    if topics is not None and (not isinstance(topics, list) or not 1 <= len(topics) <= VERIFY_TOPICS_MAX
                               or not all(isinstance(t, str) for t in topics)):
        raise InvalidRequest(f"topics must be a list of 1 to {VERIFY_TOPICS_MAX} topic names")
    start = int_field(body, "start", 0, low=0)
    deep = body.get("deep", True)
    if not isinstance(deep, bool):
        raise InvalidRequest("deep must be true or false")
    node = node_of(request)
    report = await bounded(node.verify(topics, start, deep), "verify", VERIFY_TIMEOUT_S)
    return web.json_response(report.to_json())


async def scrub_status(request: web.Request) -> web.Response:
    """The node's own scheduled scrubs: its schedule, what they found, the latest verdicts that
    were not identical. Node-local (each node scrubs the partitions it leads): ask each node."""
    return web.json_response(node_of(request).scrub_status())
