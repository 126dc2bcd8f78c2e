"""The node's state database: scans see exactly their range, whatever lies around it."""

from __future__ import annotations

from storage.state_db import TERM_RUN, StateDatabase, delete_int_range, int_key, int_range


def test_a_scan_holds_its_bounds_both_inclusive(tmp_path):
    # Goal: the scan's upper bound (an iterator bound, so seeks do not wander over
    # tombstones past the range) keeps `highest` in and everything above out.
    db = StateDatabase(str(tmp_path / "state"))
    lowest, highest = int_range(TERM_RUN, 7)
    batch = db.batch()
    for key in (int_key(TERM_RUN, 6, 5), lowest, int_key(TERM_RUN, 7, 9), highest,
                highest + b"\x00", int_key(TERM_RUN, 8, 0)):
        batch.put(key, b"v")
    db.write(batch, sync=False)
    assert [key for key, _ in db.scan(lowest, highest)] == [lowest, int_key(TERM_RUN, 7, 9), highest]
    db.close()


def test_a_scan_past_many_deleted_keys_finds_the_live_ones(tmp_path):
    # Goal: groups whose keys were all deleted (tombstones) neither hide nor add keys
    # to the scan of a group after them; a reopen compacts them away.
    path = str(tmp_path / "state")
    db = StateDatabase(path)
    batch = db.batch()
    for group in range(1, 2001):
        batch.put(int_key(TERM_RUN, group, 1), b"t")
    db.write(batch, sync=False)
    batch = db.batch()
    for group in range(1, 2000):
        delete_int_range(batch, TERM_RUN, group, 0)
    db.write(batch, sync=False)
    assert db.scan(*int_range(TERM_RUN, 1)) == []
    assert db.scan(*int_range(TERM_RUN, 2000)) == [(int_key(TERM_RUN, 2000, 1), b"t")]
    db.close()
    db = StateDatabase(path)
    assert db.scan(*int_range(TERM_RUN, 1)) == []
    assert db.scan(*int_range(TERM_RUN, 2000)) == [(int_key(TERM_RUN, 2000, 1), b"t")]
    db.close()
