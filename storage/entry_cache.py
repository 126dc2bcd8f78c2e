"""Entries a log holds in memory after `append`, until its replicas no longer need them.

A leader sends each entry to its followers and applies it moments after appending
it, and a follower applies what it appended as soon as it learns the commit. Read
back from the segment file, each of those reads is a `pread`, a frame parse and a
CRC per entry (6.7 % of a leader's event-loop thread producing over 8 partitions:
docs/scale.md). The cache keeps the log's newest entries as the `Entry` objects
that were appended, so those reads come from memory. TiKV's `EntryCache` (kept
until every follower's match index passes an entry) and etcd's unstable log are
the same idea.

Why here, in storage, and not in the Raft core:

- Safety. Every change to a log's entries (append, conflict truncation, compaction,
  snapshot install, reopen after a far install or a repair, close) passes through
  the `SegmentStore` that owns this cache, and each of them drops what it replaces
  (`append`'s truncation, `forget`, `close`). A cache in the core would have to be
  told of compactions and installs the driver performs behind the core's back; one
  stale entry sent to a follower would break log matching.
- Memory. The budget is node-wide (one `EntryCacheBudget` shared by every store of
  a node), which the core, one group and nothing else, cannot see; and the core
  must stay free of shared mutable state (STYLE.md section 1).
- The core stays pure: it reads through `LogStorage.entries` as before.

What the runtime adds is only *when* entries may go: `release(index)` after each
round of a group (multiraft/runtime/group_host.py, `cache_release_index`: a
leader's applied index and every replicating follower's match index; a
follower's applied index). Releasing too early costs a file read; releasing too
late costs memory within the budget; neither changes what `read` returns, which is
always the entries exactly as appended, or None.

Invariants (asserted): the cached entries are contiguous and end at the log's last
index (an entry the cache could not keep drops every older one with it); the
memory they hold (`entry_cost_bytes`, plus the list while there is one; not the
protocol's entry size) is charged to the budget, and the budget's total is the sum
over its caches. An idle, fully replicated and applied log holds nothing (`_entries` is
None), so a node of 10,000 idle replicas pays one small object each.
"""

from __future__ import annotations

from collections import OrderedDict

from raftlog.messages import ENTRY_OVERHEAD_BYTES, Entry
from raftlog.types import Index

# The node's default budget: a few tens of MiB is well under a node's RSS at 10,000
# partitions, and holds 2.5 s of a 3-node cluster's 100 B records at 100,000 per
# second (the bench's rate is under a third of that), i.e. every follower's window.
ENTRY_CACHE_BYTES_DEFAULT = 32 * 1024 * 1024
# A store opened without a node's budget (tools, tests, benches) gets one of its own.
STORE_CACHE_BYTES_DEFAULT = 1024 * 1024
# An entry larger than this share of the budget is not kept: a few huge batches
# would otherwise push every other log's entries out.
ENTRY_SHARE_MAX = 8


# What the budget charges is memory, not the protocol's entry size (ENTRY_OVERHEAD_BYTES,
# 32 B, the byte limits of reads and messages): a cached entry keeps alive objects that
# cost far more than its payload in CPython. Measured with sys.getsizeof on CPython 3.11,
# 64-bit: the Entry (a slots object of four fields) 64 B, its payload's bytes header 33 B,
# its index int 28 B (past the small ints; the term and kind are shared objects), the
# list slot 8 B (and up to 8 more for a released slot not yet cut): 133-141 B. The test
# (tests/storage/test_entry_cache.py) checks this against tracemalloc.
ENTRY_MEMORY_BYTES = 140
# The list a log's cache holds while it holds entries (sys.getsizeof([]): 56 B), charged
# when it is made and refunded when the cache empties.
CACHE_MEMORY_BYTES = 64


def entry_cost_bytes(entry: Entry) -> int:
    """The memory a cached entry is charged (ENTRY_MEMORY_BYTES)."""
    return len(entry.payload) + ENTRY_MEMORY_BYTES


class EntryCacheBudget:
    """The byte budget shared by a node's caches; over it, the caches appended to least
    recently give up their oldest entries first (one group's idle entries never starve
    another's busy ones). Not thread-safe: the node's event loop owns every store."""

    __slots__ = ("_caches", "bytes", "bytes_max", "entries_evicted", "entries_read", "entry_bytes_max")

    def __init__(self, bytes_max: int = ENTRY_CACHE_BYTES_DEFAULT, entry_bytes_max: int | None = None) -> None:
        """`entry_bytes_max`: the largest entry kept (by default an ENTRY_SHARE_MAX-th of the budget)."""
        assert bytes_max >= 0
        self.bytes_max = bytes_max
        self.entry_bytes_max = bytes_max // ENTRY_SHARE_MAX if entry_bytes_max is None else entry_bytes_max
        assert 0 <= self.entry_bytes_max <= bytes_max
        self.bytes = 0
        # Caches holding entries, least recently appended to first.
        self._caches: OrderedDict[EntryCache, None] = OrderedDict()
        self.entries_read = 0  # served from memory (a file read saved each)
        self.entries_evicted = 0  # dropped by the budget before being released

    def holding(self) -> int:
        """How many caches hold entries."""
        return len(self._caches)

    def _charged(self, cache: EntryCache, size: int) -> None:
        self.bytes += size
        caches = self._caches
        caches[cache] = None
        caches.move_to_end(cache)
        while self.bytes > self.bytes_max:
            oldest = next(iter(caches))
            self.entries_evicted += oldest._evict_oldest()

    def _refunded(self, cache: EntryCache, size: int, empty: bool) -> None:
        self.bytes -= size
        assert self.bytes >= 0, "the budget's total is the sum over its caches"
        if empty:
            self._caches.pop(cache, None)


class EntryCache:
    """One log's cached entries: contiguous, ending at the log's last index, or none.

    Kept in a list read from `_head` on: a read indexes it in O(1) (a deque's middle is
    O(n)); a release or eviction clears the slots it drops (None: the Entry objects go at
    once) and moves `_head`, and the cleared prefix is cut once it is half the list, so
    each entry is moved O(1) times."""

    __slots__ = ("_budget", "_bytes", "_entries", "_head")

    def __init__(self, budget: EntryCacheBudget) -> None:
        self._budget = budget
        # None when empty: an idle log pays nothing. Slots before `_head` are released (None).
        self._entries: list[Entry | None] | None = None
        self._head = 0
        self._bytes = 0

    @property
    def bytes(self) -> int:
        return self._bytes

    def _first(self) -> Entry:
        entries = self._entries
        assert entries is not None
        first = entries[self._head]
        assert first is not None, "slots from the head on hold entries"
        return first

    def first_index(self) -> Index | None:
        return self._first().index if self._entries is not None else None

    def __len__(self) -> int:
        return len(self._entries) - self._head if self._entries is not None else 0

    def read(self, lo: Index, hi: Index, max_bytes: int, used_bytes: int, last_index: Index) -> list[Entry]:
        """Entries [lo, hi) (lo at or past `first_index()`), stopping before the entry that
        would take the total past `max_bytes`, counting `used_bytes` already selected: at
        least one when `used_bytes` is 0 (the storage contract)."""
        entries = self._entries
        assert entries is not None, "the caller checked first_index()"
        first = self._first().index
        assert first <= lo <= hi <= last_index + 1, (first, lo, hi, last_index)
        last = entries[-1]
        assert last is not None and last.index == last_index, "the cached entries end the log"
        selected: list[Entry] = []
        total = used_bytes
        start = self._head - first
        for position in range(start + lo, start + hi):
            entry = entries[position]
            assert entry is not None
            total += len(entry.payload) + ENTRY_OVERHEAD_BYTES
            if total > max_bytes and (selected or used_bytes):
                break
            selected.append(entry)
        self._budget.entries_read += len(selected)
        return selected

    def remember(self, appended: list[Entry] | tuple[Entry, ...]) -> None:
        """Keep entries just appended (after any truncation the append made: `forget`)."""
        entries = self._entries
        if entries is not None:
            last = entries[-1]
            assert last is not None and last.index == appended[0].index - 1, "an append truncates first"
        budget = self._budget
        entry_bytes_max = budget.entry_bytes_max
        kept_from = 0
        for position, entry in enumerate(appended):
            # Kept and served later as appended, so immutable: a bytearray could change under
            # the cache after the file got its bytes. The core and the wire decode make bytes.
            assert type(entry.payload) is bytes, type(entry.payload)
            if entry_cost_bytes(entry) > entry_bytes_max:
                # Kept, it would hold a share of the budget out of proportion; skipped, every
                # entry before it goes too (the cache is a contiguous end of the log).
                kept_from = position + 1
        if kept_from:
            self.forget()
            entries = None
        size = 0
        for entry in appended[kept_from:]:
            if entries is None:
                entries = self._entries = []
                self._head = 0
                size += CACHE_MEMORY_BYTES
            entries.append(entry)
            size += entry_cost_bytes(entry)
        if size:
            self._bytes += size
            budget._charged(self, size)

    def release(self, index: Index) -> None:
        """Entries through `index` are no longer needed (applied, and held by every follower
        the log replicates to): drop them."""
        if self._entries is None:
            return
        first = self._first().index
        if first <= index:
            self._drop_oldest(min(index - first + 1, len(self)))

    def forget(self, from_index: Index | None = None) -> None:
        """Drop the entries from `from_index` on (all by default): the log was cut there,
        replaced by a snapshot, or closed."""
        entries = self._entries
        if entries is None:
            return
        first = self._first().index
        cut = self._head if from_index is None else self._head + max(0, from_index - first)
        if cut >= len(entries):
            return
        size = 0
        for entry in entries[cut:]:
            assert entry is not None
            size += entry_cost_bytes(entry)
        del entries[cut:]
        self._shrunk(size)

    def _evict_oldest(self) -> int:
        """The budget is over: drop the oldest entry (more if it empties). Entries dropped."""
        assert self._entries is not None, "only caches holding entries are in the budget's order"
        self._drop_oldest(1)
        return 1

    def _drop_oldest(self, count: int) -> None:
        entries = self._entries
        assert entries is not None and 0 < count <= len(self)
        head = self._head
        size = 0
        for position in range(head, head + count):
            entry = entries[position]
            assert entry is not None
            size += entry_cost_bytes(entry)
            entries[position] = None
        head += count
        if head * 2 >= len(entries):  # the cleared prefix is half the list: cut it
            del entries[:head]
            head = 0
        self._head = head
        self._shrunk(size)

    def _shrunk(self, size: int) -> None:
        entries = self._entries
        empty = entries is not None and self._head == len(entries)
        if empty:
            self._entries = None
            self._head = 0
            size += CACHE_MEMORY_BYTES
        self._bytes -= size
        assert self._bytes >= 0
        assert not empty or self._bytes == 0, "an empty cache is charged nothing"
        self._budget._refunded(self, size, empty)
