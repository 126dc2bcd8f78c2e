"""Throwaway certificates: a CA, and certificates it signs for nodes, made with `openssl`.

For `raftlog cluster up --tls` (a local cluster to try TLS with) and for tests,
never for production, where certificates come from the organisation's CA. The
`openssl` command (1.1.1 or later) does the work, so raftlog needs no
cryptography package of its own. Keys are EC P-256, written 0600 (openssl runs
under umask 077, in a directory made 0700); a node's certificate names its
hosts in subjectAltName (IP addresses as IP entries, the rest as DNS) and may
serve and dial (extendedKeyUsage serverAuth and clientAuth), so one certificate
does for a node's HTTP API and its raft port alike.
"""

from __future__ import annotations

import ipaddress
import secrets
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from storage.files import make_private_dirs

__all__ = ["CertificateError", "KeyPair", "make_ca", "make_certificate"]

OPENSSL_TIMEOUT_S = 30.0
DAYS_DEFAULT = 825  # the longest validity Apple's platforms accept for a TLS server certificate
_EC_KEY = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes")

_CA_CONFIG = """\
[req]
distinguished_name = dn
prompt = no
x509_extensions = ca
[dn]
CN = {name}
[ca]
basicConstraints = critical, CA:TRUE
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash
"""

_REQUEST_CONFIG = """\
[req]
distinguished_name = dn
prompt = no
[dn]
CN = {name}
"""

_NODE_EXTENSIONS = """\
[node]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth, clientAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid:always
subjectAltName = {names}
"""


class CertificateError(Exception):
    """openssl is missing or failed; the message says which and why."""


@dataclass(frozen=True, slots=True)
class KeyPair:
    cert: Path  # PEM certificate
    key: Path  # PEM private key, mode 0600


def make_ca(directory: Path, name: str = "raftlog local CA", *, days: int = DAYS_DEFAULT) -> KeyPair:
    """A new self-signed CA in `directory` (made 0700): ca.pem and ca.key."""
    make_private_dirs(directory)
    pair = KeyPair(directory / "ca.pem", directory / "ca.key")
    config = directory / "ca.cnf"
    config.write_text(_CA_CONFIG.format(name=_safe(name)))
    try:
        _openssl("req", "-x509", *_EC_KEY, "-keyout", str(pair.key), "-out", str(pair.cert),
                 "-days", str(days), "-config", str(config))
    finally:
        config.unlink()
    return pair


def make_certificate(ca: KeyPair, directory: Path, name: str, hosts: Sequence[str], *,
                     days: int = DAYS_DEFAULT) -> KeyPair:
    """A key and a certificate signed by `ca` for `hosts`, as `directory`/`name`.pem and .key."""
    assert hosts, "a certificate names at least one host"
    make_private_dirs(directory)
    pair = KeyPair(directory / f"{name}.pem", directory / f"{name}.key")
    request, config, extensions = (directory / f"{name}{suffix}" for suffix in (".csr", ".cnf", ".ext"))
    config.write_text(_REQUEST_CONFIG.format(name=_safe(name)))
    extensions.write_text(_NODE_EXTENSIONS.format(names=", ".join(_alt_name(h) for h in hosts)))
    try:
        _openssl("req", "-new", *_EC_KEY, "-keyout", str(pair.key), "-out", str(request),
                 "-config", str(config))
        _openssl("x509", "-req", "-in", str(request), "-CA", str(ca.cert), "-CAkey", str(ca.key),
                 "-set_serial", f"0x{secrets.token_hex(16)}", "-days", str(days), "-out", str(pair.cert),
                 "-extfile", str(extensions), "-extensions", "node")
    finally:
        for path in (request, config, extensions):
            path.unlink(missing_ok=True)
    return pair


def _alt_name(host: str) -> str:
    try:
        return f"IP:{ipaddress.ip_address(host)}"
    except ValueError:
        return f"DNS:{_safe(host)}"


def _safe(text: str) -> str:
    """A name for openssl's config syntax: no line breaks, commas or section syntax."""
    if not text or any(c in text for c in "\n\r,[]=$\\\""):
        raise CertificateError(f"cannot put {text!r} in a certificate name")
    return text


def _openssl(*args: str) -> None:
    program = shutil.which("openssl")
    if program is None:
        raise CertificateError("the openssl command is needed to make certificates (apt-get install openssl)")
    try:
        subprocess.run([program, *args], check=True, capture_output=True, timeout=OPENSSL_TIMEOUT_S,
                       stdin=subprocess.DEVNULL, umask=0o077)
    except subprocess.CalledProcessError as error:
        detail = error.stderr.decode(errors="replace").strip().splitlines()
        raise CertificateError(f"openssl {args[0]} failed: {detail[-1] if detail else error}") from None
    except subprocess.TimeoutExpired:
        raise CertificateError(f"openssl {args[0]} did not finish within {OPENSSL_TIMEOUT_S:.0f} s") from None
