"""The node's garbage-collector policy: long-lived objects frozen, garbage never frozen."""

from __future__ import annotations

import gc
import weakref

from multiraft.runtime import heap


class Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the cyclic collector frees it


def test_settle_frees_cycles_then_freezes_the_survivors() -> None:
    # Goal: what the settle freezes is alive (garbage frozen would never be freed), and
    # what dies after being frozen is freed by the next settle after groups closed.
    try:
        garbage, kept = Node(), Node()
        garbage_ref, kept_ref = weakref.ref(garbage), weakref.ref(kept)
        del garbage
        heap.settle(groups_closed=False)
        assert garbage_ref() is None, "cyclic garbage is collected before the freeze"
        assert gc.get_freeze_count() > 0
        del kept  # dies while frozen: no ordinary collection looks at it
        gc.collect()
        assert kept_ref() is not None
        heap.settle(groups_closed=True)
        assert kept_ref() is None, "closing groups hands the frozen heap back to the collector"
    finally:
        gc.unfreeze()
