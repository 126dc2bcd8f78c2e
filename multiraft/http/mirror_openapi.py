"""The OpenAPI paths of mirror links (issue 24, docs/mirror.md) and the source's log read.

Kept apart from openapi.py's table (which merges them), as live_ops_openapi.py is;
`app.ROUTES` and the merged document are checked against each other by
tests/http/test_openapi.py.
"""

from __future__ import annotations

from typing import Any

from multiraft.metadata.mirror_commands import (
    SOURCES_MAX,
    VERIFY_INTERVAL_MAX_S,
    VERIFY_INTERVAL_MIN_S,
)
from multiraft.metadata.pem_bundle import PEM_BUNDLE_BYTES_MAX
from multiraft.metadata.record_filter import CLAUSES_MAX, TEXT_BYTES_MAX
from multiraft.node.api import MAX_BYTES_MAX, TREE_LEVEL_MAX, TREE_POSITIONS_MAX, WAIT_MS_MAX

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


_ON_SOURCE_TRUNCATED = ("what a mirror partition does when the source's retention deleted offsets it had not "
                        "copied: stop (wait in source_truncated, keeping all it has) or resync (a new incarnation "
                        "from the source's log start, the mirror's copy of older offsets and its consumer offsets "
                        "discarded)")
_LINK = {"type": "object", "required": ["name", "sources", "topics", "priority", "state", "credentials",
                                      "scheme", "source_tls", "source_ca", "on_source_truncated"],
         "properties": {"name": {"type": "string"}, "sources": {"type": "array", "items": {"type": "string"}},
                        "topics": {"type": "string"}, "priority": {"enum": ["high", "normal", "low"]},
                        "state": {"enum": ["running", "paused"]}, "credentials": {"type": "boolean"},
                        "verify_interval_s": {"type": ["integer", "null"]},
                        "scheme": {"enum": ["http", "https"], "description": "how the source is read"},
                        "source_tls": {"type": "boolean"},
                        "source_ca": {"type": ["object", "null"], "required": ["certificates", "fingerprints_sha256"],
                                      "description": "the link's CA bundle for the source, summed up (null: none, "
                                                     "the system's trust store for an HTTPS source)",
                                      "properties": {"certificates": {"type": "integer", "minimum": 1},
                                                     "fingerprints_sha256": {"type": "array",
                                                                             "items": {"type": "string"}}}},
                        "on_source_truncated": {"enum": ["stop", "resync"], "description": _ON_SOURCE_TRUNCATED},
                        "record_filter": {"type": ["array", "null"], "items": {"type": "object"},
                                          "description": "the records the link copies (null: all)"},
                        "mirror_topics": {"type": "array", "items": {"type": "string"}}}}
_FILTER_TEXT = {"type": "string", "minLength": 1, "maxLength": TEXT_BYTES_MAX}
_RECORD_FILTER = {
    "type": "array", "minItems": 1, "maxItems": CLAUSES_MAX, "uniqueItems": True,
    "description": "copy only the records any clause matches (absent: all); the others become gaps in the mirror, "
                   "which keeps the source's offsets (docs/mirror.md, \"Record filters\"). Texts are at most "
                   f"{TEXT_BYTES_MAX} UTF-8 bytes. Fixed at creation; needs feature level 3",
    "items": {"oneOf": [
        {"type": "object", "required": ["key_prefix"], "additionalProperties": False,
         "properties": {"key_prefix": {**_FILTER_TEXT, "description": "the key starts with it (a null key never "
                                                                      "matches)"}}},
        {"type": "object", "required": ["header"], "additionalProperties": False,
         "properties": {"header": {**_FILTER_TEXT, "description": "the record carries a header of this name"},
                        "value": {"type": "string", "maxLength": TEXT_BYTES_MAX,
                                  "description": "with this value exactly"}}}]}}
_OFFSET = {"type": "integer", "minimum": 0, "maximum": 2**63 - 1}
_PARTITION = {"name": "partition", "in": "path", "required": True,
              "schema": {"type": "integer", "minimum": 0, "maximum": 9999}}
_COUNT = {"type": "integer", "minimum": 0}
_OFFSET_OR_NULL = {"type": ["integer", "null"], "minimum": 0}
_VERDICTS = ["identical", "behind", "different", "source_damaged", "sink_damaged", "unreachable"]
# One mirror partition in a link's status: its pull, from the node leading it (absent
# fields: no node answered for it, `state` "unknown"), and its last full sync.
_PULL = {"type": "object", "required": ["partition", "state", "last_verify"], "properties": {
    "partition": _COUNT,
    "state": {"enum": ["starting", "running", "backing_off", "paused", "source_truncated", "diverged", "resyncing",
                       "unknown"]},
    "position": _COUNT, "source_high_watermark": _OFFSET_OR_NULL, "source_log_start_offset": _OFFSET_OR_NULL,
    "lag_records": _OFFSET_OR_NULL, "bytes_copied": _COUNT, "records_copied": _COUNT, "failures": _COUNT,
    "last_error": {"type": ["string", "null"]}, "node": _COUNT,
    "in_flight": {"type": "object", "required": ["chunks", "bytes", "chunks_max", "bytes_max"],
                  "description": "chunks proposed to the mirror partition's group and not yet applied, their "
                                 "bytes, and the pipeline's limits",
                  "properties": {"chunks": _COUNT, "bytes": _COUNT, "chunks_max": _COUNT, "bytes_max": _COUNT}},
    "last_verify": {"type": ["object", "null"], "properties": {"status": {"enum": _VERDICTS}}},
    "truncated_resyncs": {**_COUNT, "description": "resyncs because the source truncated past the partition, "
                                                   "as the sink's nodes that proposed them count (in memory)"},
    "last_truncated_resync": {"type": ["object", "null"], "required": ["at_ms", "deleted", "start_offset", "node"],
                              "properties": {"at_ms": _COUNT, "deleted": {"type": "array", "items": _COUNT,
                                                                          "minItems": 2, "maxItems": 2},
                                             "start_offset": _COUNT, "old_group": _COUNT, "node": _COUNT}}}}
_STATUS = {"type": "object", "required": ["name", "sources", "topics", "priority", "state", "credentials",
                                          "discovery", "nodes_unreachable"],
           "properties": {**_LINK["properties"],  # type: ignore[dict-item]
                          "discovery": {"type": ["object", "null"]},
                          "nodes_unreachable": {"type": "array", "items": _COUNT},
                          "topics": {"type": "array", "items": {
                              "type": "object", "required": ["topic", "promoted", "partitions"], "properties": {
                                  "topic": {"type": "string"}, "promoted": {"type": "boolean"},
                                  "partitions": {"type": "array", "items": _PULL}}}}}}
_VERDICT = {"type": "object", "required": ["topic", "partition", "status", "ranges", "nodes_compared", "repair"],
            "properties": {"status": {"enum": _VERDICTS},
                           "ranges": {"type": "array", "items": {"type": "array", "items": {"type": "integer"}}},
                           "kept_below": {"type": "integer", "description": "a resync keeps the old batches below "
                                                                            "this offset (0: none)"}}}

PATHS: dict[str, Any] = {
    "/v1/admin/mirrors": {
        "post": {"summary": "create a mirror link to a source cluster (admin): its topics matching the pattern "
                            "become read-only mirror topics here, copied with their offsets and bytes",
                 "requestBody": {"required": True, "content": {"application/json": {"schema": {
                     "type": "object", "required": ["name", "sources", "topics"], "additionalProperties": False,
                     "dependentSchemas": {"source_ca": {"required": ["source_tls"],
                                                        "properties": {"source_tls": {"const": True}}}},
                     "properties": {
                         "name": {"type": "string", "pattern": "^[a-zA-Z0-9._-]{1,64}$"},
                         "sources": {"type": "array", "minItems": 1, "maxItems": SOURCES_MAX, "uniqueItems": True,
                                     "items": {"type": "string", "pattern": _SOURCE}},
                         "topics": {"type": "string", "pattern": "^[a-zA-Z0-9._*?-]{1,249}$",
                                    "description": "a glob over topic names: * any run, ? one character"},
                         "priority": {"type": "string", "enum": ["high", "normal", "low"]},
                         "token": {"type": "string", "pattern": "^[\\x21-\\x7e]{1,512}$",
                                   "description": "a bearer token of the source (never shown back)"},
                         "verify_interval_s": {"type": "integer", "minimum": VERIFY_INTERVAL_MIN_S,
                                               "maximum": VERIFY_INTERVAL_MAX_S,
                                               "description": "a full sync of each mirror partition this often, "
                                                              "with repair (absent: on demand only)"},
                         "source_tls": {"type": "boolean", "description": "the source serves HTTPS: read it over TLS "
                                        "(1.2 at least), its certificate verified and its host name checked"},
                         "source_ca": {"type": "string", "maxLength": PEM_BUNDLE_BYTES_MAX,
                                       "description": "PEM CA certificates trusted for the source, and only they "
                                                      "(needs source_tls; absent: the system's trust store)"},
                         "on_source_truncated": {"type": "string", "enum": ["stop", "resync"],
                                                 "description": _ON_SOURCE_TRUNCATED + " (absent: stop)"},
                         "record_filter": _RECORD_FILTER}}}}},
                 "responses": {"201": _json("the link", _LINK), **_errors(409, 415, 503, 504)}},
        "get": {"summary": "the mirror links (admin; tokens never shown)",
                "responses": {"200": _json("links", {"type": "object", "required": ["mirrors"], "properties": {
                    "mirrors": {"type": "array", "items": _LINK}}}), **_errors()}},
    },
    "/v1/admin/mirrors/{name}": {
        "parameters": [_NAME],
        "get": {"summary": "a link's status: discovery, and per mirror partition its pull (state, position, "
                           "lag in records, bytes copied, chunks and bytes in flight) and its last full sync",
                "responses": {"200": _json("status", _STATUS), **_errors(404, 504)}},
        "patch": {"summary": "change a link's on_source_truncated (the others, record_filter among them, are set at "
                             "creation)",
                  "requestBody": {"required": True, "content": {"application/json": {"schema": {
                      "type": "object", "required": ["on_source_truncated"], "additionalProperties": False,
                      "properties": {"on_source_truncated": {"type": "string", "enum": ["stop", "resync"],
                                                             "description": _ON_SOURCE_TRUNCATED}}}}}},
                  "responses": {"200": _json("the link", _LINK), **_errors(404, 415, 503, 504)}},
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
    "/v1/admin/mirrors/{name}/verify": {"parameters": [_NAME], "post": {
        "summary": "the full sync: up to 16 of the link's mirror partitions (of `topic`, or all) compared with the "
                   "source by tictac trees, root first; a different one is resynced unless `repair` is false; call "
                   "again with `start` = `next_start` until it is null",
        "requestBody": {"required": False, "content": {"application/json": {"schema": {
            "type": "object", "additionalProperties": False,
            "properties": {"topic": {"type": "string", "pattern": _TOPIC_PATTERN},
                           "start": {"type": "integer", "minimum": 0, "maximum": 2**53},
                           "repair": {"type": "boolean"},
                           "deep": {"type": "boolean", "description": "true: the sink and the source read every "
                                    "segment of the span (finds rot); false (the default): closed segments count "
                                    "by their tree sidecars, only the open segment and the span's edges are read"}}}}}},
        "responses": {"200": _json("verdicts", {"type": "object", "required": [
            "link", "partitions", "total", "verified", "next_start", "all_identical"], "properties": {
            "partitions": {"type": "array", "items": _VERDICT}}}), **_errors(404, 409, 415, 416, 503, 504)}}},
    "/v1/topics/{topic}/partitions/{partition}/tree": {"parameters": [_TOPIC, _PARTITION], "get": {
        "summary": "a mirror's full sync (read right): the partition's tictac tree over [lo, hi) cut to what the "
                   "answering replica holds (and to 65,536 leaves): its span, depth, root",
        "parameters": [{"name": "lo", "in": "query", "schema": _OFFSET},
                       {"name": "hi", "in": "query", "schema": _OFFSET},
                       {"name": "deep", "in": "query", "schema": {"type": "string", "enum": ["true", "false"]},
                        "description": "true: the replica reads every segment of the span (absent or false: closed "
                                       "segments count by their tree sidecars)"}],
        "responses": {"200": _json("the tree", {"type": "object", "required": [
            "lo", "hi", "depth", "root", "damaged", "log_start_offset", "high_watermark"]}),
            **_errors(404, 416, 421, 503, 504)}}},
    "/v1/topics/{topic}/partitions/{partition}/tree/nodes": {"parameters": [_TOPIC, _PARTITION], "get": {
        "summary": "digests of the tree the tree call built over exactly [lo, hi): `level` counted from the leaves "
                   "(levels above the root read as the root at position 0), `positions` comma-separated",
        "parameters": [
            {"name": "lo", "in": "query", "required": True, "schema": _OFFSET},
            {"name": "hi", "in": "query", "required": True, "schema": _OFFSET},
            {"name": "level", "in": "query", "required": True,
             "schema": {"type": "integer", "minimum": 0, "maximum": TREE_LEVEL_MAX}},
            {"name": "positions", "in": "query", "required": True, "schema": {
                "type": "string", "pattern": f"^[0-9]{{1,18}}(,[0-9]{{1,18}}){{0,{TREE_POSITIONS_MAX - 1}}}$"}}],
        "responses": {"200": _json("digests", {"type": "object", "required": ["digests"], "properties": {
            "digests": {"type": "array", "items": {"type": "string"}}}}), **_errors(404, 416, 421, 503, 504)}}},
    "/v1/topics/{topic}/partitions/{partition}/log": {"parameters": [_TOPIC, _PARTITION], "get": {
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
