"""Distinct names for the numbers of consensus, so a signature says which it wants.

`Index` is a position in a group's Raft log (physical); `Offset` is a record's
position as clients see it (logical). They are never interchangeable: the offset
index in `storage/` is the only place that maps one to the other.
"""

from __future__ import annotations

from typing import NewType

NodeId = NewType("NodeId", int)
GroupId = NewType("GroupId", int)
Term = NewType("Term", int)
Index = NewType("Index", int)
Offset = NewType("Offset", int)

# Node id 0 means "nobody" (no vote cast, no leader known); real ids start at 1.
NO_NODE = NodeId(0)
