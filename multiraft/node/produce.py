"""Produce: one record batch appended to a partition, on its leader (forwarded there if needed).

The leader checks the producer's sequence against the partition's producer table
(a duplicate answers at once with its first offsets), then proposes the batch and
answers as `acks` asks: at once (`none`), after its own fsync (`leader`), after
commit (`quorum`) or after every in-sync replica (`all`). Every path answers a
`ProduceResult`; a forwarded one crosses back as JSON.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from multiraft.errors import InvalidBatch, InvalidRequest, UnknownProducerId
from multiraft.node.acks import Acks
from multiraft.node.batch_checks import validate_off_loop
from multiraft.node.produce_result import NO_OFFSET, ProduceResult
from multiraft.node.routing import call_peer
from multiraft.state.partition import ApplyResult
from multiraft.state.producers import Accept, Duplicate, DuplicatePending
from multiraft.transport.rpc import RPC_TIMEOUT_S, Rpc, answer, error_answer
from raftlog.errors import LeaderNotAvailable, NotLeader, ProposalDropped
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
