"""Liveness of members: last seen, in the coordinator's memory only (Kafka's coordinator
keeps it the same way). Sans-I/O: every call is given the time (`now_ms`, a monotonic
clock of the caller's choosing), nothing here reads one.

A heartbeat or a fetch touches its member; it is not a Raft write. What reaches the
log is only the outcome: `ExpireMembers` for members silent past their group's session
timeout, or holding revoked partitions past their rebalance timeout. A member this
tracker has not seen (it joined through another leader, or this node just became the
coordinator) counts as seen at the first scan that meets it, so after a leadership
change every member gets a full session timeout from the new coordinator: `reset`
forgets everything when leadership moves here.
"""

from __future__ import annotations

from multiraft.consumer_groups.commands import EXPIRE_MEMBERS_PER_ENTRY_MAX, ExpireMembers
from multiraft.consumer_groups.state import GroupsState

Key = tuple[str, str]  # (group, member id)


class Sessions:
    def __init__(self) -> None:
        self._seen_ms: dict[Key, int] = {}
        self._revoking_since_ms: dict[Key, int] = {}

    def reset(self) -> None:
        """Leadership moved here: every member starts a full session from its next scan."""
        self._seen_ms.clear()
        self._revoking_since_ms.clear()

    def touch(self, group: str, member_id: str, now_ms: int) -> None:
        self._seen_ms[(group, member_id)] = now_ms

    def seen_ms(self, group: str, member_id: str) -> int | None:
        return self._seen_ms.get((group, member_id))

    def expired(self, state: GroupsState, now_ms: int) -> list[ExpireMembers]:
        """Expiry commands for the members past their timeouts (each group's at most one
        entry's worth); forgets members the state no longer has."""
        commands = []
        present: set[Key] = set()
        for name, group in sorted(state.groups.items()):
            silent: list[str] = []
            slow: list[str] = []
            for member_id, member in sorted(group.members.items()):
                key = (name, member_id)
                present.add(key)
                seen = self._seen_ms.setdefault(key, now_ms)
                if now_ms - seen > group.session_timeout_ms:
                    silent.append(member_id)
                    continue
                if not member.revoking:
                    self._revoking_since_ms.pop(key, None)
                    continue
                since = self._revoking_since_ms.setdefault(key, now_ms)
                if now_ms - since > member.rebalance_timeout_ms:
                    slow.append(member_id)
            if silent:
                commands.append(ExpireMembers(group=name, member_ids=tuple(silent[:EXPIRE_MEMBERS_PER_ENTRY_MAX])))
            if slow:
                commands.append(ExpireMembers(group=name, member_ids=tuple(slow[:EXPIRE_MEMBERS_PER_ENTRY_MAX]),
                                              reason="rebalance_timeout"))
        for table in (self._seen_ms, self._revoking_since_ms):
            for key in [k for k in table if k not in present]:
                del table[key]
        return commands
