"""Goal: keys hash exactly as Kafka's default partitioner does (Utils.murmur2 vectors)."""

from __future__ import annotations

import pytest

from multiraft.state.partitioner import murmur2, partition_for_key, to_positive

# org.apache.kafka.common.utils.UtilsTest.testMurmur2
KAFKA_VECTORS = [
    (b"21", -973932308),
    (b"foobar", -790332482),
    (b"a-little-bit-long-string", -985981536),
    (b"a-little-bit-longer-string", -1486304829),
    (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
    (b"abc", 479470107),
]


@pytest.mark.parametrize(("key", "expected"), KAFKA_VECTORS)
def test_murmur2_matches_kafka(key: bytes, expected: int) -> None:
    assert murmur2(key) == expected


def test_negative_hashes_are_masked_not_negated() -> None:
    # "21" hashes negative: Kafka masks the sign bit (toPositive), it does not take abs().
    assert to_positive(-973932308) == -973932308 & 0x7FFFFFFF
    assert partition_for_key(b"21", 7) == (-973932308 & 0x7FFFFFFF) % 7


def test_empty_key_and_single_partition() -> None:
    assert 0 <= partition_for_key(b"", 3) < 3
    assert partition_for_key(b"anything", 1) == 0
