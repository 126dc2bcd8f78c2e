"""Liveness of members: last seen, in the coordinator's memory only (Kafka's coordinator
keeps it the same way). Sans-I/O: every call is given the time (`now_ms`, a monotonic
clock of the caller's choosing), nothing here reads one.

A heartbeat or a fetch notes its member; it is not a Raft write. What reaches the log
is only the outcome: `ExpireMembers` for members silent past their group's session
timeout, or holding revoked partitions past their rebalance timeout.

When leadership moves here the coordinator calls `reset`, which counts every member
as seen now: each gets a full session timeout from the new coordinator (last-seen
times never travel between nodes). A member that joins later is noted by its join.

Cost: one heap entry per member (and one per member giving partitions back), looked
at when it falls due, so a scan costs what is due, not what is held: at the limits
(1,000 groups of 100 members) a scan of every member took 170 ms, too long to run
ten times a second. An entry that falls due for a member seen since is pushed again
at its new deadline.
"""

from __future__ import annotations

import heapq

from multiraft.consumer_groups.commands import EXPIRE_MEMBERS_PER_ENTRY_MAX, ExpireMembers
from multiraft.consumer_groups.state import GroupsState, Member

Key = tuple[str, str]  # (group, member id)
SESSION, REBALANCE = 0, 1


class Sessions:
    def __init__(self) -> None:
        # Invariant: every key of `_seen_ms` has one SESSION entry in `_due`; every key of
        # `_revoking_since_ms` one REBALANCE entry carrying the same since (others are stale).
        self._seen_ms: dict[Key, int] = {}
        self._revoking_since_ms: dict[Key, int] = {}
        self._due: list[tuple[int, int, str, str, int]] = []  # (deadline, kind, group, member, since)

    def reset(self, state: GroupsState, now_ms: int) -> None:
        """Leadership moved here: every member of `state` is seen now."""
        self._seen_ms.clear()
        self._revoking_since_ms.clear()
        self._due.clear()
        for name, group in sorted(state.groups.items()):
            for member in group.members.values():
                self.note(name, member, group.session_timeout_ms, now_ms)

    def note(self, group: str, member: Member, session_timeout_ms: int, now_ms: int) -> None:
        """The member was heard from now (and is, or is not, giving partitions back)."""
        key = (group, member.member_id)
        if key not in self._seen_ms:
            heapq.heappush(self._due, (now_ms + session_timeout_ms, SESSION, group, member.member_id, 0))
        self._seen_ms[key] = now_ms
        if not member.revoking:
            self._revoking_since_ms.pop(key, None)
        elif key not in self._revoking_since_ms:
            self._revoking_since_ms[key] = now_ms
            heapq.heappush(self._due, (now_ms + member.rebalance_timeout_ms, REBALANCE, group, member.member_id,
                                       now_ms))

    def seen_ms(self, group: str, member_id: str) -> int | None:
        return self._seen_ms.get((group, member_id))

    def expired(self, state: GroupsState, now_ms: int) -> list[ExpireMembers]:
        """Expiry commands for the members past their timeouts, by group (each at most one
        entry's worth); forgets members the state no longer has."""
        silent: dict[str, list[str]] = {}
        slow: dict[str, list[str]] = {}
        while self._due and self._due[0][0] < now_ms:
            _, kind, name, member_id, since = heapq.heappop(self._due)
            key = (name, member_id)
            group = state.groups.get(name)
            member = group.members.get(member_id) if group is not None else None
            if member is None or group is None:
                self._seen_ms.pop(key, None)
                self._revoking_since_ms.pop(key, None)
                continue
            if kind == SESSION:
                deadline = self._seen_ms[key] + group.session_timeout_ms
                if now_ms > deadline:
                    silent.setdefault(name, []).append(member_id)
                    deadline = now_ms + group.session_timeout_ms  # looked at again if it stays
                heapq.heappush(self._due, (deadline, SESSION, name, member_id, 0))
            elif self._revoking_since_ms.get(key) == since and member.revoking:
                if now_ms > since + member.rebalance_timeout_ms:
                    slow.setdefault(name, []).append(member_id)
                heapq.heappush(self._due, (now_ms + member.rebalance_timeout_ms, REBALANCE, name, member_id, since))
        commands = []
        for name in sorted(set(silent) | set(slow)):
            if name in silent:
                ids = sorted(set(silent[name]))[:EXPIRE_MEMBERS_PER_ENTRY_MAX]
                commands.append(ExpireMembers(group=name, member_ids=tuple(ids)))
            if name in slow:
                ids = sorted(set(slow[name]) - set(silent.get(name, ())))[:EXPIRE_MEMBERS_PER_ENTRY_MAX]
                if ids:
                    commands.append(ExpireMembers(group=name, member_ids=tuple(ids), reason="rebalance_timeout"))
        return commands
