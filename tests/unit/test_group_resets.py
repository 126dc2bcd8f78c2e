"""Goal: the pure part of a consumer group offset reset (multiraft/consumer_groups/
resets.py): where each strategy puts a partition, clamped to the log as Kafka's tool
clamps, and which requests are refused before anything is read."""

from __future__ import annotations

import pytest

from multiraft.consumer_groups.resets import (
    RESET_TOPICS_MAX,
    ResetRequest,
    ResetStrategy,
    ResetTopic,
    planned_offset,
)
from multiraft.errors import InvalidRequest

TOPICS = (ResetTopic(topic="t"),)


def _request(strategy: ResetStrategy, value: int | None = None) -> ResetRequest:
    return ResetRequest(group="g", strategy=strategy, value=value, topics=TOPICS)


# (strategy, value, committed, log start, high watermark, time lookup, expected)
PLANS = [
    (ResetStrategy.EARLIEST, None, 7, 2, 10, None, 2),
    (ResetStrategy.LATEST, None, 7, 2, 10, None, 10),
    (ResetStrategy.OFFSET, 5, None, 2, 10, None, 5),
    (ResetStrategy.OFFSET, 0, None, 2, 10, None, 2),  # below the log start: clamped up
    (ResetStrategy.OFFSET, 99, 3, 2, 10, None, 10),  # past the high watermark: clamped down
    (ResetStrategy.SHIFT, -3, 7, 2, 10, None, 4),
    (ResetStrategy.SHIFT, -30, 7, 2, 10, None, 2),
    (ResetStrategy.SHIFT, 30, 7, 2, 10, None, 10),
    (ResetStrategy.SHIFT, 1, None, 2, 10, None, 3),  # no commit yet: from the log start
    (ResetStrategy.TIMESTAMP, 1_000, 7, 2, 10, 6, 6),
    (ResetStrategy.TIMESTAMP, 1_000, 7, 2, 10, 10, 10),
    (ResetStrategy.EARLIEST, None, None, 0, 0, None, 0),  # an empty log
]


@pytest.mark.parametrize(("strategy", "value", "committed", "start", "end", "at_time", "expected"), PLANS)
def test_planned_offset(strategy: ResetStrategy, value: int | None, committed: int | None, start: int, end: int,
                        at_time: int | None, expected: int) -> None:
    assert planned_offset(_request(strategy, value), committed, start, end, at_time) == expected


REFUSED = [
    ("offset without a value", lambda: _request(ResetStrategy.OFFSET)),
    ("negative offset", lambda: _request(ResetStrategy.OFFSET, -1)),
    ("a bool is not an offset", lambda: _request(ResetStrategy.OFFSET, True)),
    ("earliest with a value", lambda: _request(ResetStrategy.EARLIEST, 3)),
    ("time past year 9999", lambda: _request(ResetStrategy.TIMESTAMP, 10**15)),
    ("a string strategy", lambda: ResetRequest(group="g", strategy="earliest", value=None, topics=TOPICS)),
    ("no topics", lambda: ResetRequest(group="g", strategy=ResetStrategy.EARLIEST, value=None, topics=())),
    ("too many topics", lambda: ResetRequest(group="g", strategy=ResetStrategy.EARLIEST, value=None,
                                             topics=tuple(ResetTopic(topic=f"t{i}")
                                                          for i in range(RESET_TOPICS_MAX + 1)))),
    ("a topic twice", lambda: ResetRequest(group="g", strategy=ResetStrategy.EARLIEST, value=None,
                                           topics=(ResetTopic(topic="t"), ResetTopic(topic="t")))),
    ("execute not a bool", lambda: ResetRequest(group="g", strategy=ResetStrategy.EARLIEST, value=None,
                                                topics=TOPICS, execute=1)),  # type: ignore[arg-type]
    ("bad topic name", lambda: ResetTopic(topic="a/b")),
    ("empty partitions", lambda: ResetTopic(topic="t", partitions=())),
    ("partition twice", lambda: ResetTopic(topic="t", partitions=(1, 1))),
    ("partition too high", lambda: ResetTopic(topic="t", partitions=(10_000,))),
    ("partition not an int", lambda: ResetTopic(topic="t", partitions=("0",))),  # type: ignore[arg-type]
]


@pytest.mark.parametrize(("name", "build"), REFUSED, ids=[r[0] for r in REFUSED])
def test_refused_requests(name: str, build) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InvalidRequest):
        build()
