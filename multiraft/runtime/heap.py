"""Short pauses of the cyclic garbage collector on a node hosting thousands of groups.

Almost everything a node allocates is freed by reference counting; the cyclic
collector finds next to nothing (its full passes here collect zero objects), yet
a full pass walks every tracked object. With a thousand groups open that is
80-200 ms of a stalled event loop several times a minute, long enough for peers
to take the node for dead and wake their quiet groups. So once the replicas are
open, the long-lived heap is moved out of the collector's sight (`gc.freeze`,
what Instagram does before forking its workers) and later passes walk only what
was allocated since.

Objects frozen while garbage would never be collected, so a collection runs
first. Objects that die while frozen are freed by reference counting like any
other; only a cycle among them would outlive its use. The heap is therefore never
handed back to the collector (`gc.unfreeze` and a full pass over everything held:
15-65 ms at a few hundred groups, and it grows with the heap), not even when groups
close: a closed group holds no reference cycle, so it is freed as its last
reference goes (tests/node/test_heap_cycles.py keeps that true).
"""

from __future__ import annotations

import gc
import time


def settle() -> float:
    """Collect what is not frozen, then freeze what survives; the seconds it took (a
    pause of the loop, over what was allocated since the last settle only)."""
    began = time.perf_counter()
    gc.collect()
    gc.freeze()
    return time.perf_counter() - began
