"""The `move` fault (chaos/moves.py, issue 25) without a cluster: its status parsing,
its target choice, when it is unavailable, one move's ask-follow-close against a fake
server, and how the nemesis runs it beside the other faults."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

from chaos import moves, nemesis
from chaos.history import PartitionKey
from chaos.moves import Mover, MoveRecord, StatusError, parse_status
from multiraft.client import RaftlogError

KEYS = [PartitionKey("chaos-a", 0)]
STATUS = {"node_id": 3, "decommissioning": True, "stage": "moving_replicas", "replicas": 4,
          "partitions_led": 0, "metadata_member": "voter", "waiting_for": ""}


# -- the status -------------------------------------------------------------------


@pytest.mark.parametrize("stage", ["moving_replicas", "leaving_metadata", "done"])
def test_every_documented_stage_parses(stage: str) -> None:
    # Goal: the shape live_ops.decommission_status answers is read as it is.
    status = parse_status({**STATUS, "stage": stage, "metadata_member": "none"})
    assert (status.node_id, status.stage, status.replicas, status.metadata_member) == (3, stage, 4, "none")


def test_a_recommissioned_status_has_no_stage() -> None:
    status = parse_status({**STATUS, "decommissioning": False, "stage": None, "metadata_member": "learner"})
    assert status.stage is None and not status.decommissioning


@pytest.mark.parametrize("change", [
    {"stage": "moving"},  # unknown stage
    {"stage": None},  # decommissioning without a stage
    {"decommissioning": False},  # a stage without decommissioning
    {"replicas": -1},
    {"replicas": True},  # a bool is no count
    {"partitions_led": "2"},
    {"metadata_member": "observer"},
    {"waiting_for": None},
    {"decommissioning": "yes"},
])
def test_a_status_of_another_shape_is_refused(change: dict[str, Any]) -> None:
    # Goal: a changed server answer is an error, never read as "not done yet" forever.
    with pytest.raises(StatusError):
        parse_status({**STATUS, **change})


def test_a_status_missing_a_field_is_refused() -> None:
    answer = dict(STATUS)
    del answer["stage"]
    with pytest.raises(StatusError, match="stage"):
        parse_status(answer)


def test_stages_are_kept_in_the_order_first_seen() -> None:
    seen: list[str] = []
    for stage in ["moving_replicas", "moving_replicas", "leaving_metadata", "done", "done"]:
        seen = moves.stages_seen(seen, parse_status({**STATUS, "stage": stage}))
    assert seen == ["moving_replicas", "leaving_metadata", "done"]
    recommissioned = parse_status({**STATUS, "decommissioning": False, "stage": None})
    assert moves.stages_seen(seen, recommissioned) == seen


# -- planning -----------------------------------------------------------------------


@pytest.mark.parametrize(("nodes", "available"), [(3, False), (4, True), (5, True)])
def test_move_needs_a_node_beyond_the_replication_factor(nodes: int, available: bool) -> None:
    # Goal: with replication factor 3, three nodes leave a decommission nowhere to move
    # replicas (the server would refuse every one), so the kind is not offered and says why.
    reason = moves.unavailable_reason(nodes, 3)
    assert (reason is None) == available
    if reason is not None:
        assert "CLUSTER_TOO_SMALL" in reason and "4+ nodes" in reason


def test_the_target_holds_replicas_when_some_serving_node_does() -> None:
    held = {1: 5, 2: 0, 4: 3}
    picks = {moves.choose_target(random.Random(seed), [1, 2, 3, 4], held) for seed in range(50)}
    assert picks == {1, 4}
    assert moves.choose_target(random.Random(1), [2, 3], held) in (2, 3), "none holds: any serving node"
    assert moves.choose_target(random.Random(1), [], held) is None


def test_the_target_is_a_function_of_the_seed() -> None:
    held = {n: 1 for n in range(1, 6)}
    assert moves.choose_target(random.Random(7), [5, 3, 1], held) == moves.choose_target(
        random.Random(7), [1, 3, 5], held)


def test_replicas_are_counted_per_node_from_topic_views() -> None:
    topics = [{"partitions": [{"replicas": [1, 2, 3]}, {"replicas": [2, 3, 4]}]},
              {"partitions": [{"replicas": [3, 4, 5]}]}]
    assert moves.replicas_by_node(topics) == {1: 1, 2: 2, 3: 3, 4: 2, 5: 1}


def test_a_record_describes_what_happened() -> None:
    record = MoveRecord(node=2, asked_s=10.0, answer="accepted", replicas_at_start=5,
                        stages=["moving_replicas", "done"], done_after_s=7.25, recommissioned=True,
                        closed_after_s=9.5)
    assert record.describe() == ("n2 (5 replicas): accepted; moving_replicas -> done, done in 7.2 s, "
                                 "recommissioned at 9.5 s")
    refused = MoveRecord(node=4, asked_s=1.0, answer="refused CLUSTER_TOO_SMALL")
    assert refused.describe() == "n4: refused CLUSTER_TOO_SMALL"
    assert moves.summarize([record, refused]) == "2 asked (1 done, 1 refused), longest to done 7.2 s"
    assert moves.summarize([]) == "0 asked (0 done, 0 refused)"


# -- one move against a fake server ---------------------------------------------------


class FakeCluster:
    def __init__(self, nodes: int = 5) -> None:
        self.ids = list(range(1, nodes + 1))
        self.down: set[int] = set()
        self.paused: set[int] = set()

    def serving(self) -> list[int]:
        return [n for n in self.ids if n not in self.down and n not in self.paused]

    def http(self, node: int) -> str:
        return f"127.0.0.{node}:8080"

    def pause(self, node: int) -> None:
        self.paused.add(node)

    def leader_of(self, topic: str, partition: int) -> int | None:
        return None

    def metadata_leader(self) -> int | None:
        return None

    def resume(self, node: int) -> None:
        self.paused.discard(node)


class FakeServer:
    """The decommission API of a whole cluster: the status walks one stage per GET."""

    def __init__(self, refuse: str | None = None, stuck: bool = False, recommission_fails: int = 0,
                 member_after_readmission: bool = True) -> None:
        self.refuse = refuse
        self.stuck = stuck  # never gets past moving_replicas
        self.recommission_fails = recommission_fails
        self.member_after_readmission = member_after_readmission
        self.marked: dict[int, int] = {}  # node -> GETs since marked
        self.member: dict[int, str] = {}
        self.calls: list[tuple[str, int, tuple[str, ...]]] = []

    def status(self, node: int) -> dict[str, Any]:
        if node not in self.marked:
            return {**STATUS, "node_id": node, "decommissioning": False, "stage": None,
                    "metadata_member": self.member.get(node, "voter")}
        step = 0 if self.stuck else min(self.marked[node], 2)
        return {**STATUS, "node_id": node, "stage": moves.STAGES[step], "replicas": max(0, 4 - 4 * step),
                "metadata_member": "none" if step == 2 else "voter"}


class FakeClient:
    def __init__(self, server: FakeServer, servers: list[str]) -> None:
        self.server = server
        self.servers = tuple(servers)

    async def __aenter__(self) -> FakeClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    async def describe_topic(self, name: str) -> dict[str, Any]:
        return {"partitions": [{"replicas": [1, 2, 3]}, {"replicas": [2, 3, 4]}]}

    async def decommission_node(self, node: int) -> dict[str, Any]:
        self.server.calls.append(("POST", node, self.servers))
        if self.server.refuse is not None:
            raise RaftlogError(self.server.refuse, "the other live nodes are fewer than the replication factor")
        self.server.marked[node] = 0
        return self.server.status(node)

    async def decommission_status(self, node: int) -> dict[str, Any]:
        self.server.calls.append(("GET", node, self.servers))
        if node in self.server.marked:
            self.server.marked[node] += 1
        return self.server.status(node)

    async def recommission_node(self, node: int) -> dict[str, Any]:
        self.server.calls.append(("DELETE", node, self.servers))
        if self.server.recommission_fails:
            self.server.recommission_fails -= 1
            raise RaftlogError("LEADER_NOT_AVAILABLE", "no metadata leader")
        if node in self.server.marked and self.server.status(node)["stage"] == "done":
            self.server.member[node] = "learner" if self.server.member_after_readmission else "none"
        self.server.marked.pop(node, None)
        return self.server.status(node)


def _mover(server: FakeServer, cluster: FakeCluster | None = None, seed: int = 1) -> Mover:
    return Mover(cluster or FakeCluster(), random.Random(seed), 0.0,  # type: ignore[arg-type]
                 client=lambda servers: FakeClient(server, servers))


@pytest.fixture
def fast(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(moves, "POLL_S", 0.001)
    monkeypatch.setattr(moves, "DONE_HOLD_S", (0.01, 0.02))


@pytest.mark.asyncio
async def test_a_move_asks_follows_to_done_and_recommissions(fast: None) -> None:
    # Goal: one window = the ask, the stages in order, the hold after done, the recommission;
    # no call goes to the node being moved.
    server = FakeServer()
    closed: list[MoveRecord] = []
    async with asyncio.timeout(10):
        record = await _mover(server).run(3, asyncio.Event(), closed.append)
    assert closed == [record]
    assert record.answer == "accepted" and record.replicas_at_start == 4
    assert record.stages == ["moving_replicas", "leaving_metadata", "done"]
    assert record.done_after_s is not None and record.recommissioned
    assert server.calls[0][0] == "POST" and server.calls[-1][0] == "DELETE"
    assert all("127.0.0.3:8080" not in servers for _, _, servers in server.calls)
    assert 3 not in server.marked


@pytest.mark.asyncio
async def test_a_refused_move_is_recorded_and_not_undone(fast: None) -> None:
    # Goal: 409 CLUSTER_TOO_SMALL (two of five down) marks nothing: recorded, window closed at once.
    server = FakeServer(refuse="CLUSTER_TOO_SMALL")
    async with asyncio.timeout(10):
        record = await _mover(server).run(2, asyncio.Event(), lambda r: None)
    assert record.refused and record.answer == "refused CLUSTER_TOO_SMALL"
    assert [c[0] for c in server.calls] == ["POST"]
    assert record.describe() == "n2: refused CLUSTER_TOO_SMALL"


@pytest.mark.asyncio
async def test_an_unknown_answer_is_recommissioned_all_the_same(fast: None, monkeypatch: pytest.MonkeyPatch) -> None:
    # Goal: a timeout may have set the mark: the close still asks to recommission.
    monkeypatch.setattr(moves, "MOVE_BOUND_S", 0.05)
    server = FakeServer(refuse="OUTCOME_UNKNOWN", stuck=True)
    async with asyncio.timeout(10):
        record = await _mover(server).run(2, asyncio.Event(), lambda r: None)
    assert record.answer == "unknown OUTCOME_UNKNOWN" and not record.refused
    assert server.calls[-1][0] == "DELETE" and record.recommissioned


@pytest.mark.asyncio
async def test_a_move_that_never_finishes_ends_at_its_bound(fast: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(moves, "MOVE_BOUND_S", 0.05)
    server = FakeServer(stuck=True)
    async with asyncio.timeout(10):
        record = await _mover(server).run(1, asyncio.Event(), lambda r: None)
    assert record.stages == ["moving_replicas"] and record.done_after_s is None and record.recommissioned
    assert "not done" in record.describe()


@pytest.mark.asyncio
async def test_the_end_of_the_main_phase_closes_a_move(fast: None) -> None:
    server = FakeServer(stuck=True)
    stop = asyncio.Event()
    stop.set()
    async with asyncio.timeout(10):
        record = await _mover(server).run(1, stop, lambda r: None)
    assert record.recommissioned and 1 not in server.marked


@pytest.mark.asyncio
async def test_a_failed_close_is_settled_after_the_heal(fast: None, monkeypatch: pytest.MonkeyPatch) -> None:
    # Goal: a recommission that cannot get through in the window (no metadata leader) is
    # asked again by `settle`, which also waits for the node to be a metadata member again.
    monkeypatch.setattr(moves, "RECOMMISSION_S", 0.0)
    server = FakeServer(recommission_fails=3)
    mover = _mover(server)
    async with asyncio.timeout(10):
        record = await mover.run(4, asyncio.Event(), lambda r: None)
        assert not record.recommissioned and "recommission pending" in record.describe()
        assert await mover.settle(5.0) == {}
    assert 4 not in server.marked and server.member[4] == "learner"


@pytest.mark.asyncio
async def test_settle_names_a_node_not_back_in_the_metadata_group(fast: None) -> None:
    server = FakeServer(member_after_readmission=False)
    mover = _mover(server)
    async with asyncio.timeout(10):
        await mover.run(4, asyncio.Event(), lambda r: None)
        assert await mover.settle(0.05) == {4: "not back in the metadata group"}


@pytest.mark.asyncio
async def test_a_paused_target_is_never_asked(fast: None) -> None:
    # Goal: a target paused mid-move changes nothing: every call goes to the other nodes.
    cluster = FakeCluster()
    server = FakeServer()
    cluster.pause(5)
    async with asyncio.timeout(10):
        record = await _mover(server, cluster).run(5, asyncio.Event(), lambda r: None)
    assert record.recommissioned
    assert all("127.0.0.5:8080" not in servers for _, _, servers in server.calls)


# -- the nemesis runs moves beside the other faults -------------------------------------


@pytest.mark.asyncio
async def test_the_nemesis_runs_one_move_at_a_time_beside_other_faults(
        fast: None, monkeypatch: pytest.MonkeyPatch) -> None:
    # Goal: while a move is open, other faults open and close inside its window; a slot
    # that draws `move` again draws another kind; the end of the phase closes the move.
    monkeypatch.setattr(nemesis, "GAP_S", (0.001, 0.002))
    monkeypatch.setattr(nemesis, "HOLD_S", (0.001, 0.002))
    monkeypatch.setattr(nemesis, "QUIET_SHARE", 0.0)
    monkeypatch.setattr(moves, "MOVE_BOUND_S", 60.0)
    cluster = FakeCluster()
    server = FakeServer(stuck=True)  # the move stays open until the stop
    chaos = nemesis.Nemesis(cluster, KEYS, random.Random(3), ["move", "pause"],  # type: ignore[arg-type]
                            mover=_mover(server, cluster), topics=("chaos-a",))
    stop = asyncio.Event()
    async with asyncio.timeout(20):
        task = asyncio.create_task(chaos.run(stop))
        while chaos.counts["pause"] < 5:
            await asyncio.sleep(0.01)
        stop.set()
        await task
    assert chaos.counts["move"] == 1, "one move at a time"
    move = next(w for w in chaos.windows if w.kind == "move")
    pauses = [w for w in chaos.windows if w.kind == "pause"]
    assert move.end_s is not None and all(w.end_s is not None for w in pauses)
    assert any(move.start_s <= w.start_s and w.end_s <= move.end_s for w in pauses), "faults inside the move"
    assert "recommissioned" in move.detail and not server.marked
    assert not cluster.paused


@pytest.mark.asyncio
async def test_an_interrupted_nemesis_cancels_its_move(fast: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nemesis, "GAP_S", (0.001, 0.002))
    monkeypatch.setattr(nemesis, "QUIET_SHARE", 0.0)
    cluster = FakeCluster()
    chaos = nemesis.Nemesis(cluster, KEYS, random.Random(3), ["move"],  # type: ignore[arg-type]
                            mover=_mover(FakeServer(stuck=True), cluster), topics=("chaos-a",))
    async with asyncio.timeout(10):
        task = asyncio.create_task(chaos.run(asyncio.Event()))
        while chaos._move is None:
            await asyncio.sleep(0.01)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert chaos._move.done()


# -- where moves run ----------------------------------------------------------------------


def test_moves_run_in_the_standard_suite_on_five_nodes_and_not_in_the_smoke_run() -> None:
    # Goal: `make chaos` exercises moves; `make chaos-smoke` (part of `make test`) is unchanged;
    # the three-node "all" mix and the soak's deck (ALL_FAULTS) do not draw a kind that
    # three nodes cannot run.
    from chaos.__main__ import ALL_FAULTS, FIVE_NODE_RUNS, KNOWN_FAULTS, SUITES

    assert SUITES["smoke"] == [("kill", "pause", "partition", "corrupt")] and "smoke" not in FIVE_NODE_RUNS
    assert any("move" in faults for faults in FIVE_NODE_RUNS["standard"])
    assert "move" in KNOWN_FAULTS and "move" not in ALL_FAULTS


def test_a_skipped_move_says_why_in_the_summary() -> None:
    from chaos.runner import _skipped_why

    reason = moves.unavailable_reason(3, 3)
    assert reason is not None
    assert _skipped_why({"faults_skipped_why": {"move": reason}}) == f" (move unavailable: {reason})"
    assert _skipped_why({}) == ""
