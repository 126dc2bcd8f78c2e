"""Consumer group offsets, committed through each partition's own Raft group.

A commit names its member (`member_id`, `member_epoch`): the group coordinator checks
that the member is current and owns every partition it commits (multiraft/node/
group_reads.py). A commit without a member is taken only while the group has no
members (a consumer that assigns partitions itself), or as an admin reset
(`"admin_reset": true`, the admin right).

A commit is ordered with the records it points at and is linearizable to read
(the partition leader confirms its leadership first), so every node answers
the same committed offsets. A delete removes the group from every partition that
holds it (Kafka's DeleteGroups); idle groups also expire on their own
(multiraft/node/offsets_retention.py).
"""

from __future__ import annotations

from aiohttp import web

from multiraft.errors import InvalidRequest
from multiraft.http.access import require, require_admin
from multiraft.http.handlers.common import bounded, node_of
from multiraft.http.limits import (
    GROUP_COMMITS_PER_REQUEST_MAX,
    JSON_BULK_VALUES_MAX,
    REQUEST_BYTES_MAX,
)
from multiraft.http.params import int_field, json_object, str_field
from multiraft.node.api import (
    GROUP_NAME_PATTERN,
    RESET_PARTITIONS_MAX,
    RESET_TOPICS_MAX,
    OffsetCommit,
    ResetRequest,
    ResetStrategy,
    ResetTopic,
    group_limits,
)

_COMMIT_FIELDS = {"topic", "partition", "offset", "metadata"}
_COMMIT_BODY_FIELDS = {"offsets", "member_id", "member_epoch", "admin_reset"}


def group_name(request: web.Request) -> str:
    group = request.match_info["group"]
    if not GROUP_NAME_PATTERN.fullmatch(group):
        raise InvalidRequest(f"consumer group name must match {GROUP_NAME_PATTERN.pattern}")
    return group


async def commit_offsets(request: web.Request) -> web.Response:
    node = node_of(request)
    group = group_name(request)
    # 10,000 commits with their metadata outgrow the default JSON bounds.
    body = await json_object(request, bytes_max=REQUEST_BYTES_MAX, values_max=JSON_BULK_VALUES_MAX)
    offsets = body.get("offsets")
    if set(body) - _COMMIT_BODY_FIELDS or not isinstance(offsets, list) or not offsets:
        raise InvalidRequest("body is {\"offsets\": [{\"topic\", \"partition\", \"offset\"}, ...]}")
    if len(offsets) > GROUP_COMMITS_PER_REQUEST_MAX:
        raise InvalidRequest(f"at most {GROUP_COMMITS_PER_REQUEST_MAX} offsets per request")
    member_id = body.get("member_id")
    if member_id is not None:
        group_limits.check_member_id(member_id)
    member_epoch = int_field(body, "member_epoch", 0 if member_id is None else None, low=0, high=group_limits.EPOCH_MAX)
    admin_reset = body.get("admin_reset", False)
    if not isinstance(admin_reset, bool):
        raise InvalidRequest("admin_reset is true or false")
    if admin_reset:
        require_admin(request)
    commits = []
    for i, item in enumerate(offsets):
        if not isinstance(item, dict) or set(item) - _COMMIT_FIELDS:
            raise InvalidRequest(f"offsets[{i}] must be an object with fields {sorted(_COMMIT_FIELDS)}")
        commit = OffsetCommit(group=group, topic=item.get("topic"), partition=item.get("partition"),
                              offset=item.get("offset"), metadata=item.get("metadata", ""))
        node.partition_group(commit.topic, commit.partition)  # 404 for unknown topic or partition
        require(request, "read", commit.topic)  # a group commits where it reads (Kafka: READ on the topic)
        commits.append(commit)
    await bounded(node.group_commit(group, member_id, member_epoch, commits, admin_reset=admin_reset),
                  "offset commit")
    return web.json_response({"offsets": [
        {"topic": c.topic, "partition": c.partition, "offset": c.offset, "metadata": c.metadata} for c in commits
    ]})


async def fetch_offsets(request: web.Request) -> web.Response:
    node = node_of(request)
    group = group_name(request)
    topic = request.query.get("topic")
    if not topic:
        raise InvalidRequest("query parameter topic is required")
    offsets = await bounded(node.fetch_offsets(group, topic), "offset fetch")
    return web.json_response({"group": group, "topic": topic, "offsets": offsets})


async def delete_group(request: web.Request) -> web.Response:
    """204 once no partition holds the group's offsets; 404 UNKNOWN_GROUP when none did."""
    node = node_of(request)
    group = group_name(request)
    await bounded(node.delete_group(group), "group delete")
    return web.Response(status=204)


_RESET_FIELDS = {"strategy", "value", "topics", "execute"}


def _merged(chosen: list[ResetTopic]) -> tuple[ResetTopic, ...]:
    """A topic named twice is named once: its partitions together (every one if either
    names them all). JSON Schema cannot say "each topic once", so the document cannot
    refuse it and neither does the server."""
    merged: dict[str, ResetTopic] = {}
    for item in chosen:  # each already checked (a name, distinct partition numbers)
        seen = merged.get(item.topic)
        if seen is not None:
            both = None if seen.partitions is None or item.partitions is None \
                else tuple(dict.fromkeys(seen.partitions + item.partitions))
            item = ResetTopic(topic=item.topic, partitions=both)
        merged[item.topic] = item
    return tuple(merged.values())


async def reset_offsets(request: web.Request) -> web.Response:
    """POST /v1/groups/{group}/offsets/reset: Kafka's --reset-offsets for a group without
    members (multiraft/consumer_groups/resets.py); `execute` false (the default) is a dry
    run. Admin: a reset moves where every future member of the group starts."""
    node = node_of(request)
    group = group_name(request)
    body = await json_object(request)
    extra = set(body) - _RESET_FIELDS
    if extra:
        raise InvalidRequest(f"unknown fields {sorted(extra)[:5]}; allowed: {sorted(_RESET_FIELDS)}")
    strategies = {s.value: s for s in ResetStrategy}
    strategy = strategies.get(str_field(body, "strategy", choices=tuple(strategies)))
    topics = body.get("topics")
    if not isinstance(topics, list) or not 1 <= len(topics) <= RESET_TOPICS_MAX:  # before merging (_merged)
        raise InvalidRequest(f"topics is a list of 1..{RESET_TOPICS_MAX} {{\"topic\", \"partitions\" (optional)}} "
                             "objects")
    chosen = []
    for item in topics[:RESET_PARTITIONS_MAX + 1]:
        if not isinstance(item, dict) or "topic" not in item or set(item) - {"topic", "partitions"}:
            raise InvalidRequest("each of topics is {\"topic\", \"partitions\" (optional)}")
        partitions = item.get("partitions")
        if partitions is not None and not isinstance(partitions, list):
            raise InvalidRequest("partitions is a list of partition numbers")
        chosen.append(ResetTopic(topic=item["topic"],
                                 partitions=None if partitions is None else tuple(partitions[:RESET_PARTITIONS_MAX + 1])))
    reset = ResetRequest(group=group, strategy=strategy, value=body.get("value"),  # type: ignore[arg-type]
                         topics=_merged(chosen), execute=body.get("execute", False))
    return web.json_response(await bounded(node.reset_group_offsets(reset), "offset reset"))
