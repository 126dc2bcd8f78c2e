"""Node configuration: the flags of `raftlog serve`, or the same keys in a TOML file.

Every setting has one name, used by the command line (`--raft-addr`), the TOML
file (`raft_addr = "127.0.0.1:7001"`) and this dataclass (`raft_addr`). Values
are validated here, once, with errors that name the setting; the rest of the
node trusts them. Flags override the file.
"""

from __future__ import annotations

import argparse
import re
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from multiraft.net.secret_files import (
    SECRET_BYTES_MIN,
    SECRET_FILE_NAME,
    SecretFileError,
    check_cluster_secret,
    create_private_file,
    generate_secret,
    read_private_file,
    read_token_file,
    secret_material_bytes,
)
from multiraft.net.tls import PeerTls, TlsError, http_server_context
from multiraft.node.move_throttle import (
    REPLICA_MOVE_BYTES_PER_S_DEFAULT,
    REPLICA_MOVE_BYTES_PER_S_MAX,
)
from raftlog.types import NodeId
from storage.config import FlushPolicy
from storage.entry_cache import ENTRY_CACHE_BYTES_DEFAULT

# Scheduled scrubs. A week, as Ceph's osd_deep_scrub_interval: rot in a closed segment is
# found within a week of a replica's last read, at a cost spread thin (a seventh of a day's
# reads at the default rate for a node holding 1 TiB). On by default, as Riak's AAE and
# Ceph's deep scrub are: a cluster nobody verifies should still find its rot.
SCRUB_INTERVAL_S_DEFAULT = 7 * 86_400
SCRUB_INTERVAL_S_MIN = 1  # tests: one scrub at a time under the byte rate bounds the cost of any interval
SCRUB_INTERVAL_S_MAX = 365 * 86_400
# 16 MiB/s: about 2 % of a core at the ~950 MB/s a build hashes here (docs/mirror.md), a quarter
# of the sidecar warmer's rate; 1 TiB is read in under a day.
SCRUB_BYTES_PER_S_DEFAULT = 16 * 1024 * 1024
SCRUB_BYTES_PER_S_MIN = 64 * 1024  # no "no limit": a scheduled scrub must never compete with produce


class ConfigError(ValueError):
    """A setting is missing or malformed; the message names it."""


@dataclass(frozen=True, slots=True)
class Address:
    host: str
    port: int

    @classmethod
    def parse(cls, text: str, setting: str) -> Address:
        match = re.fullmatch(r"\[?([^\]]+?)\]?:(\d{1,5})", text.strip())
        if not match or not 0 < int(match.group(2)) < 65536:
            raise ConfigError(f"{setting}: expected HOST:PORT, got {text!r}")
        return cls(match.group(1), int(match.group(2)))

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeConfig:
    node_id: NodeId
    data_dir: Path
    raft_addr: Address
    http_addr: Address
    initial_cluster: dict[NodeId, Address] = field(default_factory=dict)
    join: Address | None = None
    rack: str = ""
    cluster_secret: bytes = b""
    # 50 ms ticks: elections in 0.5-1 s, so a dead leader is replaced within about a second.
    tick_ms: int = 50
    election_timeout_ticks: int = 10
    heartbeat_interval_ticks: int = 2
    replica_lag_time_max_ms: int = 30_000  # Kafka's replica.lag.time.max.ms default
    flush: FlushPolicy = FlushPolicy()
    segment_bytes_max: int = 64 * 1024 * 1024
    node_dead_after_ms: int = 10_000
    # A node silent this long has its replicas moved to live nodes (-1: never). Long, as
    # Redpanda's 15 minutes: a restart or a short outage must not copy whole partitions.
    replica_move_after_ms: int = 900_000
    # Bytes/s this node's leaders send to learners, the copies being made by moves and
    # decommissions (multiraft/node/move_throttle.py); 0: no limit. The cluster setting of
    # the same name (PATCH /v1/admin/config) wins over this one.
    replica_move_bytes_per_s: int = REPLICA_MOVE_BYTES_PER_S_DEFAULT
    # Bytes/s the tree sidecar warmer reads and hashes of closed segments in the background
    # (multiraft/node/tree_sidecars.py); 0: no limit.
    tree_sidecar_bytes_per_s: int = 64 * 1024 * 1024
    # Scheduled scrubs (multiraft/node/scheduled_scrubs.py, docs/mirror.md "Scheduled scrubs"):
    # each partition this node leads is deep-verified against its followers once per
    # `scrub_interval_s` (0: never, on demand only), one partition at a time, every build of
    # them (this node's, and the follower builds other leaders' scheduled scrubs ask of it)
    # read through one token bucket of `scrub_bytes_per_s`.
    scrub_interval_s: int = SCRUB_INTERVAL_S_DEFAULT
    scrub_bytes_per_s: int = SCRUB_BYTES_PER_S_DEFAULT
    # A follower this many entries behind its leader, or lacking this many bytes of its
    # closed segments, catches up by whole segment files (far horizon, multiraft/node/
    # catchup_leader.py), not by appends; 0 turns either test off (both 0: never).
    far_catchup_lag_entries: int = 20_000
    far_catchup_lag_bytes: int = 32 * 1024 * 1024
    # Bytes of newly appended entries this node's stores keep in memory, all groups
    # together, until their followers hold them (storage/entry_cache.py); 0: none.
    entry_cache_bytes: int = ENTRY_CACHE_BYTES_DEFAULT
    # Leadership balancing (multiraft/node/leadership.py). A transfer's target must have been
    # live this long without a silence (30 s: three node-dead-after periods, so a node back
    # from a restart has caught up and settled before it is asked to lead); no automatic
    # balancing this long after this node starts or a topic is created (the new groups'
    # first voters win their elections meanwhile); at most this many transfers in flight
    # from this node (each wakes its group; a hundred at once deposed working leaders).
    leader_balance_target_live_ms: int = 30_000
    leader_balance_settle_ms: int = 10_000
    leader_transfers_in_flight_max: int = 8
    # Consumer offsets retention (multiraft/node/offsets_retention.py): a group's offsets in a
    # partition go once it has not committed there for this long (Kafka's
    # offsets.retention.minutes, 7 days); partition leaders look this often (Kafka's
    # offsets.retention.check.interval.ms, 10 minutes).
    consumer_offsets_retention_ms: int = 7 * 24 * 3_600_000
    consumer_offsets_retention_check_ms: int = 600_000
    # HTTP bearer-token auth (multiraft/metadata/auth.py): on when set, from --admin-token-file.
    admin_token: bytes = b""
    # Web origins whose pages may call the API, and host names the node answers to
    # beyond its own address and localhost (multiraft/http/browsers.py).
    http_allowed_origins: tuple[str, ...] = ()
    http_host_names: tuple[str, ...] = ()
    # TLS (multiraft/net/tls.py, docs/http.md "TLS", docs/transport.md "TLS"). The HTTP API's
    # certificate and key: both or neither. Mutual TLS between nodes: the cluster's CA and
    # this node's certificate and key, all three or none. Keys are checked as secrets.
    tls_cert: Path | None = None
    tls_key: Path | None = None
    peer_tls_ca: Path | None = None
    peer_tls_cert: Path | None = None
    peer_tls_key: Path | None = None

    def __post_init__(self) -> None:
        if self.node_id < 1:
            raise ConfigError("node_id: must be a positive integer")
        if not self.initial_cluster and self.join is None:
            raise ConfigError("initial_cluster: give the voters of the metadata group, or --join an existing node")
        if self.initial_cluster and len(self.initial_cluster) not in (1, 3, 5):
            raise ConfigError("initial_cluster: the metadata group has 1, 3 or 5 voters")
        if self.initial_cluster and self.node_id in self.initial_cluster:
            if self.initial_cluster[self.node_id] != self.raft_addr:
                raise ConfigError("raft_addr: differs from this node's entry in initial_cluster")
        if not 10 <= self.tick_ms <= 1000:
            raise ConfigError("tick_ms: must be between 10 and 1000")
        if not 0 < self.heartbeat_interval_ticks < self.election_timeout_ticks:
            raise ConfigError("heartbeat_interval_ticks: must be positive and below election_timeout_ticks")
        if self.admin_token and len(self.admin_token) < 16:
            raise ConfigError("admin_token_file: the admin token has at least 16 characters")
        if self.replica_move_after_ms < -1:
            raise ConfigError("replica_move_after_ms: -1 (never) or a duration in ms")
        if not 0 <= self.replica_move_bytes_per_s <= REPLICA_MOVE_BYTES_PER_S_MAX:
            raise ConfigError(f"replica_move_bytes_per_s: 0 (no limit) to {REPLICA_MOVE_BYTES_PER_S_MAX}")
        if not 0 <= self.tree_sidecar_bytes_per_s <= REPLICA_MOVE_BYTES_PER_S_MAX:
            raise ConfigError(f"tree_sidecar_bytes_per_s: 0 (no limit) to {REPLICA_MOVE_BYTES_PER_S_MAX}")
        if self.scrub_interval_s != 0 and not SCRUB_INTERVAL_S_MIN <= self.scrub_interval_s <= SCRUB_INTERVAL_S_MAX:
            raise ConfigError(f"scrub_interval_s: 0 (never: on demand only) or {SCRUB_INTERVAL_S_MIN} to "
                              f"{SCRUB_INTERVAL_S_MAX} s (default {SCRUB_INTERVAL_S_DEFAULT}, a week)")
        if not SCRUB_BYTES_PER_S_MIN <= self.scrub_bytes_per_s <= REPLICA_MOVE_BYTES_PER_S_MAX:
            raise ConfigError(f"scrub_bytes_per_s: {SCRUB_BYTES_PER_S_MIN} to {REPLICA_MOVE_BYTES_PER_S_MAX} "
                              f"(default {SCRUB_BYTES_PER_S_DEFAULT}, 16 MiB/s)")
        if self.entry_cache_bytes < 0:
            raise ConfigError("entry_cache_bytes: 0 (no cache) or a positive number of bytes")
        if self.far_catchup_lag_entries < 0 or self.far_catchup_lag_bytes < 0:
            raise ConfigError("far_catchup_lag_entries, far_catchup_lag_bytes: 0 (off) or a positive number")
        if self.leader_balance_target_live_ms < 0 or self.leader_balance_settle_ms < 0:
            raise ConfigError("leader_balance_target_live_ms, leader_balance_settle_ms: durations in ms, at least 0")
        if not 1 <= self.leader_transfers_in_flight_max <= 1000:
            raise ConfigError("leader_transfers_in_flight_max: between 1 and 1000")
        if self.consumer_offsets_retention_ms < 1:
            raise ConfigError("consumer_offsets_retention_ms: a duration in ms, at least 1")
        if self.consumer_offsets_retention_check_ms < 10:
            raise ConfigError("consumer_offsets_retention_check_ms: a duration in ms, at least 10")
        if secret_material_bytes(self.cluster_secret) < SECRET_BYTES_MIN:
            raise ConfigError(f"cluster_secret: at least {SECRET_BYTES_MIN} bytes of random material "
                              f"(64 hex digits, 43 base64 characters or {SECRET_BYTES_MIN} raw bytes)")
        _all_or_none(self, ("tls_cert", "tls_key"), "HTTPS")
        _all_or_none(self, ("peer_tls_ca", "peer_tls_cert", "peer_tls_key"), "mutual TLS between nodes")

    @property
    def http_tls(self) -> bool:
        """The HTTP API serves HTTPS (and this node calls its peers' over HTTPS)."""
        return self.tls_cert is not None

    def peer_tls(self) -> PeerTls | None:
        """The raft transport's TLS contexts, or None for plain TCP (TlsError: bad files)."""
        if self.peer_tls_ca is None or self.peer_tls_cert is None or self.peer_tls_key is None:
            return None
        return PeerTls.load(self.peer_tls_ca, self.peer_tls_cert, self.peer_tls_key)

    @property
    def replica_lag_time_max_ticks(self) -> int:
        return max(1, self.replica_lag_time_max_ms // self.tick_ms)


def _all_or_none(config: NodeConfig, names: tuple[str, ...], what: str) -> None:
    given = [name for name in names if getattr(config, name) is not None]
    if given and len(given) < len(names):
        flags = {name: "--" + name.replace("_", "-") for name in names}
        missing = ", ".join(flags[name] for name in names if name not in given)
        raise ConfigError(f"{given[0]}: {what} needs {' and '.join(flags.values())} together; missing {missing}")


def check_tls_files(config: NodeConfig) -> None:
    """Load every TLS file once (certificates, keys checked as secrets, CAs), so a bad one
    stops `raftlog serve` before it starts, with the setting named."""
    try:
        if config.tls_cert is not None and config.tls_key is not None:
            http_server_context(config.tls_cert, config.tls_key)
        config.peer_tls()
    except TlsError as error:
        raise ConfigError(str(error)) from None


def parse_initial_cluster(text: str) -> dict[NodeId, Address]:
    """`1=127.0.0.1:7001,2=127.0.0.2:7001,...`"""
    cluster: dict[NodeId, Address] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        node, sep, address = item.partition("=")
        if not sep or not node.isdigit():
            raise ConfigError(f"initial_cluster: expected ID=HOST:PORT, got {item!r}")
        cluster[NodeId(int(node))] = Address.parse(address, "initial_cluster")
    return cluster


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=Path, help="TOML file with the same settings (flags win)")
    parser.add_argument("--node-id", type=int)
    parser.add_argument("--data-dir", type=Path)
    parser.add_argument("--raft-addr")
    parser.add_argument("--http-addr")
    parser.add_argument("--initial-cluster", help="ID=HOST:PORT,... of the metadata group's voters")
    parser.add_argument("--join", help="HOST:PORT of a node of an existing cluster (joins as a learner)")
    parser.add_argument("--rack")
    parser.add_argument("--cluster-secret-file", type=Path)
    parser.add_argument("--tick-ms", type=int)
    parser.add_argument("--flush", help="fsync (default), interval_ms=N or none")
    parser.add_argument("--scrub-interval-s", type=int,
                        help="deep-verify each partition led here this often (default a week; 0: on demand only)")
    parser.add_argument("--scrub-bytes-per-s", type=int,
                        help="bytes/s the scheduled scrubs read on this node (default 16 MiB/s)")
    parser.add_argument("--admin-token-file", type=Path,
                        help="turns on HTTP bearer-token auth; the same file on every node")
    parser.add_argument("--http-allowed-origins",
                        help="comma-separated web origins (https://console.example) whose pages may call the API")
    parser.add_argument("--http-host-names",
                        help="comma-separated host names the HTTP API answers to, beyond its address and localhost")
    parser.add_argument("--tls-cert", type=Path, metavar="FILE",
                        help="serve HTTPS with this certificate (PEM, naming the host of --http-addr); with --tls-key")
    parser.add_argument("--tls-key", type=Path, metavar="FILE", help="the private key of --tls-cert (mode 0600)")
    parser.add_argument("--peer-tls-ca", type=Path, metavar="FILE",
                        help="mutual TLS between nodes: the CA that signs every node's --peer-tls-cert")
    parser.add_argument("--peer-tls-cert", type=Path, metavar="FILE",
                        help="this node's certificate on the raft port (naming the host of --raft-addr)")
    parser.add_argument("--peer-tls-key", type=Path, metavar="FILE",
                        help="the private key of --peer-tls-cert (mode 0600)")


def load_config(args: argparse.Namespace) -> NodeConfig:
    """Merge the TOML file (if any) and the flags, then validate."""
    settings: dict[str, Any] = {}
    if args.config is not None:
        try:
            settings.update(tomllib.loads(args.config.read_text()))
        except (OSError, tomllib.TOMLDecodeError) as error:
            raise ConfigError(f"config: cannot read {args.config}: {error}") from error
    for name, value in vars(args).items():
        if value is not None and name not in ("config", "command", "func"):
            settings[name] = value
    known = ({f.name for f in fields(NodeConfig)} | {"cluster_secret_file", "flush", "admin_token_file"}) - {
        "admin_token", "cluster_secret"}
    unknown = sorted(set(settings) - known)
    if unknown:
        raise ConfigError(f"config: unknown settings {unknown}")
    return _build(settings)


def _build(settings: dict[str, Any]) -> NodeConfig:
    for required in ("node_id", "data_dir", "raft_addr", "http_addr"):
        if required not in settings:
            raise ConfigError(f"{required}: required (flag --{required.replace('_', '-')})")
    data_dir = Path(settings["data_dir"])
    initial = settings.get("initial_cluster", "")
    values: dict[str, Any] = {
        "node_id": NodeId(int(settings["node_id"])),
        "data_dir": data_dir,
        "raft_addr": Address.parse(str(settings["raft_addr"]), "raft_addr"),
        "http_addr": Address.parse(str(settings["http_addr"]), "http_addr"),
        "initial_cluster": parse_initial_cluster(initial) if isinstance(initial, str) else {
            NodeId(int(k)): Address.parse(v, "initial_cluster") for k, v in initial.items()
        },
        "join": Address.parse(settings["join"], "join") if settings.get("join") else None,
        "cluster_secret": _secret(settings.get("cluster_secret_file"), data_dir),
        "admin_token": _admin_token(settings.get("admin_token_file")),
    }
    for name in ("http_allowed_origins", "http_host_names"):
        if name in settings:
            raw = settings[name]
            items = raw.split(",") if isinstance(raw, str) else raw
            if not isinstance(items, list | tuple) or not all(isinstance(i, str) for i in items):
                raise ConfigError(f"{name}: a comma-separated string or a list of strings")
            values[name] = tuple(i.strip() for i in items if i.strip())
    if "flush" in settings:
        try:
            values["flush"] = FlushPolicy.parse(str(settings["flush"]))
        except (ValueError, AssertionError) as error:
            raise ConfigError(f"flush: expected fsync, none or interval_ms=N, got {settings['flush']!r}") from error
    for name in ("tls_cert", "tls_key", "peer_tls_ca", "peer_tls_cert", "peer_tls_key"):
        if settings.get(name) is not None:
            values[name] = Path(settings[name])
    for name in ("rack", "tick_ms", "election_timeout_ticks", "heartbeat_interval_ticks",
                 "replica_lag_time_max_ms", "segment_bytes_max", "node_dead_after_ms", "replica_move_after_ms",
                 "replica_move_bytes_per_s", "tree_sidecar_bytes_per_s", "scrub_interval_s", "scrub_bytes_per_s",
                 "far_catchup_lag_entries", "far_catchup_lag_bytes", "entry_cache_bytes",
                 "consumer_offsets_retention_ms", "consumer_offsets_retention_check_ms",
                 "leader_balance_target_live_ms", "leader_balance_settle_ms", "leader_transfers_in_flight_max"):
        if name in settings:
            values[name] = settings[name] if name == "rack" else _integer(name, settings[name])
    config = NodeConfig(**values)
    check_tls_files(config)
    return config


def _integer(name: str, value: Any) -> int:
    """A whole number from a flag (already one) or a TOML value, else a ConfigError naming it.
    A TOML float that is a whole number (`tick_ms = 50.0`) is one, as it always was."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ConfigError(f"{name}: a whole number, got {value!r}")
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"{name}: a whole number, got {value!r}") from None


def _admin_token(path: str | Path | None) -> bytes:
    if path is None:
        return b""
    try:
        return read_token_file(Path(path), "admin_token_file").encode()
    except SecretFileError as error:
        raise ConfigError(str(error)) from error


def _secret(path: str | Path | None, data_dir: Path) -> bytes:
    """The cluster secret from its file; without one, from `<data_dir>/cluster.secret`,
    which the node's first start generates (0600). Nodes of one cluster need the same
    secret: `raftlog cluster up` writes one into each node's directory; elsewhere, copy
    the first node's file into the others' directories, or give every node the same
    `--cluster-secret-file`."""
    try:
        if path is not None:
            secret = read_private_file(Path(path), "cluster_secret_file")
            check_cluster_secret(secret, "cluster_secret_file", Path(path))
            return secret
        own = data_dir / SECRET_FILE_NAME
        if not own.exists():
            _refuse_a_legacy_shared_secret(own, data_dir.resolve().parent / SECRET_FILE_NAME)
            create_private_file(own, generate_secret())
        secret = read_private_file(own, "cluster_secret_file")
        check_cluster_secret(secret, "cluster_secret_file", own)
        return secret
    except SecretFileError as error:
        raise ConfigError(str(error)) from error


def _refuse_a_legacy_shared_secret(own: Path, legacy: Path) -> None:
    """Earlier versions kept the generated secret in the data directory's parent, shared
    by its siblings. It is no longer read (another user could plant one in a shared
    directory); a node that would otherwise make a secret of its own, which its peers do
    not hold, says how to carry the old one over."""
    if legacy.exists():
        raise ConfigError(
            f"cluster_secret_file: not given, and {own} does not exist; {legacy}, where earlier versions "
            f"kept a secret shared by sibling data directories, is no longer read. Copy it into each "
            f"node's data directory (cp -p {legacy} {own}) or pass --cluster-secret-file")
