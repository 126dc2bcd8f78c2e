"""Files that hold secrets: the cluster secret and bearer tokens (docs/node.md "Secrets and files").

Made here, they are created 0600 under a name of their own and linked into
place (`os.open(O_CREAT | O_EXCL | O_WRONLY, 0o600)`): never a moment when others
may read them, never half written, never over a file that exists. Read here,
they are refused, as ssh refuses a private key, when they belong to another user
or when anyone but the owner may read or write them; the error names the file
and the fix. A generated cluster secret lives in the node's own data directory,
never in a shared parent such as /tmp, where another user could plant one.

A cluster secret must carry at least 32 bytes of random material, counted by how
it is written: two hex digits make a byte (64 digits, as generated), four base64
characters three bytes (43 characters), and anything else a byte per byte (32).
"""

from __future__ import annotations

import os
import re
import secrets
import shlex
import stat
from pathlib import Path

from storage.files import make_private_dirs

SECRET_FILE_NAME = "cluster.secret"  # in the node's data directory
SECRET_BYTES_MIN = 32
SECRET_FILE_BYTES_MAX = 64 * 1024  # a secret is a line; anything longer is the wrong file
PRIVATE_FILE_MODE = 0o600
_HEX = re.compile(rb"[0-9a-fA-F]+")
_BASE64 = re.compile(rb"[A-Za-z0-9+/_-]+=*")
# In a subshell with umask 077, so the new file is never readable by others, not even for a moment.
MAKE_SECRET_HINT = "(umask 077; python3 -c 'import secrets; print(secrets.token_hex(32))' > FILE)"


# What a bearer token may hold: visible ASCII, so it goes into a header as it is (no
# space, no CR/LF to end the header early). RFC 6750's b64token is a subset.
_TOKEN = re.compile(r"[\x21-\x7e]+")


class SecretFileError(ValueError):
    """A secret file is missing, unreadable, exposed or too weak; the message names it and the fix."""


def generate_secret() -> bytes:
    """A new cluster secret: 32 random bytes, written as 64 hex digits (a text file)."""
    return secrets.token_hex(SECRET_BYTES_MIN).encode()


def secret_material_bytes(secret: bytes) -> int:
    """How many random bytes `secret` can hold at most, judged by its alphabet."""
    if _HEX.fullmatch(secret):
        return len(secret) // 2
    if _BASE64.fullmatch(secret):
        return len(secret.rstrip(b"=")) * 6 // 8
    return len(secret)


def check_cluster_secret(secret: bytes, setting: str, path: Path | None = None) -> None:
    found = secret_material_bytes(secret)
    if found >= SECRET_BYTES_MIN:
        return
    where = f"{path} holds" if path is not None else "the secret holds"
    fix = f"; make one: {MAKE_SECRET_HINT}" if path is not None else ""
    raise SecretFileError(
        f"{setting}: {where} at most {found} bytes of random material; at least {SECRET_BYTES_MIN} are "
        f"needed (64 hex digits, 43 base64 characters or {SECRET_BYTES_MIN} raw bytes){fix}")


def read_private_file(path: Path, setting: str) -> bytes:
    """The file's content without surrounding whitespace, once its owner and mode are checked
    (on the opened file, so a swap between the check and the read changes nothing)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as error:
        raise SecretFileError(f"{setting}: cannot read {path}: {error.strerror}") from error
    with open(fd, "rb") as file:
        check_private(path, os.fstat(fd), setting)
        content = file.read(SECRET_FILE_BYTES_MAX + 1)
    if len(content) > SECRET_FILE_BYTES_MAX:
        raise SecretFileError(f"{setting}: {path} is larger than {SECRET_FILE_BYTES_MAX} bytes: not a secret file")
    content = content.strip()
    if not content:
        raise SecretFileError(f"{setting}: {path} is empty")
    return content


def check_token(token: str, where: str) -> str:
    if not _TOKEN.fullmatch(token):
        raise SecretFileError(f"{where}: a bearer token is visible ASCII only (no spaces or control characters)")
    return token


def read_token_file(path: Path, setting: str = "token_file") -> str:
    """A bearer token from its file (checked as any secret file)."""
    content = read_private_file(path, setting)
    try:
        return check_token(content.decode("ascii"), f"{setting}: {path}")
    except UnicodeDecodeError:
        raise SecretFileError(f"{setting}: {path}: a bearer token is visible ASCII only") from None


def check_private(path: Path, status: os.stat_result, setting: str) -> None:
    """Refuse a secret that another user owns, or that group or others may read or write."""
    quoted = shlex.quote(str(path))
    user = os.geteuid()
    if status.st_uid != user:
        raise SecretFileError(
            f"{setting}: {path} belongs to uid {status.st_uid}, not to this user (uid {user}); a secret "
            f"must be its owner's alone. Fix: chown {user} {quoted} && chmod 600 {quoted}")
    if status.st_mode & 0o077:
        raise SecretFileError(
            f"{setting}: {path} is open to others (mode {stat.S_IMODE(status.st_mode):04o}); a secret "
            f"must be its owner's alone. Fix: chmod 600 {quoted}")


def create_private_file(path: Path, content: bytes) -> bool:
    """Create `path` holding `content`, mode 0600, unless it exists (then False: whoever
    came first wins, and everyone uses theirs). Written under a name of its own, then
    linked: the name appears complete or not at all, so nobody reads it half written
    (two starts racing for it; one that read an empty file refused to start)."""
    make_private_dirs(path.parent)
    draft = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, PRIVATE_FILE_MODE)
    try:
        with open(fd, "wb") as file:
            file.write(content)
            file.flush()
            os.fsync(file.fileno())
        try:
            os.link(draft, path)
        except FileExistsError:
            return False
        return True
    finally:
        draft.unlink()
