"""Goal: keys hash exactly as Kafka's default partitioner does (Utils.murmur2 vectors),
and the folded implementation agrees with the plain transcription of Kafka's code for
every tail length."""

from __future__ import annotations

import random

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


def plain_murmur2(data: bytes) -> int:
    """Kafka's Utils.murmur2 transcribed step by step (the reference for the folded one)."""
    mask, m = 0xFFFFFFFF, 0x5BD1E995
    length = len(data)
    h = (0x9747B28C ^ length) & mask
    for i in range(0, length - length % 4, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * m) & mask
        k ^= k >> 24
        k = (k * m) & mask
        h = (h * m) & mask
        h ^= k
    tail, whole = length % 4, length - length % 4
    if tail == 3:
        h ^= data[whole + 2] << 16
    if tail >= 2:
        h ^= data[whole + 1] << 8
    if tail >= 1:
        h ^= data[whole]
        h = (h * m) & mask
    h ^= h >> 13
    h = (h * m) & mask
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def test_murmur2_agrees_with_the_plain_form_for_every_length() -> None:
    rng = random.Random(26)
    for length in range(0, 41):
        for _ in range(25):
            data = bytes(rng.randrange(256) for _ in range(length))
            assert murmur2(data) == plain_murmur2(data), data
