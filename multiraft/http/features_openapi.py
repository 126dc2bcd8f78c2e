"""The OpenAPI paths of the cluster's feature level (multiraft/http/handlers/features.py).

Kept apart from openapi.py's table (which merges them), as live_ops_openapi.py is; the
routes and the merged document are checked against each other by tests/http/test_openapi.py.
"""

from __future__ import annotations

from typing import Any

from multiraft.metadata.features import FEATURE_LEVEL_MAX

_ERROR = {"$ref": "#/components/responses/Error"}
_LEVEL = {"type": "integer", "minimum": 0}
_MAYBE_LEVEL = {"type": ["integer", "null"], "minimum": 0}


def _errors(*statuses: int) -> dict[str, Any]:
    # 401 and 403 only on a node started with --admin-token-file (multiraft/metadata/auth.py).
    return {str(status): _ERROR for status in sorted({400, 401, 403, *statuses})}


_NODE = {
    "type": "object", "additionalProperties": False,
    "required": ["node_id", "status", "answered", "supported", "finalized", "decommissioned", "error"],
    "properties": {
        "node_id": {"type": "integer", "minimum": 1}, "status": {"type": "string"},
        "answered": {"type": "boolean"},
        "supported": {**_MAYBE_LEVEL, "description": "the level it supports (null: not asked, or no answer)"},
        "finalized": {**_MAYBE_LEVEL, "description": "its catalog's level, as it said (null: unknown)"},
        "decommissioned": {"type": "boolean", "description": "not asked: holds no copy, out of the metadata group"},
        "error": {"type": "string", "description": "why it did not answer"}}}
_REPORT_PROPERTIES: dict[str, Any] = {
    "finalized": {**_LEVEL, "description": "the level the cluster is finalized at (this node's catalog)"},
    "supported_here": {**_LEVEL, "description": "the level this node supports"},
    "highest_common": {**_MAYBE_LEVEL, "description": "the highest level every asked node supports (null: "
                                                      "some did not answer)"},
    "nodes": {"type": "array", "items": _NODE},
    "not_answered": {"type": "array", "items": {"type": "integer"}},
    "levels": {"type": "array", "items": {
        "type": "object", "additionalProperties": False, "required": ["level", "name", "description"],
        "properties": {"level": _LEVEL, "name": {"type": "string"}, "description": {"type": "string"}}}},
}
_REQUIRED = ["finalized", "supported_here", "highest_common", "nodes", "not_answered", "levels"]


def _report(description: str, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    schema = {"type": "object", "additionalProperties": False, "required": _REQUIRED + list(extra or {}),
              "properties": {**_REPORT_PROPERTIES, **(extra or {})}}
    return {"description": description, "content": {"application/json": {"schema": schema}}}


PATHS: dict[str, Any] = {
    "/v1/admin/features": {
        "get": {"summary": "the cluster's finalized feature level and the level each registered node supports, "
                           "asked now (a node decommissioned to the end is listed, not asked) (admin)",
                "responses": {"200": _report("the levels"), **_errors(504)}},
        "post": {"summary": "raise the finalized feature level: to `level`, or (no body) to the highest level "
                            "every registered node supports; refused (409 FEATURE_LEVEL_UNSUPPORTED, naming "
                            "them) when a node did not answer or supports less; never lowered (admin)",
                 "requestBody": {"required": False, "content": {"application/json": {"schema": {
                     "type": "object", "additionalProperties": False,
                     "properties": {"level": {"type": ["integer", "null"], "minimum": 1,
                                              "maximum": FEATURE_LEVEL_MAX}}}}}},
                 "responses": {"200": _report("the levels after it", {"previous": _LEVEL}),
                               **_errors(409, 415, 421, 503, 504)}},
    },
}
