"""The HTTP API of a node (DESIGN.md section 6): `create_app(node)` and `HttpServer`."""

from multiraft.http.app import ROUTES, create_app
from multiraft.http.server import HttpServer

__all__ = ["ROUTES", "HttpServer", "create_app"]
