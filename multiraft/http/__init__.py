"""The HTTP API of a node (DESIGN.md section 6): `create_app(node.api)` and `HttpServer`, which
see the node only through its `NodeApi` (multiraft/node/api.py)."""

from multiraft.http.app import ROUTES, create_app
from multiraft.http.server import HttpServer

__all__ = ["ROUTES", "HttpServer", "create_app"]
