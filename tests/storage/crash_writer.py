"""A writer for the crash tests: appends and syncs until it is killed.

Run as `python -m tests.storage.crash_writer ROOT SEED`. After each `sync()`
returns it prints `synced <index>`: the parent kills it with SIGKILL at a
random moment and checks that every reported index survived. Files go through
the write-behind double, so the kill loses what a power failure would.
"""

from __future__ import annotations

import random
import sys

from raftlog.messages import HardState
from raftlog.types import Index, Term
from storage.config import StoreConfig
from tests.storage.helpers import SegmentHarness, data_entry

ENTRIES_MAX = 200_000


def expected_entry(index: int):
    return data_entry(index, 1, count=index % 5 + 1, value_bytes=index % 300)


def main() -> None:
    root, seed = sys.argv[1], int(sys.argv[2])
    rng = random.Random(seed)
    config = StoreConfig(segment_bytes_max=rng.choice([4096, 16384, 1 << 20]))
    harness = SegmentHarness(root, config=config)
    store = harness.store
    index = store.last_index() + 1
    while index < ENTRIES_MAX:
        group = [expected_entry(i) for i in range(index, index + rng.randint(1, 20))]
        store.append(group)
        index += len(group)
        if rng.random() < 0.7:
            store.set_hard_state(HardState(term=Term(1), commit=Index(index - 1)))
            result = store.sync()
            print(f"synced {result.durable_index}", flush=True)


if __name__ == "__main__":
    main()
