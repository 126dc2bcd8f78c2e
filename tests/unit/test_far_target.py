"""When a leader sends a follower whole segment files instead of appends (catchup_leader.py)."""

from __future__ import annotations

from multiraft.node.catchup_leader import far_target
from raftlog.core.progress import Inflights, Progress, ProgressState
from raftlog.types import Index

MIB = 1024 * 1024
CLOSED = [(Index(1), Index(100), 4 * MIB), (Index(101), Index(200), 4 * MIB), (Index(201), Index(300), 4 * MIB)]


def _progress(match: int, state: ProgressState = ProgressState.REPLICATE, active: bool = True) -> Progress:
    progress = Progress(match=Index(match), next=Index(match + 1), inflights=Inflights(16, MIB), state=state)
    progress.recent_active = active
    return progress


def test_far_in_entries_ends_at_the_newest_committed_closed_segment() -> None:
    assert far_target(_progress(10), Index(350), Index(340), Index(0), CLOSED, 100, 0) == 300
    assert far_target(_progress(10), Index(350), Index(250), Index(0), CLOSED, 100, 0) == 200  # 300 not committed


def test_far_in_bytes_counts_the_whole_files_beyond_its_match() -> None:
    assert far_target(_progress(150), Index(310), Index(310), Index(0), CLOSED, 0, 8 * MIB) is None  # one file
    assert far_target(_progress(90), Index(310), Index(310), Index(0), CLOSED, 0, 8 * MIB) == 300  # two


def test_near_or_unknown_followers_replay() -> None:
    assert far_target(_progress(290), Index(310), Index(310), Index(0), CLOSED, 100, 8 * MIB) is None
    assert far_target(_progress(10, ProgressState.PROBE), Index(350), Index(340), Index(0), CLOSED, 100, 0) is None
    assert far_target(_progress(10, active=False), Index(350), Index(340), Index(0), CLOSED, 100, 0) is None
    assert far_target(_progress(10), Index(350), Index(340), Index(0), CLOSED, 0, 0) is None  # both off
    assert far_target(_progress(10), Index(350), Index(340), Index(0), [], 100, 0) is None
    # Files that do not start right after the start point cannot be taken as they are.
    assert far_target(_progress(10), Index(350), Index(340), Index(50), CLOSED, 100, 0) is None
