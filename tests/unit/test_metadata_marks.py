"""A node mark (drain, decommission) is proposed again when the metadata leader was
handing its leadership over: the fuzz pass met `POST /v1/admin/nodes/2/drain` answering
503 LEADERSHIP_TRANSFER_IN_PROGRESS (a second drain of node 2 while its first moved the
metadata group's leadership away). Other refusals are answered at once."""

from __future__ import annotations

import asyncio

import pytest

from multiraft.metadata.commands import SetNodeDrained
from multiraft.node import metadata_ops
from multiraft.node.metadata_ops import MetadataOps
from multiraft.node.registry import METADATA_GROUP
from multiraft.transport.remote_errors import error_from_body
from raftlog.errors import ClientError, LeadershipTransferInProgress, NotEnoughReplicas, NotLeader
from raftlog.types import NodeId

pytestmark = pytest.mark.asyncio(loop_scope="function")


def _ops(answers: list[ClientError | None]) -> tuple[MetadataOps, list[object]]:
    ops = MetadataOps.__new__(MetadataOps)  # only `propose` and the clock are used by the marks
    proposed: list[object] = []
    now = [0.0]
    ops._clock = lambda: now[0]  # type: ignore[assignment]

    async def propose(command: object) -> None:
        proposed.append(command)
        now[0] += 1.0  # each proposal takes a second
        answer = answers.pop(0)
        if answer is not None:
            raise answer

    ops.propose = propose  # type: ignore[method-assign]
    return ops, proposed


def _reading_ops(runtime: object) -> MetadataOps:
    """MetadataOps whose metadata group is `runtime` (only its read_index is used)."""

    class Registry:
        groups = {METADATA_GROUP: runtime}

    ops = MetadataOps.__new__(MetadataOps)
    ops._registry = Registry()  # type: ignore[assignment]
    return ops


@pytest.fixture(autouse=True)
def _no_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metadata_ops, "SET_DRAINED_RETRY_S", 0.0)


async def test_a_mark_dropped_during_a_leadership_transfer_is_proposed_again() -> None:
    forwarded = error_from_body(b'{"error_code": "LEADERSHIP_TRANSFER_IN_PROGRESS", '
                                b'"message": "leadership is moving to node 3"}')
    assert not isinstance(forwarded, LeadershipTransferInProgress)  # a peer's answer: by its code
    ops, proposed = _ops([LeadershipTransferInProgress("moving to 3"), forwarded, None])
    await ops.set_drained(NodeId(2), True)
    assert proposed == [SetNodeDrained(node_id=NodeId(2), drained=True)] * 3


async def test_a_transfer_that_outlasts_the_attempts_is_answered() -> None:
    # Goal: bounded by SET_DRAINED_WAIT_S (8 s: eight proposals of a second each), well
    # inside the HTTP answer's 15 s, then the last refusal is the answer.
    ops, proposed = _ops([LeadershipTransferInProgress("moving")] * 100)
    with pytest.raises(LeadershipTransferInProgress):
        await ops.set_drained(NodeId(2), True)
    assert len(proposed) == 8


async def test_other_refusals_are_answered_at_once() -> None:
    ops, proposed = _ops([NotEnoughReplicas("no")])
    with pytest.raises(NotEnoughReplicas):
        await ops.set_decommissioning(NodeId(2), True)
    assert len(proposed) == 1


async def test_a_catalog_sync_whose_forwarded_read_was_lost_asks_again(monkeypatch: pytest.MonkeyPatch) -> None:
    # Goal: the drain's propagation (sync_catalog, a ReadIndex) answered in seconds when the
    # read it forwarded died with the metadata leader's leadership (the fuzz pass met a 504
    # after 15 s): one lost read, one refused by a node without a leader, then an answer.
    monkeypatch.setattr(metadata_ops, "READ_ATTEMPT_S", 0.05)
    asked: list[str] = []

    class Runtime:
        async def read_index(self) -> int:
            asked.append("read")
            if len(asked) == 1:
                await asyncio.sleep(3600)  # forwarded to a leader that stepped down: never answered
            if len(asked) == 2:
                raise NotLeader(NodeId(0), "no leader known to confirm a read")
            return 7

    ops = _reading_ops(Runtime())
    async with asyncio.timeout(5):
        await ops.sync_catalog()
    assert asked == ["read"] * 3


async def test_a_catalog_sync_that_no_leader_confirms_is_refused_within_its_bound(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Goal: bounded whatever the caller does (a produce with a new producer id waits on it):
    # reads never answered end as NOT_LEADER (retriable) after SYNC_CATALOG_WAIT_S.
    monkeypatch.setattr(metadata_ops, "READ_ATTEMPT_S", 0.05)
    monkeypatch.setattr(metadata_ops, "SYNC_CATALOG_WAIT_S", 0.3)

    class Runtime:
        async def read_index(self) -> int:
            await asyncio.sleep(3600)
            return 0

    ops = _reading_ops(Runtime())
    async with asyncio.timeout(5):
        with pytest.raises(NotLeader):
            await ops.sync_catalog()
