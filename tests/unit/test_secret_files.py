"""Goal: secret files as `raftlog serve` reads and makes them (multiraft/net/secret_files.py):
refused, with the file and the fix named, when open to others, owned by another
user, or too weak; made 0600 without a window, never over an existing file.
The same refusals against real `raftlog serve` processes:
tests/integration/test_files_processes.py."""

from __future__ import annotations

import argparse
import base64
import os
import secrets
from pathlib import Path

import pytest

from multiraft.net.secret_files import (
    SecretFileError,
    create_private_file,
    read_private_file,
    secret_material_bytes,
)
from multiraft.node.config import ConfigError, add_serve_arguments, load_config


def _load(tmp_path: Path, *extra: str) -> object:
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    return load_config(parser.parse_args([
        "--node-id", "1", "--data-dir", str(tmp_path / "n1"), "--raft-addr", "127.0.0.1:7001",
        "--http-addr", "127.0.0.1:8001", "--initial-cluster", "1=127.0.0.1:7001", *extra]))


def _file(path: Path, content: bytes, mode: int = 0o600) -> Path:
    path.write_bytes(content)
    path.chmod(mode)
    return path


@pytest.mark.parametrize(("secret", "material"), [
    (secrets.token_hex(32).encode(), 32),  # what a node generates
    (secrets.token_hex(16).encode(), 16),  # `openssl rand -hex 16`: 32 characters, 16 bytes
    (secrets.token_urlsafe(32).encode(), 32),  # 43 characters
    (base64.b64encode(secrets.token_bytes(32)), 32),  # `openssl rand -base64 32`: 44 characters
    (bytes(range(128, 160)), 32),  # raw bytes
    (b"a passphrase, with punctuation", 30),
])
def test_random_material_is_judged_by_the_alphabet(secret: bytes, material: int) -> None:
    assert secret_material_bytes(secret) == material


@pytest.mark.parametrize("secret", [
    secrets.token_bytes(16), secrets.token_hex(16).encode(), secrets.token_urlsafe(16).encode(),
], ids=["16-raw-bytes", "16-bytes-in-hex", "16-bytes-in-base64"])
def test_a_secret_of_16_bytes_is_refused(tmp_path: Path, secret: bytes) -> None:
    path = _file(tmp_path / "secret", secret.strip() or b"x")
    with pytest.raises(ConfigError, match=r"cluster_secret_file: .*secret holds at most \d+ bytes.*at least 32"):
        _load(tmp_path, "--cluster-secret-file", str(path))
    path.write_bytes(secrets.token_hex(32).encode())
    assert len(_load(tmp_path, "--cluster-secret-file", str(path)).cluster_secret) == 64


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o620, 0o660], ids=lambda mode: f"{mode:04o}")
def test_a_secret_file_open_to_others_is_refused_with_the_fix(tmp_path: Path, mode: int) -> None:
    path = _file(tmp_path / "secret", secrets.token_hex(32).encode(), mode)
    with pytest.raises(ConfigError) as refused:
        _load(tmp_path, "--cluster-secret-file", str(path))
    assert str(path) in str(refused.value) and f"chmod 600 {path}" in str(refused.value)
    assert f"mode {mode:04o}" in str(refused.value)


def test_a_generated_secret_made_readable_later_and_an_admin_token_file_are_refused(tmp_path: Path) -> None:
    _load(tmp_path)
    generated = tmp_path / "n1" / "cluster.secret"
    generated.chmod(0o644)
    with pytest.raises(ConfigError, match=f"chmod 600 {generated}"):
        _load(tmp_path)
    generated.chmod(0o600)
    token = _file(tmp_path / "admin.token", b"an-admin-token-of-enough-length\n", 0o644)
    with pytest.raises(ConfigError, match=f"admin_token_file: .*chmod 600 {token}"):
        _load(tmp_path, "--admin-token-file", str(token))


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user takes root")
def test_a_secret_file_of_another_user_is_refused(tmp_path: Path) -> None:
    path = _file(tmp_path / "secret", secrets.token_hex(32).encode())
    os.chown(path, 65534, 65534)
    with pytest.raises(ConfigError, match=f"belongs to uid 65534.*chown 0 {path} && chmod 600 {path}"):
        _load(tmp_path, "--cluster-secret-file", str(path))


def test_a_secret_left_in_the_parent_by_an_earlier_version_is_not_read(tmp_path: Path) -> None:
    # Goal: earlier versions shared `<data_dir>/../cluster.secret`; a node that finds one
    # but none of its own says how to carry it over instead of making a secret its
    # peers do not hold, and reads nothing from the shared directory.
    _file(tmp_path / "cluster.secret", secrets.token_hex(32).encode())
    with pytest.raises(ConfigError, match=r"no longer read.*cp -p .*--cluster-secret-file"):
        _load(tmp_path)
    assert not (tmp_path / "n1" / "cluster.secret").exists()


def test_a_private_file_is_made_0600_whatever_the_umask_and_never_over_another(tmp_path: Path) -> None:
    before = os.umask(0)  # the most permissive umask: only the mode asked for protects the file
    try:
        assert create_private_file(tmp_path / "deep" / "token", b"first\n")
    finally:
        os.umask(before)
    path = tmp_path / "deep" / "token"
    assert (path.stat().st_mode & 0o777, (tmp_path / "deep").stat().st_mode & 0o777) == (0o600, 0o700)
    assert not create_private_file(path, b"second\n"), "an existing file wins"
    assert read_private_file(path, "token_file") == b"first"
    assert sorted(p.name for p in path.parent.iterdir()) == ["token"], "no draft left behind"


@pytest.mark.parametrize(("content", "message"), [(b"  \n", "is empty"), (b"x" * 70_000, "larger than")])
def test_an_empty_or_huge_file_is_no_secret(tmp_path: Path, content: bytes, message: str) -> None:
    with pytest.raises(SecretFileError, match=message):
        read_private_file(_file(tmp_path / "f", content), "token_file")
    with pytest.raises(SecretFileError, match="cannot read"):
        read_private_file(tmp_path / "missing", "token_file")
