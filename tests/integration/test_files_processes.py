"""Goal: a real `raftlog serve` keeps its secret and its data to itself (docs/node.md
"Secrets and files"): started without a secret file it generates one, 0600, in its
own data directory (never in the shared parent); after it has written records its
segment files are 0600 and its directories 0700, under the commonest umask (022);
and it refuses to start, naming the file and the fix, when a secret or token file
is open to others or belongs to another user, or when the secret is too short."""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from multiraft.client import Client

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 60.0
REFUSAL_TIMEOUT_S = 20.0  # a refusal comes before the node listens: seconds at most


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _serve_command(data_dir: Path, *extra: str) -> list[str]:
    raft = f"127.0.0.1:{_free_port()}"
    return [sys.executable, "-m", "multiraft.cli", "serve", "--node-id", "1", "--data-dir", str(data_dir),
            "--raft-addr", raft, "--http-addr", f"127.0.0.1:{_free_port()}", "--initial-cluster",
            f"1={raft}", "--tick-ms", "20", *extra]


def _environment() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _wait_registered(process: subprocess.Popen[bytes], http: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        assert process.poll() is None, f"serve exited with {process.returncode}"
        try:
            with urllib.request.urlopen(f"http://{http}/v1/health", timeout=1) as answer:
                if json.loads(answer.read()).get("registered"):
                    return
        except (OSError, urllib.error.URLError, ValueError):
            pass
        time.sleep(0.1)  # poll interval, not a condition wait
    raise AssertionError(f"serve did not register within {START_TIMEOUT_S:.0f} s")


@pytest.fixture
def node(tmp_path: Path) -> Iterator[tuple[Path, str, subprocess.Popen[bytes]]]:
    data_dir = tmp_path / "shared" / "node1"  # "shared": the parent a node must not write its secret into
    command = _serve_command(data_dir)
    http = command[command.index("--http-addr") + 1]
    process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, env=_environment(), umask=0o022)
    try:
        _wait_registered(process, http)
        yield data_dir, http, process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)  # by PID
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)
        assert process.stderr is not None
        process.stderr.close()


def test_a_node_keeps_its_generated_secret_and_its_data_to_itself(
        node: tuple[Path, str, subprocess.Popen[bytes]]) -> None:
    data_dir, http, process = node
    with Client(http, attempts=4) as client:
        client.create_topic("files", partitions=2, replication_factor=1)
        with client.producer("files") as producer:
            for i in range(100):
                producer.send(b"record-%d" % i, key=b"k%d" % i)
    process.send_signal(signal.SIGTERM)
    assert process.wait(30) == 0

    secret = data_dir / "cluster.secret"
    assert _mode(secret) == 0o600
    assert len(bytes.fromhex(secret.read_text().strip())) == 32, "32 random bytes, in hex"
    assert sorted(p.name for p in data_dir.parent.iterdir()) == ["node1"], "nothing in the shared parent"

    segments = sorted(data_dir.glob("groups/*/*.seg"))
    assert len({p.parent for p in segments}) == 3, "the metadata group and both partitions wrote"
    assert {str(p): _mode(p) for p in segments} == {str(p): 0o600 for p in segments}
    directories = [data_dir, data_dir / "groups", data_dir / "state.db",
                   *sorted(p for p in (data_dir / "groups").iterdir())]
    assert {str(p): _mode(p) for p in directories} == {str(p): 0o700 for p in directories}


def _refusal(tmp_path: Path, case: str) -> tuple[list[str], str]:
    """The extra `serve` arguments of one refused start, and what its message must say."""
    data_dir = tmp_path / "node1"
    good = secrets.token_hex(32).encode()
    if case == "generated-secret-made-world-readable":
        path = data_dir / "cluster.secret"
        data_dir.mkdir(mode=0o700)
        path.write_bytes(good)
        path.chmod(0o644)
        return [], f"chmod 600 {path}"
    path = tmp_path / "given.secret"
    path.write_bytes(secrets.token_hex(16).encode() if case == "secret-of-16-bytes" else good)
    path.chmod(0o640 if case == "given-secret-group-readable" else 0o600)
    if case == "secret-of-16-bytes":
        return ["--cluster-secret-file", str(path)], "at least 32"
    if case == "given-secret-of-another-user":
        os.chown(path, 65534, 65534)
        return ["--cluster-secret-file", str(path)], f"chmod 600 {path}"
    if case == "admin-token-world-readable":
        token = tmp_path / "admin.token"
        token.write_text("an-admin-token-of-enough-length\n")
        token.chmod(0o644)
        return ["--cluster-secret-file", str(path), "--admin-token-file", str(token)], f"chmod 600 {token}"
    return ["--cluster-secret-file", str(path)], f"chmod 600 {path}"


@pytest.mark.parametrize("case", [
    "generated-secret-made-world-readable",
    "given-secret-group-readable",
    pytest.param("given-secret-of-another-user",
                 marks=pytest.mark.skipif(os.geteuid() != 0, reason="giving a file away takes root")),
    "admin-token-world-readable",
    "secret-of-16-bytes",
])
def test_a_start_with_an_exposed_or_weak_secret_is_refused(tmp_path: Path, case: str) -> None:
    extra, message = _refusal(tmp_path, case)
    refused = subprocess.run(_serve_command(tmp_path / "node1", *extra), capture_output=True, env=_environment(),
                             timeout=REFUSAL_TIMEOUT_S, check=False)
    assert refused.returncode == 2, refused.stderr.decode()
    assert message in refused.stderr.decode(), refused.stderr.decode()
