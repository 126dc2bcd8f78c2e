"""The OpenAPI 3 document of the HTTP API, kept beside the routes it describes.

`app.ROUTES` and this document are checked against each other by a test (every
served route is documented, every documented route is served), so the two
cannot drift. Written by hand rather than generated: the document is part of
the contract (DESIGN.md section 6) and reads better as data than as decorators.
"""

from __future__ import annotations

from typing import Any

from multiraft.http import confluent_openapi, features_openapi, live_ops_openapi, mirror_openapi
from multiraft.http.limits import (
    BATCH_CONTENT_TYPE,
    GROUP_COMMITS_PER_REQUEST_MAX,
    RECORDS_PER_REQUEST_MAX,
)
from multiraft.metadata.commands import (
    PARTITIONS_MAX,
    REPLICATION_FACTOR_MAX,
    TOPIC_CONFIG_KEYS,
    TYPED_CONFIG,
)
from multiraft.node.api import (
    ASSIGNORS,
    MAX_BYTES_MAX,
    MAX_RECORDS_MAX,
    RESET_PARTITIONS_MAX,
    RESET_TOPICS_MAX,
    RESET_VALUE_RANGES,
    RESETS,
    WAIT_MS_MAX,
    ResetStrategy,
    group_limits,
)

_ERROR = {"$ref": "#/components/responses/Error"}
_INT = {"type": "integer"}
_NULLABLE_INT = {"type": ["integer", "null"]}


def _json(schema: dict[str, Any]) -> dict[str, Any]:
    return {"content": {"application/json": {"schema": schema}}}


def _ok(description: str, schema: dict[str, Any] | None = None) -> dict[str, Any]:
    answer: dict[str, Any] = {"description": description}
    if schema is not None:
        answer.update(_json(schema))
    return answer


def _errors(*statuses: int) -> dict[str, Any]:
    # 401 and 403 only on a node started with --admin-token-file (multiraft/metadata/auth.py);
    # 413 for any body beyond its route's bound (multiraft/http/limits.py), a GET's included.
    return {str(status): _ERROR for status in sorted({400, 401, 403, 413, *statuses})}


def _path(name: str, schema: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True, "schema": schema or {"type": "string"}}


def _query(name: str, schema: dict[str, Any], required: bool = False) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": required, "schema": schema}


_TOPIC = _path("topic", {"type": "string", "pattern": "^[a-zA-Z0-9._-]{1,249}$"})
# Catalog reads: this node's view (default) or, linearizable, after catching up with the metadata leader.
_CONSISTENCY = _query("consistency", {"type": "string", "enum": ["local", "linearizable"], "default": "local"})
_ADDRESS = r"^[A-Za-z0-9.\-\[\]:]{1,255}:[0-9]{1,5}$"


def _config(*, removable: bool, closed: bool = True) -> dict[str, Any]:
    """Topic settings: the keys the node acts on (metadata/commands.py), typed and ranged,
    so the fuzzer's valid cases are valid (an open object made every one a 400).
    `removable`: a PATCH sets a key to null to remove it. A described topic's config
    is not `closed`: a catalog written before unknown keys were refused still replays."""
    properties: dict[str, Any] = {}
    for key, (low, high, unlimited) in sorted(TYPED_CONFIG.items()):
        ranged: dict[str, Any] = {"type": "integer", "minimum": low, "maximum": high}
        properties[key] = {"anyOf": [ranged, {"const": -1}]} if unlimited else ranged
    properties["flush"] = {"type": "string", "pattern": "^(fsync|none|interval_ms=[1-9][0-9]{0,9})$"}
    assert set(properties) == TOPIC_CONFIG_KEYS
    if removable:
        properties = {key: {"anyOf": [schema, {"type": "null"}]} for key, schema in properties.items()}
    return {"type": "object", "properties": properties, **({"additionalProperties": False} if closed else {})}


_CONFIG = _config(removable=False)
_PARTITION = _path("partition", {"type": "integer", "minimum": 0, "maximum": 999_999_999})
_GROUP = _path("group", {"type": "string", "pattern": "^[a-zA-Z0-9._-]{1,249}$"})
_MEMBER = _path("member", {"type": "string", "pattern": "^[a-zA-Z0-9_-]{1,64}$"})
_EPOCH = {"type": "integer", "minimum": 0, "maximum": group_limits.EPOCH_MAX}
_ACKS = {"type": "string", "enum": ["none", "leader", "quorum", "all"]}
_FORMAT = {"type": "string", "enum": ["json", "string", "binary"]}
_BASE64 = confluent_openapi.BASE64


def _records_in(fmt: str, text: dict[str, Any]) -> dict[str, Any]:
    """With `"format": fmt`, keys, values and header values are `text` (or null)."""
    nullable = {"anyOf": [text, {"type": "null"}]}
    return {"if": {"required": ["format"], "properties": {"format": {"const": fmt}}},
            "then": {"properties": {"records": {"items": {"properties": {
                "key": nullable, "value": nullable,
                "headers": {"items": {"properties": {"value": text}}}}}}}}}

_SCHEMAS: dict[str, Any] = {
    "Error": {"type": "object", "required": ["error_code", "message"],
              "properties": {"error_code": {"type": "string"}, "message": {"type": "string"}}},
    "Header": {"type": "object", "required": ["name"], "additionalProperties": False,
               "properties": {"name": {"type": "string"}, "value": {"type": "string"}}},
    "Record": {"type": "object", "additionalProperties": False, "properties": {
        "key": {"type": ["string", "null"]}, "value": {},
        "headers": {"type": "array", "items": {"$ref": "#/components/schemas/Header"}},
        "partition": {"type": "integer", "minimum": 0}, "timestamp": {"type": "integer", "minimum": 0, "maximum": 2**62 - 1}}},
    "ProduceRequest": {"type": "object", "required": ["records"], "additionalProperties": False,
                       "allOf": [_records_in("string", {"type": "string"}), _records_in("binary", _BASE64)],
                       "properties": {
        "format": _FORMAT, "acks": _ACKS,
        "records": {"type": "array", "minItems": 1, "maxItems": RECORDS_PER_REQUEST_MAX,
                    "items": {"$ref": "#/components/schemas/Record"}}}},
    "PartitionProduceRequest": {"allOf": [{"$ref": "#/components/schemas/ProduceRequest"}], "properties": {
        "producer_id": {"type": "integer", "minimum": 0}, "producer_epoch": {"type": "integer", "minimum": 0},
        "base_sequence": {"type": "integer", "minimum": 0}}},
    "Partition": {"type": "object", "properties": {
        "partition": _INT, "group_id": _INT, "leader": _NULLABLE_INT, "replicas": {"type": "array", "items": _INT},
        "leaving": {"type": "array", "items": _INT}, "isr": {"type": ["array", "null"], "items": _INT}, "log_start_offset": _NULLABLE_INT,
        "high_watermark": _NULLABLE_INT, "log_end_offset": _NULLABLE_INT}},
    "Topic": {"type": "object", "properties": {
        "name": {"type": "string"}, "replication_factor": _INT, "config": _config(removable=False, closed=False),
        "partitions": {"type": "array", "items": {"$ref": "#/components/schemas/Partition"}}}},
    "OffsetCommit": {"type": "object", "required": ["topic", "partition", "offset"], "additionalProperties": False,
                     "properties": {
        "topic": {"type": "string", "minLength": 1}, "partition": {"type": "integer", "minimum": 0},
        "offset": {"type": "integer", "minimum": 0, "maximum": 2**63 - 1}, "metadata": {"type": "string"}}},
    "TopicPartitions": {"type": "array", "maxItems": group_limits.OWNED_PARTITIONS_MAX, "items": {
        "type": "object", "required": ["topic", "partitions"], "additionalProperties": False, "properties": {
            "topic": {"type": "string", "pattern": "^[a-zA-Z0-9._-]{1,249}$"},
            "partitions": {"type": "array", "uniqueItems": True, "items": {"type": "integer", "minimum": 0,
                                                        "maximum": group_limits.PARTITION_MAX}}}}},
    "Member": {"type": "object", "required": ["group", "member_id", "member_epoch", "group_epoch", "assignment",
                                              "revoking", "pending", "state", "session_timeout_ms"], "properties": {
        "group": {"type": "string"}, "member_id": {"type": "string"}, "member_epoch": _INT, "group_epoch": _INT,
        "session_timeout_ms": _INT, "state": {"type": "string", "enum": ["stable", "revoking", "assigning"]},
        "assignment": {"$ref": "#/components/schemas/TopicPartitions"},
        "revoking": {"$ref": "#/components/schemas/TopicPartitions"},
        "pending": {"$ref": "#/components/schemas/TopicPartitions"}}},
}

_CREATE_TOPIC = {"type": "object", "required": ["name"], "additionalProperties": False, "properties": {
    "name": {"type": "string", "pattern": "^[a-zA-Z0-9._-]{1,249}$"},
    "partitions": {"type": "integer", "minimum": 1, "maximum": PARTITIONS_MAX},
    "replication_factor": {"type": "integer", "minimum": 1, "maximum": REPLICATION_FACTOR_MAX},
    "config": _CONFIG}}

# A subscription names topics or a topic_pattern, exactly one (null stands for absent).
_JOIN = {"type": "object", "additionalProperties": False, "oneOf": [
    {"required": ["topics"], "properties": {"topics": {"type": "array"}}},
    {"required": ["topic_pattern"], "properties": {"topic_pattern": {"type": "string"}}}], "properties": {
    "member_id": {"type": ["string", "null"], "pattern": "^[a-zA-Z0-9_-]{1,64}$"},  # null: a new member
    "topics": {"type": ["array", "null"], "minItems": 1, "maxItems": group_limits.SUBSCRIBED_TOPICS_MAX,
               "items": {"type": "string", "pattern": "^[a-zA-Z0-9._-]{1,249}$"}},
    "topic_pattern": {"type": ["string", "null"], "pattern": "^[a-zA-Z0-9._*?-]{1,249}$"},
    "rebalance_timeout_ms": {"type": "integer", "minimum": group_limits.REBALANCE_TIMEOUT_MS_MIN,
                             "maximum": group_limits.REBALANCE_TIMEOUT_MS_MAX},
    "session_timeout_ms": {"type": ["integer", "null"], "minimum": group_limits.SESSION_TIMEOUT_MS_MIN,
                           "maximum": group_limits.SESSION_TIMEOUT_MS_MAX},
    "assignor": {"type": "string", "enum": list(ASSIGNORS)}}}
_FETCH = {"type": "object", "required": ["member_epoch"], "additionalProperties": False, "properties": {
    "member_epoch": _EPOCH,
    "positions": {"type": "array", "maxItems": group_limits.OWNED_PARTITIONS_MAX, "items": {
        "type": "object", "required": ["topic", "partition", "offset"], "additionalProperties": False, "properties": {
            "topic": {"type": "string", "pattern": "^[a-zA-Z0-9._-]{1,249}$"},
            "partition": {"type": "integer", "minimum": 0, "maximum": group_limits.PARTITION_MAX},
            "offset": {"type": "integer", "minimum": 0, "maximum": 2**63 - 1}}}},
    "auto_offset_reset": {"type": "string", "enum": list(RESETS)},
    "max_records": {"type": "integer", "minimum": 1, "maximum": MAX_RECORDS_MAX},
    "max_bytes": {"type": "integer", "minimum": 1, "maximum": MAX_BYTES_MAX},
    "wait_ms": {"type": "integer", "minimum": 0, "maximum": WAIT_MS_MAX},
    "format": _FORMAT}}

# `value` per strategy (multiraft/consumer_groups/resets.py): required, in its range, by those
# that need one (offset, timestamp, shift); absent or null for earliest and latest.
_RESET_VALUE = [{"properties": {"strategy": {"enum": [s.value for s in ResetStrategy if s not in RESET_VALUE_RANGES]},
                                "value": {"type": "null"}}},
                *({"required": ["value"], "properties": {"strategy": {"const": strategy.value},
                                                         "value": {"type": "integer", "minimum": low, "maximum": high}}}
                  for strategy, (low, high) in RESET_VALUE_RANGES.items())]
_RESET = {"type": "object", "required": ["strategy", "topics"], "additionalProperties": False,
          "oneOf": _RESET_VALUE, "properties": {
    "strategy": {"type": "string", "enum": [s.value for s in ResetStrategy]},
    "value": {"type": ["integer", "null"], "minimum": -(2**63 - 1), "maximum": 2**63 - 1},
    "topics": {"type": "array", "minItems": 1, "maxItems": RESET_TOPICS_MAX, "items": {
        "type": "object", "required": ["topic"], "additionalProperties": False, "properties": {
            "topic": {"type": "string", "pattern": "^[a-zA-Z0-9._-]{1,249}$"},
            "partitions": {"type": ["array", "null"], "minItems": 1, "maxItems": RESET_PARTITIONS_MAX, "uniqueItems": True,
                           "items": {"type": "integer", "minimum": 0, "maximum": group_limits.PARTITION_MAX}}}}},
    "execute": {"type": "boolean"}}}

_PATHS: dict[str, Any] = {
    "/v1/health": {"get": {
        "summary": "liveness; with ready=cluster, readiness: a metadata leader known and every known node live",
        "parameters": [_query("ready", {"type": "string", "enum": ["cluster"]})],
        "responses": {"200": _ok("ok (and, with ready, ready)", {
            "type": "object", "required": ["status", "node_id", "registered"],
            "properties": {"status": {"const": "ok"}, "node_id": _INT, "registered": {"type": "boolean"},
                           "feature_level": {"type": "object", "required": ["supported", "finalized", "unsupported"],
                                             "properties": {"supported": _INT, "finalized": _INT,
                                                            "unsupported": {"type": "boolean"}}},
                           "ready": {"type": "string"}, "metadata_leader": _INT,
                           "nodes": {"type": "array", "items": _INT}}}),
                      "400": _ERROR, "503": _ERROR}}},
    "/v1/cluster": {"get": {"summary": "nodes and the metadata group", "parameters": [_CONSISTENCY], "responses": {
        "200": _ok("the cluster as this node sees it", {"type": "object"}), **_errors(421, 503, 504)}}},
    "/v1/topics": {
        "get": {"summary": "list topics", "parameters": [_CONSISTENCY],
                "responses": {"200": _ok("topics", {"type": "object"}), **_errors(421, 503, 504)}},
        "post": {"summary": "create a topic", "requestBody": {"required": True, **_json(_CREATE_TOPIC)},
                 "responses": {"201": _ok("created", {"$ref": "#/components/schemas/Topic"}),
                               **_errors(409, 415, 503, 504)}},
    },
    "/v1/topics/{topic}": {
        "parameters": [_TOPIC],
        "get": {"summary": "describe a topic", "parameters": [_CONSISTENCY], "responses": {
            "200": _ok("the topic", {"$ref": "#/components/schemas/Topic"}), **_errors(404, 421, 503, 504)}},
        "patch": {"summary": "set (a value) or remove (null) topic settings",
                  "requestBody": {"required": True, **_json({
                      "type": "object", "required": ["config"], "additionalProperties": False,
                      "properties": {"config": {**_config(removable=True), "minProperties": 1}}})},
                  "responses": {"200": _ok("the topic", {"$ref": "#/components/schemas/Topic"}),
                                **_errors(404, 415, 503, 504)}},
        "delete": {"summary": "delete a topic", "responses": {"204": _ok("deleted"), **_errors(404, 503, 504)}},
    },
    "/v1/topics/{topic}/records": {
        "parameters": [_TOPIC],
        "post": {"summary": "produce records, partitioned by key (murmur2) or round-robin",
                 "parameters": [_query("forward", {"type": "string", "enum": ["true", "false"]})],
                 "requestBody": {"required": True, **_json({"$ref": "#/components/schemas/ProduceRequest"})},
                 "responses": {"200": _ok("offsets in request order", {"type": "object"}),
                               **_errors(404, 413, 415, 421, 503, 504)}},
    },
    "/v1/topics/{topic}/partitions/{partition}/records": {
        "parameters": [_TOPIC, _PARTITION],
        "post": {
            "summary": "produce to one partition: JSON records or a binary batch",
            "parameters": [_query("acks", _ACKS), _query("forward", {"type": "string", "enum": ["true", "false"]})],
            "requestBody": {"required": True, "content": {
                "application/json": {"schema": {"$ref": "#/components/schemas/PartitionProduceRequest"}},
                BATCH_CONTENT_TYPE: {"schema": {"type": "string", "format": "binary"}}}},
            "responses": {"200": _ok("the batch's offsets", {"type": "object"}),
                          **_errors(404, 409, 413, 415, 421, 503, 504)},
        },
        "get": {
            "summary": "consume records from any replica",
            "parameters": [
                _query("offset", {"type": "integer", "minimum": 0, "maximum": 2**63 - 1}, required=True),
                _query("max_records", {"type": "integer", "minimum": 1, "maximum": MAX_RECORDS_MAX}),
                _query("max_bytes", {"type": "integer", "minimum": 1, "maximum": MAX_BYTES_MAX}),
                _query("wait_ms", {"type": "integer", "minimum": 0, "maximum": WAIT_MS_MAX}),
                _query("isolation", {"type": "string", "enum": ["committed", "uncommitted"]}),
                _query("format", _FORMAT),
            ],
            "responses": {"200": {"description": "records (JSON) or framed stored batches (binary)", "content": {
                "application/json": {"schema": {"type": "object"}},
                BATCH_CONTENT_TYPE: {"schema": {"type": "string", "format": "binary"}}}},
                **_errors(404, 416, 503, 504)},
        },
    },
    "/v1/producers": {"post": {"summary": "allocate an idempotent producer id", "responses": {
        "200": _ok("producer id and epoch", {"type": "object"}), **_errors(503, 504)}}},
    "/v1/groups/{group}/offsets": {
        "parameters": [_GROUP],
        "post": {"summary": "commit consumer group offsets: as a member (member_id, member_epoch: refused when "
                            "fenced or for a partition it does not own), without one (only while the group has "
                            "no members), or as an admin reset", "requestBody": {"required": True, **_json({
            "type": "object", "required": ["offsets"], "additionalProperties": False,
            "dependentRequired": {"member_id": ["member_epoch"]}, "properties": {
                "offsets": {"type": "array", "minItems": 1, "maxItems": GROUP_COMMITS_PER_REQUEST_MAX,
                            "items": {"$ref": "#/components/schemas/OffsetCommit"}},
                "member_id": {"type": "string", "pattern": "^[a-zA-Z0-9_-]{1,64}$"}, "member_epoch": _EPOCH,
                "admin_reset": {"type": "boolean"}}})},
            "responses": {"200": _ok("committed", {"type": "object"}), **_errors(404, 409, 416, 421, 503, 504)}},
        "get": {"summary": "committed offsets of a group for a topic",
                "parameters": [_query("topic", {"type": "string", "minLength": 1}, required=True)],
                "responses": {"200": _ok("offsets", {"type": "object"}), **_errors(404, 503, 504)}},
    },
    "/v1/groups/{group}/offsets/reset": {
        "parameters": [_GROUP],
        "post": {"summary": "reset a group's committed offsets (as kafka-consumer-groups --reset-offsets): to the "
                            "earliest or latest offset, an offset, a time (ms) or shifted by N, clamped to the log; "
                            "only while the group has no members; a dry run unless execute is true (admin)",
                 "requestBody": {"required": True, **_json(_RESET)},
                 "responses": {"200": _ok("the plan (and whether it was written)", {
                     "type": "object", "required": ["group", "executed", "offsets"]}),
                               **_errors(404, 409, 415, 416, 421, 503, 504)}},
    },
    "/v1/groups": {"get": {"summary": "consumer groups with members", "responses": {
        "200": _ok("groups", {"type": "object", "required": ["groups"]}), **_errors(421, 503, 504)}}},
    "/v1/groups/{group}/members": {
        "parameters": [_GROUP],
        "post": {"summary": "join a consumer group with a subscription (topics or a glob topic_pattern); the "
                            "answer names the member id, its epoch and what it owns",
                 "requestBody": {"required": True, **_json(_JOIN)},
                 "responses": {"200": _ok("the member", {"$ref": "#/components/schemas/Member"}),
                               **_errors(404, 409, 415, 421, 503, 504)}},
    },
    "/v1/groups/{group}/members/{member}/heartbeat": {
        "parameters": [_GROUP, _MEMBER],
        "post": {"summary": "keep a member alive and report what it owns (acknowledges revocations); the answer "
                            "says what it owns now, what to give back and what is still coming",
                 "requestBody": {"required": True, **_json({
                     "type": "object", "required": ["member_epoch"], "additionalProperties": False, "properties": {
                         "member_epoch": _EPOCH, "owned": {"$ref": "#/components/schemas/TopicPartitions"}}})},
                 "responses": {"200": _ok("the member", {"$ref": "#/components/schemas/Member"}),
                               **_errors(404, 409, 415, 421, 503, 504)}},
    },
    "/v1/groups/{group}/members/{member}/records": {
        "parameters": [_GROUP, _MEMBER],
        "post": {"summary": "fetch records of the member's partitions (from its positions, else the committed "
                            "offsets, else auto_offset_reset); keeps the member alive",
                 "requestBody": {"required": True, **_json(_FETCH)},
                 "responses": {"200": {
                     "description": "records, positions, per-partition errors and the member (JSON); or, with "
                                    "Accept: application/vnd.raftlog.batch, a u32 length, that much JSON (member, "
                                    "positions, errors, batches) and the stored batches' bytes",
                     "content": {"application/json": {"schema": {
                         "type": "object", "required": ["member", "records", "positions", "errors"]}},
                         BATCH_CONTENT_TYPE: {"schema": {"type": "string", "format": "binary"}}}},
                               **_errors(404, 409, 415, 421, 503, 504)}},
    },
    "/v1/groups/{group}/members/{member}": {
        "parameters": [_GROUP, _MEMBER],
        "delete": {"summary": "leave the group: the member's partitions go to the others at once",
                   "parameters": [_query("member_epoch", _EPOCH, required=True)],
                   "responses": {"204": _ok("left"), **_errors(404, 409, 421, 503, 504)}},
    },
    "/v1/groups/{group}": {
        "parameters": [_GROUP],
        "get": {"summary": "describe a consumer group: members, assignment, committed offsets and lag (in records "
                           "and seconds); topic: also these topics, which describe a group without members too",
                "parameters": [{"name": "topic", "in": "query", "required": False, "style": "form", "explode": True,
                                "schema": {"type": "array", "maxItems": group_limits.SUBSCRIBED_TOPICS_MAX,
                                           "items": {"type": "string", "pattern": "^[a-zA-Z0-9._-]{1,249}$"}}}],
                "responses": {"200": _ok("the group", {"type": "object", "required": ["group", "members",
                                                                                       "partitions"]}),
                              **_errors(404, 421, 503, 504)}},
        "delete": {"summary": "delete a consumer group without members: its committed offsets in every "
                              "partition (admin)",
                   "responses": {"204": _ok("deleted"), **_errors(404, 409, 421, 503, 504)}},
    },
    "/v1/admin/leadership/balance": {"post": {
        "summary": "one balancing round on every node now (leadership goes to each partition's first replica; "
                   "a node above its share hands partitions that cannot go home to nodes below it)",
        "responses": {"200": _ok("transfers started, by node (-1: node not reached)", {
            "type": "object", "required": ["transfers_started", "by_node"],
            "properties": {"transfers_started": {"type": "integer", "minimum": 0},
                           "by_node": {"type": "object", "additionalProperties": {"type": "integer"}}}}),
                      **_errors(504)}}},
    "/v1/admin/verify": {"post": {
        "summary": "compare partitions' replicas with their leaders by tictac trees (the scrubber, admin): "
                   "each identical, behind, different (offset ranges; the follower's self-repair started), "
                   "leader_damaged or unreachable; at most 16 partitions a call, next_start goes on",
        "requestBody": {"required": False, **_json({
            "type": "object", "additionalProperties": False,
            "properties": {"topics": {"type": ["array", "null"], "minItems": 1, "maxItems": 100,
                                      "description": "absent or null: every topic",
                                      "items": {"type": "string", "pattern": "^[a-zA-Z0-9._-]{1,249}$"}},
                           "start": {"type": "integer", "minimum": 0,
                                     "description": "past the partitions asked for: 416"},
                           "deep": {"type": "boolean", "description": "true (the default): every replica reads "
                                    "its closed segments again (finds rot); false: closed segments count by their "
                                    "tree sidecars, only the open segment and the span's edges are read (fast)"}}})},
        "responses": {"200": _ok("per partition, what its replicas' trees showed", {
            "type": "object", "required": ["partitions", "total", "verified", "next_start", "all_identical"],
            "properties": {"partitions": {"type": "array", "items": {"type": "object", "required": [
                               "topic", "partition", "status", "ranges", "repair_started", "replicas"]}},
                           "total": {"type": "integer", "minimum": 0},
                           "verified": {"type": "integer", "minimum": 0},
                           "next_start": {"type": ["integer", "null"]},
                           "all_identical": {"type": "boolean"}}}),
                      **_errors(400, 404, 415, 416, 504)}}},
    "/v1/admin/scrub": {"get": {
        "summary": "this node's scheduled scrubs (admin): each partition it leads deep-verified once per "
                   "scrub_interval_s, one at a time, within scrub_bytes_per_s; verdicts counted, the latest "
                   "that were not identical (at most 64), node-local: ask each node",
        "responses": {"200": _ok("the schedule and what it found", {
            "type": "object", "required": ["node", "interval_s", "bytes_per_s", "partitions_scheduled", "next_due_ms",
                                           "running", "verdicts", "skipped", "differing_ranges", "repairs_started",
                                           "bytes_hashed", "latest_not_identical"],
            "properties": {"node": {"type": "integer", "minimum": 1},
                           "interval_s": {"type": ["integer", "null"], "description": "null: off"},
                           "bytes_per_s": {"type": "integer", "minimum": 0},
                           "partitions_scheduled": {"type": "integer", "minimum": 0},
                           "next_due_ms": {"type": ["integer", "null"]},
                           "running": {"type": ["object", "null"], "required": ["topic", "partition", "started_ms"]},
                           "verdicts": {"type": "object", "additionalProperties": {"type": "integer", "minimum": 0}},
                           "skipped": {"type": "integer", "minimum": 0,
                                       "description": "cut short by a leadership change: not a verdict"},
                           "differing_ranges": {"type": "integer", "minimum": 0},
                           "repairs_started": {"type": "integer", "minimum": 0},
                           "bytes_hashed": {"type": "integer", "minimum": 0},
                           "latest_not_identical": {"type": "array", "maxItems": 64, "items": {
                               "type": "object", "required": ["at_ms", "seconds", "topic", "partition", "status",
                                                              "ranges", "repair_started", "replicas"]}}}}),
                      **_errors()}}},
    "/v1/admin/nodes": {"post": {
        "summary": "admit a node started with --join (registers it, adds it as a metadata learner); the body is "
                   "signed with the cluster secret (Raftlog-Timestamp, Raftlog-Signature), else 403",
        "requestBody": {"required": True, **_json({"type": "object", "required": ["node_id", "raft_addr", "http_addr"],
                                                   "properties": {"node_id": {"type": "integer", "minimum": 1},
                                                                  "raft_addr": {"type": "string", "pattern": _ADDRESS},
                                                                  "http_addr": {"type": "string", "pattern": _ADDRESS},
                                                                  "rack": {"type": ["string", "null"]}}})},
        "responses": {"200": _ok("the raft addresses of the registered nodes",
                                 {"type": "object", "properties": {"nodes": {"type": "object"}}}),
                      "400": _ERROR, "403": _ERROR, "421": _ERROR, "503": _ERROR, "504": _ERROR}}},
    "/v1/admin/tokens": {
        "post": {"summary": "make a bearer token (its value is in this answer only; an existing name is replaced)",
                 "requestBody": {"required": True, **_json({
                     "type": "object", "required": ["name", "rights"], "additionalProperties": False,
                     "properties": {"name": {"type": "string", "pattern": "^[a-zA-Z0-9._-]{1,64}$"},
                                    "rights": {"type": "array", "minItems": 1, "maxItems": 100, "items": {
                                        "type": "string",
                                        "pattern": "^(admin|(read|write):(\\*|[a-zA-Z0-9._-]{1,249}))$"}}}})},
                 "responses": {"201": _ok("the token", {"type": "object", "required": ["name", "rights", "token"]}),
                               **_errors(415, 503, 504)}},
        "get": {"summary": "the tokens' names and rights (never their values)",
                "responses": {"200": _ok("tokens", {"type": "object"}), **_errors()}},
    },
    "/v1/admin/tokens/{name}": {
        "parameters": [_path("name", {"type": "string", "pattern": "^[a-zA-Z0-9._-]{1,64}$"})],
        "delete": {"summary": "delete a token", "responses": {"204": _ok("deleted"), **_errors(404, 503, 504)}},
    },
    "/v1/openapi.json": {"get": {"summary": "this document", "responses": {"200": _ok("OpenAPI 3",
                                                                                    {"type": "object"})}}},
    "/metrics": {"get": {"summary": "Prometheus metrics", "responses": {"200": {
        "description": "Prometheus text", "content": {"text/plain": {"schema": {"type": "string"}}}}}}},
    "/ui": {"get": {"summary": "the cluster page (HTML, this node's view, reloads itself)", "responses": {"200": {
        "description": "an HTML page", "content": {"text/html": {"schema": {"type": "string"}}}}}}},
}


def openapi_document() -> dict[str, Any]:
    return {
        "openapi": "3.1.0",
        "info": {"title": "raftlog", "version": "1", "description": "A replicated, partitioned message log."},
        "paths": {**_PATHS, **live_ops_openapi.PATHS, **features_openapi.PATHS, **mirror_openapi.PATHS,
                  **confluent_openapi.PATHS},
        "security": [{"bearer": []}, {}],  # a token only where the node requires one
        "components": {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
                       "schemas": {**_SCHEMAS, **confluent_openapi.SCHEMAS}, "responses": {"Error": {
            "description": "every error: {error_code, message}",
            **_json({"$ref": "#/components/schemas/Error"})}, **confluent_openapi.RESPONSES}},
    }
