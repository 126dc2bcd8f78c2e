"""Chaos hooks: what the chaos runner may switch on in a node, by environment only.

Read once, when the node is built (`ChaosHooks.from_environment`), into one frozen
value, which the node turns, once, into the collaborators each switch chooses
(multiraft/node/faults.py): the group runtimes' persistence, the segment stores'
class and frame check, the partition state machine factory (its producer table),
the read path's end, the file layer.
No hot path reads a switch; the HTTP app reads the value to pick its routes and to
name the switches in `GET /v1/health`. Nothing else reads these variables, and the Raft core (`raftlog/`) never sees
them. With none set every field is False and the node behaves exactly as without
this module.

- `RAFTLOG_CHAOS_FILES=write-behind`: segment files go through
  `storage.write_behind.WriteBehindFiles`, which keeps unsynced appends and
  directory changes in process memory, so a `kill -9` loses what a power failure
  would (CHAOS.md 3.3, item 4, option A). The rocksdict state database cannot be
  doubled: its unsynced writes survive a `kill -9` as the OS page cache would.
  Safe: acknowledged data survives it (the node fsyncs before acknowledging).
- `RAFTLOG_CHAOS_DEBUG=1`: serve `/v1/debug/...` (per-group Raft state, log
  digests) for the runner's end-of-run checks.
- `RAFTLOG_CHAOS_FEATURE_LEVEL=N`: a test knob, no fault: the node supports feature
  level N only (0 up to its build's, multiraft/metadata/features.py), as a node of an
  older build would: it says so to the others (a finalize above N is refused), and a
  catalog finalized above N is one it may misread (multiraft/node/features.py). Named in
  `GET /v1/health`. tests/integration/test_features_processes.py starts a cluster "from
  before the gate" with it.
- `RAFTLOG_UNSAFE=name,name,...`: deliberately break the node, for the runner's
  negative controls (CHAOS.md 5.4). Never set them anywhere else: each can lose,
  duplicate or corrupt acknowledged data. Unknown names refuse to start; a node
  running any logs a loud warning at start and names them in `GET /v1/health`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields

from multiraft.metadata.features import SUPPORTED_LEVEL
from multiraft.node.config import ConfigError

FILES_VARIABLE = "RAFTLOG_CHAOS_FILES"
DEBUG_VARIABLE = "RAFTLOG_CHAOS_DEBUG"
FEATURE_LEVEL_VARIABLE = "RAFTLOG_CHAOS_FEATURE_LEVEL"
UNSAFE_VARIABLE = "RAFTLOG_UNSAFE"
WRITE_BEHIND = "write-behind"

# Switch name (as spelled in RAFTLOG_UNSAFE) -> field of ChaosHooks.
UNSAFE_SWITCHES = {
    "ack-before-fsync": "ack_before_fsync",
    "no-dedup": "no_dedup",
    "read-uncommitted": "read_uncommitted",
    "skip-crc": "skip_crc",
    "vote-without-persist": "vote_without_persist",
    "group-early-assign": "group_early_assign",
    "mirror-skip-batch": "mirror_skip_batch",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class ChaosHooks:
    write_behind_files: bool = False
    debug_endpoints: bool = False
    feature_level: int | None = None  # the level this node says it supports (None: its build's)
    # Unsafe switches (negative controls). Where each one acts:
    # runtime/persistence.py AckBeforeFsync (injected by replicas.py): answer and count as
    # durable before the fsync, which is deferred (UNSAFE_SYNC_DELAY_S); term and vote
    # changes still sync first.
    ack_before_fsync: bool = False
    # faults.py ProducerTableWithoutDedup (the partition machines' table, kept across
    # restores): a retried batch is never a duplicate; it is appended again.
    no_dedup: bool = False
    # faults.py log_end, the read path's end: committed reads go to the log end, past the high watermark.
    read_uncommitted: bool = False
    # faults.py framing_only, the frame check every store is opened with: reads and
    # recovery do not check frame CRCs.
    skip_crc: bool = False
    # faults.py SegmentStoreForgettingVotes, the class every store is opened as: term and
    # vote never reach the database.
    vote_without_persist: bool = False
    # faults.py GroupsStateGivingEarly (group 0's consumer group state, through the catalog
    # holder): a member gets its target partitions at once, before their old owners gave them back.
    group_early_assign: bool = False
    # faults.py drop_first_batch, the mirror pull's chunk filter (mirror_pull.py): a sink
    # leader copying two or more batches at once leaves the first out (its records lost,
    # the rest at other offsets than the source's).
    mirror_skip_batch: bool = False

    @property
    def unsafe(self) -> tuple[str, ...]:
        """The unsafe switches that are on, by name, sorted."""
        return tuple(sorted(name for name, field in UNSAFE_SWITCHES.items() if getattr(self, field)))

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> ChaosHooks:
        """The hooks the environment asks for. Raises `ConfigError` on any value it does not know."""
        environ = os.environ if environ is None else environ
        files = environ.get(FILES_VARIABLE, "").strip()
        if files not in ("", WRITE_BEHIND):
            raise ConfigError(f"{FILES_VARIABLE}: only {WRITE_BEHIND!r} is known, got {files!r}")
        debug = environ.get(DEBUG_VARIABLE, "").strip()
        if debug not in ("", "0", "1"):
            raise ConfigError(f"{DEBUG_VARIABLE}: 1 or 0, got {debug!r}")
        names = [name.strip() for name in environ.get(UNSAFE_VARIABLE, "").split(",") if name.strip()]
        unknown = sorted(set(names) - set(UNSAFE_SWITCHES))
        if unknown:
            raise ConfigError(f"{UNSAFE_VARIABLE}: unknown switches {unknown}; known: {sorted(UNSAFE_SWITCHES)}")
        switches = {UNSAFE_SWITCHES[name]: True for name in names}
        return cls(write_behind_files=files == WRITE_BEHIND, debug_endpoints=debug == "1",
                   feature_level=_feature_level(environ.get(FEATURE_LEVEL_VARIABLE, "").strip()), **switches)

    @property
    def supported_level(self) -> int:
        """The feature level this node supports: its build's, or less for a test."""
        return SUPPORTED_LEVEL if self.feature_level is None else self.feature_level


def _feature_level(value: str) -> int | None:
    if not value:
        return None
    if not (value.isascii() and value.isdigit()) or int(value) > SUPPORTED_LEVEL:
        raise ConfigError(f"{FEATURE_LEVEL_VARIABLE}: a feature level 0..{int(SUPPORTED_LEVEL)}, got {value!r}")
    return int(value)


NO_HOOKS = ChaosHooks()
assert {f.name for f in fields(ChaosHooks)} >= set(UNSAFE_SWITCHES.values())
