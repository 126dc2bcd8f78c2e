"""Goal: the mirror-skip-batch negative control (RAFTLOG_UNSAFE, multiraft/node/unsafe.py)
reaches the mirror pull as a chunk filter that leaves out the first of two or more
batches, and nothing filters chunks without it (chaos/mirror_checks.py must catch it:
`python -m chaos suite controls`)."""

from __future__ import annotations

from multiraft.node.faults import Faults, drop_first_batch
from multiraft.node.unsafe import NO_HOOKS, ChaosHooks


def test_the_switch_drops_the_first_of_several_batches_only() -> None:
    hooks = ChaosHooks.from_environment({"RAFTLOG_UNSAFE": "mirror-skip-batch"})
    assert hooks.unsafe == ("mirror-skip-batch",)
    assert Faults.of(hooks).mirror_chunk is drop_first_batch
    assert drop_first_batch([b"a", b"b", b"c"]) == [b"b", b"c"]
    assert drop_first_batch([b"a"]) == [b"a"] and drop_first_batch([]) == []


def test_without_it_chunks_are_copied_as_read() -> None:
    assert Faults.of(NO_HOOKS).mirror_chunk is None
