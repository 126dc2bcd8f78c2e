"""The client's own credentials module agrees with the node's transport.

Goal: the client keeps its own copy of the TLS floor and of the secret-file refusal
(multiraft/client/credentials.py), so that it imports nothing of the node; these
tests pin the copy to the node's rules (multiraft/net/tls.py and
secret_files.py): the same floor, and the same refusals with the same words.
"""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest

from multiraft.client import CredentialsError, read_token_file
from multiraft.client.credentials import TLS_VERSION_MIN, client_context
from multiraft.client.http import bearer_token
from multiraft.net import secret_files, tls


def _file(path: Path, content: bytes, mode: int = 0o600) -> Path:
    path.write_bytes(content)
    path.chmod(mode)
    return path


def test_the_client_takes_its_token_from_a_private_file_or_the_environment(tmp_path: Path, monkeypatch) -> None:
    # Goal: the client's token: given (a program's own), else from its file, else
    # $RAFTLOG_TOKEN; a token that could break out of its header is refused.
    monkeypatch.setenv("RAFTLOG_TOKEN", "from-the-environment")
    path = _file(tmp_path / "token", b"from-the-file\n")
    assert bearer_token(None, None) == "from-the-environment"
    assert bearer_token(None, path) == "from-the-file"
    assert bearer_token("given", None) == "given"
    with pytest.raises(ValueError, match="not both"):
        bearer_token("given", path)
    path.chmod(0o640)
    with pytest.raises(CredentialsError, match=f"chmod 600 {path}"):
        bearer_token(None, path)
    monkeypatch.setenv("RAFTLOG_TOKEN", "two\r\nX-Injected: 1")
    with pytest.raises(CredentialsError, match="RAFTLOG_TOKEN"):
        bearer_token(None, None)
    monkeypatch.delenv("RAFTLOG_TOKEN")
    assert bearer_token(None, None) is None
    assert bearer_token("", None) is None, "an empty token: no auth, as before"


@pytest.mark.parametrize(
    ("name", "content", "mode"),
    [
        ("open", b"token\n", 0o640),
        ("empty", b"  \n", 0o600),
        ("huge", b"x" * 70_000, 0o600),
        ("spaces", b"two words\n", 0o600),
        ("binary", b"\xff\xfe\n", 0o600),
        ("missing", None, 0o600),
    ],
)
def test_a_token_file_is_refused_as_the_node_refuses_it(
    tmp_path: Path, name: str, content: bytes | None, mode: int
) -> None:
    # Goal: each refusal of the node's reader is the client's too, in the same words.
    path = tmp_path / name if content is None else _file(tmp_path / name, content, mode)
    with pytest.raises(secret_files.SecretFileError) as node_error:
        secret_files.read_token_file(path)
    with pytest.raises(CredentialsError) as client_error:
        read_token_file(path)
    assert str(client_error.value) == str(node_error.value)


def test_a_good_token_file_reads_the_same(tmp_path: Path) -> None:
    # Goal: the positive space of the same comparison.
    path = _file(tmp_path / "token", b"  s3cret-token\n")
    assert read_token_file(path) == secret_files.read_token_file(path) == "s3cret-token"


def test_the_tls_floor_and_ca_refusals_match(tmp_path: Path) -> None:
    # Goal: the same minimum version, the same checks of the server, the same words for a bad CA.
    assert TLS_VERSION_MIN == tls.TLS_VERSION_MIN
    context = client_context(None)
    assert context.minimum_version == TLS_VERSION_MIN
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    not_pem = _file(tmp_path / "ca.pem", b"not a certificate\n", 0o644)
    for ca in (tmp_path / "none.pem", not_pem):
        with pytest.raises(tls.TlsError) as node_error:
            tls.client_context(ca)
        with pytest.raises(CredentialsError) as client_error:
            client_context(ca)
        assert str(client_error.value) == str(node_error.value)
