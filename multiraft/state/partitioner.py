"""Kafka's default partitioner: `murmur2(key) % partitions`, positive-masked.

A keyed record lands on the partition a Kafka producer would pick for the same
key and partition count, so users moving from Kafka keep their key locality.
This mirrors `org.apache.kafka.common.utils.Utils.murmur2` (seed 0x9747b28c,
32-bit signed arithmetic) and `Utils.toPositive` (mask the sign bit: not
`abs()`, which differs for negative hashes). Shared by the HTTP layer and the
Python client, so both place keys identically.
"""

from __future__ import annotations

_SEED = 0x9747B28C
_M = 0x5BD1E995
_MASK32 = 0xFFFFFFFF


def _signed(value: int) -> int:
    value &= _MASK32
    return value - (1 << 32) if value & 0x80000000 else value


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 of `data`, as the signed 32-bit Java int it returns."""
    length = len(data)
    h = (_SEED ^ length) & _MASK32
    whole = length - length % 4
    for i in range(0, whole, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * _M) & _MASK32
        k ^= k >> 24  # Java's >>> on the 32-bit value
        k = (k * _M) & _MASK32
        h = ((h * _M) & _MASK32) ^ k
    tail = length % 4
    if tail >= 3:
        h ^= data[whole + 2] << 16
    if tail >= 2:
        h ^= data[whole + 1] << 8
    if tail >= 1:
        h ^= data[whole]
        h = (h * _M) & _MASK32
    h ^= h >> 13
    h = (h * _M) & _MASK32
    h ^= h >> 15
    return _signed(h)


def to_positive(value: int) -> int:
    """Kafka's `Utils.toPositive`: clear the sign bit."""
    return value & 0x7FFFFFFF


def partition_for_key(key: bytes, partitions: int) -> int:
    """The partition of a keyed record without an explicit partition."""
    assert partitions >= 1
    return to_positive(murmur2(key)) % partitions
