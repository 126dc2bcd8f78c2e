"""The async client's calls of mirror links (docs/mirror.md), apart from http.py (its size).

`AsyncClient` takes them as a base class; they go through its `_json` and `request`,
so retries, tokens and TLS are the client's as for every other call.
"""

from __future__ import annotations

from typing import Any


class MirrorCalls:
    """Create, list, show, pause, resume, alter, promote, verify and delete mirror links (admin)."""

    async def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        raise NotImplementedError  # AsyncClient's

    async def request(self, method: str, path: str, **kwargs: Any) -> tuple[int, bytes, Any]:
        raise NotImplementedError  # AsyncClient's

    async def create_mirror(self, name: str, sources: list[str], topics: str, priority: str = "normal",
                            token: str | None = None, verify_interval_s: int | None = None,
                            source_tls: bool = False, source_ca: str | None = None,
                            on_source_truncated: str | None = None,
                            record_filter: list[dict[str, str]] | None = None) -> dict[str, Any]:
        """`source_ca`: PEM CA certificates for an HTTPS source; `on_source_truncated`: `stop` or
        `resync` (None: the sink's default, stop); `record_filter`: clauses `{"key_prefix": P}`,
        `{"header": N}` or `{"header": N, "value": V}`, any matching copies a record (None: all;
        docs/mirror.md "Record filters"). Defaults are not sent (an earlier sink refuses them)."""
        optional = {"token": token, "verify_interval_s": verify_interval_s, "source_tls": source_tls or None,
                    "source_ca": source_ca, "on_source_truncated": on_source_truncated,
                    "record_filter": record_filter}
        body = {"name": name, "sources": sources, "topics": topics, "priority": priority,
                **{key: value for key, value in optional.items() if value is not None}}
        return await self._json("POST", "/v1/admin/mirrors", json_body=body)

    async def list_mirrors(self) -> list[dict[str, Any]]:
        return (await self._json("GET", "/v1/admin/mirrors"))["mirrors"]

    async def mirror_status(self, name: str) -> dict[str, Any]:
        return await self._json("GET", f"/v1/admin/mirrors/{name}")

    async def mirror_action(self, name: str, action: str, topic: str | None = None,
                            body: dict[str, Any] | None = None) -> dict[str, Any]:
        """`pause`, `resume`, `promote` (of `topic`) or `verify` (`body`: topic, start, repair) a link."""
        assert action in ("pause", "resume", "promote", "verify")
        return await self._json("POST", f"/v1/admin/mirrors/{name}/{action}",
                                json_body={"topic": topic} if action == "promote" else body)

    async def alter_mirror(self, name: str, on_source_truncated: str) -> dict[str, Any]:
        """Change a link's `on_source_truncated` (`stop` or `resync`); the link."""
        return await self._json("PATCH", f"/v1/admin/mirrors/{name}",
                                json_body={"on_source_truncated": on_source_truncated})

    async def delete_mirror(self, name: str) -> None:
        await self.request("DELETE", f"/v1/admin/mirrors/{name}")
