"""Produce: one record batch appended to a partition, on its leader (forwarded there if needed).

The leader checks the producer's sequence against the partition's producer table
(a duplicate answers at once with its first offsets), then proposes the batch and
answers as `acks` asks: at once (`none`), after its own fsync (`leader`), after
commit (`quorum`) or after every in-sync replica (`all`). Every path answers a
`ProduceResult`; a forwarded one crosses back as JSON.

A topic produce spread over several partitions (`produce_spread`) proposes the
batches of the partitions led here and forwards the others one call per leader
node (`forwarding.py`), each partition answered on its own.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from multiraft.errors import InvalidBatch, InvalidRequest, MirrorReadOnly, UnknownProducerId
from multiraft.node import forwarding
from multiraft.node.acks import Acks
from multiraft.node.batch_checks import validate_off_loop
from multiraft.node.forwarding import ForwardItem, Outcome, PartitionBatch
from multiraft.node.produce_result import NO_OFFSET, ProduceResult
from multiraft.node.routing import call_peer
from multiraft.state.partition import ApplyResult
from multiraft.state.producers import Accept, Duplicate, DuplicatePending
from multiraft.transport.rpc import RPC_TIMEOUT_S, STATUS_OK, Rpc, answer, error_answer
from raftlog.errors import ClientError, LeaderNotAvailable, NotLeader, ProposalDropped
from raftlog.types import GroupId, Index
from storage.batch import BatchHeader
from storage.errors import InvalidBatchError

if TYPE_CHECKING:
    from multiraft.node.catalog_holder import CatalogHolder
    from multiraft.node.routing import Routing

_PRODUCE = struct.Struct(">QB")  # group id, acks


class Produce:
    def __init__(self, routing: Routing, catalog: CatalogHolder, rpc: Rpc,
                 sync_catalog: Callable[[], Awaitable[None]]) -> None:
        """`sync_catalog`: catch this node's catalog up with the metadata leader (a ReadIndex)."""
        self._routing = routing
        self._registry = routing.registry
        self._catalog = catalog
        self._rpc = rpc
        self._sync_catalog = sync_catalog
        rpc.register("partition.produce", self.serve)
        rpc.register(forwarding.METHOD, self.serve_many)

    async def produce(self, topic: str, partition: int, batch: bytes, acks: Acks | str = Acks.QUORUM,
                      header: BatchHeader | None = None) -> ProduceResult:
        """Append one record batch to a partition; forwarded to its leader if needed.

        `acks`: "none" (answer at once), "leader" (after the leader's fsync),
        "quorum" (after commit, the default), "all" (after every in-sync replica).
        `header`: what `validate_batch` returned, when the caller already validated
        `batch` (the HTTP layer does, to answer 400 before anything else): not twice.
        """
        acks = Acks.parse(acks)
        group_id = self._catalog.partition_group(topic, partition)
        if self._registry.leading(group_id) is not None:
            return await self._produce_local(group_id, batch, acks, header)
        replicas = self._catalog.catalog.topic(topic).partitions[partition].replicas
        leader = self._routing.forward_target(group_id, replicas)
        if leader == 0:
            raise LeaderNotAvailable("the partition has no leader yet")
        body = _PRODUCE.pack(group_id, acks.code) + batch
        reply = await call_peer(self._rpc, leader, "partition.produce", body, RPC_TIMEOUT_S, write=True)
        return ProduceResult.from_json(reply)

    def produce_spread(self, topic: str, batches: Sequence[PartitionBatch],
                       acks: Acks | str = Acks.QUORUM) -> list[Awaitable[ProduceResult]]:
        """Each batch to its partition of `topic`: one awaitable per batch, in order, each
        answering (or raising) that partition's own outcome. The batches of partitions led
        here are proposed here; the others go to their leaders, one call per leader node
        (split only past the call's bounds). Await them all: a call runs until its
        deadline whether or not anyone still waits for it."""
        acks = Acks.parse(acks)
        waits: list[Awaitable[ProduceResult] | None] = [None] * len(batches)
        to_forward: dict[int, list[tuple[int, ForwardItem]]] = {}  # leader -> (position, item)
        for position, entry in enumerate(batches):
            group_id = self._catalog.partition_group(topic, entry.partition)
            if self._registry.leading(group_id) is not None:
                waits[position] = self._produce_local(group_id, entry.batch, acks)
                continue
            replicas = self._catalog.catalog.topic(topic).partitions[entry.partition].replicas
            leader = self._routing.forward_target(group_id, replicas)
            if leader == 0:
                waits[position] = _raise(LeaderNotAvailable("the partition has no leader yet"))
                continue
            to_forward.setdefault(leader, []).append((position, ForwardItem(group_id=group_id, batch=entry.batch)))
        for leader, entries in sorted(to_forward.items()):
            positions = iter([position for position, _ in entries])
            for chunk in forwarding.chunks([item for _, item in entries]):
                call = asyncio.ensure_future(self._forward(leader, acks, chunk))
                call.add_done_callback(_consume_task)
                for index in range(len(chunk)):
                    waits[next(positions)] = _outcome_of(call, index)
        assert all(wait is not None for wait in waits)
        return waits  # type: ignore[return-value]  # every place filled (asserted)

    async def _forward(self, leader: int, acks: Acks, items: list[ForwardItem]) -> list[Outcome]:
        """One call to `leader` for `items`; a call that fails as a whole fails each of them
        as a single forward would have failed (NOT_LEADER retriable, OUTCOME_UNKNOWN)."""
        body = forwarding.encode_request(acks, items)
        try:
            reply = await call_peer(self._rpc, leader, forwarding.METHOD, body, RPC_TIMEOUT_S, write=True)
        except ClientError as error:
            return [error] * len(items)
        return forwarding.decode_answer(reply, len(items))

    def require_leadership(self, topic: str, partition: int) -> None:
        """Refuse (421 naming the leader, or 503 when none is known) unless this node leads."""
        group_id = self._catalog.partition_group(topic, partition)
        runtime = self._registry.groups.get(group_id)
        if runtime is None:
            replicas = self._catalog.catalog.topic(topic).partitions[partition].replicas
            raise NotLeader(self._routing.forward_target(group_id, replicas),
                            "this node hosts no replica of the partition")
        if self._registry.leading(group_id) is None:
            raise NotLeader(runtime.core.leader, "this node does not lead the partition")

    async def _produce_local(self, group_id: GroupId, batch: bytes, acks: Acks,
                             header: BatchHeader | None = None) -> ProduceResult:
        if header is None:  # first: nothing below may be separated from the proposal by an await
            try:
                header = await validate_off_loop(batch)
            except InvalidBatchError as error:
                raise InvalidBatch(str(error)) from None
        if header.producer_id >= self._catalog.catalog.next_producer_id:  # before the checks below: it may await
            await self._require_allocated(header.producer_id)
        runtime = self._registry.leading(group_id)
        if runtime is None:
            raise NotLeader(self._registry.local_leader(group_id), "this node no longer leads the partition")
        machine = self._registry.partitions[group_id]
        if machine.state.mirror:  # until its promotion applied (docs/mirror.md)
            raise MirrorReadOnly(f"{machine.state.topic} is a mirror of a source cluster's topic: read-only "
                                 "until promoted (raftlog mirror promote)")
        core = runtime.core
        if acks in (Acks.QUORUM, Acks.ALL):
            topic = self._catalog.catalog.topic(machine.state.topic)
            core.check_min_insync(int(topic.config.get("min_insync_replicas", 1)))
        if core.applied_index < core.commit_index or core.log.term_or_none(core.commit_index) != core.term:
            # Until this leader applied its own term's NOOP, its producer table may lag.
            raise ProposalDropped("the new leader is not ready yet; retry")
        decision = machine.state.check_produce(header)
        if isinstance(decision, Duplicate):
            return ProduceResult(base_offset=decision.base_offset, count=decision.record_count, duplicate=True)
        if isinstance(decision, DuplicatePending):
            raise ProposalDropped("this batch is still being replicated; retry for its offsets")
        assert isinstance(decision, Accept)
        machine.state.record_proposal(header)
        if acks is Acks.NONE:
            task = asyncio.create_task(runtime.propose([batch]))
            task.add_done_callback(_consume_task)
            return ProduceResult(base_offset=NO_OFFSET, count=header.record_count, duplicate=False)
        (result,) = await runtime.propose([batch], acks=acks)
        if acks is Acks.LEADER:  # durable here, not committed: the offset the leader's log gives it (Kafka's acks=1)
            base_offset = self._registry.stores[group_id].offset_after(Index(result - 1))
            return ProduceResult(base_offset=int(base_offset), count=header.record_count, duplicate=False)
        return applied(result)

    async def _require_allocated(self, producer_id: int) -> None:
        """Refuse a producer id the cluster never handed out (UNKNOWN_PRODUCER_ID), so a
        client cannot fill the partition's producer table with invented ids. This node's
        catalog may trail the allocation a client just got elsewhere, so it first catches
        up with every allocation completed before (a ReadIndex on the metadata group);
        only ids above the catalog's next id pay that."""
        await self._sync_catalog()
        if producer_id >= self._catalog.catalog.next_producer_id:
            raise UnknownProducerId(producer_id, self._catalog.catalog.next_producer_id)

    async def serve(self, source: int, body: bytes) -> tuple[int, bytes]:
        """partition.produce: a produce forwarded by a peer."""
        group_id, acks_code = _PRODUCE.unpack_from(body)
        try:
            acks = Acks.from_code(acks_code)
        except InvalidRequest as error:
            return error_answer(error)
        if self._registry.leading(GroupId(group_id)) is None:
            return error_answer(NotLeader(self._registry.local_leader(GroupId(group_id))))
        work = self._produce_local(GroupId(group_id), body[_PRODUCE.size :], acks)
        return await answer(work, ProduceResult.to_json)

    async def serve_many(self, source: int, body: bytes) -> tuple[int, bytes]:
        """partition.produce_many: the batches a peer forwards for partitions led here,
        served concurrently, each answered on its own (forwarding.py)."""
        try:
            acks, items = forwarding.decode_request(body)
        except InvalidRequest as error:
            return error_answer(error)
        results = await asyncio.gather(*(self._serve_item(item, acks) for item in items), return_exceptions=True)
        outcomes: list[Outcome] = []
        for result in results:
            if isinstance(result, ProduceResult | ClientError):
                outcomes.append(result)
                continue
            # A bug (not a client error): reported as the RPC layer reports one, and this
            # batch alone answers INTERNAL (the others' outcomes are known).
            asyncio.get_running_loop().call_exception_handler(
                {"message": "forwarded produce failed", "exception": result})
            outcomes.append(ClientError("internal error"))
        return STATUS_OK, forwarding.encode_answer(outcomes)

    async def _serve_item(self, item: ForwardItem, acks: Acks) -> ProduceResult:
        if self._registry.leading(item.group_id) is None:
            raise NotLeader(self._registry.local_leader(item.group_id))
        return await self._produce_local(item.group_id, item.batch, acks)


async def _raise(error: BaseException) -> ProduceResult:
    raise error


async def _outcome_of(call: asyncio.Future[list[Outcome]], index: int) -> ProduceResult:
    """The outcome of the `index`th batch of a forwarded call. Shielded: one partition's
    caller giving up (its deadline) must not cancel the call the others wait on."""
    outcome = (await asyncio.shield(call))[index]
    if isinstance(outcome, ClientError):
        raise outcome
    return outcome


def _consume_task(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()  # acks=none: nobody waits; the outcome is dropped on purpose


def applied(result: ApplyResult) -> ProduceResult:
    """A committed batch's apply result as the producer's answer; a batch the state
    machine refused (found out of order or fenced only at apply) raises its error here,
    inside the produce, so a forwarded produce answers it as a typed error too."""
    if result.error is not None:
        raise result.error
    assert result.base_offset is not None, "an applied DATA entry has offsets"
    return ProduceResult(base_offset=int(result.base_offset), count=result.count, duplicate=result.duplicate)
