"""How long a produce waits before it answers: one typed value from the edge to the log.

`acks` arrives as text over HTTP and as a one-byte code between nodes (a follower
forwarding a produce to the leader). Both are parsed here, and anything else is
refused: an unknown code from a peer used to become `quorum` silently, so a newer
node's stricter mode would have been weakened without a word.
"""

from __future__ import annotations

import enum

from multiraft.errors import InvalidRequest


class Acks(enum.StrEnum):
    NONE = "none"  # answer at once, before anything is stored
    LEADER = "leader"  # after the leader's fsync (Kafka's acks=1)
    QUORUM = "quorum"  # after commit: a majority fsynced (the default)
    ALL = "all"  # after every in-sync replica fsynced

    @property
    def code(self) -> int:
        return _CODES[self]

    @classmethod
    def parse(cls, text: object) -> Acks:
        try:
            return cls(text)
        except ValueError:
            raise InvalidRequest(f"acks must be one of {', '.join(a.value for a in cls)}") from None

    @classmethod
    def from_code(cls, code: int) -> Acks:
        acks = _BY_CODE.get(code)
        if acks is None:
            raise InvalidRequest(f"unknown acks code {code} from a peer")
        return acks


_CODES = {Acks.NONE: 0, Acks.LEADER: 1, Acks.QUORUM: 2, Acks.ALL: 3}
_BY_CODE = {code: acks for acks, code in _CODES.items()}
