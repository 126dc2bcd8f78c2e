"""The OpenAPI paths of mirror links (issue 24, docs/mirror.md) and the source's log read.

Kept apart from openapi.py's table (which merges them), as live_ops_openapi.py is;
`app.ROUTES` and the merged document are checked against each other by
tests/http/test_openapi.py.
"""

from __future__ import annotations

from typing import Any

from multiraft.metadata.mirror_commands import SOURCES_MAX
from multiraft.node.api import MAX_BYTES_MAX, WAIT_MS_MAX

_ERROR = {"$ref": "#/components/responses/Error"}
_TOPIC_PATTERN = "^[a-zA-Z0-9._-]{1,249}$"
_TOPIC = {"name": "topic", "in": "path", "required": True, "schema": {"type": "string", "pattern": _TOPIC_PATTERN}}
_NAME = {"name": "name", "in": "path", "required": True,
         "schema": {"type": "string", "pattern": "^[a-zA-Z0-9._-]{1,64}$"}}
_SOURCE = r"^([a-zA-Z0-9.-]{1,253}|\[[0-9a-fA-F:.]{2,45}\]):([1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])$"


def _errors(*statuses: int) -> dict[str, Any]:
    # 401 and 403 only on a node started with --admin-token-file (multiraft/metadata/auth.py).
    return {str(status): _ERROR for status in sorted({400, 401, 403, 413, *statuses})}


def _json(description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


_LINK = {"type": "object", "required": ["name", "sources", "topics", "priority", "state", "credentials"],
         "properties": {"name": {"type": "string"}, "sources": {"type": "array", "items": {"type": "string"}},
                        "topics": {"type": "string"}, "priority": {"enum": ["high", "normal", "low"]},
                        "state": {"enum": ["running", "paused"]}, "credentials": {"type": "boolean"},
                        "mirror_topics": {"type": "array", "items": {"type": "string"}}}}

PATHS: dict[str, Any] = {
    "/v1/admin/mirrors": {
        "post": {"summary": "create a mirror link to a source cluster (admin): its topics matching the pattern "
                            "become read-only mirror topics here, copied with their offsets and bytes",
                 "requestBody": {"required": True, "content": {"application/json": {"schema": {
                     "type": "object", "required": ["name", "sources", "topics"], "additionalProperties": False,
                     "properties": {
                         "name": {"type": "string", "pattern": "^[a-zA-Z0-9._-]{1,64}$"},
                         "sources": {"type": "array", "minItems": 1, "maxItems": SOURCES_MAX, "uniqueItems": True,
                                     "items": {"type": "string", "pattern": _SOURCE}},
                         "topics": {"type": "string", "pattern": "^[a-zA-Z0-9._*?-]{1,249}$",
                                    "description": "a glob over topic names: * any run, ? one character"},
                         "priority": {"type": "string", "enum": ["high", "normal", "low"]},
                         "token": {"type": "string", "pattern": "^[\\x21-\\x7e]{1,512}$",
                                   "description": "a bearer token of the source (never shown back)"}}}}}},
                 "responses": {"201": _json("the link", _LINK), **_errors(409, 415, 503, 504)}},
        "get": {"summary": "the mirror links (admin; tokens never shown)",
                "responses": {"200": _json("links", {"type": "object", "required": ["mirrors"], "properties": {
                    "mirrors": {"type": "array", "items": _LINK}}}), **_errors()}},
    },
    "/v1/admin/mirrors/{name}": {
        "parameters": [_NAME],
        "get": {"summary": "a link's status: discovery, and per mirror partition its pull (state, position, "
                           "lag in records, bytes copied)",
                "responses": {"200": _json("status", {"type": "object", "required": ["name", "topics"]}),
                              **_errors(404, 504)}},
        "delete": {"summary": "delete a link (refused while it has mirror topics not promoted)",
                   "responses": {"204": {"description": "deleted"}, **_errors(404, 409, 503, 504)}},
    },
    "/v1/admin/mirrors/{name}/pause": {"parameters": [_NAME], "post": {
        "summary": "pause a link: its mirrors stop copying, positions stay",
        "responses": {"200": _json("the link", _LINK), **_errors(404, 503, 504)}}},
    "/v1/admin/mirrors/{name}/resume": {"parameters": [_NAME], "post": {
        "summary": "resume a paused link",
        "responses": {"200": _json("the link", _LINK), **_errors(404, 503, 504)}}},
    "/v1/admin/mirrors/{name}/promote": {"parameters": [_NAME], "post": {
        "summary": "promote one mirror topic: its copying stops and it takes producers, at the next offset "
                   "(produce answers 403 MIRROR_READ_ONLY until each partition's leader applied the promotion)",
        "requestBody": {"required": True, "content": {"application/json": {"schema": {
            "type": "object", "required": ["topic"], "additionalProperties": False,
            "properties": {"topic": {"type": "string", "pattern": _TOPIC_PATTERN}}}}}},
        "responses": {"200": _json("promoted", {"type": "object", "required": ["link", "topic", "promoted"]}),
                      **_errors(404, 409, 415, 503, 504)}}},
    "/v1/topics/{topic}/partitions/{partition}/log": {"parameters": [
        _TOPIC, {"name": "partition", "in": "path", "required": True,
                 "schema": {"type": "integer", "minimum": 0, "maximum": 9999}}], "get": {
        "summary": "a mirror's read (read right): committed batches as stored from `offset`, skipped ones "
                   "included and named in Raftlog-Skipped; below the log start: none, and the log start",
        "parameters": [
            {"name": "offset", "in": "query", "required": True,
             "schema": {"type": "integer", "minimum": 0, "maximum": 2**63 - 1}},
            {"name": "max_bytes", "in": "query", "schema": {"type": "integer", "minimum": 1,
                                                            "maximum": MAX_BYTES_MAX}},
            {"name": "wait_ms", "in": "query", "schema": {"type": "integer", "minimum": 0, "maximum": WAIT_MS_MAX}}],
        "responses": {"200": {"description": "frames: base offset i64, length u32, batch",
                              "content": {"application/vnd.raftlog.batch": {"schema": {"type": "string",
                                                                                       "format": "binary"}}}},
                      **_errors(404, 416, 421, 503, 504)}}},
}
