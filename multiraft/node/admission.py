"""Signed node admissions: a node's addresses change only by that node itself.

`POST /v1/admin/nodes` registers a node's raft and HTTP addresses in the catalog.
An unsigned body could re-point any node at an address nobody listens on, and the
cluster would keep dialling it there: one request damaging the cluster map for
good. So the joining node signs its body with the cluster secret, the one proof
every node holds and no HTTP client does, as it proves itself in the transport
handshake (multiraft/transport/handshake.py): HMAC-SHA256 over the timestamp and the body's
exact bytes, sent in `Raftlog-Timestamp` and `Raftlog-Signature`. A signature
older or newer than ADMISSION_SKEW_S is refused, so a captured request cannot be
replayed later (within the window it can only repeat what the node itself asked).
"""

from __future__ import annotations

import hashlib
import hmac

from multiraft.errors import NotAuthorized

TIMESTAMP_HEADER = "Raftlog-Timestamp"
SIGNATURE_HEADER = "Raftlog-Signature"
# As AWS SigV4's five minutes: clocks of one cluster agree far better than that.
ADMISSION_SKEW_S = 300.0
_CONTEXT = b"raftlog node admission v1\n"


def _mac(secret: bytes, timestamp: str, body: bytes) -> str:
    return hmac.new(secret, _CONTEXT + timestamp.encode() + b"\n" + body, hashlib.sha256).hexdigest()


def sign(secret: bytes, body: bytes, now_s: float) -> dict[str, str]:
    """The headers that prove `body` comes from a holder of the cluster secret."""
    timestamp = str(int(now_s))
    return {TIMESTAMP_HEADER: timestamp, SIGNATURE_HEADER: _mac(secret, timestamp, body)}


def verify(secret: bytes, body: bytes, timestamp: str | None, signature: str | None, now_s: float) -> None:
    """Raise NotAuthorized (403) unless the body was signed with `secret` recently."""
    if timestamp is None or signature is None:
        raise NotAuthorized(f"a node admission is signed with the cluster secret ({SIGNATURE_HEADER}); "
                            "only a node started with --join sends one")
    if not (timestamp.isascii() and timestamp.isdigit() and len(timestamp) <= 12):
        raise NotAuthorized(f"{TIMESTAMP_HEADER} must be seconds since the epoch")
    if abs(int(timestamp) - now_s) > ADMISSION_SKEW_S:
        raise NotAuthorized(f"the admission's {TIMESTAMP_HEADER} is more than {ADMISSION_SKEW_S:.0f} s off this "
                            "node's clock")
    if not hmac.compare_digest(_mac(secret, timestamp, body), signature.strip().lower()):
        raise NotAuthorized("the admission's signature does not match the cluster secret")
