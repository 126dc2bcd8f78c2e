"""`raftlog serve` settings: flags and TOML share names; bad values name the setting."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from multiraft.node.config import Address, ConfigError, add_serve_arguments, load_config


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    return parser.parse_args(argv)


def _private(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o600)  # a secret file open to others is refused (tests/unit/test_secret_files.py)
    return path


def _base(tmp_path: Path) -> list[str]:
    secret = _private(tmp_path / "secret", "0123456789abcdef" * 4)
    return [
        "--node-id", "1", "--data-dir", str(tmp_path / "n1"), "--raft-addr", "127.0.0.1:7001",
        "--http-addr", "127.0.0.1:8001", "--initial-cluster", "1=127.0.0.1:7001,2=127.0.0.2:7001,3=127.0.0.3:7001",
        "--cluster-secret-file", str(secret),
    ]


def test_flags(tmp_path: Path) -> None:
    config = load_config(_parse(_base(tmp_path)))
    assert config.node_id == 1
    assert config.initial_cluster[2] == Address("127.0.0.2", 7001)
    assert config.replica_lag_time_max_ticks == 600


def test_toml_file_and_flag_override(tmp_path: Path) -> None:
    path = tmp_path / "node.toml"
    path.write_text('tick_ms = 100\nrack = "r1"\nflush = "interval_ms=20"\nreplica_move_after_ms = -1\n')
    config = load_config(_parse([*_base(tmp_path), "--config", str(path), "--tick-ms", "40"]))
    assert (config.tick_ms, config.rack, config.flush.interval_ms) == (40, "r1", 20)
    assert config.replica_move_after_ms == -1, "never move replicas"
    path.write_text("replica_move_after_ms = -5\n")
    with pytest.raises(ConfigError, match="replica_move_after_ms"):
        load_config(_parse([*_base(tmp_path), "--config", str(path)]))


def test_consumer_offsets_retention_settings(tmp_path: Path) -> None:
    # Goal: Kafka's defaults (7 days, checked every 10 minutes), settable in the TOML file,
    # and a retention or check interval that is not a positive duration refuses the start.
    default = load_config(_parse(_base(tmp_path)))
    assert (default.consumer_offsets_retention_ms, default.consumer_offsets_retention_check_ms) == (
        7 * 24 * 3_600_000, 600_000)
    path = tmp_path / "node.toml"
    path.write_text("consumer_offsets_retention_ms = 2000\nconsumer_offsets_retention_check_ms = 100\n")
    config = load_config(_parse([*_base(tmp_path), "--config", str(path)]))
    assert (config.consumer_offsets_retention_ms, config.consumer_offsets_retention_check_ms) == (2000, 100)
    for text, setting in (("consumer_offsets_retention_ms = 0", "consumer_offsets_retention_ms"),
                          ("consumer_offsets_retention_check_ms = 5", "consumer_offsets_retention_check_ms")):
        path.write_text(text + "\n")
        with pytest.raises(ConfigError, match=setting):
            load_config(_parse([*_base(tmp_path), "--config", str(path)]))


def test_scheduled_scrub_settings(tmp_path: Path) -> None:
    # Goal: on by default, a week at 16 MiB/s; flags and TOML keys of the same names; 0 turns
    # the schedule off; out of bounds, or not a whole number, refuses the start naming it.
    default = load_config(_parse(_base(tmp_path)))
    assert (default.scrub_interval_s, default.scrub_bytes_per_s) == (7 * 86_400, 16 * 1024 * 1024)
    config = load_config(_parse([*_base(tmp_path), "--scrub-interval-s", "0", "--scrub-bytes-per-s", "1048576"]))
    assert (config.scrub_interval_s, config.scrub_bytes_per_s) == (0, 1 << 20)
    path = tmp_path / "node.toml"
    path.write_text("scrub_interval_s = 86400\nscrub_bytes_per_s = 65536\n")
    config = load_config(_parse([*_base(tmp_path), "--config", str(path)]))
    assert (config.scrub_interval_s, config.scrub_bytes_per_s) == (86_400, 65_536)
    for text, setting in (("scrub_interval_s = -1", "scrub_interval_s"),
                          ("scrub_interval_s = 31536001", "scrub_interval_s"),
                          ('scrub_interval_s = "a week"', "scrub_interval_s"),
                          ("scrub_interval_s = 1.5", "scrub_interval_s"),
                          ("scrub_bytes_per_s = 0", "scrub_bytes_per_s"),
                          ("scrub_bytes_per_s = 1099511627777", "scrub_bytes_per_s")):
        path.write_text(text + "\n")
        with pytest.raises(ConfigError, match=setting):
            load_config(_parse([*_base(tmp_path), "--config", str(path)]))


def test_integer_settings_take_whole_floats_and_refuse_fractions(tmp_path: Path) -> None:
    # Goal: a TOML float that is a whole number is taken for any integer setting, as before
    # the scheduled-scrub settings came (`tick_ms = 50.0`); a fraction, or inf, refuses the
    # start with a ConfigError naming the setting.
    path = tmp_path / "node.toml"
    path.write_text("tick_ms = 50.0\nscrub_interval_s = 86400.0\n")
    config = load_config(_parse([*_base(tmp_path), "--config", str(path)]))
    assert (config.tick_ms, config.scrub_interval_s) == (50, 86_400) and isinstance(config.tick_ms, int)
    for text, setting in (("tick_ms = 1.5", "tick_ms"), ("segment_bytes_max = inf", "segment_bytes_max"),
                          ("scrub_bytes_per_s = nan", "scrub_bytes_per_s")):
        path.write_text(text + "\n")
        with pytest.raises(ConfigError, match=setting):
            load_config(_parse([*_base(tmp_path), "--config", str(path)]))


@pytest.mark.parametrize(
    ("extra", "setting"),
    [
        (["--raft-addr", "nohost"], "raft_addr"),
        (["--initial-cluster", "1=127.0.0.1:7001,2=x"], "initial_cluster"),
        (["--initial-cluster", "1=127.0.0.1:7001,2=127.0.0.2:7001"], "initial_cluster"),
        (["--flush", "sometimes"], "flush"),
        (["--tick-ms", "1"], "tick_ms"),
    ],
)
def test_bad_settings_are_named(tmp_path: Path, extra: list[str], setting: str) -> None:
    with pytest.raises(ConfigError, match=setting):
        load_config(_parse([*_base(tmp_path), *extra]))


def test_a_node_without_a_secret_file_generates_one_in_its_own_data_directory(tmp_path: Path) -> None:
    # Goal: without --cluster-secret-file a node makes 32 random bytes (64 hex digits) in
    # `<data_dir>/cluster.secret`, never in the shared parent, and reads the same one again.
    argv = _base(tmp_path)[:-2]
    first = load_config(_parse(argv)).cluster_secret
    assert len(first) == 64 and bytes.fromhex(first.decode())
    assert (tmp_path / "n1" / "cluster.secret").read_bytes().strip() == first
    assert not (tmp_path / "cluster.secret").exists(), "nothing in the parent"
    assert load_config(_parse(argv)).cluster_secret == first


def test_starts_side_by_side_never_read_a_half_written_secret(tmp_path: Path, monkeypatch) -> None:
    # Goal: a start that finds the secret file while another start is still creating it
    # must not read it empty (CI saw "cluster_secret: at least 16 bytes" and a node that
    # would not start). Here the second start comes in while the first is between
    # deciding to create the file and having written it; both must end up with the
    # same whole secret.
    import multiraft.net.secret_files as secret_files

    argv = _base(tmp_path)[:-2]
    real_token_hex = secret_files.secrets.token_hex
    seen: list[bytes] = []

    def token_hex(count: int) -> str:
        if not seen:
            seen.append(b"")  # only the first start's generation lets the other one in
            seen[0] = load_config(_parse(argv)).cluster_secret
        return real_token_hex(count)

    monkeypatch.setattr(secret_files.secrets, "token_hex", token_hex)
    first = load_config(_parse(argv)).cluster_secret
    assert len(first) == 64 and seen == [first]
    data_dir = tmp_path / "n1"
    assert (data_dir / "cluster.secret").stat().st_mode & 0o077 == 0, "the secret is the owner's alone"
    assert sorted(p.name for p in data_dir.iterdir() if p.name.startswith(".cluster.secret")) == []


def test_admin_token_file_turns_auth_on_and_is_checked(tmp_path: Path) -> None:
    assert load_config(_parse(_base(tmp_path))).admin_token == b"", "auth off by default"
    token = _private(tmp_path / "admin.token", "an-admin-token-of-enough-length\n")
    config = load_config(_parse([*_base(tmp_path), "--admin-token-file", str(token)]))
    assert config.admin_token == b"an-admin-token-of-enough-length"
    token.write_text("short")
    with pytest.raises(ConfigError, match="admin_token_file"):
        load_config(_parse([*_base(tmp_path), "--admin-token-file", str(token)]))
    with pytest.raises(ConfigError, match="admin_token_file"):
        load_config(_parse([*_base(tmp_path), "--admin-token-file", str(tmp_path / "missing")]))
