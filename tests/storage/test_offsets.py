"""Reads by logical offset: index lookups against a reference model, ranges, limits."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raftlog.messages import Entry, EntryKind, HardState
from raftlog.types import Index, Offset, Term
from storage.batch import decode_batch
from storage.config import StoreConfig
from storage.errors import OffsetOutOfRangeError
from storage.offsets import lookup, read_records
from tests.storage.helpers import SegmentHarness, data_entry

_SMALL_SEGMENTS = StoreConfig(segment_bytes_max=4096)
_counter = itertools.count()

# An operation: ("append", [record counts, 0 = META]) | ("truncate", back) | ("sync",) | ("crash",)
_operations = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.lists(st.integers(0, 40), min_size=1, max_size=12)),
        st.tuples(st.just("truncate"), st.integers(1, 10)),
        st.tuples(st.just("sync")),
        st.tuples(st.just("crash")),
    ),
    max_size=25,
)


def _entry(index: int, term: int, count: int) -> Entry:
    if count == 0:
        return Entry(Index(index), Term(term), EntryKind.META, b"m")
    return data_entry(index, term, count=count)


@settings(max_examples=40, deadline=None)
@given(operations=_operations)
def test_lookup_matches_reference_model(tmp_path_factory, operations):
    # Goal: every offset maps to the entry holding it, across rolls, truncations and crashes.
    root = tmp_path_factory.mktemp(f"model{next(_counter)}")
    harness = SegmentHarness(str(root), config=_SMALL_SEGMENTS)
    model: list[tuple[int, int]] = []  # per entry (term, record count); index = position + 1
    durable: list[tuple[int, int]] = []  # the model as of the last sync
    states: list[list[tuple[int, int]]] = [[]]  # every model state since the last sync
    term = 1
    try:
        for operation in operations:
            store = harness.store
            if operation[0] == "append":
                first = len(model) + 1
                new = [_entry(first + i, term, c) for i, c in enumerate(operation[1])]
                store.append(new)
                model += [(term, c) for c in operation[1]]
            elif operation[0] == "truncate" and len(model) > 0:
                cut = max(1, len(model) - operation[1] + 1)
                term += 1
                store.append([_entry(cut, term, 1)])
                model = [*model[: cut - 1], (term, 1)]
            elif operation[0] == "sync":
                store.sync()
                durable, states = list(model), []
            elif operation[0] == "crash":
                model = _after_crash(harness, durable, states)
                durable, states = list(model), []
            states.append(list(model))
            _check(harness, model)
    finally:
        harness.close()


def _after_crash(harness, durable, model):
    """The durable log comes back whole, possibly with more: rolling a segment
    fsyncs it, so the recovered log is a prefix of some log state since the last
    sync (an unsynced truncation may be undone), extending the durable one."""
    store = harness.crash()
    survived = store.last_index()
    terms = [store.term(Index(i)) for i in range(1, survived + 1)]
    # Synced entries survive, except those a later append truncated (a conflict).
    kept = min(_common_prefix(durable, state) for state in [durable, *model])
    assert survived >= kept, "a synced entry that was never truncated was lost"
    for state in reversed([durable, *model]):
        if len(state) >= survived and [t for t, _ in state[:survived]] == terms:
            return state[:survived]
    raise AssertionError(f"recovered terms {terms} match no log state since the last sync")


def _common_prefix(a: list, b: list) -> int:
    length = 0
    while length < min(len(a), len(b)) and a[length] == b[length]:
        length += 1
    return length


def _check(harness: SegmentHarness, model: list[tuple[int, int]]) -> None:
    store = harness.store
    assert store.last_index() == len(model)
    assert store.recovery.corruption == ()
    offset = 0
    for position, (term, count) in enumerate(model):
        index = position + 1
        assert store.term(Index(index)) == term
        for o in range(offset, offset + count):
            assert lookup(store, Offset(o))[0] == index
        offset += count
    assert store.log_end_offset == offset


@pytest.fixture
def harness(tmp_path):
    made = SegmentHarness(str(tmp_path), config=_SMALL_SEGMENTS)
    yield made
    made.close()


def _fill(harness: SegmentHarness, entries_count: int, records: int = 10) -> None:
    store = harness.store
    store.append([data_entry(i, 1, count=records) for i in range(1, entries_count + 1)])
    store.set_hard_state(HardState(term=Term(1), commit=Index(entries_count)))
    store.sync()


def test_read_records_limits_and_bounds(harness):
    # Goal: reads honour max_records/max_bytes (at least one batch) and the committed end.
    _fill(harness, 30)
    store = harness.store
    end = store.offset_after(Index(20))
    assert end == 200
    result = read_records(store, Offset(15), end_offset=end, max_records=25, max_bytes=1 << 20)
    assert [b.base_offset for b in result.batches] == [10, 20, 30]
    assert sum(b.record_count for b in result.batches) == 30
    one = read_records(store, Offset(15), end_offset=end, max_records=1000, max_bytes=1)
    assert len(one.batches) == 1
    everything = read_records(
        store, Offset(0), end_offset=end, max_records=10**6, max_bytes=1 << 30
    )
    assert everything.batches[-1].base_offset == 190
    _, records = decode_batch(everything.batches[3].payload)
    assert records[0].key == b"k4-0"
    assert read_records(store, end, end_offset=end, max_records=5, max_bytes=100).batches == []
    with pytest.raises(OffsetOutOfRangeError) as raised:
        read_records(store, Offset(201), end_offset=end, max_records=5, max_bytes=100)
    assert raised.value.log_start_offset == 0


def test_offset_below_log_start_carries_start(harness):
    # Goal: after compaction, reading below the log start says where it now begins.
    _fill(harness, 60)
    store = harness.store
    store.compact(Index(40))
    store.sync()
    assert store.log_start_offset == 400
    assert len(store.segments) < 20
    with pytest.raises(OffsetOutOfRangeError) as raised:
        read_records(store, Offset(5), end_offset=Offset(600), max_records=5, max_bytes=100)
    assert raised.value.log_start_offset == 400
    result = read_records(store, Offset(400), end_offset=Offset(600), max_records=5, max_bytes=1000)
    assert result.batches[0].base_offset == 400
