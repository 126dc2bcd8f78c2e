"""Goal: keys hash exactly as Kafka's default partitioner does (Utils.murmur2 vectors),
and the folded implementation agrees with the plain transcription of Kafka's code for
every tail length; a request's keys placed at once (numpy columns) land where each
alone would."""

from __future__ import annotations

import random
import subprocess
import sys

import pytest

from multiraft.state.partitioner import (
    VECTOR_KEY_BYTES_MAX,
    VECTOR_KEYS_MIN,
    murmur2,
    partition_for_key,
    partitions_for_keys,
    to_positive,
)

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


def test_keys_placed_at_once_land_where_each_alone_would() -> None:
    # Every length up to past the vector limit (the long ones go one by one), empty keys,
    # high bytes (words above 2**31), lists below the vector minimum, and partition counts
    # from 1 to Java's largest int.
    rng = random.Random(2611)
    for trial in range(300):
        count = rng.choice([0, 1, VECTOR_KEYS_MIN - 1, VECTOR_KEYS_MIN, rng.randint(17, 400)])
        keys = [bytes(rng.randrange(256) for _ in range(rng.choice([0, rng.randint(1, 12),
                                                                     rng.randint(13, VECTOR_KEY_BYTES_MAX + 30)])))
                for _ in range(count)]
        partitions = rng.choice([1, 2, 3, 8, 1000, 2**31 - 1])
        assert partitions_for_keys(keys, partitions) == [partition_for_key(k, partitions) for k in keys], trial


@pytest.mark.parametrize(("key", "expected"), KAFKA_VECTORS)
def test_kafka_vectors_hold_for_keys_placed_at_once(key: bytes, expected: int) -> None:
    keys = [key] * VECTOR_KEYS_MIN + [b"x" * VECTOR_KEY_BYTES_MAX]  # the vector path, padded past the key
    placed = partitions_for_keys(keys, 2**31 - 1)
    assert placed[:VECTOR_KEYS_MIN] == [to_positive(expected) % (2**31 - 1)] * VECTOR_KEYS_MIN


def test_the_server_loads_numpy_at_start_and_the_client_never() -> None:
    # Goal: the first keyed topic produce does not import numpy on the event loop (25+ ms):
    # the produce handlers load it with the server; the client, which shares the
    # partitioner, does not pay for it.
    def loaded(module: str) -> bool:
        code = f"import sys, {module}; print('numpy' in sys.modules)"
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                              timeout=60).stdout.strip() == "True"

    assert loaded("multiraft.http.handlers.produce")
    assert not loaded("multiraft.client.producer")
