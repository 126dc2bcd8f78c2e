"""A consumer group member driven over the native HTTP routes, for tests.

It behaves as a well-written client does: it joins, heartbeats what it owns (which
acknowledges revocations), fetches from its own positions, commits before it gives a
partition back, and hops between nodes (each call to the next node in turn) so every
call is served through forwarding as often as not.
"""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable
from typing import Any

Call = Callable[..., Awaitable[tuple[int, Any]]]  # (node index, method, path, **kwargs) -> (status, body)
TopicPartition = tuple[str, int]


def pairs(listed: list[dict[str, Any]]) -> set[TopicPartition]:
    return {(item["topic"], p) for item in listed for p in item["partitions"]}


def listing(partitions: set[TopicPartition]) -> list[dict[str, Any]]:
    by_topic: dict[str, list[int]] = {}
    for topic, partition in sorted(partitions):
        by_topic.setdefault(topic, []).append(partition)
    return [{"topic": t, "partitions": ps} for t, ps in by_topic.items()]


class Member:
    def __init__(self, call: Call, nodes: int, group: str, start_node: int = 0) -> None:
        self.call = call
        self.group = group
        self._nodes = itertools.cycle([(start_node + i) % nodes for i in range(nodes)])
        self.member_id = ""
        self.epoch = 0
        self.owned: set[TopicPartition] = set()
        self.revoking: set[TopicPartition] = set()
        self.positions: dict[TopicPartition, int] = {}
        self.consumed: list[tuple[str, int, int, Any]] = []  # (topic, partition, offset, value)
        self.last: dict[str, Any] = {}

    def _node(self) -> int:
        return next(self._nodes)

    def _take(self, view: dict[str, Any]) -> None:
        self.last = view
        self.member_id = view["member_id"]
        self.epoch = view["member_epoch"]
        self.owned = pairs(view["assignment"])
        self.revoking = pairs(view["revoking"])
        for tp in list(self.positions):
            if tp not in self.owned and tp not in self.revoking:
                del self.positions[tp]  # not ours any more: the next owner starts at the commit

    async def join(self, topics: list[str], **settings: Any) -> dict[str, Any]:
        status, body = await self.call(self._node(), "POST", f"/v1/groups/{self.group}/members",
                                       json={"topics": topics, **settings})
        assert status == 200, body
        self._take(body)
        return body

    async def heartbeat(self) -> dict[str, Any]:
        """Commit what is being revoked, then report ownership without it (acknowledging)."""
        if self.revoking:
            await self.commit(self.revoking)
        owned = self.owned  # what it holds, without the partitions it gives back
        status, body = await self.call(self._node(), "POST",
                                       f"/v1/groups/{self.group}/members/{self.member_id}/heartbeat",
                                       json={"member_epoch": self.epoch, "owned": listing(owned)})
        assert status == 200, body
        self._take(body)
        return body

    async def fetch(self, wait_ms: int = 0, max_records: int = 500) -> list[dict[str, Any]]:
        positions = [{"topic": t, "partition": p, "offset": o} for (t, p), o in sorted(self.positions.items())]
        status, body = await self.call(self._node(), "POST",
                                       f"/v1/groups/{self.group}/members/{self.member_id}/records",
                                       json={"member_epoch": self.epoch, "positions": positions,
                                             "auto_offset_reset": "earliest", "wait_ms": wait_ms,
                                             "max_records": max_records})
        assert status == 200, body
        assert not body["errors"], body["errors"]
        self._take(body["member"])
        for position in body["positions"]:
            tp = (position["topic"], position["partition"])
            if tp in self.owned:
                self.positions[tp] = position["next_offset"]
        for record in body["records"]:
            self.consumed.append((record["topic"], record["partition"], record["offset"], record["value"]))
        return body["records"]

    async def commit(self, partitions: set[TopicPartition] | None = None) -> tuple[int, Any]:
        chosen = sorted((partitions if partitions is not None else self.owned) & set(self.positions))
        if not chosen:
            return 200, {}
        offsets = [{"topic": t, "partition": p, "offset": self.positions[(t, p)]} for t, p in chosen]
        return await self.call(self._node(), "POST", f"/v1/groups/{self.group}/offsets",
                               json={"member_id": self.member_id, "member_epoch": self.epoch, "offsets": offsets})

    async def leave(self) -> None:
        status, body = await self.call(self._node(), "DELETE",
                                       f"/v1/groups/{self.group}/members/{self.member_id}",
                                       params={"member_epoch": self.epoch})
        assert status == 204, body


def no_two_owners(members: list[Member]) -> None:
    """What the members were last told: no partition owned (or being given back) by two."""
    seen: dict[TopicPartition, str] = {}
    for member in members:
        for tp in member.owned | member.revoking:
            assert tp not in seen, f"{tp} owned by {seen[tp]} and {member.member_id}"
            seen[tp] = member.member_id


async def settle(members: list[Member], rounds_max: int = 30) -> None:
    """Heartbeat everyone until every member is stable (checking exclusivity at each step)."""
    for _ in range(rounds_max):
        for member in members:
            await member.heartbeat()
            no_two_owners(members)
        if all(m.last["state"] == "stable" for m in members):
            return
    raise AssertionError(f"not stable after {rounds_max} rounds: {[m.last for m in members]}")
