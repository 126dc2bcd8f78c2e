"""A replica's tree RPCs (multiraft/node/scrub_trees.py) over a real store and a stub
registry: the span is cut to what the replica applied, follow-up calls reuse the
tree, every verify reads afresh, and malformed calls get the one error shape."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

import pytest

from multiraft.node.move_throttle import BytePace
from multiraft.node.scrub_trees import POSITIONS_MAX, ReplicaTrees
from multiraft.transport.rpc import STATUS_OK
from raftlog.errors import NotLeader
from raftlog.messages import HardState
from raftlog.types import GroupId, Index, Term
from storage.config import StoreConfig
from tests.storage.helpers import SegmentHarness, data_entry

GROUP = GroupId(7)


class _Rpc:
    def __init__(self, after: Any = None) -> None:
        self.handlers: dict[str, Any] = {}
        self.after = after  # awaited after each call: the sidecars a build offered are written


    def register(self, method: str, handler: Any) -> None:
        self.handlers[method] = handler

    def call(self, method: str, request: Any) -> tuple[int, dict[str, Any]]:
        body = request if isinstance(request, bytes) else json.dumps(request).encode()

        async def call_and_wait() -> tuple[int, bytes]:
            answered = await self.handlers[method](2, body)
            if self.after is not None:
                await self.after()
            return answered

        status, answer = asyncio.run(call_and_wait())
        return status, json.loads(answer)


@pytest.fixture
def served(tmp_path):
    harness = SegmentHarness(str(tmp_path), config=StoreConfig(segment_bytes_max=4096))
    store = harness.store
    for first in range(1, 41, 5):
        store.append([data_entry(i, 1, count=300, value_bytes=1) for i in range(first, first + 5)])
    store.set_hard_state(HardState(term=Term(1), commit=Index(40)))
    store.sync()
    machine = SimpleNamespace(state=SimpleNamespace(high_watermark=store.log_end_offset - 300))  # one batch unapplied
    registry = SimpleNamespace(stores={GROUP: store}, partitions={GROUP: machine}, groups={GROUP: object()})
    repaired: list[GroupId] = []
    trees = ReplicaTrees(registry, repaired.append)  # type: ignore[arg-type]
    rpc = _Rpc(trees.sidecars.flush)
    trees.serve(rpc)  # type: ignore[arg-type]
    yield rpc, trees, repaired, int(store.log_end_offset)
    harness.close()


def test_the_span_is_cut_to_what_the_replica_applied(served) -> None:
    rpc, trees, _, end = served
    status, summary = rpc.call("scrub.tree", {"group_id": GROUP, "lo": 0, "hi": end + 10_000, "deep": False})
    assert status == STATUS_OK and (summary["lo"], summary["hi"]) == (0, end - 300)
    status, nodes = rpc.call("scrub.nodes", {"group_id": GROUP, "lo": 0, "hi": end - 300,
                                             "level": summary["depth"] - 1, "positions": [0]})
    assert status == STATUS_OK and nodes["digests"] == [summary["root"]]
    hashed = trees.bytes_hashed
    rpc.call("scrub.nodes", {"group_id": GROUP, "lo": 0, "hi": end - 300, "level": 0, "positions": [0, 1, 2]})
    assert trees.bytes_hashed == hashed, "follow-up calls reuse the tree"
    rpc.call("scrub.tree", {"group_id": GROUP, "lo": 0, "hi": end, "deep": False})
    second = trees.bytes_hashed - hashed
    assert 0 < second < hashed and trees.sidecars.counts.segments_from_sidecars > 0, \
        "a fast build: closed segments from the sidecars the first one wrote, the edge read"
    for deep_field in ({"deep": True}, {}):  # absent: an earlier version's leader, whose builds read everything
        before = trees.bytes_hashed
        status, deep = rpc.call("scrub.tree", {"group_id": GROUP, "lo": 0, "hi": end, **deep_field})
        assert status == STATUS_OK and deep["root"] == summary["root"]
        assert trees.bytes_hashed - before == hashed, "a deep build reads every segment afresh"


def test_repair_goes_through_report_damage(served) -> None:
    rpc, _, repaired, _ = served
    assert rpc.call("scrub.repair", {"group_id": GROUP}) == (STATUS_OK, {"started": True})
    assert rpc.call("scrub.repair", {"group_id": 99}) == (STATUS_OK, {"started": False})
    assert repaired == [GROUP]


@pytest.mark.parametrize("request_body", [
    b"not json", b"[1]", {"group_id": -1, "lo": 0, "hi": 1}, {"group_id": GROUP, "lo": "0", "hi": 1},
    {"group_id": GROUP, "lo": 0, "hi": 10, "level": 0, "positions": list(range(POSITIONS_MAX + 1))},
    {"group_id": GROUP, "lo": 0, "hi": 10, "level": 0, "positions": [-1]},
    {"group_id": GROUP, "lo": 0, "hi": 10, "level": 99, "positions": [0]},
])
def test_malformed_calls_get_the_error_shape(served, request_body) -> None:
    rpc = served[0]
    method = "scrub.nodes" if isinstance(request_body, dict) and "positions" in request_body else "scrub.tree"
    status, body = rpc.call(method, request_body)
    assert status != STATUS_OK and body["error_code"] == "INVALID_REQUEST"


def test_a_group_not_here_answers_a_retriable_error(served) -> None:
    # Not here (or reopening: a repair under way): the verifying leader reports it unreachable.
    status, body = served[0].call("scrub.tree", {"group_id": 99, "lo": 0, "hi": 10})
    assert status != STATUS_OK and body["error_code"] == "LEADER_NOT_AVAILABLE"


def test_a_paced_tree_call_reads_through_the_scrub_rate(served) -> None:
    # Goal: `paced` (a scheduled scrub's call) takes every byte it hashes from the node's scrub
    # pace; a call without it (an on-demand verify, an earlier version's leader) reads at full
    # speed; a deep call tells the schedule the replica was read whole, a fast one does not.
    rpc, trees, _, end = served
    trees.pace = BytePace(1 << 40)  # a rate no test waits for
    told: list[GroupId] = []
    trees.read_whole = told.append
    before = trees.bytes_hashed
    status, _ = rpc.call("scrub.tree", {"group_id": GROUP, "lo": 0, "hi": end, "deep": True, "paced": True})
    assert status == STATUS_OK and trees.pace.bytes == trees.bytes_hashed - before > 0 and told == [GROUP]
    paced = trees.pace.bytes
    for request in ({"deep": True}, {"deep": False, "paced": False}):
        status, _ = rpc.call("scrub.tree", {"group_id": GROUP, "lo": 0, "hi": end, **request})
        assert status == STATUS_OK and trees.pace.bytes == paced
    assert told == [GROUP, GROUP], "the fast call read closed segments by their sidecars: not a scrub"


def _in_debt_pace(during_wait: Any) -> tuple[BytePace, list[float]]:
    """A pace already in debt (another build spent through it), with a fake clock and a sleep
    that runs `during_wait` once, as other work on the loop would while a build waits."""
    clock, waits = [0.0], []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)
        clock[0] += seconds
        if len(waits) == 1:
            during_wait()

    pace = BytePace(1 << 20, clock=lambda: clock[0], sleep=sleep)
    pace.spent(4 << 20)
    return pace, waits


def test_a_paced_build_waits_before_its_first_slice(served) -> None:
    # Goal: a paced build asks the pace before it reads anything: a build that starts while the
    # node's scrub rate is in debt reads nothing until the debt is waited off.
    _, trees, _, end = served
    read_at_first_wait: list[int] = []
    trees.pace, waits = _in_debt_pace(lambda: read_at_first_wait.append(trees.pace.bytes))
    built = asyncio.run(trees.build(GROUP, 0, end - 300, fresh=True, deep=True, paced=True))
    assert waits and abs(waits[0] - 4.0) < 1e-6 and read_at_first_wait == [4 << 20]
    assert trees.pace.bytes == (4 << 20) + built.bytes_hashed > 4 << 20


@pytest.mark.parametrize("change", ["retention", "reopen"])
def test_a_store_changed_during_a_paced_wait_gives_the_retriable_error(served, change) -> None:
    # Goal: retention passing a paced build's position (or a reopen replacing the store) while
    # it waits for the rate ends the build with NotLeader ("ask again": the verifying leader
    # reports it, a scheduled scrub is tried again), never a read of deleted entries (an
    # AssertionError or CompactedError that would end the scheduled-scrubs task).
    rpc, trees, _, end = served
    store = trees._registry.stores[GROUP]

    def during_wait() -> None:
        if change == "retention":
            store.compact(Index(20))
            assert store.first_index() == 21 and store.segments[0].first_index > 1
        else:
            trees._registry.stores[GROUP] = object()

    trees.pace, _ = _in_debt_pace(during_wait)
    with pytest.raises(NotLeader, match="retention passed" if change == "retention" else "reopened"):
        asyncio.run(trees.build(GROUP, 0, end - 300, fresh=True, deep=True, paced=True))
    trees._registry.stores[GROUP] = store
    # Served to a leader: the answer is the retriable error, and the replica does not count
    # as read whole for the schedule (only a build that finished does).
    told: list[GroupId] = []
    trees.read_whole = told.append
    trees.pace, _ = _in_debt_pace(lambda: store.compact(Index(30)) if change == "retention" else None)
    status, body = rpc.call("scrub.tree", {"group_id": GROUP, "lo": 0, "hi": end, "deep": True, "paced": True})
    assert (status != STATUS_OK and body["error_code"] == "LEADER_NOT_AVAILABLE") == (change == "retention")
    assert told == ([] if change == "retention" else [GROUP])


def test_a_tree_call_stops_at_the_deadline_the_leader_sent(served) -> None:
    # Goal: a paced follower build waiting on its node's scrub rate stops at the request's
    # `deadline_s` (the leader's timeout for the call) with the retriable Timeout, drawing no
    # more from the rate and not counted as a read of the whole replica; the handler is not
    # left running after the leader stopped waiting (the RPC server cancels no handler).
    rpc, trees, _, end = served
    trees.pace = BytePace(64 << 10)  # the real clock and sleep: the debt below is 1024 s
    trees.pace.spent(64 << 20)
    told: list[GroupId] = []
    trees.read_whole = told.append
    body = json.dumps({"group_id": GROUP, "lo": 0, "hi": end, "deep": True, "paced": True,
                       "deadline_s": 0.05}).encode()
    status, answer = asyncio.run(asyncio.wait_for(rpc.handlers["scrub.tree"](2, body), 10))
    assert status != STATUS_OK and json.loads(answer)["error_code"] == "TIMEOUT"
    assert trees.pace.bytes == 64 << 20 and told == []
    for bad in (0, -1, "1", True):
        status, answer = rpc.call("scrub.tree", {"group_id": GROUP, "lo": 0, "hi": end, "deadline_s": bad})
        assert status != STATUS_OK and answer["error_code"] == "INVALID_REQUEST"
