"""Goal: the window of a mirror pull (multiraft/node/mirror_window.py) reads after what it
proposed, holds at most its bounds of proposals and bytes in flight, and moves the
committed position only oldest first, to the end of each applied chunk."""

from __future__ import annotations

import pytest

from multiraft.node.mirror_window import (
    BYTES_IN_FLIGHT_MAX,
    CHUNK_BYTES,
    PROPOSALS_IN_FLIGHT_MAX,
    InFlight,
    PipelineBounds,
    Window,
)


def test_the_defaults_are_explicit() -> None:
    assert (PROPOSALS_IN_FLIGHT_MAX, CHUNK_BYTES, BYTES_IN_FLIGHT_MAX) == (4, 2**20, 4 * 2**20)
    window = PipelineBounds().window(7)
    assert (window.committed, window.proposals_max, window.bytes_max) == (7, 4, 4 * 2**20)


def test_reads_follow_what_was_proposed_and_the_position_what_was_applied() -> None:
    window = Window(100, proposals_max=4, bytes_max=4000, chunk_bytes_max=1000)
    assert window.read_position == 100 and window.has_room()
    window.add(InFlight(100, 110, 900, 3))
    window.add(InFlight(110, 125, 1000, 4))
    assert (window.committed, window.read_position, window.bytes_in_flight) == (100, 125, 1900)
    assert window.applied() == InFlight(100, 110, 900, 3)
    assert (window.committed, window.read_position, window.bytes_in_flight) == (110, 125, 1000)
    window.applied()
    assert (window.committed, window.read_position, window.bytes_in_flight) == (125, 125, 0)


@pytest.mark.parametrize("proposals_max, bytes_max, fits", [
    pytest.param(3, 10_000, 3, id="proposals"),
    pytest.param(8, 2000, 2, id="bytes: a chunk to come counts at its largest"),
])
def test_room_ends_at_either_bound(proposals_max: int, bytes_max: int, fits: int) -> None:
    window = Window(0, proposals_max=proposals_max, bytes_max=bytes_max, chunk_bytes_max=1000)
    added = 0
    while window.has_room():
        window.add(InFlight(window.read_position, window.read_position + 5, 700, 1))
        added += 1
    assert added == fits
    window.applied()
    assert window.has_room()


def test_an_empty_window_takes_one_batch_larger_than_a_chunk() -> None:
    # The source answers at least one whole batch; one above the chunk size goes alone.
    window = Window(0, proposals_max=4, bytes_max=2000, chunk_bytes_max=1000)
    window.add(InFlight(0, 1, 5000, 1))
    assert not window.has_room()


def test_a_chunk_must_start_where_the_last_one_ends() -> None:
    window = Window(10, proposals_max=4, bytes_max=4000, chunk_bytes_max=1000)
    with pytest.raises(AssertionError):
        window.add(InFlight(11, 20, 10, 1))


@pytest.mark.parametrize("bounds", [(0, 10, 10), (1, 10, 0), (2, 5, 10)])
def test_bounds_are_validated(bounds: tuple[int, int, int]) -> None:
    with pytest.raises(ValueError):
        PipelineBounds(*bounds)
