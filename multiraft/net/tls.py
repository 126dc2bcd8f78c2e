"""TLS contexts of a node and its clients (docs/http.md "TLS", docs/transport.md "TLS").

Three uses, one module, so every context gets the same floor (TLS 1.2, Python's
default ciphers) and every file the same checks:

- the HTTP API: `http_server_context(cert, key)`, from `--tls-cert` and
  `--tls-key`;
- mutual TLS between nodes: `PeerTls.load(ca, cert, key)`, from `--peer-tls-ca`,
  `--peer-tls-cert` and `--peer-tls-key`. The accepting side requires a client
  certificate signed by the CA (`CERT_REQUIRED`); the dialling side verifies the
  peer's certificate against the same CA, and only that CA (a certificate from a
  public CA does not make a node), and checks that it names the host dialled;
- clients: `client_context(ca)`, from `--ca` / `$RAFTLOG_CA` (only that CA), or
  the system's trust store when there is none;
- a mirror link's reads of an HTTPS source cluster: `source_context(ca_pem)`, from
  the link's CA bundle (PEM text kept in the sink's catalog, only it), or the
  system's trust store when the link has none (docs/mirror.md "TLS to the source").

A private key is a secret: its file is refused, as the cluster secret's, when
another user owns it or group or others have any permission on it
(multiraft/net/secret_files.py; the check runs on the opened file, then OpenSSL
reads it by name). An encrypted key is refused rather than prompted for: a node
runs unattended.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

from multiraft.net.secret_files import SecretFileError, read_private_file

__all__ = ["TLS_VERSION_MIN", "PeerTls", "TlsError", "client_context", "http_server_context",
           "node_http_client_context", "source_context"]

# TLS 1.0 and 1.1 were deprecated by RFC 8996; 1.2 is what every client of the last decade speaks.
TLS_VERSION_MIN = ssl.TLSVersion.TLSv1_2


class TlsError(ValueError):
    """A certificate, key or CA file cannot be used; the message names the setting and the file."""


class _EncryptedKey(Exception):
    pass


def _refuse_password() -> str:
    raise _EncryptedKey


def _load_chain(context: ssl.SSLContext, cert: Path, key: Path, cert_setting: str, key_setting: str) -> None:
    try:
        read_private_file(key, key_setting)  # owner and mode, on the opened file
    except SecretFileError as error:
        raise TlsError(str(error)) from None
    try:
        context.load_cert_chain(certfile=cert, keyfile=key, password=_refuse_password)
    except _EncryptedKey:
        raise TlsError(f"{key_setting}: {key} is encrypted; a node runs unattended, so give it an "
                       f"unencrypted key (mode 0600): openssl pkey -in {key} -out NEW_KEY") from None
    except FileNotFoundError as error:
        raise TlsError(f"{cert_setting}: cannot read {error.filename or cert}: {error.strerror}") from None
    except ssl.SSLError as error:
        raise TlsError(f"{cert_setting}/{key_setting}: {cert} and {key} do not make a certificate and "
                       f"its private key (PEM): {error.reason or error}") from None
    except OSError as error:
        raise TlsError(f"{cert_setting}: cannot read {cert}: {error.strerror}") from None


def _load_ca(context: ssl.SSLContext, ca: Path, setting: str) -> None:
    try:
        context.load_verify_locations(cafile=ca)
    except ssl.SSLError as error:
        raise TlsError(f"{setting}: {ca} holds no CA certificate in PEM: {error.reason or error}") from None
    except OSError as error:
        raise TlsError(f"{setting}: cannot read {ca}: {error.strerror}") from None


def http_server_context(cert: Path, key: Path) -> ssl.SSLContext:
    """The HTTP API's context: this certificate, no client certificates asked for."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = TLS_VERSION_MIN
    _load_chain(context, cert, key, "tls_cert", "tls_key")
    return context


@dataclass(frozen=True, slots=True)
class PeerTls:
    """Mutual TLS on the raft port: `server` accepts, `client` dials; one CA for both."""

    server: ssl.SSLContext
    client: ssl.SSLContext
    ca: Path

    @classmethod
    def load(cls, ca: Path, cert: Path, key: Path) -> PeerTls:
        server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        server.minimum_version = TLS_VERSION_MIN
        server.verify_mode = ssl.CERT_REQUIRED  # no certificate signed by the CA, no connection
        _load_chain(server, cert, key, "peer_tls_cert", "peer_tls_key")
        _load_ca(server, ca, "peer_tls_ca")
        client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # CERT_REQUIRED and check_hostname
        client.minimum_version = TLS_VERSION_MIN
        _load_chain(client, cert, key, "peer_tls_cert", "peer_tls_key")
        _load_ca(client, ca, "peer_tls_ca")  # this CA only: not the system's
        return cls(server=server, client=client, ca=ca)


def client_context(ca: Path | None) -> ssl.SSLContext:
    """A client's: the server's certificate must chain to `ca` (only to it), or, without
    one, to the system's trust store; and it must name the host the client dialled."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = TLS_VERSION_MIN
    if ca is None:
        context.load_default_certs()
    else:
        _load_ca(context, ca, "ca")
    return context


def node_http_client_context(peer_ca: Path | None) -> ssl.SSLContext:
    """What a node with HTTP TLS on trusts when it calls another node's HTTP API (to join):
    the system's trust store ($SSL_CERT_FILE too), and the cluster's peer CA if it has one."""
    context = client_context(None)
    if peer_ca is not None:
        _load_ca(context, peer_ca, "peer_tls_ca")
    return context


def source_context(ca_pem: str | None) -> ssl.SSLContext:
    """A mirror link's, to its source cluster: the source's certificate must chain to the
    link's `ca_pem` (only to it), or, without one, to the system's trust store
    ($SSL_CERT_FILE and $SSL_CERT_DIR honoured, as OpenSSL's defaults); it must name the
    host dialled; TLS 1.2 at least. Never CERT_NONE: a mirror carries the source's token."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # CERT_REQUIRED and check_hostname
    context.minimum_version = TLS_VERSION_MIN
    if ca_pem is None:
        context.load_default_certs()
    else:
        try:
            context.load_verify_locations(cadata=ca_pem)
        except (ssl.SSLError, ValueError) as error:
            reason = getattr(error, "reason", None) or error
            raise TlsError(f"source_ca: OpenSSL takes no CA certificate from it: {reason}") from None
    assert context.verify_mode == ssl.CERT_REQUIRED
    assert context.check_hostname
    return context
