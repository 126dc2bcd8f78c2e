"""Turn an error answer from another node back into a typed `ClientError`.

A node that forwards a request (produce to the partition leader, a metadata
command to the controller) must answer its own client exactly as the remote
node would have: same code, same HTTP status, same retriable flag.
"""

from __future__ import annotations

import json

from multiraft.errors import error_table
from raftlog.errors import ClientError, LeaderNotAvailable, NotLeader
from raftlog.types import NodeId


class RemoteClientError(ClientError):
    """A `ClientError` raised on another node, carried over with its code and status."""

    def __init__(self, code: str, message: str, http_status: int, retriable: bool) -> None:
        super().__init__(message)
        self.code = code
        self.http_status = http_status
        self.retriable = retriable


def error_from_body(body: bytes) -> ClientError:
    try:
        decoded = json.loads(body)
        code, message = str(decoded["error_code"]), str(decoded["message"])
    except (ValueError, KeyError, TypeError):
        return RemoteClientError("INTERNAL", "a peer answered with a malformed error", 500, False)
    if code == NotLeader.code:
        hint = decoded.get("leader_hint", 0)
        return NotLeader(NodeId(hint if isinstance(hint, int) else 0), message)
    if code == LeaderNotAvailable.code:
        return LeaderNotAvailable(message)
    http_status, retriable = error_table().get(code, (500, False))
    return RemoteClientError(code, message, http_status, retriable)
