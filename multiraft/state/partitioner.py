"""Kafka's default partitioner: `murmur2(key) % partitions`, positive-masked.

A keyed record lands on the partition a Kafka producer would pick for the same
key and partition count, so users moving from Kafka keep their key locality.
This mirrors `org.apache.kafka.common.utils.Utils.murmur2` (seed 0x9747b28c,
32-bit signed arithmetic) and `Utils.toPositive` (mask the sign bit: not
`abs()`, which differs for negative hashes). Shared by the HTTP layer and the
Python client, so both place keys identically.
"""

from __future__ import annotations

import struct

_SEED = 0x9747B28C
_M = 0x5BD1E995
_MASK32 = 0xFFFFFFFF
_WORDS = struct.Struct("<I")


def _signed(value: int) -> int:
    value &= _MASK32
    return value - (1 << 32) if value & 0x80000000 else value


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 of `data`, as the signed 32-bit Java int it returns.

    Every keyed record of a topic produce pays this in Python, so the 4-byte words are
    read by `struct.iter_unpack` and the per-word steps folded (docs/scale.md has what
    it saved); tests/http/test_murmur2.py holds Kafka's vectors and the plain form."""
    length = len(data)
    h = (_SEED ^ length) & _MASK32
    whole = length & ~3
    if whole:
        for (k,) in _WORDS.iter_unpack(data if whole == length else data[:whole]):
            k = (k * _M) & _MASK32
            k ^= k >> 24  # Java's >>> on the 32-bit value
            h = ((h * _M) & _MASK32) ^ ((k * _M) & _MASK32)
    tail = length & 3
    if tail:
        if tail == 3:
            h ^= data[whole + 2] << 16
        if tail >= 2:
            h ^= data[whole + 1] << 8
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
