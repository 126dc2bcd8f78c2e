"""The Confluent REST v2 dialect's error shape, and its media types: one mapping from our
typed errors to Confluent's integer codes (docs/http.md, "Confluent REST v2 dialect").

Confluent answers `{"error_code": <int>, "message"}` where the code is the HTTP status
times 100 plus a detail (40403: consumer instance not found), or the bare status for
generic HTTP conditions (404, 405, 415, 422, 500). The codes below are those of
kafka-rest's `Errors.java` and rest-utils' `KafkaExceptionMapper`. Errors are matched by
their code string, so an error raised on another node and carried over RPC
(`RemoteClientError`) maps exactly as the local one would. Handlers raise our typed
errors only; this table is the one place Confluent's numbers appear.

Which paths speak the dialect: `/topics...`, `/brokers`, `/consumers/...`, so even an
unknown route or a refused token under them answers in Confluent's shape
(`is_confluent_path`, used by the one error middleware, multiraft/http/errors.py).
"""

from __future__ import annotations

from typing import Any

from multiraft.errors import (
    ConsumerFormatMismatch,
    ConsumerIllegalState,
    ConsumerInstanceExists,
    FencedMemberEpoch,
    ForeignOrigin,
    GroupMaxSizeReached,
    InconsistentGroupConfig,
    InvalidConsumerConfig,
    InvalidRequest,
    MessageTooLarge,
    MethodNotAllowed,
    NonEmptyGroup,
    NotAcceptable,
    NotAuthorized,
    OffsetOutOfRange,
    PartitionNotAssigned,
    RequestTimeout,
    RequestTooLarge,
    RouteNotFound,
    TooManyConsumerGroups,
    Unauthenticated,
    UnknownConsumerInstance,
    UnknownHost,
    UnknownMemberId,
    UnknownPartition,
    UnknownTopic,
    UnsupportedMediaType,
    answered,
)
from raftlog.errors import ClientError

# Media types (Confluent's Versions.java).
V2_JSON = "application/vnd.kafka.v2+json"  # bodies and answers without embedded records
JSON_V2 = "application/vnd.kafka.json.v2+json"  # records whose keys and values are JSON
BINARY_V2 = "application/vnd.kafka.binary.v2+json"  # records whose keys and values are base64
EMBEDDED = {JSON_V2: "json", BINARY_V2: "binary"}
# What a body may be sent as: the produce routes name the embedded format; the others take
# any v2 type or plain JSON. None of them is a type a web page can send cross-site without
# a CORS preflight (multiraft/http/browsers.py).
PRODUCE_TYPES = (JSON_V2, BINARY_V2)
BODY_TYPES = (V2_JSON, JSON_V2, BINARY_V2, "application/vnd.kafka+json", "application/json")
# What an Accept may ask for on the routes without embedded records.
# (The embedded types too: some clients send the body's type as their Accept.)
ACCEPTED = (V2_JSON, "application/vnd.kafka+json", "application/json", "application/*", "*/*", JSON_V2, BINARY_V2)

# code -> (HTTP status, Confluent error_code). kafka-rest's numbers where it has one.
_BY_CODE: dict[str, tuple[int, int]] = {
    UnknownTopic.code: (404, 40401),
    UnknownConsumerInstance.code: (404, 40403),
    UnknownMemberId.code: (404, 40403),  # the instance's member went (expired): the instance too
    ConsumerFormatMismatch.code: (406, 40601),
    NotAcceptable.code: (406, 406),
    ConsumerInstanceExists.code: (409, 40902),
    ConsumerIllegalState.code: (409, 40903),
    PartitionNotAssigned.code: (409, 40903),
    GroupMaxSizeReached.code: (409, 40903),
    InconsistentGroupConfig.code: (409, 40903),
    NonEmptyGroup.code: (409, 40903),
    FencedMemberEpoch.code: (409, 40903),
    # A cluster bound (groups, partitions across groups, a partition's offsets): retrying
    # will not cure it, so not the retriable 50003 its 503 would map to. Confluent has no
    # such bound; its instance bound is 40903 too (kafka-rest's illegal-state code).
    TooManyConsumerGroups.code: (409, 40903),
    InvalidConsumerConfig.code: (422, 42204),
    OffsetOutOfRange.code: (422, 42202),
    InvalidRequest.code: (422, 422),
    UnsupportedMediaType.code: (415, 415),
    RequestTooLarge.code: (413, 413),
    MessageTooLarge.code: (413, 413),
    RequestTimeout.code: (408, 408),
    Unauthenticated.code: (401, 40101),
    NotAuthorized.code: (403, 40301),
    ForeignOrigin.code: (403, 403),
    UnknownHost.code: (403, 403),
    RouteNotFound.code: (404, 404),
    MethodNotAllowed.code: (405, 405),
}
KAFKA_ERROR = 50002  # a server-side failure that retrying will not cure
KAFKA_RETRIABLE_ERROR = 50003  # a server-side failure worth retrying (no leader yet, a timeout, ...)


def confluent_error(error: ClientError) -> tuple[int, int]:
    """(HTTP status, Confluent error_code) of one of our errors."""
    error = answered(error)
    if isinstance(error, UnknownPartition):
        return 404, 40402
    found = _BY_CODE.get(error.code)
    if found is not None:
        return found
    if 400 <= error.http_status < 500:  # a client error with no Confluent code: its bare status
        return (422, 422) if error.http_status == 400 else (error.http_status, error.http_status)
    # Server side: Confluent's 5xx codes; 503 and 504 keep their status (retry later), the rest 500.
    status = error.http_status if error.http_status in (503, 504) else 500
    return status, KAFKA_RETRIABLE_ERROR if error.retriable or status != 500 else KAFKA_ERROR


def confluent_body(error: ClientError) -> dict[str, Any]:
    _, code = confluent_error(error)
    return {"error_code": code, "message": error.message}


def is_confluent_path(path: str) -> bool:
    """Whether a request path belongs to the dialect (matched or not)."""
    return path in ("/topics", "/brokers") or path.startswith(("/topics/", "/consumers/"))
