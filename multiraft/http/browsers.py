"""Browsers are clients too: no web page may drive a node by visiting a developer.

Two attacks reach a node on loopback from a page in the developer's browser:

- **Cross-site requests.** A page on any site can POST to `http://127.0.0.1:8080`.
  A "simple" request (a form, or `text/plain`) goes out without a CORS preflight,
  so the server must refuse it itself: JSON routes take only `application/json`
  (`params.json_object`; the Confluent dialect's routes also its own
  `application/vnd.kafka...+json` types, which are not CORS-safelisted either, so a
  browser asks first), and any request that carries an `Origin` header (browsers
  add one to every cross-origin request and to every POST) is refused with 403
  unless that origin is the node's own or listed in `--http-allowed-origins`.
- **DNS rebinding.** A page on `evil.example` re-resolves its own name to
  127.0.0.1; its requests are then same-origin for the browser, but carry
  `Host: evil.example`. The node answers only to Host names it knows: IP literals
  (a browser sends one only when the page's own URL was that address), `localhost`,
  its HTTP address, and the names in `--http-host-names`.

Clients that are not browsers (curl, the Python client, other nodes) send no Origin
and a Host the node knows, so nothing changes for them. Go's `net/http` pprof, the
Docker daemon, Jupyter and etcd's gateway refuse foreign hosts the same way.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from aiohttp import web

from multiraft.errors import ForeignOrigin, UnknownHost

if TYPE_CHECKING:
    from multiraft.node.api import NodeConfig

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True, slots=True)
class BrowserPolicy:
    allowed_origins: frozenset[str]
    host_names: frozenset[str]

    @classmethod
    def of(cls, config: NodeConfig) -> BrowserPolicy:
        names = {"localhost", config.http_addr.host.lower(), *(n.lower() for n in config.http_host_names)}
        return cls(frozenset(o.rstrip("/").lower() for o in config.http_allowed_origins), frozenset(names))

    def host_allowed(self, host: str | None) -> bool:
        if host is None:  # HTTP/1.0 without Host: not a browser
            return True
        name = _host_name(host)
        if name in self.host_names or name.endswith(".localhost"):
            return True
        try:
            ipaddress.ip_address(name)
        except ValueError:
            return False
        return True

    def origin_allowed(self, origin: str, scheme: str, host: str | None) -> bool:
        origin = origin.rstrip("/").lower()
        if origin in self.allowed_origins:
            return True
        return host is not None and origin == f"{scheme}://{host.lower()}"  # the node's own pages


def _host_name(host: str) -> str:
    """`Host` without its port; `[::1]:8080` -> `::1`."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:].partition("]")[0]
    if host.count(":") == 1:
        return host.partition(":")[0]
    return host


def browser_middleware(policy: BrowserPolicy) -> Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]:
    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        host = request.headers.get("Host")
        if not policy.host_allowed(host):
            raise UnknownHost(f"this node does not answer to the host name {_host_name(host or '')[:100]!r}; "
                              "add it with --http-host-names")
        origin = request.headers.get("Origin")
        if origin is not None and not policy.origin_allowed(origin, request.scheme, host):
            raise ForeignOrigin(f"requests from the web origin {origin[:100]!r} are refused; "
                                "allow it with --http-allowed-origins")
        return await handler(request)

    return middleware
