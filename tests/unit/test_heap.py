"""The node's garbage-collector policy: long-lived objects frozen, garbage never frozen,
the frozen heap never walked again."""

from __future__ import annotations

import gc
import weakref

from multiraft.runtime import heap


class Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the cyclic collector frees it


class Leaf:
    pass


def test_settle_frees_cycles_then_freezes_the_survivors() -> None:
    # Goal: what the settle freezes is alive (garbage frozen would never be freed); a
    # later settle leaves the frozen heap frozen (no pass over it), and what dies while
    # frozen without a cycle is freed at once by reference counting.
    try:
        garbage, kept, leaf = Node(), Node(), Leaf()
        garbage_ref, kept_ref, leaf_ref = weakref.ref(garbage), weakref.ref(kept), weakref.ref(leaf)
        del garbage
        heap.settle()
        assert garbage_ref() is None, "cyclic garbage is collected before the freeze"
        frozen = gc.get_freeze_count()
        assert frozen > 0
        del leaf
        assert leaf_ref() is None, "a frozen object without a cycle is freed by its last reference"
        heap.settle()
        assert gc.get_freeze_count() >= frozen - 1, "the frozen heap stays frozen"
        assert kept_ref() is not None
    finally:
        gc.unfreeze()
