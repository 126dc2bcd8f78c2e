"""Goal: the one mapping from our typed errors to Confluent REST v2's codes
(multiraft/http/confluent_errors.py) gives kafka-rest's numbers, maps an error carried
over RPC from another node exactly as the local one, never answers a client's mistake
with a 5xx, and knows which paths speak the dialect."""

from __future__ import annotations

import pytest

from multiraft.errors import (
    ConsumerFormatMismatch,
    ConsumerIllegalState,
    ConsumerInstanceExists,
    InvalidConsumerConfig,
    InvalidRequest,
    NotAuthorized,
    Timeout,
    TooManyConsumerGroups,
    Unauthenticated,
    UnknownConsumerInstance,
    UnknownPartition,
    UnknownTopic,
    error_table,
)
from multiraft.http.confluent_errors import confluent_body, confluent_error, is_confluent_path
from multiraft.transport.remote_errors import error_from_body
from raftlog.errors import ClientError, LeaderNotAvailable, NotLeader
from raftlog.types import NodeId


@pytest.mark.parametrize(("error", "expected"), [
    (UnknownTopic("t"), (404, 40401)),
    (UnknownPartition("p"), (404, 40402)),
    (UnknownConsumerInstance("i"), (404, 40403)),
    (ConsumerFormatMismatch("f"), (406, 40601)),
    (ConsumerInstanceExists("e"), (409, 40902)),
    (ConsumerIllegalState("s"), (409, 40903)),
    (InvalidConsumerConfig("c"), (422, 42204)),
    (InvalidRequest("bad"), (422, 422)),
    (Unauthenticated("u"), (401, 40101)),
    (NotAuthorized("n"), (403, 40301)),
    (LeaderNotAvailable("l"), (503, 50003)),
    (NotLeader(NodeId(0), "no leader known"), (503, 50003)),
    (Timeout("t"), (504, 50003)),
    (TooManyConsumerGroups("g"), (409, 40903)),  # a bound: retrying will not cure it
])
def test_kafka_rest_codes(error: ClientError, expected: tuple[int, int]) -> None:
    assert confluent_error(error) == expected
    assert confluent_body(error) == {"error_code": expected[1], "message": error.message}


@pytest.mark.parametrize("local", [UnknownConsumerInstance("m"), ConsumerInstanceExists("m"), UnknownTopic("m"),
                                   ConsumerIllegalState("m"), InvalidConsumerConfig("m"), Timeout("m")])
def test_an_error_from_another_node_maps_as_the_local_one(local: ClientError) -> None:
    remote = error_from_body(f'{{"error_code": "{local.code}", "message": "m"}}'.encode())
    assert confluent_error(remote) == confluent_error(local)


def test_no_client_mistake_is_a_5xx() -> None:
    for code, (status, _) in error_table().items():
        if status < 500 and code != NotLeader.code:  # no leader named: 503, not the client's mistake
            remote = error_from_body(f'{{"error_code": "{code}", "message": "m"}}'.encode())
            assert confluent_error(remote)[0] < 500, code


@pytest.mark.parametrize(("path", "dialect"), [
    ("/topics", True), ("/topics/t/partitions/0", True), ("/brokers", True), ("/consumers/g", True),
    ("/v1/topics", False), ("/metrics", False), ("/topicsx", False), ("/consumers", False),
])
def test_dialect_paths(path: str, dialect: bool) -> None:
    assert is_confluent_path(path) is dialect
