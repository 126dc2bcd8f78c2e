"""Connection handshake: both ends prove they hold the cluster secret, and name themselves.

    client -> server  HELLO      magic "RLTP", version u8, client_id u64,
                                 expected server_id u64, client_nonce 32 bytes
    server -> client  CHALLENGE  magic, version u8, status u8, server_id u64,
                                 server_nonce 32 bytes, server_proof 32 bytes
    client -> server  PROOF      client_proof 32 bytes
    server -> client  ACCEPT     status u8 (0)

    server_proof = HMAC-SHA256(secret, "raftlog/server" | client_id | server_id
                               | client_nonce | server_nonce)
    client_proof = HMAC-SHA256(secret, "raftlog/client" | client_id | server_id
                               | server_nonce | client_nonce)

Why this shape: each side answers a fresh nonce chosen by the other, so a
recorded exchange cannot be replayed; the role label keeps a proof made by one
side from being reflected back as the other's; both node ids are inside the MAC,
so a connection cannot be redirected to (or claim to come from) another node.
The secret never crosses the wire and proofs are compared in constant time. A
server that rejects the client's proof closes the connection without a word,
which a client reports as a refused handshake (most likely a wrong secret).

This authenticates, it does not encrypt: without TLS, frames after the handshake
are in the clear. With mutual TLS on (docs/transport.md "TLS"), this runs inside
TLS all the same: a node must hold both a certificate of the cluster's CA and the
secret.
"""

from __future__ import annotations

import asyncio
import enum
import hashlib
import hmac
import secrets
import struct
from typing import Any, Protocol

from multiraft.transport.frames import TransportError

__all__ = [
    "HandshakeError",
    "HandshakeReader",
    "HandshakeStatus",
    "HandshakeWriter",
    "accept_handshake",
    "connect_handshake",
]

MAGIC = b"RLTP"
HANDSHAKE_VERSION = 1
NONCE_BYTES = 32
PROOF_BYTES = hashlib.sha256().digest_size
_HELLO = struct.Struct(f">4sBQQ{NONCE_BYTES}s")
_CHALLENGE = struct.Struct(f">4sBBQ{NONCE_BYTES}s{PROOF_BYTES}s")
_ACCEPT = struct.Struct(">B")
_IDS = struct.Struct(">QQ")
_SERVER_LABEL = b"raftlog/server\x00"
_CLIENT_LABEL = b"raftlog/client\x00"
# A secret shorter than this is a configuration mistake, not a secret.
SECRET_BYTES_MIN = 16


class HandshakeStatus(enum.IntEnum):
    OK = 0
    WRONG_NODE = 1  # the client expected another node id at this address
    BAD_VERSION = 2
    BAD_HELLO = 3


class HandshakeError(TransportError):
    """The handshake failed: wrong secret, wrong node, bad bytes, or the peer hung up."""


def _proof(label: bytes, secret: bytes, ids: bytes, first: bytes, second: bytes) -> bytes:
    return hmac.new(secret, label + ids + first + second, hashlib.sha256).digest()


async def connect_handshake(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    *,
    secret: bytes,
    node_id: int,
    peer_id: int,
) -> None:
    """Client side: prove the secret to `peer_id` and check it proves it back.

    The caller bounds the whole exchange with a timeout and closes the connection
    on any exception."""
    assert len(secret) >= SECRET_BYTES_MIN
    client_nonce = secrets.token_bytes(NONCE_BYTES)
    _send(writer, _HELLO.pack(MAGIC, HANDSHAKE_VERSION, node_id, peer_id, client_nonce))
    challenge = await _read(reader, _CHALLENGE.size, "challenge")
    magic, version, status, server_id, server_nonce, server_proof = _CHALLENGE.unpack(challenge)
    if magic != MAGIC or version != HANDSHAKE_VERSION:
        raise HandshakeError(f"peer speaks another protocol (magic {magic!r}, version {version})")
    if status != HandshakeStatus.OK:
        raise HandshakeError(f"peer refused the hello: {_status_name(status)}")
    if server_id != peer_id:
        raise HandshakeError(f"expected node {peer_id} at this address, found node {server_id}")
    ids = _IDS.pack(node_id, peer_id)
    expected = _proof(_SERVER_LABEL, secret, ids, client_nonce, server_nonce)
    if not hmac.compare_digest(expected, server_proof):
        raise HandshakeError("peer failed to prove the cluster secret")
    _send(writer, _proof(_CLIENT_LABEL, secret, ids, server_nonce, client_nonce))
    accept = await _read(reader, _ACCEPT.size, "accept (wrong cluster secret?)")
    if accept[0] != HandshakeStatus.OK:
        raise HandshakeError(f"peer refused the proof: {_status_name(accept[0])}")


class HandshakeReader(Protocol):
    """What the server side reads with: a StreamReader, or an inbound connection."""

    async def readexactly(self, n: int, /) -> bytes: ...


class HandshakeWriter(Protocol):
    """What the handshake writes with: a StreamWriter, or an inbound connection."""

    @property
    def transport(self) -> Any: ...

    def write(self, data: bytes, /) -> None: ...


async def accept_handshake(
    reader: HandshakeReader,
    writer: HandshakeWriter,
    *,
    secret: bytes,
    node_id: int,
) -> int:
    """Server side: returns the client's node id once it has proven the secret.

    Raises HandshakeError otherwise; the caller closes the connection."""
    assert len(secret) >= SECRET_BYTES_MIN
    hello = await _read(reader, _HELLO.size, "hello")
    magic, version, client_id, expected_id, client_nonce = _HELLO.unpack(hello)
    status = HandshakeStatus.OK
    if magic != MAGIC:
        status = HandshakeStatus.BAD_HELLO
    elif version != HANDSHAKE_VERSION:
        status = HandshakeStatus.BAD_VERSION
    elif expected_id != node_id:
        status = HandshakeStatus.WRONG_NODE
    elif client_id == 0:
        status = HandshakeStatus.BAD_HELLO
    if status != HandshakeStatus.OK:
        empty = bytes(NONCE_BYTES)
        _send(writer, _CHALLENGE.pack(MAGIC, HANDSHAKE_VERSION, status, node_id, empty, empty))
        raise HandshakeError(f"refused hello from node {client_id}: {status.name}")
    server_nonce = secrets.token_bytes(NONCE_BYTES)
    ids = _IDS.pack(client_id, node_id)
    server_proof = _proof(_SERVER_LABEL, secret, ids, client_nonce, server_nonce)
    _send(writer, _CHALLENGE.pack(MAGIC, HANDSHAKE_VERSION, status, node_id, server_nonce, server_proof))
    client_proof = await _read(reader, PROOF_BYTES, "proof")
    expected = _proof(_CLIENT_LABEL, secret, ids, server_nonce, client_nonce)
    if not hmac.compare_digest(expected, client_proof):
        raise HandshakeError(f"node {client_id} failed to prove the cluster secret")
    _send(writer, _ACCEPT.pack(HandshakeStatus.OK))
    return client_id


def _send(writer: HandshakeWriter, data: bytes) -> None:
    # uvloop refuses a write on a transport that a reset already closed (RuntimeError,
    # where asyncio's own loop drops it with a warning): either way the peer hung up.
    if writer.transport.is_closing():
        raise HandshakeError("connection closed during handshake")
    writer.write(data)


async def _read(reader: HandshakeReader, size: int, what: str) -> bytes:
    try:
        return await reader.readexactly(size)
    except asyncio.IncompleteReadError as error:
        raise HandshakeError(f"connection closed during handshake, waiting for {what}") from error


def _status_name(status: int) -> str:
    try:
        return HandshakeStatus(status).name
    except ValueError:
        return f"status {status}"
