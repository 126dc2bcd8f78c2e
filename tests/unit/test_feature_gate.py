"""Goal: a node's part in the cluster's feature level (multiraft/node/features.py), with the
real catalog and fakes for the network: a finalize asks every registered node and proposes
only when each answered and supports the level (an older node's empty answer is level 0),
naming the nodes otherwise, from a catalog synced first; a node decommissioned to the end is
not asked; a new cluster's first metadata leader, and only it, finalizes, at the lowest level
its initial voters support (none while one supports 0 or is silent); the levels heartbeats
carry leave a node below the finalized level out of placement; a node below it says so once
and its catalog reads as unreadable; and a verify's repair keeps no prefix below level 1,
written exactly as before the prefix existed."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import structlog

from multiraft.errors import FeatureLevelUnsupported, InvalidRequest
from multiraft.metadata import Catalog, RegisterNode, SetNodeDecommissioning
from multiraft.metadata.commands import Command, encode_command
from multiraft.metadata.features import SUPPORTED_LEVEL, FinalizeFeatureLevel
from multiraft.node import features
from multiraft.node.catalog_holder import CatalogHolder
from multiraft.node.features import (
    FeatureGate,
    NodeLevel,
    finalize_target,
    first_leader_state,
    read_answer,
)
from multiraft.node.mirror_verify import MirrorVerifier
from multiraft.transport.rpc import RpcUnreachable
from raftlog.messages import Role
from raftlog.types import Index, NodeId, Term
from tests.unit.test_mirror_prefix import INFO, LAST, OLD, VOTERS, _Host, _Logger

NEW = b'{"supported":1,"finalized":0}'  # a node of this build (its catalog caught up with the leader's: _Rpc)
OLDER = b""  # a node from before the gate answers its heartbeat with nothing: level 0


class _Rpc:
    """Each peer's answer to `node.heartbeat`: bytes, or the error the call raises. NEW: a
    node of this build whose catalog applied what the leader's `holder` did (its level)."""

    def __init__(self, answers: dict[int, bytes | Exception], holder: CatalogHolder) -> None:
        self.answers, self.asked, self.holder = answers, [], holder

    async def call(self, peer: int, method: str, body: bytes, timeout_s: float) -> bytes:
        assert method == "node.heartbeat" and read_answer(body)[0] == 1  # the asker's levels, as a heartbeat's
        self.asked.append(peer)
        answer = self.answers[peer]
        if isinstance(answer, Exception):
            raise answer
        if answer == NEW:
            return json.dumps({"supported": 1, "finalized": self.holder.catalog.feature_level}).encode()
        return answer


class _Metadata:
    """Proposals applied at once to the holder's real catalog, as group 0 would."""

    def __init__(self, holder: CatalogHolder) -> None:
        self.holder, self.proposed = holder, []
        self.behind: list[Command] = []  # committed at the leader, applied here at the next sync

    def _apply(self, command: Command) -> Any:
        catalog = self.holder.catalog
        return catalog.apply(Index(catalog.applied_index + 1), command)

    async def propose(self, command: Command) -> None:
        self.proposed.append(command)
        result = self._apply(command)
        if result.error is not None:
            raise result.error

    async def sync_catalog(self) -> None:
        while self.behind:
            assert self._apply(self.behind.pop(0)).ok


def _gate(nodes: int, answers: dict[int, bytes | Exception], *commands: Command,
          groups: dict[int, Any] | None = None, supported: int = 1) -> tuple[FeatureGate, _Rpc, _Metadata]:
    holder = CatalogHolder(supported_level=supported)
    catalog = holder.catalog
    for command in [*(RegisterNode(node_id=NodeId(n), raft_addr=f"n{n}:1", http_addr=f"n{n}:2")
                      for n in range(1, nodes + 1)), *commands]:
        assert catalog.apply(Index(catalog.applied_index + 1), command).ok
    rpc, metadata = _Rpc(answers, holder), _Metadata(holder)
    gate = FeatureGate(NodeId(1), SimpleNamespace(groups=groups or {}), holder, metadata, rpc,  # type: ignore[arg-type]
                       structlog.get_logger(), initial_voters=[NodeId(1), NodeId(2), NodeId(3)])
    return gate, rpc, metadata


@pytest.mark.parametrize(("body", "read"), [(NEW, (1, 0)), (OLDER, (0, None)), (b'{"supported":3,"finalized":2}', (3, 2))])
def test_a_heartbeat_answer_reads_as_levels(body: bytes, read: tuple[int, int | None]) -> None:
    assert read_answer(body) == read


@pytest.mark.parametrize("body", [b"{}", b'{"supported":-1,"finalized":0}', b'{"supported":true,"finalized":0}',
                                  b'{"supported":1}', b"[1]", b"x", b"\xff", b"null"])
def test_a_malformed_answer_is_no_answer(body: bytes) -> None:
    with pytest.raises(ValueError):
        read_answer(body)


def _level(node_id: int, supported: int | None, decommissioned: bool = False) -> NodeLevel:
    return NodeLevel(node_id=node_id, status="alive", supported=supported, decommissioned=decommissioned,
                     error="" if supported is not None else "node silent")


@pytest.mark.parametrize(("nodes", "requested", "finalized", "outcome"), [
    ([_level(1, 1), _level(2, 1), _level(3, 1)], None, 0, 1),
    ([_level(1, 1), _level(2, 1), _level(3, 1)], 1, 1, 1),  # already there: nothing to change
    ([_level(1, 1), _level(2, 1), _level(3, None, decommissioned=True)], None, 0, 1),
    ([_level(1, 1), _level(2, 1), _level(3, 0)], None, 0, "node 3 (alive, supports 0)"),
    ([_level(1, 1), _level(2, 1), _level(3, 0)], None, 1, "node 3 (alive, supports 0)"),  # downgraded since
    ([_level(1, 1), _level(2, None)], None, 0, "no answer from node 2 (alive, node silent)"),
    ([_level(1, 0), _level(2, 0)], None, 0, "not supported by node 1 (alive, supports 0), node 2"),
    ([_level(1, 1), _level(2, 1)], 2, 1, "feature level 2 is not supported"),
    ([_level(1, 2), _level(2, 2)], 1, 2, InvalidRequest),
    ([_level(1, None, decommissioned=True)], None, 0, "no registered node to ask"),
    ([], None, 0, "no registered node to ask"),
])
def test_the_finalize_target(nodes: list[NodeLevel], requested: int | None, finalized: int, outcome: object) -> None:
    if isinstance(outcome, int):
        assert finalize_target(nodes, requested, finalized) == outcome
        return
    error = outcome if isinstance(outcome, type) else FeatureLevelUnsupported
    with pytest.raises(error) as refused:  # type: ignore[call-overload]
        finalize_target(nodes, requested, finalized)
    if isinstance(outcome, str):
        assert outcome in refused.value.message and refused.value.http_status == 409


@pytest.mark.asyncio
async def test_a_finalize_is_refused_while_a_node_supports_less_and_proposed_once_every_node_does() -> None:
    gate, rpc, metadata = _gate(3, {2: NEW, 3: OLDER})
    async with asyncio.timeout(5):
        report = await gate.report()
        assert (report["finalized"], report["highest_common"], report["not_answered"]) == (0, 0, [])
        assert [(n["node_id"], n["supported"], n["finalized"]) for n in report["nodes"]] == [
            (1, 1, 0), (2, 1, 0), (3, 0, None)]
        with pytest.raises(FeatureLevelUnsupported) as refused:
            await gate.finalize(None)
        assert "node 3 (alive, supports 0)" in refused.value.message
        assert metadata.proposed == [] and gate.health() == {"supported": 1, "finalized": 0, "unsupported": False}
        rpc.answers[3] = NEW  # node 3 upgraded
        report = await gate.finalize(None)
        assert metadata.proposed == [FinalizeFeatureLevel(level=1)]
        assert (report["finalized"], report["previous"], report["highest_common"]) == (1, 0, 1)
        again = await gate.finalize(1)  # the same level: nothing proposed
        assert (again["finalized"], again["previous"], len(metadata.proposed)) == (1, 1, 1)
    # Itself answered locally, the others each time, and once more after the commit.
    assert sorted(rpc.asked) == [2] * 5 + [3] * 5


@pytest.mark.asyncio
async def test_a_silent_node_blocks_a_finalize_and_a_decommissioned_one_is_not_asked() -> None:
    gate, rpc, _ = _gate(4, {2: NEW, 3: RpcUnreachable("node 3 is silent; it may be down")},
                                SetNodeDecommissioning(node_id=NodeId(4), decommissioning=True))
    async with asyncio.timeout(5):
        with pytest.raises(FeatureLevelUnsupported) as refused:
            await gate.finalize(None)
        assert "no answer from node 3 (alive, node 3 is silent" in refused.value.message
        rpc.answers[3] = NEW
        report = await gate.finalize(None)
    assert report["finalized"] == 1 and 4 not in rpc.asked  # holds no copy, out of the metadata group
    assert report["nodes"][3] == {"node_id": 4, "status": "alive", "answered": False, "supported": None,
                                  "finalized": None, "decommissioned": True, "error": ""}


@pytest.mark.asyncio
async def test_a_finalize_answers_each_nodes_level_asked_again_after_the_commit(
        monkeypatch: pytest.MonkeyPatch) -> None:
    gate, rpc, _ = _gate(3, {2: NEW, 3: NEW})
    async with asyncio.timeout(5):
        report = await gate.finalize(None)
    assert [(n["node_id"], n["supported"], n["finalized"]) for n in report["nodes"]] == [(1, 1, 1), (2, 1, 1), (3, 1, 1)]
    assert sorted(rpc.asked) == [2, 2, 3, 3]  # before it, and once after: each sees it already
    monkeypatch.setattr(features, "FINALIZE_REREAD_S", 0.3)
    gate, rpc, _ = _gate(3, {2: NEW, 3: b'{"supported":1,"finalized":0}'[:-1] + b" }"})  # node 3 lags behind
    async with asyncio.timeout(5):
        report = await gate.finalize(None)
    assert [(n["node_id"], n["finalized"]) for n in report["nodes"]] == [(1, 1), (2, 1), (3, 0)]
    assert rpc.asked.count(3) > 2  # asked again until the bound: what it says last is shown


@pytest.mark.asyncio
async def test_a_finalize_asks_the_nodes_of_a_catalog_synced_first() -> None:
    gate, rpc, metadata = _gate(2, {2: NEW, 3: OLDER})
    metadata.behind.append(RegisterNode(node_id=NodeId(3), raft_addr="n3:1", http_addr="n3:2"))  # not here yet
    async with asyncio.timeout(5):
        with pytest.raises(FeatureLevelUnsupported) as refused:
            await gate.finalize(None)
    assert "node 3 (alive, supports 0)" in refused.value.message and 3 in rpc.asked and metadata.proposed == []


@pytest.mark.asyncio
async def test_a_finalize_above_what_the_nodes_support_or_below_the_level_is_refused() -> None:
    gate, _, metadata = _gate(2, {2: NEW})
    async with asyncio.timeout(5):
        with pytest.raises(FeatureLevelUnsupported):
            await gate.finalize(2)
        assert metadata.holder.catalog.apply(Index(3), FinalizeFeatureLevel(level=2)).ok  # a later build's
        with pytest.raises(InvalidRequest):
            await gate.finalize(1)
    assert metadata.proposed == []


def _metadata_runtime(entries: list[int], role: Role, term: int, committed: int) -> Any:
    """Group 0's replica with entries of these terms from index 1 (three bootstrap entries first)."""
    log = SimpleNamespace(last_index=lambda: len(entries), committed=Index(committed),
                          term_or_none=lambda i: Term(entries[i - 1]) if 1 <= i <= len(entries) else None)
    return SimpleNamespace(core=SimpleNamespace(log=log, role=role, term=Term(term)))


@pytest.mark.parametrize(("runtime", "state"), [
    (None, "open"),
    (_metadata_runtime([1, 1, 1], Role.FOLLOWER, 2, 3), "open"),  # no leader has appended yet
    (_metadata_runtime([1, 1, 1, 2], Role.LEADER, 2, 3), "mine"),  # this leader's entry follows the bootstrap
    (_metadata_runtime([1, 1, 1, 2, 2, 2], Role.LEADER, 2, 6), "mine"),  # registrations after it: still its term
    (_metadata_runtime([1, 1, 1, 2], Role.FOLLOWER, 2, 3), "open"),  # not committed: may still be replaced
    (_metadata_runtime([1, 1, 1, 2], Role.FOLLOWER, 2, 4), "closed"),
    (_metadata_runtime([1, 1, 1, 2, 3], Role.LEADER, 3, 5), "closed"),  # a later leader: something was written
])
def test_only_a_new_clusters_first_metadata_leader_finalizes(runtime: Any, state: str) -> None:
    assert first_leader_state(runtime, 3) == state


async def _first_leader_run(answers: dict[int, bytes | Exception], supported: int = 1,
                            run_s: float = 0.3) -> tuple[list[Command], list[int], list[dict[str, Any]]]:
    """A new cluster's first metadata leader (node 1 of initial voters 1-3) running for
    `run_s`: what it proposed, whom it asked, what it logged."""
    groups = {0: _metadata_runtime([1, 1, 1, 2], Role.LEADER, 2, 4)}
    with structlog.testing.capture_logs() as logs:
        gate, rpc, metadata = _gate(0, answers, groups=groups, supported=supported)
        task = asyncio.create_task(gate.run())
        await asyncio.sleep(run_s)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    return metadata.proposed, rpc.asked, logs


@pytest.mark.asyncio
async def test_the_first_leader_finalizes_at_the_lowest_level_the_initial_voters_support() -> None:
    proposed, asked, _ = await _first_leader_run({2: NEW, 3: b'{"supported":3,"finalized":0}'})
    assert proposed == [FinalizeFeatureLevel(level=1)] and sorted(asked) == [2, 3]  # once: then it is there
    proposed, asked, logs = await _first_leader_run({2: NEW, 3: OLDER})  # an initial voter of an older build
    assert proposed == [] and sorted(asked) == [2, 3]  # asked once, then left to the operator
    assert [log["nodes"] for log in logs if log["event"] == "feature_level_first_finalize_skipped"] == [
        "node 3 (initial voter, supports 0)"]
    proposed, asked, _ = await _first_leader_run({}, supported=0)  # its own build supports 0: nothing to ask
    assert proposed == [] and asked == []


@pytest.mark.asyncio
async def test_the_first_leader_finalizes_nothing_while_an_initial_voter_is_silent(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(features, "FIRST_FINALIZE_ASK_S", 0.2)
    monkeypatch.setattr(features, "WATCH_INTERVAL_S", 0.05)
    proposed, asked, logs = await _first_leader_run({2: NEW, 3: RpcUnreachable("node 3 is silent")}, run_s=0.6)
    assert proposed == [] and asked.count(3) >= 2 and asked.count(3) == asked.count(2)  # again, within the bound
    assert [log["nodes"] for log in logs if log["event"] == "feature_level_first_finalize_skipped"] == [
        "node 3 (initial voter, node 3 is silent)"]


def test_the_levels_heartbeats_carry_leave_a_node_below_the_finalized_level_out_of_placement() -> None:
    gate, _, metadata = _gate(4, {})
    for source, body in ((2, NEW), (3, OLDER), (4, b"not json")):  # a malformed body: nothing learned
        gate.heard(source, body)
    assert gate.below_level() == frozenset()  # the cluster is at level 0: every node is at it
    assert metadata.holder.catalog.apply(Index(5), FinalizeFeatureLevel(level=1)).ok
    assert gate.below_level() == {3}
    gate.heard(3, NEW)  # upgraded
    gate.heard(4, b'{"supported":0,"finalized":1}')  # rolled back
    assert gate.below_level() == {4}


@pytest.mark.asyncio
async def test_a_node_below_the_finalized_level_says_so_once_and_reads_its_catalog_as_unreadable() -> None:
    with structlog.testing.capture_logs() as logs:  # (loggers bound inside it are captured)
        gate, _, metadata = _gate(1, {}, supported=0)
        holder = metadata.holder
        gate._watch()
        assert holder.readable and logs == []
        assert holder.catalog.apply(Index(2), FinalizeFeatureLevel(level=1)).ok
        gate._watch()
        gate._watch()
    assert not holder.readable and gate.health() == {"supported": 0, "finalized": 1, "unsupported": True}
    assert [(log["event"], log["log_level"], log["supported_level"], log["finalized_level"]) for log in logs] == [
        ("feature_level_unsupported", "error", 0, 1)]
    assert json.loads(gate.heartbeat_answer()) == {"supported": 0, "finalized": 1}


@pytest.mark.asyncio
async def test_below_level_1_a_verifys_repair_resyncs_whole_written_as_before_the_prefix(tmp_path: Path) -> None:
    host = _Host(tmp_path)
    differs_at = host.store.offset_after(Index(41))
    runtime = SimpleNamespace(core=SimpleNamespace(membership=SimpleNamespace(learners=frozenset(),
                                                                              voters=frozenset(VOTERS)),
                                                   applied_index=Index(LAST)))
    registry = SimpleNamespace(stores={OLD: host.store}, leading=lambda group: runtime)
    for level, kept in ((0, False), (1, True)):
        catalog = SimpleNamespace(feature_level=level, topic=lambda name: SimpleNamespace(partitions=(INFO,)))
        metadata = _Proposals()
        verifier = MirrorVerifier(registry, SimpleNamespace(catalog=catalog), None, None, None,  # type: ignore[arg-type]
                                  metadata, _Logger())  # type: ignore[arg-type]
        async with asyncio.timeout(10):
            outcome = await verifier._resync("orders", 0, OLD, 0, differs_at)
        (command,) = metadata.proposed
        assert outcome[0] == "resync_started" and (outcome[1] > 0) == kept and bool(command.prefix_index) == kept
        if not kept:  # the bytes an older node writes and reads (tests/unit/test_mirror_prefix.py OLD_RESYNC)
            assert encode_command(command) == (b'{"group_id":5,"name":"orders","partition":0,"start_offset":0,'
                                               b'"type":"resync_mirror_partition","v":1}')


class _Proposals:
    def __init__(self) -> None:
        self.proposed: list[Any] = []

    async def propose(self, command: Any) -> None:
        self.proposed.append(command)


def test_the_catalog_holder_reads_a_catalog_at_or_below_its_level() -> None:
    holder = CatalogHolder()
    assert holder.supported_level == SUPPORTED_LEVEL == 3 and holder.readable
    holder.replace(Catalog.restore(holder.catalog.snapshot().replace(b'"drained":[]', b'"drained":[],"feature_level":4')))
    assert holder.catalog.feature_level == 4 and not holder.readable
