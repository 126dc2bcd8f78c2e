"""Consumer groups (KIP-848 semantics): the state machine, its commands, assignors and
the coordinator's liveness tracker. Pure: no asyncio, no I/O, no clock read.

- `commands.py`: the typed commands, their limits and their encoding;
- `state.py`: `GroupsState`, applied by group 0 beside the catalog;
- `assignors.py`: uniform (sticky, the default) and range;
- `topics.py`: what a subscription resolves to (topic names or a glob);
- `instances.py`: Confluent REST v2 consumer instances, each a member of its group;
- `sessions.py`: last seen per member, in the coordinator's memory;
- `snapshot.py`: the state's snapshot codec.

docs/node.md ("Consumer groups") says why the state lives in group 0 and what a
heartbeat costs; docs/http.md has the routes.
"""

from multiraft.consumer_groups.commands import (
    ASSIGNORS,
    GROUP_NAME_PATTERN,
    INSTANCE_RELEASING,
    AssignInstance,
    CreateInstance,
    DeleteInstance,
    ExpireMembers,
    GroupCommand,
    Heartbeat,
    InstanceCommand,
    InstancePositions,
    JoinGroup,
    LeaveGroup,
    SubscribeInstance,
    Subscription,
    decode_group_command,
    encode_group_command,
    is_group_command,
)
from multiraft.consumer_groups.sessions import Sessions
from multiraft.consumer_groups.snapshot import decode_groups, encode_groups
from multiraft.consumer_groups.state import (
    GroupResult,
    GroupsState,
    MemberView,
    describe,
    partitions_json,
    summary,
)
from multiraft.consumer_groups.topics import StaticTopics, TopicsView

__all__ = [
    "ASSIGNORS", "GROUP_NAME_PATTERN", "INSTANCE_RELEASING", "AssignInstance", "CreateInstance",
    "DeleteInstance", "ExpireMembers", "GroupCommand", "GroupResult", "GroupsState", "Heartbeat",
    "InstanceCommand", "InstancePositions", "JoinGroup", "LeaveGroup", "MemberView", "Sessions", "StaticTopics",
    "SubscribeInstance", "Subscription", "TopicsView", "decode_group_command", "decode_groups", "describe",
    "encode_group_command", "encode_groups", "is_group_command", "partitions_json", "summary",
]
