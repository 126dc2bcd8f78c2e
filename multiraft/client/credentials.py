"""What a client trusts and presents: the TLS context it dials with, and its bearer token.

The client is what a user's program imports (DESIGN.md section 2), so it imports
nothing of the node: it keeps its own copy of the two rules it shares with the
node's transport (multiraft/net/tls.py, multiraft/net/secret_files.py):

- the TLS floor: 1.2 at least, Python's default ciphers; the server's certificate
  must chain to the CA given (only to it) or, without one, to the system's trust
  store, and name the host dialled;
- a token file is refused, as ssh refuses a private key, when another user owns it
  or anyone but its owner may read or write it; the error names the file and the fix.

tests/unit/test_client_credentials.py checks that the two copies agree.
"""

from __future__ import annotations

import os
import re
import shlex
import ssl
import stat
from pathlib import Path

# TLS 1.0 and 1.1 were deprecated by RFC 8996; 1.2 is what every server of the last decade speaks.
TLS_VERSION_MIN = ssl.TLSVersion.TLSv1_2
TOKEN_FILE_BYTES_MAX = 64 * 1024  # a token is a line; anything longer is the wrong file
# What a bearer token may hold: visible ASCII, so it goes into a header as it is (no
# space, no CR/LF to end the header early). RFC 6750's b64token is a subset.
_TOKEN = re.compile(r"[\x21-\x7e]+")


class CredentialsError(ValueError):
    """A CA file or token file the client cannot use, or a token that cannot go into a
    header; the message names the setting, the file and the fix."""


def client_context(ca: Path | None) -> ssl.SSLContext:
    """The server's certificate must chain to `ca` (only to it), or, without one, to the
    system's trust store; and it must name the host the client dialled."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # CERT_REQUIRED and check_hostname
    context.minimum_version = TLS_VERSION_MIN
    if ca is None:
        context.load_default_certs()
        return context
    try:
        context.load_verify_locations(cafile=ca)
    except ssl.SSLError as error:
        raise CredentialsError(f"ca: {ca} holds no CA certificate in PEM: {error.reason or error}") from None
    except OSError as error:
        raise CredentialsError(f"ca: cannot read {ca}: {error.strerror}") from None
    return context


def check_token(token: str, where: str) -> str:
    if not _TOKEN.fullmatch(token):
        raise CredentialsError(f"{where}: a bearer token is visible ASCII only (no spaces or control characters)")
    return token


def read_token_file(path: Path, setting: str = "token_file") -> str:
    """A bearer token from its file, once the file's owner and mode are checked (on the
    opened file, so a swap between the check and the read changes nothing)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as error:
        raise CredentialsError(f"{setting}: cannot read {path}: {error.strerror}") from error
    with open(fd, "rb") as file:
        _check_private(path, os.fstat(fd), setting)
        content = file.read(TOKEN_FILE_BYTES_MAX + 1)
    if len(content) > TOKEN_FILE_BYTES_MAX:
        raise CredentialsError(f"{setting}: {path} is larger than {TOKEN_FILE_BYTES_MAX} bytes: not a secret file")
    content = content.strip()
    if not content:
        raise CredentialsError(f"{setting}: {path} is empty")
    try:
        return check_token(content.decode("ascii"), f"{setting}: {path}")
    except UnicodeDecodeError:
        raise CredentialsError(f"{setting}: {path}: a bearer token is visible ASCII only") from None


def _check_private(path: Path, status: os.stat_result, setting: str) -> None:
    """Refuse a secret that another user owns, or that group or others may read or write."""
    quoted = shlex.quote(str(path))
    user = os.geteuid()
    if status.st_uid != user:
        raise CredentialsError(
            f"{setting}: {path} belongs to uid {status.st_uid}, not to this user (uid {user}); a secret "
            f"must be its owner's alone. Fix: chown {user} {quoted} && chmod 600 {quoted}")
    if status.st_mode & 0o077:
        raise CredentialsError(
            f"{setting}: {path} is open to others (mode {stat.S_IMODE(status.st_mode):04o}); a secret "
            f"must be its owner's alone. Fix: chmod 600 {quoted}")
