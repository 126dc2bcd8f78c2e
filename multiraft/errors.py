"""Client errors of the node's state machines, and the one table of error codes.

Each error is an operating condition a client can see: a produce refused by the
idempotent-producer rules, a catalog command that does not validate, an offset
commit beyond the high watermark. They subclass `raftlog.errors.ClientError`, so
the HTTP layer maps every one of them the same way (`code`, `http_status`).
State machines never raise these from `apply`: they return them inside their
result, because a refused command is still a committed entry every replica must
apply identically (see docs/node.md).
"""

from __future__ import annotations

from typing import Any

from raftlog.errors import ClientError, LeaderNotAvailable, NotLeader
from raftlog.types import NO_NODE, Offset


class InvalidRequest(ClientError):
    """Malformed input: nothing was proposed."""

    code = "INVALID_REQUEST"
    http_status = 400


class InvalidProducerEpoch(ClientError):
    """A newer instance of this producer id exists (Kafka: the producer is fenced)."""

    code = "INVALID_PRODUCER_EPOCH"
    http_status = 409

    def __init__(self, producer_id: int, epoch: int, current_epoch: int) -> None:
        super().__init__(
            f"producer {producer_id} epoch {epoch} is older than the current epoch {current_epoch}"
        )
        self.producer_id = producer_id
        self.epoch = epoch
        self.current_epoch = current_epoch


class OutOfOrderSequence(ClientError):
    """A gap or reorder in a producer's sequence: accepting it could lose or reorder data."""

    code = "OUT_OF_ORDER_SEQUENCE"
    http_status = 409

    def __init__(self, producer_id: int, sequence: int, expected: int | None) -> None:
        wanted = "0 (new epoch)" if expected is None else str(expected)
        super().__init__(f"producer {producer_id} sent sequence {sequence}, expected {wanted}")
        self.producer_id = producer_id
        self.sequence = sequence
        self.expected = expected


class InvalidBatch(InvalidRequest):
    """A binary record batch failed validation (header, CRC or lengths)."""

    code = "INVALID_BATCH"
    http_status = 400


class OffsetOutOfRange(ClientError):
    """A read outside [log start, high watermark]; carries both so a client can reset."""

    code = "OFFSET_OUT_OF_RANGE"
    http_status = 416

    def __init__(self, message: str, log_start_offset: int = 0, high_watermark: int = 0) -> None:
        super().__init__(message)
        self.log_start_offset = log_start_offset
        self.high_watermark = high_watermark


class CommitOffsetOutOfRange(OffsetOutOfRange):
    """A consumer offset commit beyond the high watermark (it would skip unwritten records)."""

    def __init__(self, offset: int, high_watermark: Offset) -> None:
        super().__init__(f"offset {offset} is beyond the high watermark {high_watermark}", 0, high_watermark)
        self.offset = offset
        self.high_watermark = high_watermark


class StaleOffsetCommit(ClientError):
    """A member's commit reached its partition after a newer commit of the same group had
    set the offset there (a write delayed on the way): applied, it would move the
    committed offset back (multiraft/state/consumer_offsets.py, "Stamps"). Not retriable:
    the newer offset stands."""

    code = "STALE_OFFSET_COMMIT"
    http_status = 409
    retriable = False


class TooManyConsumerGroups(ClientError):
    """The partition already keeps offsets for its maximum number of consumer groups, or
    the cluster's group state is at a bound (groups with members, partitions across them)."""

    code = "TOO_MANY_CONSUMER_GROUPS"
    http_status = 503
    retriable = False


class UnknownGroup(ClientError):
    """No partition keeps committed offsets for the consumer group (Kafka: GROUP_ID_NOT_FOUND)."""

    code = "UNKNOWN_GROUP"
    http_status = 404


class UnknownMemberId(ClientError):
    """The consumer group has no member with this id (never joined, left, or expired after
    its session timeout): the member must join again (Kafka: UNKNOWN_MEMBER_ID)."""

    code = "UNKNOWN_MEMBER_ID"
    http_status = 404


class FencedMemberEpoch(ClientError):
    """The member's epoch is neither its current nor its previous one: a stale instance
    (Kafka: FENCED_MEMBER_EPOCH). It must join again."""

    code = "FENCED_MEMBER_EPOCH"
    http_status = 409


class PartitionNotAssigned(ClientError):
    """A member commits for a partition the group does not assign to it (Kafka refuses
    such commits as stale): another member may own it now."""

    code = "PARTITION_NOT_ASSIGNED"
    http_status = 409


class GroupMaxSizeReached(ClientError):
    """The consumer group has its maximum number of members (Kafka: GROUP_MAX_SIZE_REACHED)."""

    code = "GROUP_MAX_SIZE_REACHED"
    http_status = 409


class InconsistentGroupConfig(ClientError):
    """A join asks for group settings (session timeout, assignor) other than those of the
    group it joins, which has members (Kafka: INCONSISTENT_GROUP_PROTOCOL)."""

    code = "INCONSISTENT_GROUP_CONFIG"
    http_status = 409


class NonEmptyGroup(ClientError):
    """The consumer group has members: an offset commit without a member (or a delete)
    would race them (Kafka: NON_EMPTY_GROUP)."""

    code = "NON_EMPTY_GROUP"
    http_status = 409


class UnknownConsumerInstance(ClientError):
    """A Confluent REST v2 consumer instance that does not exist (never created, deleted, or
    expired after `consumer.instance.timeout.ms`): Confluent's 40403."""

    code = "UNKNOWN_CONSUMER_INSTANCE"
    http_status = 404


class ConsumerInstanceExists(ClientError):
    """A consumer instance of that name already exists in the group: Confluent's 40902."""

    code = "CONSUMER_INSTANCE_EXISTS"
    http_status = 409


class ConsumerIllegalState(ClientError):
    """A consumer instance call that its state forbids (subscribe while manually assigned,
    assign while subscribed, seek a partition it does not hold): Kafka's
    IllegalStateException, Confluent's 40903."""

    code = "CONSUMER_ILLEGAL_STATE"
    http_status = 409


class InvalidConsumerConfig(InvalidRequest):
    """A consumer instance's settings do not validate: Confluent's 42204."""

    code = "INVALID_CONSUMER_CONFIG"
    http_status = 422


class ConsumerFormatMismatch(ClientError):
    """A records GET whose Accept names another embedded format than the instance's: 40601."""

    code = "CONSUMER_FORMAT_MISMATCH"
    http_status = 406


class NotAcceptable(ClientError):
    """No representation the request's Accept header allows (406)."""

    code = "NOT_ACCEPTABLE"
    http_status = 406


class UnknownProducerId(ClientError):
    """A produce names a producer id the cluster never allocated (above the catalog's next
    one): a client must get its ids from POST /v1/producers, not invent them, or it could
    fill every partition's producer table with made-up ids (Kafka refuses such ids too:
    UNKNOWN_PRODUCER_ID / INVALID_PRODUCER_ID_MAPPING). Not retriable."""

    code = "UNKNOWN_PRODUCER_ID"
    http_status = 400

    def __init__(self, producer_id: int, next_producer_id: int) -> None:
        super().__init__(f"producer id {producer_id} was never allocated (ids below {next_producer_id} "
                         f"were); get one from POST /v1/producers")
        self.producer_id = producer_id


class InvalidTopic(InvalidRequest):
    code = "INVALID_TOPIC"
    http_status = 400


class InvalidPartitions(InvalidRequest):
    code = "INVALID_PARTITIONS"
    http_status = 400


class InvalidReplicationFactor(InvalidRequest):
    code = "INVALID_REPLICATION_FACTOR"
    http_status = 400


class InvalidReplicaAssignment(InvalidRequest):
    code = "INVALID_REPLICA_ASSIGNMENT"
    http_status = 400


class UnknownTopic(ClientError):
    code = "UNKNOWN_TOPIC"
    http_status = 404


class UnknownPartition(UnknownTopic):
    """The topic exists, the partition does not (native answers share UNKNOWN_TOPIC; the
    Confluent dialect tells them apart: 40402)."""


class TopicExists(ClientError):
    code = "TOPIC_EXISTS"
    http_status = 409


class ClusterTooSmall(ClientError):
    """The cluster has too few nodes for what was asked: a decommission whose node's
    replicas would have nowhere to go (fewer staying nodes than their replication
    factor). Add a node first; retrying as is changes nothing."""

    code = "CLUSTER_TOO_SMALL"
    http_status = 409


class PromotionRefused(ClientError):
    """The metadata group's state does not allow this promotion (multiraft/node/metadata_voters.py:
    the node is no learner, is leaving, not live or behind; a sixth voter; the node to
    replace is itself, no voter, the leader, live, or its removal would leave no live
    majority). The message says which; nothing changed."""

    code = "PROMOTION_REFUSED"
    http_status = 409


class UnknownNode(ClientError):
    code = "UNKNOWN_NODE"
    http_status = 404


class UnknownToken(ClientError):
    code = "UNKNOWN_TOKEN"
    http_status = 404


class UnknownMirrorLink(ClientError):
    code = "UNKNOWN_MIRROR_LINK"
    http_status = 404


class MirrorLinkExists(ClientError):
    code = "MIRROR_LINK_EXISTS"
    http_status = 409


class MirrorLinkInUse(ClientError):
    """A link still has mirror topics: promote or delete them before the link goes."""

    code = "MIRROR_LINK_IN_USE"
    http_status = 409


class TooManyMirrorLinks(ClientError):
    code = "TOO_MANY_MIRROR_LINKS"
    http_status = 409


class NotAMirror(ClientError):
    """A mirror operation (promote, resync, a growth following the source) on a topic that is
    not a mirror of that link (or no longer is: promoted)."""

    code = "NOT_A_MIRROR"
    http_status = 409


class MirrorPartitionsFixed(ClientError):
    """Partitions added by hand to a mirror topic not promoted: it follows its source's count
    (discovery grows it when the source grows; a partition added here would copy a source
    partition that does not exist). Promote it first."""

    code = "MIRROR_PARTITIONS_FIXED"
    http_status = 409


class MirrorReadOnly(ClientError):
    """A produce to a mirror topic: it copies its source and takes no writes until promoted."""

    code = "MIRROR_READ_ONLY"
    http_status = 403


class Unauthenticated(ClientError):
    """No valid bearer token on a node that requires one (multiraft/metadata/auth.py)."""

    code = "UNAUTHENTICATED"
    http_status = 401


class NotAuthorized(ClientError):
    """A valid token whose rights do not cover the request."""

    code = "NOT_AUTHORIZED"
    http_status = 403


class InvalidConfig(InvalidRequest):
    code = "INVALID_CONFIG"
    http_status = 400


class ResourceExhausted(ClientError):
    """An id space (group ids, producer ids) has no room left: never wraps, never reuses."""

    code = "RESOURCE_EXHAUSTED"
    http_status = 503


class ClusterNotReady(ClientError):
    """`GET /v1/health?ready=cluster` while this node sees no metadata leader, or some node
    of the cluster (its initial nodes and every registered one) is not live in the catalog
    yet: the message names what is missing. A start-up state, so retriable."""

    code = "CLUSTER_NOT_READY"
    http_status = 503
    retriable = True


class FeatureLevelUnsupported(ClientError):
    """The cluster's feature level does not allow this (multiraft/metadata/features.py): a
    finalize that some registered node does not support or did not answer (the message
    names each node and its level), or a gated command proposed below its level (the
    message names the level and how to finalize it). Upgrade the nodes first."""

    code = "FEATURE_LEVEL_UNSUPPORTED"
    http_status = 409


class SnapshotFormatError(Exception):
    """A state machine snapshot from a peer does not decode: refuse it, fetch again.

    Not a ClientError: no client ever sees it; the node logs it and retries the transfer.
    """


# ---------------------------------------------------------------- conditions only HTTP has

class RouteNotFound(ClientError):
    code = "NOT_FOUND"
    http_status = 404


class MethodNotAllowed(ClientError):
    code = "METHOD_NOT_ALLOWED"
    http_status = 405


class RequestTooLarge(ClientError):
    """The request body exceeds the server's bound (413 before anything is parsed)."""

    code = "REQUEST_TOO_LARGE"
    http_status = 413


class MessageTooLarge(ClientError):
    """One record (key + value + headers) exceeds `record_bytes_max`."""

    code = "MESSAGE_TOO_LARGE"
    http_status = 413

    def __init__(self, message: str, bytes_max: int) -> None:
        super().__init__(message)
        self.bytes_max = bytes_max


class UnsupportedMediaType(ClientError):
    code = "UNSUPPORTED_MEDIA_TYPE"
    http_status = 415


class RequestTimeout(ClientError):
    """The client did not send its body within the bound (slow or abandoned client)."""

    code = "REQUEST_TIMEOUT"
    http_status = 408


class Timeout(ClientError):
    """The cluster did not answer within the request's bound.

    For a produce the outcome is unknown (it may still commit): retry only with
    an idempotent producer, which deduplicates.
    """

    code = "TIMEOUT"
    http_status = 504


class ForeignOrigin(ClientError):
    """The request came from a web page of another origin (cross-site request)."""

    code = "FORBIDDEN_ORIGIN"
    http_status = 403


class UnknownHost(ClientError):
    """The Host header names no address of this node (DNS rebinding)."""

    code = "FORBIDDEN_HOST"
    http_status = 403


def _subclasses(cls: type[ClientError]) -> list[type[ClientError]]:
    found = []
    for sub in cls.__subclasses__():
        found.append(sub)
        found.extend(_subclasses(sub))
    return found


def _build_table() -> dict[str, tuple[int, bool]]:
    table: dict[str, tuple[int, bool]] = {}
    owners: dict[str, type[ClientError]] = {}
    for cls in [ClientError, *_subclasses(ClientError)]:
        if cls.code in owners:
            # A subclass refining another without a code of its own shares it.
            assert issubclass(cls, owners[cls.code]), f"code {cls.code} defined twice"
            continue
        owners[cls.code] = cls
        table[cls.code] = (cls.http_status, cls.retriable)
    return table


# Built once, here, after every code is defined (raftlog.errors and this module hold them
# all; tests/unit/test_error_table.py checks no other module defines one), so it is the
# same in every process whatever else it imported: a client's table lacked the HTTP-only
# codes while they lived in the HTTP layer.
_TABLE = _build_table()


def error_table() -> dict[str, tuple[int, bool]]:
    """The one table: error code -> (HTTP status, retriable), over every ClientError."""
    return dict(_TABLE)


def answered(error: ClientError) -> ClientError:
    """The error as the contract answers it: a refusal that names no leader is
    LEADER_NOT_AVAILABLE (503), whichever layer raised it; the Raft core only knows
    "not the leader" and has no say in HTTP statuses."""
    if type(error) is NotLeader and error.leader_hint == NO_NODE:
        return LeaderNotAvailable(error.message)
    return error


def error_body(error: ClientError) -> dict[str, Any]:
    """The JSON body of every error answer (DESIGN.md section 6); a NOT_LEADER names the leader."""
    error = answered(error)
    body: dict[str, Any] = {"error_code": error.code, "message": error.message}
    hint = getattr(error, "leader_hint", 0)
    if hint:
        body["leader_hint"] = hint
    return body
