"""Storage benchmarks, each printed with a baseline measured in the same run.

    .venv/bin/python bench/storage.py [--log-mib 1024] [--log-entries 100000] [--dir PATH]

Figures (targets from issue 3):
  1. append MB/s, 100 KiB entries, fsync group commit  vs  plain write+fsync loop  (>= 0.6)
  2. entries/s, 1 KiB entries, 100 per fsync            (>= 20,000)
  3. records/s validating a 1,000 x 100 B record batch  (>= 2,000,000)
  4. sequential read MB/s by offset (page cache)        (>= 500), vs pread of the files
  5. random offset lookup latency                       (<= 20 us), vs one rocksdict get
  6. reopen of a 1 GiB / 100,000-entry log after kill -9 (<= 1 s)
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from raftlog.messages import Entry, EntryKind
from raftlog.types import GroupId, Index, Offset, Term
from storage.batch import Record, encode_batch, validate_batch
from storage.files import OsFiles
from storage.offsets import lookup, read_records
from storage.segments import SegmentStore
from storage.state_db import StateDatabase

GROUP = GroupId(1)


def _open(root: str) -> tuple[StateDatabase, SegmentStore]:
    db = StateDatabase(os.path.join(root, "state"))
    return db, SegmentStore(GROUP, os.path.join(root, "log"), db, OsFiles())


def _data_entries(first: int, count: int, value_bytes: int, records: int = 1) -> list[Entry]:
    payload = encode_batch(
        [Record(b"key", os.urandom(value_bytes // records))] * records, first_timestamp_ms=1
    )
    return [Entry(Index(i), Term(1), EntryKind.DATA, payload) for i in range(first, first + count)]


def _report(name: str, value: float, unit: str, baseline: float, baseline_name: str, target: str):
    ratio = value / baseline if baseline else float("nan")
    print(f"{name:<48} {value:>14,.1f} {unit:<8} baseline {baseline_name} {baseline:,.1f} "
          f"-> ratio {ratio:.2f}   target {target}")  # fmt: skip


def bench_append(
    root: str, entry_bytes: int, total_entries: int, group: int
) -> tuple[float, float]:
    """(store entries/s, plain write+fsync entries/s) with one fsync per `group` entries."""
    os.makedirs(root, exist_ok=True)
    entries = _data_entries(1, total_entries, entry_bytes)
    db, store = _open(os.path.join(root, f"append{entry_bytes}"))
    started = time.perf_counter()
    for first in range(0, total_entries, group):
        store.append(entries[first : first + group])
        store.sync()
    store_rate = total_entries / (time.perf_counter() - started)
    store.close()
    db.close()
    chunk = entries[0].payload
    path = os.path.join(root, f"plain{entry_bytes}")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    started = time.perf_counter()
    for first in range(0, total_entries, group):
        for _ in range(min(group, total_entries - first)):
            os.write(fd, chunk)
        os.fsync(fd)
    plain_rate = total_entries / (time.perf_counter() - started)
    os.close(fd)
    return store_rate, plain_rate


def bench_validate() -> tuple[float, float]:
    import zlib

    batch = encode_batch([Record(b"k" * 12, os.urandom(100))] * 1000, first_timestamp_ms=1)
    best_validate = best_crc = float("inf")
    for _ in range(5):
        started = time.perf_counter()
        for _ in range(200):
            validate_batch(batch)
        best_validate = min(best_validate, (time.perf_counter() - started) / 200)
        started = time.perf_counter()
        for _ in range(200):
            zlib.crc32(batch)
        best_crc = min(best_crc, (time.perf_counter() - started) / 200)
    return 1000 / best_validate, 1000 / best_crc


def write_log(root: str, total_bytes: int, total_entries: int) -> None:
    """Subprocess body: write the big log, syncing every 100 entries, until killed."""
    _db, store = _open(root)
    entry_bytes = total_bytes // total_entries
    template = _data_entries(1, 1, entry_bytes, records=10)[0].payload
    for first in range(1, total_entries + 1, 100):
        last = min(first + 100, total_entries + 1)
        store.append(
            [Entry(Index(i), Term(1), EntryKind.DATA, template) for i in range(first, last)]
        )
        store.sync()
    print("done", flush=True)
    time.sleep(3600)  # wait for the kill


def bench_reopen(root: str, log_bytes: int, log_entries: int) -> tuple[float, float]:
    process = subprocess.Popen(
        [sys.executable, __file__, "--write-log", root, str(log_bytes), str(log_entries)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert process.stdout is not None
    assert process.stdout.readline().strip() == "done"
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    process.stdout.close()
    started = time.perf_counter()
    db, store = _open(root)
    reopen_s = time.perf_counter() - started
    assert store.last_index() == log_entries and store.recovery.corruption == ()
    store.close()
    db.close()
    started = time.perf_counter()
    db = StateDatabase(os.path.join(root, "state"))
    os.listdir(os.path.join(root, "log"))
    floor_s = time.perf_counter() - started
    db.close()
    return reopen_s, floor_s


def bench_reads(root: str) -> None:
    db, store = _open(root)
    end = store.log_end_offset
    for segment in store.segments:  # warm the page cache
        with open(segment.path, "rb") as file:
            while file.read(8 << 20):
                pass
    started, total, offset = time.perf_counter(), 0, Offset(0)
    while offset < end:
        result = read_records(store, offset, end_offset=end, max_records=10**9, max_bytes=1 << 20)
        total += sum(len(b.payload) for b in result.batches)
        last = result.batches[-1]
        offset = Offset(last.base_offset + last.record_count)
    read_rate = total / (time.perf_counter() - started) / 1e6
    started, plain = time.perf_counter(), 0
    for segment in store.segments:
        fd = os.open(segment.path, os.O_RDONLY)
        position = 0
        while chunk := os.pread(fd, 1 << 20, position):
            position += len(chunk)
            plain += len(chunk)
        os.close(fd)
    plain_rate = plain / (time.perf_counter() - started) / 1e6
    _report("4. sequential read by offset", read_rate, "MB/s", plain_rate, "pread", ">= 500 MB/s")
    rng = random.Random(1)
    targets = [Offset(rng.randrange(end)) for _ in range(20_000)]
    started = time.perf_counter()
    for target in targets:
        lookup(store, target)
    lookup_us = (time.perf_counter() - started) / len(targets) * 1e6
    keys = [b"H" + GROUP.to_bytes(8, "big")] * len(targets)
    started = time.perf_counter()
    for key in keys:
        db.get(key)
    get_us = (time.perf_counter() - started) / len(keys) * 1e6
    _report("5. random offset lookup", lookup_us, "us", get_us, "db.get", "<= 20 us")
    store.close()
    db.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dir", default=None, help="where to write (default: a temp dir)")
    parser.add_argument("--log-mib", type=int, default=1024)
    parser.add_argument("--log-entries", type=int, default=100_000)
    parser.add_argument("--append-mib", type=int, default=200)
    parser.add_argument("--write-log", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.write_log:
        write_log(args.write_log[0], int(args.write_log[1]), int(args.write_log[2]))
        return
    root = tempfile.mkdtemp(prefix="raftlog-bench-", dir=args.dir)
    try:
        big = args.append_mib * 1024 * 1024 // (100 * 1024) // 3
        # fsync latency on this shared disk swings 2x between seconds: alternate the
        # two sides three times and keep each side's best round.
        rounds = [bench_append(os.path.join(root, f"r{i}"), 100 * 1024, big, group=1)
                  for i in range(3)]  # fmt: skip
        store_rate, plain_rate = max(r[0] for r in rounds), max(r[1] for r in rounds)
        _report("1. append 100 KiB, fsync each (MB/s)", store_rate * 0.1, "MB/s",
                plain_rate * 0.1, "write+fsync", "ratio >= 0.6")  # fmt: skip
        store_rate, plain_rate = bench_append(root, 1024, 100_000, group=100)
        _report("2. append 1 KiB, 100 per fsync", store_rate, "entries/s", plain_rate,
                "write+fsync", ">= 20,000/s")  # fmt: skip
        validate_rate, crc_rate = bench_validate()
        _report("3. validate 1,000 x 100 B batch", validate_rate, "rec/s", crc_rate,
                "crc32 alone", ">= 2,000,000/s")  # fmt: skip
        log_root = os.path.join(root, "biglog")
        reopen_s, floor_s = bench_reopen(log_root, args.log_mib << 20, args.log_entries)
        _report(f"6. reopen {args.log_mib} MiB / {args.log_entries} entries after kill -9",
                reopen_s * 1000, "ms", floor_s * 1000, "db open+listdir", "<= 1000 ms")  # fmt: skip
        bench_reads(log_root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
