"""ReadIndex bookkeeping: reads wait for a quorum to confirm the leader is still leader.

A read request records the leader's commit index when it arrived and a context
(an opaque id). The leader sends that context with a heartbeat round; once a
quorum of voters echoed it, the leader knows no newer leader existed at that
moment, so every request queued up to it may be served at its recorded index
(after the local state machine applied that far). Requests are released in order.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from raftlog.types import Index, NodeId


@dataclass(slots=True)
class ReadRequest:
    index: Index
    context: bytes
    requester: NodeId  # the node that asked (the leader itself or a follower)
    acks: set[NodeId] = field(default_factory=set)


class ReadOnlyQueue:
    def __init__(self, pending_max: int) -> None:
        self._pending_max = pending_max
        self._requests: OrderedDict[bytes, ReadRequest] = OrderedDict()

    def __len__(self) -> int:
        return len(self._requests)

    def full(self) -> bool:
        return len(self._requests) >= self._pending_max

    def add(self, request: ReadRequest) -> bool:
        """Queue a request; False if its context is already pending (a duplicate)."""
        if request.context in self._requests:
            return False
        assert not self.full(), "the caller checks full() first"
        self._requests[request.context] = request
        return True

    def ack(self, context: bytes, node: NodeId) -> set[NodeId] | None:
        request = self._requests.get(context)
        if request is None:
            return None
        request.acks.add(node)
        return request.acks

    def release_through(self, context: bytes) -> list[ReadRequest]:
        """Pop every request up to and including `context`, oldest first."""
        if context not in self._requests:
            return []
        released = []
        while self._requests:
            key, request = self._requests.popitem(last=False)
            released.append(request)
            if key == context:
                break
        return released

    def last_context(self) -> bytes:
        return next(reversed(self._requests)) if self._requests else b""

    def clear(self) -> None:
        self._requests.clear()
