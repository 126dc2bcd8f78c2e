"""How hard the fuzz tests push: `make test` runs them briefly, `make fuzz` deeply.

`RAFTLOG_FUZZ_SCALE=N` multiplies every fuzz test's example count (hypothesis over
the batch codec and the transport decoders, schemathesis over the HTTP API).
`cost` measures one decoder call's memory peak and CPU time, for the bounds per
input byte the decoders' fuzz tests assert (issue 21).
"""

from __future__ import annotations

import os
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


def fuzz_examples(default: int) -> int:
    scale = int(os.environ.get("RAFTLOG_FUZZ_SCALE", "1"))
    assert scale >= 1, "RAFTLOG_FUZZ_SCALE is a positive integer"
    return default * scale


# CPU bound per input for a decoder: a loaded 2-core box stalls a process for tens of
# milliseconds, so the fixed part is generous; the per-byte part is ~100x what the
# decoders take (a few microseconds per kilobyte) so only a superlinear path trips it.
SECONDS_PER_INPUT = 0.25
SECONDS_PER_BYTE = 20e-6


@dataclass
class Cost:
    """What one decoder call cost: its result or the exception it raised, the peak of
    memory it allocated (tracemalloc, so Python and C allocations through PyMem), and
    its process CPU time."""

    outcome: Any
    peak_bytes: int
    cpu_seconds: float

    def assert_within(self, *, input_bytes: int, bytes_per_byte: int, bytes_fixed: int) -> None:
        assert self.peak_bytes <= bytes_per_byte * input_bytes + bytes_fixed, (
            f"allocated {self.peak_bytes} bytes for {input_bytes} input bytes "
            f"(bound {bytes_per_byte} per byte + {bytes_fixed})")
        limit = SECONDS_PER_INPUT + SECONDS_PER_BYTE * input_bytes
        assert self.cpu_seconds <= limit, f"took {self.cpu_seconds:.3f} s of CPU for {input_bytes} bytes"


def cost(call: Callable[[], Any]) -> Cost:
    """Run `call` once, measuring its memory peak and CPU time; exceptions are its outcome."""
    tracemalloc.start()
    started = time.process_time()
    try:
        outcome = call()
    except Exception as error:  # the caller asserts which exceptions are allowed
        outcome = error
    cpu_seconds = time.process_time() - started
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return Cost(outcome, peak, cpu_seconds)
