"""POST /v1/admin/leadership/balance: not built yet (the operations issue)."""

from __future__ import annotations

from aiohttp import web

from multiraft.http.errors import NotImplementedYet


async def balance_leadership(request: web.Request) -> web.Response:
    raise NotImplementedYet("leadership balancing is not yet available")
