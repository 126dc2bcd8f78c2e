"""Kafka's default partitioner: `murmur2(key) % partitions`, positive-masked.

A keyed record lands on the partition a Kafka producer would pick for the same
key and partition count, so users moving from Kafka keep their key locality.
This mirrors `org.apache.kafka.common.utils.Utils.murmur2` (seed 0x9747b28c,
32-bit signed arithmetic) and `Utils.toPositive` (mask the sign bit: not
`abs()`, which differs for negative hashes). Shared by the HTTP layer and the
Python client, so both place keys identically.

A topic produce places a whole request's keys at once (`partitions_for_keys`): the
same arithmetic over numpy columns, one word of every key per step, so a request of
1,000 keys costs a few array operations instead of 1,000 Python-level hashes (the
per-key loop was a tenth of a node's loop in a keyed produce over eight partitions).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

_SEED = 0x9747B28C
_M = 0x5BD1E995
_MASK32 = 0xFFFFFFFF
_WORDS = struct.Struct("<I")
# Keys hashed together are padded to the longest one's words: longer keys go one by one,
# so one huge key cannot make a request's matrix huge. Fewer keys than this: one by one.
VECTOR_KEY_BYTES_MAX = 64
VECTOR_KEYS_MIN = 16


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


def partitions_for_keys(keys: Sequence[bytes], partitions: int) -> list[int]:
    """`partition_for_key` of every key, in order, computed for the short ones at once."""
    assert 1 <= partitions < 1 << 31, partitions  # a Java int, as Kafka's; the columns are uint32
    short = [i for i, key in enumerate(keys) if len(key) <= VECTOR_KEY_BYTES_MAX]
    if len(short) < VECTOR_KEYS_MIN:
        return [partition_for_key(key, partitions) for key in keys]
    placed = [0] * len(keys)
    hashed = _murmur2_columns([keys[i] for i in short]) & 0x7FFFFFFF
    for i, partition in zip(short, (hashed % partitions).tolist(), strict=True):
        placed[i] = partition
    if len(short) < len(keys):
        for i, key in enumerate(keys):
            if len(key) > VECTOR_KEY_BYTES_MAX:
                placed[i] = partition_for_key(key, partitions)
    return placed


def _murmur2_columns(keys: Sequence[bytes]) -> np.ndarray:
    """`murmur2` of each key as an unsigned 32-bit column (uint32 arithmetic wraps as Java's
    int does). Row i holds key i's little-endian words, zero-padded with at least one
    spare word, so the word after a key's whole words is its tail, zeros beyond it.
    numpy is imported here: the server hashes keys together, the client and the CLI (which
    share this module) never do and do not pay its import."""
    import numpy as np

    count = len(keys)
    lengths = np.fromiter(map(len, keys), dtype=np.uint32, count=count)
    longest = int(lengths.max())
    width = (longest // 4 + 1) * 4
    words = np.frombuffer(b"".join(key.ljust(width, b"\0") for key in keys), dtype="<u4").reshape(count, width // 4)
    m = np.uint32(_M)
    h = np.uint32(_SEED) ^ lengths
    whole = lengths >> np.uint32(2)
    for column in range(longest // 4):
        k = words[:, column] * m
        k ^= k >> np.uint32(24)
        k *= m
        h = np.where(whole > column, (h * m) ^ k, h)
    tail = words[np.arange(count), whole]
    h = np.where((lengths & np.uint32(3)) != 0, (h ^ tail) * m, h)
    h ^= h >> np.uint32(13)
    h *= m
    h ^= h >> np.uint32(15)
    return h
