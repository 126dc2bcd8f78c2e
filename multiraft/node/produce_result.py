"""What a produce answers: one typed value on every path, local or forwarded.

`Node.produce` used to return a dict on some paths (a duplicate, acks none or
leader, a forwarded answer) and the partition's apply result on others, and its
callers indexed `result["base_offset"]`. Now every path returns a `ProduceResult`;
errors are raised, never carried inside it.

Between nodes (a follower forwards a produce to the leader) it travels as JSON.
What a peer sends is checked on the way in: a malformed answer to a produce the
leader accepted means the records may be stored, so it is an `OutcomeUnknown`
for the caller, never a KeyError or a wrong offset.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from raftlog.errors import OutcomeUnknown

# acks=none answers before the leader's log gives the batch an offset.
NO_OFFSET = -1


@dataclass(frozen=True, slots=True, kw_only=True)
class ProduceResult:
    base_offset: int  # the first record's offset; NO_OFFSET for acks=none
    count: int  # records in the batch (>= 1, as every valid batch holds)
    duplicate: bool  # a retry of a batch already stored: base_offset is the original's

    def __post_init__(self) -> None:
        # Checked on construction, like every message at a boundary; from_json relies on it.
        for name in ("base_offset", "count"):
            value = getattr(self, name)
            if type(value) is not int:  # bool is an int subclass: refuse it too
                raise TypeError(f"{name} must be an int, not {type(value).__name__}")
        if type(self.duplicate) is not bool:
            raise TypeError(f"duplicate must be a bool, not {type(self.duplicate).__name__}")
        if self.base_offset < NO_OFFSET:
            raise ValueError(f"base_offset {self.base_offset} below {NO_OFFSET}")
        if self.count < 1:
            raise ValueError(f"count {self.count} below 1")
        if self.duplicate and self.base_offset == NO_OFFSET:
            raise ValueError("a duplicate answers with its original offset")

    def to_json(self) -> bytes:
        return json.dumps({"base_offset": self.base_offset, "count": self.count,
                           "duplicate": self.duplicate}).encode()

    @classmethod
    def from_json(cls, body: bytes) -> ProduceResult:
        """A peer's answer, checked: a missing or ill-typed field is refused; fields
        a newer peer may add are ignored."""
        try:
            decoded = json.loads(body)
            if not isinstance(decoded, dict):
                raise TypeError(f"a JSON object expected, not {type(decoded).__name__}")
            return cls(base_offset=decoded["base_offset"], count=decoded["count"], duplicate=decoded["duplicate"])
        except (ValueError, TypeError, KeyError, RecursionError) as error:  # JSON and UTF-8 errors are ValueErrors
            raise OutcomeUnknown(f"the leader accepted the produce but answered malformed ({error!r})") from None
