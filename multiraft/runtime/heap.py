"""Short pauses of the cyclic garbage collector on a node hosting thousands of groups.

Almost everything a node allocates is freed by reference counting; the cyclic
collector finds next to nothing (its full passes here collect zero objects), yet
a full pass walks every tracked object. With a thousand groups open that is
80-200 ms of a stalled event loop several times a minute, long enough for peers
to take the node for dead and wake their quiet groups. So once the replicas are
open, the long-lived heap is moved out of the collector's sight (`gc.freeze`,
what Instagram does before forking its workers) and later passes walk only what
was allocated since.

Objects frozen while garbage would never be collected, so a full collection
runs first; when groups were closed their frozen objects go back under the
collector (`gc.unfreeze`) so that collection can free them.
"""

from __future__ import annotations

import gc
import time


def settle(groups_closed: bool) -> float:
    """Collect, then freeze what survives; the seconds it took (a pause of the loop)."""
    began = time.perf_counter()
    if groups_closed:
        gc.unfreeze()
    gc.collect()
    gc.freeze()
    return time.perf_counter() - began
