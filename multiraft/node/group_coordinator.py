"""The consumer group coordinator: the metadata leader, reached from any node.

Group state lives in group 0 beside the catalog (docs/node.md, "Consumer groups"),
so the coordinator of every group is the metadata leader. Any node serves every
group call: on the leader it runs here; elsewhere it is forwarded to the leader over
RPC (`groups.*` methods), as metadata commands are (`metadata_ops.py`).

What is a Raft write and what is not:
- a join, a leave, an expiry, and a heartbeat that changes something (acknowledges
  a revocation, takes newly freed partitions, moves to a new epoch, or meets a topic
  change) are proposed to group 0 and answered from their applied result;
- a heartbeat that changes nothing, a fetch's keep-alive and a commit check are
  answered from the leader's applied state and only touch the member's last-seen
  time, which lives in this process's memory (`Sessions`), as Kafka's coordinator
  keeps it.

Before answering from applied state a new leader first catches up with what its
predecessors committed (a ReadIndex), so no answer comes from a state older than one
already given. When leadership moves here, `Sessions` forgets every last-seen time:
each member gets a full session timeout from the new coordinator. The expiry loop
(`run`) proposes `ExpireMembers` for members silent past their group's session
timeout (or holding revoked partitions past their rebalance timeout).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from multiraft.consumer_groups import (
    INSTANCE_RELEASING,
    CreateInstance,
    GroupCommand,
    Heartbeat,
    JoinGroup,
    LeaveGroup,
    Sessions,
    decode_group_command,
    describe,
    encode_group_command,
    summary,
)
from multiraft.consumer_groups.commands import (
    GROUP_PARTITIONS_MAX,
    check_epoch,
    check_group,
    check_member_id,
    check_partitions,
)
from multiraft.consumer_groups.state import Group
from multiraft.errors import InvalidRequest, NonEmptyGroup, UnknownGroup
from multiraft.node.group_commits import CommitFence
from multiraft.node.machines import CatalogTopics
from multiraft.node.registry import METADATA_GROUP
from multiraft.node.routing import call_peer
from multiraft.state.consumer_offsets import OffsetCommit
from multiraft.transport.rpc import RPC_TIMEOUT_S, Rpc, answer
from raftlog.errors import ClientError, LeaderNotAvailable, NotLeader
from raftlog.messages import EntryKind, Role

if TYPE_CHECKING:
    from multiraft.node.catalog_holder import CatalogHolder
    from multiraft.node.registry import GroupRegistry
    from multiraft.runtime.group import GroupRuntime

# How often the coordinator looks for expired members: a member leaves at most this
# much after its session timeout (the smallest allowed session is 500 ms).
EXPIRY_SCAN_S = 0.1
# A commit forwarded to the coordinator waits for its writes to the partitions (each
# forwarded to the partition leader, one RPC bound each) and so gets two bounds.
COMMIT_TIMEOUT_S = 2 * RPC_TIMEOUT_S
CommitOffsets = Callable[[str, list[OffsetCommit]], Awaitable[None]]


def _monotonic_ms() -> int:
    return int(time.monotonic() * 1000)


def _partitions_of(group: Group | None, member_ids: tuple[str, ...]) -> tuple[tuple[str, int], ...]:
    """What these members hold (assigned or revoking): what removing them releases."""
    if group is None:
        return ()
    held: set[tuple[str, int]] = set()
    for member_id in member_ids:
        member = group.members.get(member_id)
        if member is not None:
            held |= member.assigned | member.revoking
    return tuple(sorted(held))


class GroupCoordinator:
    def __init__(self, registry: GroupRegistry, catalog: CatalogHolder, rpc: Rpc, commit_offsets: CommitOffsets,
                 logger: Any, clock_ms: Callable[[], int] = _monotonic_ms) -> None:
        """`commit_offsets`: writes commits through the partitions' groups (partition_ops.py)."""
        self._registry = registry
        self._commit_offsets = commit_offsets
        self.fence = CommitFence()
        self._catalog = catalog
        self._rpc = rpc
        self._logger = logger
        self._clock_ms = clock_ms
        self.sessions = Sessions()
        self._term = -1  # the term whose sessions `sessions` holds
        self._commits_stamped = 0  # the counter of commit stamps (see `_commit`)
        rpc.register("groups.command", self._serve_command)
        rpc.register("groups.commit", self._serve_json(self._commit))
        rpc.register("groups.require_empty", self._serve_json(self._require_empty))
        rpc.register("groups.describe", self._serve_json(self._describe))
        rpc.register("groups.list", self._serve_json(self._list))

    # ------------------------------------------------------------------ entry points (any node)

    async def command(self, command: GroupCommand) -> dict[str, Any]:
        """Apply a join, heartbeat or leave at the coordinator; the member's view (or {})."""
        runtime = self._runtime()
        if runtime.core.role is Role.LEADER:
            return await self._command(command)
        body = await self._call_leader(runtime, "groups.command", encode_group_command(command),
                                       write=not isinstance(command, Heartbeat) or command.owned is not None)
        return json.loads(body)  # type: ignore[no-any-return]

    async def commit(self, group: str, member_id: str | None, member_epoch: int,
                     commits: list[OffsetCommit]) -> None:
        """Commit through the coordinator: refused from a fenced member or for a partition it
        does not own (or is giving back, see group_commits.py); without a member only while
        the group has none. The coordinator writes the commits to the partitions itself,
        inside its fence."""
        request = {"group": group, "member_id": member_id, "member_epoch": member_epoch,
                   "offsets": [{"topic": c.topic, "partition": c.partition, "offset": c.offset,
                                "metadata": c.metadata} for c in commits]}
        runtime = self._runtime()
        if runtime.core.role is Role.LEADER:
            await self._commit(request)
            return
        leader = runtime.core.leader
        if leader == 0:
            raise LeaderNotAvailable("no group coordinator (metadata leader) known yet; retry")
        await call_peer(self._rpc, leader, "groups.commit", json.dumps(request).encode(), COMMIT_TIMEOUT_S,
                        write=True)

    async def require_empty(self, group: str) -> None:
        """Refuse (NON_EMPTY_GROUP) while the group has members: a delete would race them."""
        await self._json_call("groups.require_empty", self._require_empty, {"group": group})

    async def describe(self, group: str) -> dict[str, Any]:
        return await self._json_call("groups.describe", self._describe, {"group": group})

    async def list_groups(self) -> dict[str, Any]:
        return await self._json_call("groups.list", self._list, {})

    # ------------------------------------------------------------------ on the coordinator

    async def _command(self, command: GroupCommand) -> dict[str, Any]:
        runtime = await self._leading()
        now = self._clock_ms()
        released: tuple[tuple[str, int], ...] = ()
        if isinstance(command, Heartbeat):
            needed, view = self._catalog.groups.plan_heartbeat(command, self._topics())
            self._note(command.group, command.member_id, now)
            if not needed:
                return view.as_json()
            if command.owned is not None and command.member_epoch == view.member_epoch \
                    and set(view.revoking).isdisjoint(command.owned):
                released = view.revoking  # it acknowledges (state.py `_acknowledges`): they go to new owners
        elif isinstance(command, LeaveGroup):
            _, member = self._catalog.groups.member(command.group, command.member_id, command.member_epoch)
            released = tuple(sorted(member.assigned | member.revoking))
        elif isinstance(command, INSTANCE_RELEASING):  # a consumer instance's call frees what it holds at once
            released = self._catalog.groups.held(command.group, command.member_id)
        if isinstance(command, JoinGroup | CreateInstance):
            (result,) = await self._propose_join(runtime, command)
        else:
            async with self.fence.releasing(command.group, released):
                (result,) = await runtime.propose([encode_group_command(command)], EntryKind.META)
        if result.error is not None:
            raise result.error
        if not isinstance(command, JoinGroup | LeaveGroup):  # a heartbeat, or any call of an instance
            self._note(command.group, command.member_id, self._clock_ms())
        if hasattr(result.value, "as_json"):  # a member's view
            return result.value.as_json()  # type: ignore[no-any-return]
        if isinstance(result.value, dict):  # an instance's positions
            return result.value
        if isinstance(command, LeaveGroup):
            self._logger.info("group_member_left", group=command.group, member_id=command.member_id)
        return {}

    async def _propose_join(self, runtime: GroupRuntime, command: JoinGroup | CreateInstance) -> list[Any]:
        """Propose a join; its member is noted in `sessions` when the entry applies, whether
        or not this caller still waits. A caller cancelled after proposing (its HTTP
        deadline) would otherwise leave a member that joins yet is never noted, and so
        never expires. The proposal runs in its own task, shielded from the caller's
        cancellation; the callback owns its outcome (it resolves on apply, or fails on
        a step-down, whose new term resets every session anyway)."""
        proposal = asyncio.ensure_future(runtime.propose([encode_group_command(command)], EntryKind.META))
        proposal.add_done_callback(lambda done: self._joined(command, done))
        return await asyncio.shield(proposal)

    def _joined(self, command: JoinGroup | CreateInstance, proposal: asyncio.Future[list[Any]]) -> None:
        if proposal.cancelled() or proposal.exception() is not None:
            return
        (result,) = proposal.result()
        if result.error is None:
            self._note(command.group, command.member_id, self._clock_ms())

    async def _commit(self, request: dict[str, Any]) -> dict[str, Any]:
        group, member_id, epoch = request["group"], request["member_id"], request["member_epoch"]
        check_group(group)
        check_epoch(epoch)
        if not isinstance(request["offsets"], list):
            raise InvalidRequest("a groups commit carries a list of offsets")
        commits = [OffsetCommit(group=group, topic=o["topic"], partition=o["partition"], offset=o["offset"],
                                metadata=o["metadata"]) for o in request["offsets"]]
        partitions = sorted({(c.topic, c.partition) for c in commits})
        check_partitions(tuple(partitions), "partitions", GROUP_PARTITIONS_MAX)
        runtime = await self._leading()
        # The stamp only grows over the commits this coordinator and its successors issue
        # (a successor leads in a higher term): a write delayed on its way to the partition
        # cannot land over a newer one (multiraft/state/consumer_offsets.py, "Stamps").
        self._commits_stamped += 1
        stamp = (runtime.core.term, self._commits_stamped)
        commits = [replace(c, stamp=stamp) for c in commits]
        state = self._catalog.groups
        if member_id is None:
            if state.has_members(group):
                raise NonEmptyGroup(f"group {group!r} has members: commit as one of them (member_id, "
                                    "member_epoch), or as an admin reset")
        else:
            check_member_id(member_id)
            state.check_commit(group, member_id, epoch, partitions)
            self._note(group, member_id, self._clock_ms())
        async with self.fence.committing(group, partitions):  # no await between the check and this
            await self._commit_offsets(group, commits)
        return {}

    async def _require_empty(self, request: dict[str, Any]) -> dict[str, Any]:
        group = request["group"]
        check_group(group)
        await self._leading()
        if self._catalog.groups.has_members(group):
            raise NonEmptyGroup(f"group {group!r} has members; they must leave (or expire) first")
        return {}

    async def _describe(self, request: dict[str, Any]) -> dict[str, Any]:
        group = request["group"]
        check_group(group)
        await self._leading()
        state = self._catalog.groups.groups.get(group)
        if state is None:
            raise UnknownGroup(f"consumer group {group!r} has no members")
        described = describe(state)
        now = self._clock_ms()
        for member in described["members"]:
            seen = self.sessions.seen_ms(group, member["member_id"])
            member["last_seen_ms_ago"] = None if seen is None else max(0, now - seen)
        return described

    async def _list(self, request: dict[str, Any]) -> dict[str, Any]:
        await self._leading()
        return {"groups": [summary(g) for _, g in sorted(self._catalog.groups.groups.items())]}

    # ------------------------------------------------------------------ expiry

    async def run(self) -> None:
        """On the metadata leader: expire silent members (supervised by the node)."""
        while True:
            await asyncio.sleep(EXPIRY_SCAN_S)
            runtime = self._registry.groups.get(METADATA_GROUP)
            if runtime is None or runtime.core.role is not Role.LEADER or not self._caught_up(runtime):
                continue
            self._check_term(runtime)
            for command in self.sessions.expired(self._catalog.groups, self._clock_ms()):
                self._logger.info("group_members_expired", group=command.group, members=list(command.member_ids),
                                  reason=command.reason)
                released = _partitions_of(self._catalog.groups.groups.get(command.group), command.member_ids)
                try:
                    async with self.fence.releasing(command.group, released):
                        (result,) = await runtime.propose([encode_group_command(command)], EntryKind.META)
                except NotLeader:
                    break
                except ClientError as error:
                    # Commits still in flight (PROPOSAL_DROPPED), a full inbox, a step-down
                    # (OUTCOME_UNKNOWN: the next term resets every session): the next scan
                    # looks at these members again, and the loop goes on.
                    self.sessions.recheck(command.group, command.member_ids, self._clock_ms())
                    self._logger.warning("group_expiry_deferred", group=command.group, error=str(error))
                    continue
                if result.error is not None:
                    self._logger.warning("group_expiry_refused", group=command.group, error=str(result.error))

    # ------------------------------------------------------------------ helpers

    def _runtime(self) -> GroupRuntime:
        runtime = self._registry.groups.get(METADATA_GROUP)
        if runtime is None:
            raise LeaderNotAvailable("the metadata group is not open on this node yet")
        return runtime

    def _topics(self) -> CatalogTopics:
        return CatalogTopics(self._catalog.catalog, self._catalog.topics_index)

    @staticmethod
    def _caught_up(runtime: GroupRuntime) -> bool:
        core = runtime.core
        return core.applied_index >= core.commit_index and core.log.term_or_none(core.commit_index) == core.term

    async def _leading(self) -> GroupRuntime:
        """The metadata runtime, led here and caught up with what was committed before."""
        runtime = self._runtime()
        if runtime.core.role is not Role.LEADER:
            raise NotLeader(runtime.core.leader, "this node is no longer the group coordinator")
        if not self._caught_up(runtime):
            await runtime.read_index()
        self._check_term(runtime)
        return runtime

    async def leading(self) -> GroupRuntime:
        """`_leading` for the consumer instances' service (multiraft/node/consumer_instances.py)."""
        return await self._leading()

    def note(self, group: str, member_id: str) -> None:
        """A consumer instance was heard from now (its view was read here)."""
        self._note(group, member_id, self._clock_ms())

    def _note(self, group: str, member_id: str, now_ms: int) -> None:
        """The member was heard from now, as the applied state has it (if it still does)."""
        state = self._catalog.groups.groups.get(group)
        member = state.members.get(member_id) if state is not None else None
        if state is not None and member is not None:
            self.sessions.note(group, member, self._catalog.groups.session_timeout_ms(group, member_id), now_ms)

    def _check_term(self, runtime: GroupRuntime) -> None:
        if runtime.core.term != self._term:
            # Leadership (re)gained: every member gets a full session from now.
            self.sessions.reset(self._catalog.groups, self._clock_ms())
            self._term = runtime.core.term

    async def _call_leader(self, runtime: GroupRuntime, method: str, body: bytes, *, write: bool) -> bytes:
        leader = runtime.core.leader
        if leader == 0:
            raise LeaderNotAvailable("no group coordinator (metadata leader) known yet; retry")
        return await call_peer(self._rpc, leader, method, body, RPC_TIMEOUT_S, write=write)

    async def _json_call(self, method: str, local: Callable[[dict[str, Any]], Any],
                         request: dict[str, Any]) -> dict[str, Any]:
        runtime = self._runtime()
        if runtime.core.role is Role.LEADER:
            return await local(request)  # type: ignore[no-any-return]
        body = await self._call_leader(runtime, method, json.dumps(request).encode(), write=False)
        return json.loads(body)  # type: ignore[no-any-return]

    async def _serve_command(self, source: int, body: bytes) -> tuple[int, bytes]:
        async def work() -> dict[str, Any]:
            return await self._command(decode_group_command(body))

        return await answer(work(), lambda value: json.dumps(value).encode())

    def _serve_json(self, local: Callable[[dict[str, Any]], Any]) -> Callable[[int, bytes], Any]:
        async def serve(source: int, body: bytes) -> tuple[int, bytes]:
            async def work() -> dict[str, Any]:
                try:
                    request = json.loads(body)
                except ValueError:
                    raise InvalidRequest("a groups call's body is JSON") from None
                if not isinstance(request, dict):
                    raise InvalidRequest("a groups call's body is a JSON object")
                try:
                    return await local(request)  # type: ignore[no-any-return]
                except (KeyError, TypeError) as error:
                    raise InvalidRequest(f"a groups call misses a field: {error}") from None

            return await answer(work(), lambda value: json.dumps(value).encode())

        return serve
