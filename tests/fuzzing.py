"""How hard the fuzz tests push: `make test` runs them briefly, `make fuzz` deeply.

`RAFTLOG_FUZZ_SCALE=N` multiplies every fuzz test's example count (hypothesis over
the batch codec and the transport decoders, schemathesis over the HTTP API).
"""

from __future__ import annotations

import os


def fuzz_examples(default: int) -> int:
    scale = int(os.environ.get("RAFTLOG_FUZZ_SCALE", "1"))
    assert scale >= 1, "RAFTLOG_FUZZ_SCALE is a positive integer"
    return default * scale
