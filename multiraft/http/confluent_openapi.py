"""The Confluent REST v2 dialect's part of the OpenAPI document (merged by openapi.py).

Its own media types (`application/vnd.kafka...+json`), its own error shape (an integer
`error_code`, multiraft/http/confluent_errors.py), and every route of it, so the
schemathesis pass (tests/http/test_fuzz.py) fuzzes the dialect like the rest.
"""

from __future__ import annotations

from typing import Any

from multiraft.http.confluent_errors import BINARY_V2, JSON_V2, V2_JSON
from multiraft.http.handlers.confluent_common import PARTITIONS_PER_REQUEST_MAX
from multiraft.node.api import MAX_BYTES_MAX, group_limits

_ERROR = {"$ref": "#/components/responses/ConfluentError"}
_INT = {"type": "integer"}
_NAME = {"type": "string", "pattern": "^[a-zA-Z0-9._-]{1,249}$"}
_TOPIC = {"name": "topic", "in": "path", "required": True, "schema": _NAME}
_PARTITION = {"name": "partition", "in": "path", "required": True,
              "schema": {"type": "integer", "minimum": 0, "maximum": 999_999_999}}
_GROUP = {"name": "group", "in": "path", "required": True, "schema": _NAME}
_INSTANCE = {"name": "instance", "in": "path", "required": True,
             "schema": {"type": "string", "pattern": "^[a-zA-Z0-9_-]{1,64}$"}}
_TP = {"type": "object", "required": ["topic", "partition"], "additionalProperties": False,
       "properties": {"topic": _NAME, "partition": {"type": "integer", "minimum": 0}}}
_TP_OFFSET = {"type": "object", "required": ["topic", "partition", "offset"], "additionalProperties": False,
              "properties": {"topic": _NAME, "partition": {"type": "integer", "minimum": 0},
                             "offset": {"type": "integer", "minimum": 0, "maximum": 2**63 - 2},
                             "metadata": {"type": ["string", "null"]}}}
_PARTITIONS_BODY = {"type": "object", "required": ["partitions"], "additionalProperties": False,
                    "properties": {"partitions": {"type": "array", "maxItems": PARTITIONS_PER_REQUEST_MAX,
                                                  "items": _TP}}}
_OFFSETS = {"type": "array", "maxItems": PARTITIONS_PER_REQUEST_MAX, "items": _TP_OFFSET}
_OFFSETS_BODY = {"type": "object", "required": ["offsets"], "additionalProperties": False,
                 "properties": {"offsets": _OFFSETS}}
# A commit's body may leave `offsets` out: then every position is committed (Confluent's empty body).
_COMMIT_BODY = {"type": "object", "additionalProperties": False, "properties": {"offsets": _OFFSETS}}
# A record's partition: absent or null, the key's (else round-robin); beyond the topic's, 404 40402.
_RECORD_PARTITION = {"type": ["integer", "null"], "minimum": 0}
_RECORD = {"type": "object", "additionalProperties": False, "properties": {
    "key": {}, "value": {}, "partition": _RECORD_PARTITION}}
_PRODUCE = {"type": "object", "required": ["records"], "additionalProperties": False, "properties": {
    "records": {"type": "array", "minItems": 1, "items": _RECORD}}}
# Binary keys and values are base64 (standard alphabet, padded), as the server decodes them.
BASE64 = {"type": "string", "pattern": "^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"}
_NULLABLE_BASE64 = {"anyOf": [BASE64, {"type": "null"}]}
_BINARY_RECORD = {"type": "object", "additionalProperties": False, "properties": {
    "key": _NULLABLE_BASE64, "value": _NULLABLE_BASE64, "partition": _RECORD_PARTITION}}
_PRODUCE_BINARY = {**_PRODUCE, "properties": {"records": {"type": "array", "minItems": 1, "items": _BINARY_RECORD}}}


def _same_length(low: str, high: str) -> list[str]:
    """Regex alternatives for the decimal numbers low..high, both of one length."""
    if low == high:
        return [low]
    if low == "0" * len(low) and high == "9" * len(high):
        return ["[0-9]" * len(low)]
    if low[0] == high[0]:
        return [low[0] + rest for rest in _same_length(low[1:], high[1:])]
    tail = len(low) - 1
    middle = [f"[{int(low[0]) + 1}-{int(high[0]) - 1}]" + "[0-9]" * tail] if int(high[0]) - int(low[0]) > 1 else []
    return ([low[0] + rest for rest in _same_length(low[1:], "9" * tail)] + middle
            + [high[0] + rest for rest in _same_length("0" * tail, high[1:])])


def _int_setting(low: int, high: int) -> dict[str, Any]:
    """A creation setting that is an integer in low..high, or (as Confluent's clients send
    them) its decimal digits as a string: at most 9 of them, leading zeros allowed."""
    alternatives = [part for length in range(len(str(low)), len(str(high)) + 1)
                    for part in _same_length(str(max(low, 10 ** (length - 1) if length > 1 else 0)),
                                             str(min(high, 10 ** length - 1)))]
    digits = {"type": "string", "maxLength": 9, "pattern": f"^0*(?:{'|'.join(alternatives)})$"}
    return {"anyOf": [{"type": "integer", "minimum": low, "maximum": high}, digits]}


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": [schema, {"type": "null"}]}


# Every setting may be null: the default (a random name for name and id).
_CREATE = {"type": "object", "additionalProperties": False, "properties": {name: _nullable(schema) for name, schema in {
    "name": {"type": "string", "pattern": "^[a-zA-Z0-9_-]{1,64}$"},
    "id": {"type": "string", "pattern": "^[a-zA-Z0-9_-]{1,64}$", "description": "kafka-rest's alias of name"},
    "format": {"type": "string", "pattern": "^(?i:binary|json)$", "description": "binary or json, any case"},
    "auto.offset.reset": {"type": "string", "enum": ["earliest", "latest"]},
    "auto.commit.enable": {"anyOf": [{"type": "boolean"}, {"type": "string", "pattern": "^(?i:true|false)$"}]},
    "fetch.min.bytes": {"anyOf": [{"type": "integer"}, {"type": "string", "pattern": "^[0-9]{1,9}$"}],
                        "description": "an integer, or its decimal digits as a string; accepted, not used"},
    "consumer.request.timeout.ms": _int_setting(0, group_limits.REQUEST_TIMEOUT_MS_MAX),
    "consumer.instance.timeout.ms": _int_setting(group_limits.SESSION_TIMEOUT_MS_MIN,
                                                 group_limits.SESSION_TIMEOUT_MS_MAX)}.items()}}
_SUBSCRIBE = {"type": "object", "additionalProperties": False, "oneOf": [
    {"required": ["topics"]}, {"required": ["topic_pattern"]}], "properties": {
    "topics": {"type": "array", "minItems": 1, "maxItems": group_limits.SUBSCRIBED_TOPICS_MAX, "items": _NAME},
    "topic_pattern": {"type": "string", "pattern": "^[a-zA-Z0-9._*?-]{1,249}$"}}}
_CONFLUENT_PARTITION = {"type": "object", "required": ["partition", "leader", "replicas"], "properties": {
    "partition": _INT, "leader": _INT, "replicas": {"type": "array", "items": {
        "type": "object", "properties": {"broker": _INT, "leader": {"type": "boolean"},
                                         "in_sync": {"type": "boolean"}}}}}}
_CONSUMED = {"type": "array", "items": {"type": "object", "required": ["topic", "key", "value", "partition",
                                                                      "offset"]}}

SCHEMAS: dict[str, Any] = {
    "ConfluentError": {"type": "object", "required": ["error_code", "message"],
                       "properties": {"error_code": {"type": "integer"}, "message": {"type": "string"}}},
}
RESPONSES: dict[str, Any] = {
    "ConfluentError": {"description": "every error of the dialect: {error_code (an integer), message}",
                       "content": {V2_JSON: {"schema": {"$ref": "#/components/schemas/ConfluentError"}}}},
}


def _body(schema: dict[str, Any], types: tuple[str, ...] = (V2_JSON, "application/json"),
          required: bool = True) -> dict[str, Any]:
    return {"required": required, "content": {t: {"schema": schema} for t in types}}


def _ok(description: str, schema: dict[str, Any] | None = None, content_type: str = V2_JSON) -> dict[str, Any]:
    answer: dict[str, Any] = {"description": description}
    if schema is not None:
        answer["content"] = {content_type: {"schema": schema}}
    return answer


def _errors(*statuses: int) -> dict[str, Any]:
    # 401/403 with tokens on; 406 for an Accept it cannot answer; 415/422 for bodies; 5xx from the cluster.
    return {str(s): _ERROR for s in sorted({401, 403, 406, 415, 422, 503, 504, *statuses})}


_NO_CONTENT = {"204": _ok("done")}


def _instance(suffix: str) -> str:
    return "/consumers/{group}/instances/{instance}" + suffix


PATHS: dict[str, Any] = {
    "/topics": {"get": {"summary": "[Confluent v2] topic names", "responses": {
        "200": _ok("names", {"type": "array", "items": {"type": "string"}}), **_errors()}}},
    "/topics/{topic}": {
        "parameters": [_TOPIC],
        "get": {"summary": "[Confluent v2] a topic: configs and partitions", "responses": {
            "200": _ok("the topic", {"type": "object", "required": ["name", "configs", "partitions"]}),
            **_errors(404)}},
        "post": {"summary": "[Confluent v2] produce records (partition, else murmur2 of the key, else round-robin)",
                 "requestBody": {"required": True, "content": {
                     JSON_V2: {"schema": _PRODUCE}, BINARY_V2: {"schema": _PRODUCE_BINARY}}},
                 "responses": {"200": _ok("offsets in request order, or a per-record error_code", {
                     "type": "object", "required": ["key_schema_id", "value_schema_id", "offsets"]}),
                     **_errors(404, 413)}},
    },
    "/topics/{topic}/partitions": {"parameters": [_TOPIC], "get": {
        "summary": "[Confluent v2] a topic's partitions", "responses": {
            "200": _ok("partitions", {"type": "array", "items": _CONFLUENT_PARTITION}), **_errors(404)}}},
    "/topics/{topic}/partitions/{partition}": {
        "parameters": [_TOPIC, _PARTITION],
        "get": {"summary": "[Confluent v2] one partition", "responses": {
            "200": _ok("the partition", _CONFLUENT_PARTITION), **_errors(404)}},
        "post": {"summary": "[Confluent v2] produce records to one partition",
                 "requestBody": {"required": True, "content": {
                     JSON_V2: {"schema": _PRODUCE}, BINARY_V2: {"schema": _PRODUCE_BINARY}}},
                 "responses": {"200": _ok("offsets", {"type": "object", "required": ["offsets"]}),
                               **_errors(404, 413)}},
    },
    "/topics/{topic}/partitions/{partition}/offsets": {"parameters": [_TOPIC, _PARTITION], "get": {
        "summary": "[Confluent v2] the log start and the high watermark", "responses": {
            "200": _ok("offsets", {"type": "object", "required": ["beginning_offset", "end_offset"],
                                   "properties": {"beginning_offset": _INT, "end_offset": _INT}}),
            **_errors(404)}}},
    "/brokers": {"get": {"summary": "[Confluent v2] the node ids", "responses": {
        "200": _ok("brokers", {"type": "object", "required": ["brokers"]}), **_errors()}}},
    "/consumers/{group}": {"parameters": [_GROUP], "post": {
        "summary": "[Confluent v2] create a consumer instance (a member of the group, served by every node)",
        "requestBody": _body(_CREATE, required=False),
        "responses": {"200": _ok("the instance", {"type": "object", "required": ["instance_id", "base_uri"]}),
                      **_errors(409)}}},
    _instance(""): {"parameters": [_GROUP, _INSTANCE], "delete": {
        "summary": "[Confluent v2] delete the instance (its partitions go to the others at once)",
        "responses": {**_NO_CONTENT, **_errors(404, 409)}}},
    _instance("/subscription"): {
        "parameters": [_GROUP, _INSTANCE],
        "post": {"summary": "[Confluent v2] subscribe to topics or a glob topic_pattern",
                 "requestBody": _body(_SUBSCRIBE), "responses": {**_NO_CONTENT, **_errors(404, 409)}},
        "get": {"summary": "[Confluent v2] the subscribed topics", "responses": {
            "200": _ok("topics", {"type": "object", "required": ["topics"]}), **_errors(404)}},
        "delete": {"summary": "[Confluent v2] unsubscribe", "responses": {**_NO_CONTENT, **_errors(404, 409)}},
    },
    _instance("/assignments"): {
        "parameters": [_GROUP, _INSTANCE],
        "post": {"summary": "[Confluent v2] assign partitions by hand", "requestBody": _body(_PARTITIONS_BODY),
                 "responses": {**_NO_CONTENT, **_errors(404, 409)}},
        "get": {"summary": "[Confluent v2] the partitions it reads now", "responses": {
            "200": _ok("partitions", {"type": "object", "required": ["partitions"]}), **_errors(404)}},
    },
    _instance("/positions"): {"parameters": [_GROUP, _INSTANCE], "post": {
        "summary": "[Confluent v2] seek: read these partitions from these offsets next",
        "requestBody": _body(_OFFSETS_BODY), "responses": {**_NO_CONTENT, **_errors(404, 409)}}},
    _instance("/positions/beginning"): {"parameters": [_GROUP, _INSTANCE], "post": {
        "summary": "[Confluent v2] seek to the log start", "requestBody": _body(_PARTITIONS_BODY),
        "responses": {**_NO_CONTENT, **_errors(404, 409)}}},
    _instance("/positions/end"): {"parameters": [_GROUP, _INSTANCE], "post": {
        "summary": "[Confluent v2] seek to the high watermark", "requestBody": _body(_PARTITIONS_BODY),
        "responses": {**_NO_CONTENT, **_errors(404, 409)}}},
    _instance("/records"): {"parameters": [_GROUP, _INSTANCE], "get": {
        "summary": "[Confluent v2] records from the instance's partitions (Accept: its embedded format)",
        "parameters": [
            {"name": "timeout", "in": "query", "schema": {"type": "integer"},
             "description": "ms; 0 or less: the instance's consumer.request.timeout.ms; at most "
                            f"{group_limits.REQUEST_TIMEOUT_MS_MAX} (more is clamped)"},
            {"name": "max_bytes", "in": "query", "schema": {"type": "integer"},
             "description": f"0 or less: the default; at most {MAX_BYTES_MAX} (more is clamped)"}],
        "responses": {"200": {"description": "records", "content": {
            JSON_V2: {"schema": _CONSUMED}, BINARY_V2: {"schema": _CONSUMED}}}, **_errors(404, 409)}}},
    _instance("/offsets"): {
        "parameters": [_GROUP, _INSTANCE],
        "post": {"summary": "[Confluent v2] commit the offsets of records consumed, or (no body) every position",
                 "requestBody": _body(_COMMIT_BODY, required=False),
                 "responses": {**_NO_CONTENT, **_errors(404, 409)}},
        "get": {"summary": "[Confluent v2] the group's committed offsets of the partitions in the body",
                "requestBody": _body(_PARTITIONS_BODY), "responses": {
                    "200": _ok("offsets", {"type": "object", "required": ["offsets"]}), **_errors(404)}},
    },
}
