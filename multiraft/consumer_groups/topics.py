"""What a subscription resolves to: topic names, and a glob matcher over them.

Patterns are globs (`*` any run of characters, `?` one), not regular expressions.
Kafka's KIP-848 takes RE2/J regexes, which run in linear time; Python's `re` can
backtrack exponentially, and a pattern is matched against every topic name inside
group 0's apply on every node, so one hostile pattern could stall the metadata
group. `glob_match` is the classic two-pointer wildcard match: O(len(name) *
len(pattern)) at worst, no backtracking stack.

The state machine reads topics through `TopicsView` (names and partition counts),
which group 0's machine builds over the catalog it applies beside (multiraft/node/
machines.py): a subscription resolves against the catalog as of the same log index
on every replica.

Matching a glob against every topic on every heartbeat and join would cost
members x topics x pattern length each time, so `PatternMatches` keeps each
pattern's matches while the topics stay as they were: a view carries `version`, the
log index of the last catalog command applied (the same on every replica at the
same entry), and a new version drops every match. The cache changes no result:
apply stays a pure function of the log. A view without a version (None) is not
cached.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from multiraft.consumer_groups.commands import GROUP_PARTITIONS_MAX, Subscription, TopicPartition

# Patterns whose matches are kept (one per distinct pattern; past it they all go).
PATTERNS_CACHED_MAX = 10_000


class TopicsView(Protocol):
    @property
    def version(self) -> int | None:
        """Changes whenever the topics may have (None: unknown, nothing is cached)."""

    def partition_count(self, topic: str) -> int | None:
        """The topic's partitions, None when it does not exist."""

    def names(self) -> Iterable[str]:
        """Every topic name (any order)."""


class StaticTopics:
    """A `TopicsView` over a dict (tests, and a catalog's counts)."""

    def __init__(self, counts: dict[str, int], version: int | None = None) -> None:
        self.counts = counts
        self.version = version

    def partition_count(self, topic: str) -> int | None:
        return self.counts.get(topic)

    def names(self) -> Iterable[str]:
        return self.counts.keys()


def glob_match(pattern: str, name: str) -> bool:
    """Whether `name` matches `pattern` (`*`: any run, `?`: any one character)."""
    p = n = 0
    star = -1  # position of the last `*` seen in the pattern
    mark = 0  # where in `name` that star's run currently ends
    while n < len(name):
        if p < len(pattern) and (pattern[p] == "?" or pattern[p] == name[n]):
            p += 1
            n += 1
        elif p < len(pattern) and pattern[p] == "*":
            star, mark = p, n
            p += 1
        elif star >= 0:
            p = star + 1
            mark += 1
            n = mark
        else:
            return False
    while p < len(pattern) and pattern[p] == "*":
        p += 1
    return p == len(pattern)


class PatternMatches:
    """Each pattern's matching topics, for one version of the topics (module docstring)."""

    def __init__(self) -> None:
        self._version: int | None = None
        self._matches: dict[str, tuple[str, ...]] = {}

    def matches(self, pattern: str, topics: TopicsView) -> tuple[str, ...]:
        version = topics.version
        if version is None:
            return _matching(pattern, topics)
        if version != self._version or len(self._matches) >= PATTERNS_CACHED_MAX:
            self._matches.clear()
            self._version = version
        found = self._matches.get(pattern)
        if found is None:
            found = self._matches[pattern] = _matching(pattern, topics)
        return found


def _matching(pattern: str, topics: TopicsView) -> tuple[str, ...]:
    return tuple(sorted(name for name in topics.names() if glob_match(pattern, name)))


def subscribed_topics(subscription: Subscription, topics: TopicsView,
                      matches: PatternMatches | None = None) -> tuple[str, ...]:
    """The existing topics a subscription names, sorted."""
    if subscription.pattern is None:
        return tuple(t for t in subscription.topics if topics.partition_count(t) is not None)
    if matches is None:
        return _matching(subscription.pattern, topics)
    return matches.matches(subscription.pattern, topics)


def topic_partitions(names: Iterable[str], topics: TopicsView) -> dict[str, int]:
    """Partition counts of `names` (sorted), cut so they add up to at most GROUP_PARTITIONS_MAX."""
    counts: dict[str, int] = {}
    total = 0
    for name in sorted(set(names)):
        count = topics.partition_count(name)
        if count is None:
            continue
        count = min(count, GROUP_PARTITIONS_MAX - total)
        if count <= 0:
            break
        counts[name] = count
        total += count
    return counts


def all_partitions(counts: dict[str, int]) -> list[TopicPartition]:
    return [(topic, p) for topic in sorted(counts) for p in range(counts[topic])]
