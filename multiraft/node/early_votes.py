"""Vote requests that arrive before their group opens here, kept for it (bounded, briefly).

A group's replicas open on their nodes at slightly different moments: each node applies
a new topic from its own catalog, and in a mirror resync each host first builds its kept
prefix (a second or more for a large partition). The first voter campaigns as soon as its
replica opens. A vote request reaching a node whose replica was not open yet used to be
dropped, and the campaign waited a whole election timeout to ask again: in a 1 GiB mirror
repair the new incarnation's first voter opened 40-70 ms before the others and was
elected 2.3 s later instead of 0.35 s. Kept here, the request is handed to the replica
when it opens. A vote is decided by terms and logs, so a request a moment old is as safe
as a fresh one; older than EARLY_VOTE_TTL_S it is dropped (the candidate has asked again
by then, or given up), and at most EARLY_VOTES_MAX are kept (the oldest go first), one
per group and candidate, so a peer cannot fill memory with requests for made-up groups.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

from multiraft.runtime.quiescence import VOTE_REQUESTS
from raftlog.messages import Message
from raftlog.types import GroupId

EARLY_VOTES_MAX = 1024
EARLY_VOTE_TTL_S = 2.0


class EarlyVotes:
    """The latest vote request per (group, candidate) for groups not open here (pure but for
    the clock). `take` costs the group's own requests only: a node opening 5,000 new
    groups asks once per group."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, limit: int = EARLY_VOTES_MAX,
                 ttl_s: float = EARLY_VOTE_TTL_S) -> None:
        assert limit >= 1 and ttl_s > 0
        self._clock, self._limit, self._ttl_s = clock, limit, ttl_s
        self._order: OrderedDict[tuple[GroupId, int], float] = OrderedDict()  # oldest first
        self._by_group: dict[GroupId, dict[int, tuple[float, Message]]] = {}

    def __len__(self) -> int:
        return len(self._order)

    def keep(self, group_id: GroupId, message: Message) -> bool:
        """Keep `message` if it is a vote request (True); anything else is dropped, as before."""
        if message.type not in VOTE_REQUESTS:
            return False
        now = self._clock()
        key = (group_id, message.source)
        self._order.pop(key, None)
        self._order[key] = now
        self._by_group.setdefault(group_id, {})[message.source] = (now, message)
        while self._order and (len(self._order) > self._limit or next(iter(self._order.values())) < now - self._ttl_s):
            (old_group, source), _ = self._order.popitem(last=False)
            kept = self._by_group[old_group]
            del kept[source]
            if not kept:
                del self._by_group[old_group]
        return True

    def take(self, group_id: GroupId) -> list[Message]:
        """The requests kept for `group_id` that are still fresh, oldest first; forgotten here."""
        kept = self._by_group.pop(group_id, None)
        if not kept:
            return []
        now = self._clock()
        for source in kept:
            del self._order[(group_id, source)]
        return [message for at, message in sorted(kept.values(), key=lambda pair: pair[0])
                if at >= now - self._ttl_s]
