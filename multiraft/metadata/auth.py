"""Optional bearer tokens with per-topic rights (DESIGN.md section 10).

Off unless the node was given an admin token (`--admin-token-file`, the same file
on every node, as the cluster secret). Then every HTTP request but `/v1/health`
and `/v1/openapi.json` carries `Authorization: Bearer TOKEN`, and the token's
rights decide what it may do:

- `admin`: everything (topics, settings, tokens, nodes, balancing);
- `read:TOPIC`: consume `TOPIC` and fetch and commit consumer-group offsets on it;
- `write:TOPIC`: produce to `TOPIC` (and take producer ids);
- `TOPIC` is a topic name or `*` for every topic.

Any valid token may read the cluster's description (cluster, topic list and
settings, metrics, the cluster page), as Kafka lets any authenticated client
read metadata. The admin token lives only in the nodes' files; other tokens are
made by an admin (`POST /v1/admin/tokens`) and kept in the catalog as SHA-256
digests, never in clear, so every node knows them and a snapshot carries no
secret. A token is 32 random bytes (base64url), so a digest without salt is
safe. Comparisons of secrets are constant-time.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Callable, Iterable
from dataclasses import dataclass

# The checks of token names and rights live with the topic-name pattern they share
# with the commands; re-exported here for the edge (multiraft/http/handlers/tokens.py).
from multiraft.metadata.patterns import check_rights, check_token_name

__all__ = [
    "ADMIN", "BEARER", "Principal", "authenticate", "check_rights", "check_token_name",
    "new_token", "token_digest",
]

BEARER = "Bearer "


def new_token() -> str:
    return secrets.token_urlsafe(32)


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a request comes from, and what it may do."""

    name: str
    rights: frozenset[str]

    @property
    def is_admin(self) -> bool:
        return "admin" in self.rights

    def may(self, action: str, topic: str | None = None) -> bool:
        """`action` ("read", "write" or "admin") on `topic` (None: on some topic)."""
        if self.is_admin:
            return True
        if action == "admin":
            return False
        if topic is None:
            return any(right.startswith(f"{action}:") for right in self.rights)
        return f"{action}:{topic}" in self.rights or f"{action}:*" in self.rights


ADMIN = Principal("admin", frozenset({"admin"}))


def authenticate(header: str | None, admin_token: bytes,
                 by_digest: Callable[[str], tuple[str, Iterable[str]] | None]) -> Principal | None:
    """The principal of an `Authorization` header (None: no valid bearer token).
    `by_digest`: the catalog's (name, rights) of a token digest. Looking a digest up
    tells a guesser nothing: it cannot steer the digest of what it sends."""
    if not header or not header.startswith(BEARER):
        return None
    presented = header[len(BEARER):].strip()
    if not presented:
        return None
    if hmac.compare_digest(presented.encode(), admin_token):
        return ADMIN
    found = by_digest(token_digest(presented))
    return Principal(found[0], frozenset(found[1])) if found is not None else None
