"""The OpenAPI paths of the live operations (issue 25): more partitions, drain and undrain,
decommission and recommission.

Kept apart from openapi.py's table (which merges them) so the routes and their
document change together in one small module; `app.ROUTES` and the merged
document are still checked against each other by tests/http/test_openapi.py.
"""

from __future__ import annotations

from typing import Any

from multiraft.metadata.commands import PARTITIONS_MAX
from multiraft.node.api import REPLICA_MOVE_BYTES_PER_S_MAX

_ERROR = {"$ref": "#/components/responses/Error"}
_TOPIC = {"name": "topic", "in": "path", "required": True,
          "schema": {"type": "string", "pattern": "^[a-zA-Z0-9._-]{1,249}$"}}
_NODE = {"name": "node", "in": "path", "required": True,
         "schema": {"type": "integer", "minimum": 1, "maximum": 2**31 - 1}}


def _errors(*statuses: int) -> dict[str, Any]:
    # 401 and 403 only on a node started with --admin-token-file (multiraft/metadata/auth.py).
    return {str(status): _ERROR for status in sorted({400, 401, 403, *statuses})}


_DRAIN_STATUS = {"type": "object", "required": ["node_id", "drained", "partitions_led", "leads_metadata"],
                 "properties": {"node_id": {"type": "integer"}, "drained": {"type": "boolean"},
                                "partitions_led": {"type": "integer", "minimum": 0},
                                "leads_metadata": {"type": "boolean"}}}


def _drain_answer(description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": _DRAIN_STATUS}}}


_DECOMMISSION_STATUS = {
    "type": "object", "additionalProperties": False,
    "required": ["node_id", "decommissioning", "stage", "replicas", "partitions_led", "metadata_member",
                 "waiting_for"],
    "properties": {
        "node_id": {"type": "integer"}, "decommissioning": {"type": "boolean"},
        "stage": {"type": ["string", "null"], "enum": ["moving_replicas", "leaving_metadata", "done", None]},
        "replicas": {"type": "integer", "minimum": 0}, "partitions_led": {"type": "integer", "minimum": 0},
        "metadata_member": {"type": "string", "enum": ["voter", "learner", "none"]},
        "waiting_for": {"type": "string"}}}


def _decommission_answer(description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": _DECOMMISSION_STATUS}}}


_SETTING = {"type": "object", "additionalProperties": False, "required": ["value", "cluster"],
            "properties": {"value": {"type": "integer", "minimum": 0},
                           "cluster": {"type": ["integer", "null"], "minimum": 0}}}
_SETTINGS = {"description": "the cluster settings: what this node uses, and the cluster's setting (null: none)",
             "content": {"application/json": {"schema": {
                 "type": "object", "additionalProperties": False, "required": ["replica_move_bytes_per_s"],
                 "properties": {"replica_move_bytes_per_s": _SETTING}}}}}


PATHS: dict[str, Any] = {
    "/v1/topics/{topic}/partitions": {
        "parameters": [_TOPIC],
        "post": {
            "summary": "grow a topic to `count` partitions (the new total; increase only, as Kafka's "
                       "CreatePartitions; keyed records may map to other partitions afterwards) (admin)",
            "requestBody": {"required": True, "content": {"application/json": {"schema": {
                "type": "object", "required": ["count"], "additionalProperties": False,
                "properties": {"count": {"type": "integer", "minimum": 1, "maximum": PARTITIONS_MAX}}}}}},
            "responses": {"200": {"description": "the topic with its new partitions", "content": {
                "application/json": {"schema": {"$ref": "#/components/schemas/Topic"}}}},
                **_errors(404, 409, 415, 421, 503, 504)},
        },
    },
    "/v1/admin/nodes/{node}/drain": {
        "parameters": [_NODE],
        "post": {"summary": "drain a node: its leaderships move to other nodes and it takes none (a rolling "
                            "restart's first step); the answer is its drain status now (admin)",
                 "responses": {"200": _drain_answer("the node's drain status"),
                               **_errors(404, 409, 421, 503, 504)}},
        "delete": {"summary": "undrain a node: it may lead again, and balancing brings its preferred "
                              "leaderships back (admin)",
                   "responses": {"200": _drain_answer("the node's drain status"),
                                 **_errors(404, 409, 421, 503, 504)}},
    },
    "/v1/admin/nodes/{node}/promote": {
        "parameters": [_NODE],
        "post": {"summary": "make a learner of the metadata group a voter, in place of voter `replace` if given "
                            "(a dead voter replaced without a restart); the answer is the group's members once "
                            "this node applied it (admin)",
                 "parameters": [{"name": "replace", "in": "query", "required": False,
                                 "schema": {"type": "integer", "minimum": 1, "maximum": 2**31 - 1}}],
                 "responses": {"200": {"description": "the metadata group's voters and learners", "content": {
                     "application/json": {"schema": {
                         "type": "object", "additionalProperties": False,
                         "required": ["node_id", "metadata_voters", "metadata_learners"],
                         "properties": {"node_id": {"type": "integer"},
                                        "metadata_voters": {"type": "array", "items": {"type": "integer"}},
                                        "metadata_learners": {"type": "array", "items": {"type": "integer"}}}}}}},
                               **_errors(404, 409, 421, 503, 504)}},
    },
    "/v1/admin/config": {
        "get": {"summary": "cluster settings nodes act on at run time: the move throttle "
                           "(replica_move_bytes_per_s, bytes/s to learners per node; 0: no limit) (admin)",
                "responses": {"200": _SETTINGS, **_errors()}},
        "patch": {"summary": "set cluster settings for every node (null: back to each node's own) (admin)",
                  "requestBody": {"required": True, "content": {"application/json": {"schema": {
                      "type": "object", "additionalProperties": False, "minProperties": 1,
                      "properties": {"replica_move_bytes_per_s": {
                          "type": ["integer", "null"], "minimum": 0, "maximum": REPLICA_MOVE_BYTES_PER_S_MAX}}}}}},
                  "responses": {"200": _SETTINGS, **_errors(415, 421, 503, 504)}},
    },
    "/v1/admin/nodes/{node}/decommission": {
        "parameters": [_NODE],
        "get": {"summary": "how far a node's decommission got, as this node sees it (admin)",
                "responses": {"200": _decommission_answer("the node's decommission status"),
                              **_errors(404)}},
        "post": {"summary": "decommission a node: it leads nothing, its replicas move to the other nodes "
                            "(a few partitions at a time), then it leaves the metadata group and can be "
                            "stopped; the answer is its status now (admin)",
                 "responses": {"200": _decommission_answer("the node's decommission status"),
                               **_errors(404, 409, 421, 503, 504)}},
        "delete": {"summary": "recommission a node: its decommission stops (replicas already moved stay "
                              "where they are) (admin)",
                   "responses": {"200": _decommission_answer("the node's decommission status"),
                                 **_errors(404, 409, 421, 503, 504)}},
    },
}
