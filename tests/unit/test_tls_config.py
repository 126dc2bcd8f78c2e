"""TLS settings and files (multiraft/net/tls.py, multiraft/node/config.py, multiraft/cli/tls_certs.py):
certificates made by the test itself (tests/tls_pki.py)."""

from __future__ import annotations

import argparse
import ssl
import stat
import subprocess
from pathlib import Path

import pytest

from multiraft.net.tls import (
    TLS_VERSION_MIN,
    PeerTls,
    TlsError,
    client_context,
    http_server_context,
)
from multiraft.node.config import ConfigError, add_serve_arguments, load_config
from tests.tls_pki import Pki, make_pki


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def _load(tmp_path: Path, *extra: str):  # type: ignore[no-untyped-def]
    secret = tmp_path / "secret"
    secret.write_text("0123456789abcdef" * 4)
    secret.chmod(0o600)
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    return load_config(parser.parse_args([
        "--node-id", "1", "--data-dir", str(tmp_path / "n1"), "--raft-addr", "127.0.0.1:7001",
        "--http-addr", "127.0.0.1:8001", "--initial-cluster", "1=127.0.0.1:7001",
        "--cluster-secret-file", str(secret), *extra]))


# Goal: the made certificates are what a node needs: keys 0600 in 0700 directories, the
# host in subjectAltName, usable for serving and for dialling (both EKUs).
def test_made_certificates_are_private_and_name_their_hosts(pki: Pki) -> None:
    node = pki.nodes["127.0.0.2"]
    assert stat.S_IMODE(node.key.stat().st_mode) == 0o600
    assert stat.S_IMODE(pki.ca.key.stat().st_mode) == 0o600
    assert stat.S_IMODE(node.key.parent.stat().st_mode) == 0o700
    text = subprocess.run(["openssl", "x509", "-in", str(node.cert), "-noout", "-text"], check=True,
                          capture_output=True, text=True).stdout
    assert "IP Address:127.0.0.2" in text and "DNS:localhost" in text
    assert "TLS Web Server Authentication" in text and "TLS Web Client Authentication" in text


# Goal: the flags reach the config as paths, every file is loaded once at start (so a bad
# one stops the node before it listens), and the contexts are what docs/transport.md says:
# TLS 1.2 at least, client certificates required on the raft port, hostnames checked.
def test_tls_flags_load_and_build_the_contexts(tmp_path: Path, pki: Pki) -> None:
    node = pki.nodes["127.0.0.1"]
    config = _load(tmp_path, "--tls-cert", str(node.cert), "--tls-key", str(node.key),
                   "--peer-tls-ca", str(pki.ca.cert), "--peer-tls-cert", str(node.cert),
                   "--peer-tls-key", str(node.key))
    assert config.http_tls and config.tls_cert == node.cert
    peer = config.peer_tls()
    assert isinstance(peer, PeerTls)
    assert peer.server.verify_mode == ssl.CERT_REQUIRED
    assert peer.client.verify_mode == ssl.CERT_REQUIRED and peer.client.check_hostname
    assert peer.server.minimum_version == peer.client.minimum_version == TLS_VERSION_MIN
    assert http_server_context(node.cert, node.key).minimum_version == TLS_VERSION_MIN
    plain = _load(tmp_path)
    assert not plain.http_tls and plain.peer_tls() is None


# Goal: half a pair, or two of the peer trio, is a clear ConfigError naming what is missing.
@pytest.mark.parametrize(("given", "missing"), [
    (("--tls-cert",), "--tls-key"),
    (("--tls-key",), "--tls-cert"),
    (("--peer-tls-ca", "--peer-tls-cert"), "--peer-tls-key"),
    (("--peer-tls-key",), "--peer-tls-ca, --peer-tls-cert"),
])
def test_tls_files_come_in_sets(tmp_path: Path, pki: Pki, given: tuple[str, ...], missing: str) -> None:
    files = {"--tls-cert": pki.nodes["127.0.0.1"].cert, "--tls-key": pki.nodes["127.0.0.1"].key,
             "--peer-tls-ca": pki.ca.cert, "--peer-tls-cert": pki.nodes["127.0.0.1"].cert,
             "--peer-tls-key": pki.nodes["127.0.0.1"].key}
    argv = [item for flag in given for item in (flag, str(files[flag]))]
    with pytest.raises(ConfigError, match=f"missing {missing}"):
        _load(tmp_path, *argv)


# Goal: a private key gets the cluster secret's checks (open to others: refused, with the
# chmod that fixes it), an encrypted key is refused rather than prompted for, a key of
# another certificate and a CA file without a certificate are refused, each naming the setting.
def test_bad_tls_files_are_refused_with_the_setting_named(tmp_path: Path, pki: Pki) -> None:
    node = pki.nodes["127.0.0.1"]
    exposed = tmp_path / "exposed.key"
    exposed.write_bytes(node.key.read_bytes())
    exposed.chmod(0o644)
    with pytest.raises(ConfigError, match=r"tls_key: .*open to others.*chmod 600"):
        _load(tmp_path, "--tls-cert", str(node.cert), "--tls-key", str(exposed))
    encrypted = tmp_path / "encrypted.key"
    subprocess.run(["openssl", "pkey", "-in", str(node.key), "-aes256", "-passout", "pass:x", "-out",
                    str(encrypted)], check=True, capture_output=True, umask=0o077)
    with pytest.raises(ConfigError, match=r"peer_tls_key: .*encrypted"):
        _load(tmp_path, "--peer-tls-ca", str(pki.ca.cert), "--peer-tls-cert", str(node.cert),
              "--peer-tls-key", str(encrypted))
    with pytest.raises(ConfigError, match=r"tls_cert/tls_key: .*do not make a certificate and its private key"):
        _load(tmp_path, "--tls-cert", str(node.cert), "--tls-key", str(pki.rogue.key))
    with pytest.raises(ConfigError, match=r"peer_tls_ca: .*no CA certificate"):
        _load(tmp_path, "--peer-tls-ca", str(node.key), "--peer-tls-cert", str(node.cert),
              "--peer-tls-key", str(node.key))
    with pytest.raises(ConfigError, match="tls_cert: cannot read"):
        _load(tmp_path, "--tls-cert", str(tmp_path / "none.pem"), "--tls-key", str(node.key))
    with pytest.raises(TlsError, match="ca: cannot read"):
        client_context(tmp_path / "none.pem")
