"""Server-side assignors (KIP-848): uniform (sticky, the default) and range.

Both are pure and deterministic: the same members, subscriptions, partitions and
previous target give the same result on every replica (members and partitions are
walked in sorted order; no set is iterated unsorted). Each partition subscribed by
at least one member goes to exactly one member subscribed to its topic.

**uniform** (KIP-848's UniformAssignor): balanced counts, moving as few partitions as
possible from the previous target. When every member subscribes to the same topics
(the usual group) the result is exact: each member gets floor(N/M) or ceil(N/M)
partitions, members keep up to their quota of what they had (the members that had
most get the ceil slots, so fewest partitions move), and the freed and new
partitions fill the members below quota. With different subscriptions it keeps
up to a quota per member (from a balanced fill, topics with fewest eligible members
first) of what it had and is still eligible for, then gives each partition left to
the eligible member furthest below its quota. O(P log M) either way: it runs inside
group 0's apply on every replica (at the limits, 10,000 partitions and 100 members,
a join takes tens of milliseconds; docs/node.md).

Partitions in `reserved` (those consumer instances assigned themselves by hand,
instances.py) are left out: the others are balanced over what is left, not over all
and then thinned.

**range** (Kafka's RangeAssignor, per topic): the members subscribed to a topic, by
id, take contiguous ranges of its partitions, the first `N mod M` one more. Not
sticky: a join moves about half of every range, which is what range users expect.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping

from multiraft.consumer_groups.commands import TopicPartition
from multiraft.consumer_groups.topics import all_partitions

Assignment = dict[str, frozenset[TopicPartition]]


def assign(assignor: str, subscriptions: Mapping[str, tuple[str, ...]], counts: Mapping[str, int],
           previous: Mapping[str, frozenset[TopicPartition]],
           reserved: frozenset[TopicPartition] = frozenset()) -> Assignment:
    """`subscriptions`: member id -> the existing topics it subscribes to; `counts`: topic
    -> partitions (the group's resolved topics); `previous`: the last target; `reserved`:
    partitions no member here gets (assigned by hand elsewhere)."""
    if assignor == "range":
        return range_assign(subscriptions, counts, reserved)
    assert assignor == "uniform", assignor
    return uniform_assign(subscriptions, counts, previous, reserved)


def range_assign(subscriptions: Mapping[str, tuple[str, ...]], counts: Mapping[str, int],
                 reserved: frozenset[TopicPartition] = frozenset()) -> Assignment:
    result: dict[str, list[TopicPartition]] = {member: [] for member in sorted(subscriptions)}
    for topic in sorted(counts):
        members = [m for m in sorted(subscriptions) if topic in subscriptions[m]]
        if not members:
            continue
        partitions = [(topic, p) for p in range(counts[topic]) if (topic, p) not in reserved]
        base, extra = divmod(len(partitions), len(members))
        start = 0
        for i, member in enumerate(members):
            size = base + (1 if i < extra else 0)
            result[member].extend(partitions[start:start + size])
            start += size
    return {member: frozenset(tps) for member, tps in result.items()}


def uniform_assign(subscriptions: Mapping[str, tuple[str, ...]], counts: Mapping[str, int],
                   previous: Mapping[str, frozenset[TopicPartition]],
                   reserved: frozenset[TopicPartition] = frozenset()) -> Assignment:
    members = sorted(subscriptions)
    if not members:
        return {}
    eligible = {m: frozenset(t for t in subscriptions[m] if t in counts) for m in members}
    if len(set(eligible.values())) == 1:
        partitions = all_partitions({t: counts[t] for t in eligible[members[0]]})
        return _uniform_same(members, [tp for tp in partitions if tp not in reserved], previous)
    return _uniform_mixed(members, eligible, counts, previous, reserved)


def _uniform_same(members: list[str], partitions: list[TopicPartition],
                  previous: Mapping[str, frozenset[TopicPartition]]) -> Assignment:
    """Every member subscribes to the same topics: exact balance, maximal stickiness."""
    valid = set(partitions)
    claimed: set[TopicPartition] = set()
    kept: dict[str, list[TopicPartition]] = {}
    for member in members:  # a partition is kept by at most one member (the first, by id)
        mine = sorted(tp for tp in previous.get(member, frozenset()) if tp in valid and tp not in claimed)
        claimed.update(mine)
        kept[member] = mine
    base, extra = divmod(len(partitions), len(members))
    by_kept = sorted(members, key=lambda m: (-len(kept[m]), m))
    quota = {member: base + (1 if i < extra else 0) for i, member in enumerate(by_kept)}
    result = {member: kept[member][:quota[member]] for member in members}
    taken = {tp for tps in result.values() for tp in tps}
    free = [tp for tp in partitions if tp not in taken]
    position = 0
    for member in members:
        need = quota[member] - len(result[member])
        result[member].extend(free[position:position + need])
        position += need
    assert position == len(free), "every partition goes to a member"
    return {member: frozenset(tps) for member, tps in result.items()}


def _uniform_mixed(members: list[str], eligible: Mapping[str, frozenset[str]], counts: Mapping[str, int],
                   previous: Mapping[str, frozenset[TopicPartition]],
                   reserved: frozenset[TopicPartition]) -> Assignment:
    """Members subscribe to different topics: quotas from a balanced fill, then sticky.

    1. Quotas: the topics' partitions, topic by topic (fewest eligible members first),
       each to the least loaded eligible member (a heap per topic: O(P log M)).
    2. Each member keeps up to its quota of what it had and is still eligible for,
       the partitions of topics with fewest eligible members first.
    3. The rest go, topic by topic, to the eligible member furthest below its quota
       (or the least above it when all are full).
    """
    topics = sorted({t for m in members for t in eligible[m]},
                    key=lambda t: (sum(1 for m in members if t in eligible[m]), t))
    by_topic = {t: [m for m in members if t in eligible[m]] for t in topics}
    quota = dict.fromkeys(members, 0)
    reserved_in: dict[str, int] = {}
    for topic, _ in sorted(reserved):
        reserved_in[topic] = reserved_in.get(topic, 0) + 1
    for topic in topics:
        heap = [(quota[m], m) for m in by_topic[topic]]
        heapq.heapify(heap)
        for _ in range(counts[topic] - reserved_in.get(topic, 0)):
            load, member = heapq.heappop(heap)
            quota[member] = load + 1
            heapq.heappush(heap, (load + 1, member))
    owned: dict[str, list[TopicPartition]] = {m: [] for m in members}
    taken: set[TopicPartition] = set()
    rank = {topic: i for i, topic in enumerate(topics)}
    for member in members:
        # Kept first: partitions of topics the fewest others could take instead.
        mine = sorted((tp for tp in previous.get(member, frozenset())
                       if tp[0] in eligible[member] and tp[1] < counts[tp[0]] and tp not in taken
                       and tp not in reserved),
                      key=lambda tp: (rank[tp[0]], tp))
        owned[member] = mine[:quota[member]]
        taken.update(owned[member])
    for topic in topics:
        free = [(topic, p) for p in range(counts[topic]) if (topic, p) not in taken and (topic, p) not in reserved]
        if not free:
            continue
        heap = [(len(owned[m]) - quota[m], m) for m in by_topic[topic]]
        heapq.heapify(heap)
        for tp in free:
            excess, member = heapq.heappop(heap)
            owned[member].append(tp)
            heapq.heappush(heap, (excess + 1, member))
    return {member: frozenset(tps) for member, tps in owned.items()}
