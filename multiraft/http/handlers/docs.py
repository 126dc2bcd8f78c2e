"""GET /v1/openapi.json: the OpenAPI 3 document of what this server serves."""

from __future__ import annotations

from aiohttp import web

from multiraft.http.openapi import openapi_document


async def openapi(request: web.Request) -> web.Response:
    return web.json_response(openapi_document())
