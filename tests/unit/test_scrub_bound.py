"""Goal: the in-cluster scrubber never builds a tree over more than `SPAN_LEAVES_MAX`
leaves, on the leader or on a follower (multiraft/node/scrub_trees.py, scrubber.py;
docs/mirror.md "The scrubber"): `scrub.tree` cuts its span to the bound, `scrub.nodes`
refuses a span over it, and a verify walks a partition longer than the bound span after
span, with the same verdicts as over one tree. A mirror's sink leader takes a source's
answer over the bound as `unreachable` rather than build its own tree over it.

Two replicas of one partition, each a real segment store (12,000 offsets: 40 batches of
300 records, one unapplied) behind its own `ReplicaTrees`; the leader's `Scrubber` calls
the follower's RPC handlers directly. The bound is lowered to one leaf (4,096 offsets), so
the partition's 11,700 applied offsets take three spans.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from multiraft.node import scrub_trees
from multiraft.node.scrub_trees import ReplicaTrees
from multiraft.node.scrubber import Scrubber
from multiraft.transport.rpc import STATUS_OK, RemoteError
from raftlog.errors import NotLeader
from raftlog.messages import HardState
from raftlog.types import GroupId, Index, NodeId, Term
from storage.config import StoreConfig
from storage.tictac import LEAF_OFFSETS
from tests.storage.helpers import SegmentHarness, data_entry

GROUP = GroupId(7)
LEADER, FOLLOWER = 1, 2
APPLIED = 39 * 300  # the high watermark: the last batch is not applied yet


class _Rpc:
    """Handlers by method; `call` runs the follower's, as the transport would, then `after`
    (what happens on the leader while the call is under way)."""

    def __init__(self) -> None:
        self.handlers: dict[str, Any] = {}
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.timeouts: list[float] = []  # each call's, beside `calls`
        self.after: Callable[[str, dict[str, Any]], None] = lambda method, request: None
        self.rewrite: Callable[[str, dict[str, Any], bytes], bytes] = lambda method, request, answer: answer

    def register(self, method: str, handler: Any) -> None:
        self.handlers[method] = handler

    async def call(self, peer: int, method: str, body: bytes, timeout_s: float) -> bytes:
        assert peer == FOLLOWER
        self.calls.append((method, json.loads(body)))
        self.timeouts.append(timeout_s)
        status, answer = await self.handlers[method](LEADER, body)
        self.after(method, json.loads(body))
        answer = self.rewrite(method, json.loads(body), answer)
        if status != STATUS_OK:
            raise RemoteError(answer)
        return answer


def _replica(root: Path, high_watermark: int, odd_entry: int | None = None) -> tuple[SegmentHarness, Any]:
    """A store of 40 batches of 300 records; `odd_entry`'s batch has other bytes, same count."""
    harness = SegmentHarness(str(root), config=StoreConfig(segment_bytes_max=4096))
    store = harness.store
    for first in range(1, 41, 5):
        store.append([data_entry(i, 1, count=300, value_bytes=2 if i == odd_entry else 1)
                      for i in range(first, first + 5)])
    store.set_hard_state(HardState(term=Term(1), commit=Index(40)))
    store.sync()
    machine = SimpleNamespace(state=SimpleNamespace(high_watermark=high_watermark))
    return harness, SimpleNamespace(stores={GROUP: store}, partitions={GROUP: machine}, groups={GROUP: object()})


@pytest.fixture
def one_leaf(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scrub_trees, "SPAN_LEAVES_MAX", 1)


# During a call to the follower: (method, request, the leader's store, the leader's registry).
During = Callable[[str, dict[str, Any], Any, Any], None]


def _scrub(tmp_path: Path, follower_high_watermark: int = APPLIED, odd_entry: int | None = None,
           during: During | None = None, leader_rot: bool = False, rewrite: Any = None,
           ) -> tuple[dict[str, Any], _Rpc, list[tuple[int, int]], dict[int, list[GroupId]]]:
    """One verify of the partition on the leader: its answer, the calls made to the
    follower, every span either side built a tree over, the repairs started on each
    replica (by node). `leader_rot`: a byte flipped in the leader's closed segment of
    entries 31-35 (offsets [9000, 10500), the third span)."""
    leader_store, leader_registry = _replica(tmp_path / "leader", APPLIED)
    follower_store, follower_registry = _replica(tmp_path / "follower", follower_high_watermark, odd_entry)
    if leader_rot:
        _flip_a_byte(leader_store.store, first_index=31)
    built: list[tuple[int, int]] = []
    repaired: dict[int, list[GroupId]] = {LEADER: [], FOLLOWER: []}
    rpc = _Rpc()
    if during is not None:
        rpc.after = lambda method, request: during(method, request, leader_store.store, leader_registry)
    if rewrite is not None:
        rpc.rewrite = rewrite
    follower = ReplicaTrees(follower_registry, repaired[FOLLOWER].append)
    follower.serve(rpc)  # type: ignore[arg-type]
    runtime = SimpleNamespace(core=SimpleNamespace(membership=SimpleNamespace(voters={NodeId(LEADER),
                                                                                        NodeId(FOLLOWER)})))
    leader_registry.leading = lambda group_id: runtime
    catalog = SimpleNamespace(partition_group=lambda topic, partition: GROUP)
    routing = SimpleNamespace(id=NodeId(LEADER), leader_of=lambda group_id: LEADER)
    scrubber = Scrubber(leader_registry, catalog, routing, rpc, ReplicaTrees(leader_registry, repaired[LEADER].append))

    for trees in (scrubber.trees, follower):
        build = trees.build

        async def recorded(group_id: GroupId, lo: int, hi: int, *, fresh: bool, deep: bool = False,
                           paced: bool = False, build: Any = build) -> Any:
            built.append((lo, hi))
            return await build(group_id, lo, hi, fresh=fresh, deep=deep, paced=paced)

        trees.build = recorded  # type: ignore[method-assign]
    try:
        verdict = asyncio.run(scrubber.verify_partition("t", 0)).to_json()
    finally:
        leader_store.close()
        follower_store.close()
    return verdict, rpc, built, repaired


def _flip_a_byte(store: Any, first_index: int) -> None:
    """Rot in the closed segment that starts at entry `first_index`: its frame there fails its check."""
    (segment,) = [s for s in store.segments if s.closed and s.first_index == first_index]
    with open(segment.path, "r+b") as file:
        file.seek(segment.size // 2)
        byte = file.read(1)
        file.seek(segment.size // 2)
        file.write(bytes([byte[0] ^ 0x01]))


def _spans_asked(rpc: _Rpc) -> list[tuple[int, int]]:
    return [(request["lo"], request["hi"]) for method, request in rpc.calls if method == "scrub.tree"]


def test_each_tree_call_bounds_the_followers_build_by_its_timeout(tmp_path: Path, one_leaf: None) -> None:
    # Goal: every `scrub.tree` call tells the follower how long this leader waits for it
    # (`deadline_s`), so the follower's build stops when nobody waits for it any more.
    _, rpc, _, _ = _scrub(tmp_path)
    asked = [(request.get("deadline_s"), timeout_s)
             for (method, request), timeout_s in zip(rpc.calls, rpc.timeouts, strict=True) if method == "scrub.tree"]
    assert len(asked) == 3 and all(deadline == timeout_s > 0 for deadline, timeout_s in asked), asked


def test_identical_replicas_compare_span_after_span_one_root_each(tmp_path: Path, one_leaf: None) -> None:
    verdict, rpc, built, _ = _scrub(tmp_path)
    assert verdict["status"] == "identical", verdict
    (replica,) = verdict["replicas"]
    assert (replica["status"], replica["lo"], replica["hi"], replica["nodes_compared"]) == ("identical", 0, APPLIED, 3)
    assert _spans_asked(rpc) == [(0, 4096), (4096, 8192), (8192, APPLIED)]
    assert built and all(hi - lo <= LEAF_OFFSETS for lo, hi in built), built  # no tree past the bound


def test_a_difference_in_the_second_span_is_its_leaf_and_the_walk_stops_there(tmp_path: Path,
                                                                              one_leaf: None) -> None:
    # Entry 20 holds offsets [5700, 6000): leaf 1, the second span.
    verdict, rpc, built, repaired = _scrub(tmp_path, odd_entry=20)
    (replica,) = verdict["replicas"]
    assert (verdict["status"], replica["status"]) == ("different", "different"), verdict
    assert replica["ranges"] == [[4096, 8192]] and (replica["lo"], replica["hi"]) == (0, 8192), replica
    assert replica["repair_started"] and repaired == {LEADER: [], FOLLOWER: [GROUP]}
    assert _spans_asked(rpc) == [(0, 4096), (4096, 8192)], "a follower found different is asked no further"
    assert (8192, APPLIED) in built, "the leader reads its whole span: its own damage would come first"
    assert all(hi - lo <= LEAF_OFFSETS for lo, hi in built), built


def test_a_leader_damaged_after_a_follower_differs_repairs_itself_and_not_the_follower(tmp_path: Path,
                                                                                    one_leaf: None) -> None:
    # Repairs wait for the leader's whole read: the follower differs in the first span
    # (entry 5, offsets [1200, 1500)), and only the third shows the leader's own rot. The
    # leader is no reference, so the follower found different is not repaired from it.
    verdict, rpc, built, repaired = _scrub(tmp_path, odd_entry=5, leader_rot=True)
    (replica,) = verdict["replicas"]
    assert (verdict["status"], replica["node"], replica["status"]) == ("leader_damaged", LEADER, "leader_damaged")
    assert replica["repair_started"] and repaired == {LEADER: [GROUP], FOLLOWER: []}, repaired
    assert [method for method, _ in rpc.calls if method == "scrub.repair"] == []
    assert _spans_asked(rpc) == [(0, 4096)], "the follower was found different in the first span"
    assert (8192, APPLIED) in built, "the leader read on to its third span"


def test_a_follower_behind_is_behind_over_what_it_applied(tmp_path: Path, one_leaf: None) -> None:
    verdict, rpc, _, repaired = _scrub(tmp_path, follower_high_watermark=6000)
    (replica,) = verdict["replicas"]
    assert (replica["status"], replica["lo"], replica["hi"]) == ("behind", 0, 6000), replica
    assert _spans_asked(rpc) == [(0, 4096), (4096, 8192)] and repaired == {LEADER: [], FOLLOWER: []}


@pytest.mark.parametrize(("start_index", "spans"), [
    (20, [(0, 4096), (6000, 8192), (8192, APPLIED)]),  # log start 6000: inside the second span
    (39, [(0, 4096)]),  # log start 11,700: past what was left of the span
])
def test_retention_during_a_followers_call_moves_the_next_spans_start(tmp_path: Path, one_leaf: None,
                                                                      start_index: int,
                                                                      spans: list[tuple[int, int]]) -> None:
    # Retention (compaction_loop, every 2 s on the leader's loop) runs while the first span's
    # follower builds: the next span starts where the leader's log does now, or there is none.
    def compact(method: str, request: dict[str, Any], store: Any, registry: Any) -> None:
        if method == "scrub.tree" and request["lo"] == 0:
            store.compact(Index(start_index))

    verdict, rpc, built, _ = _scrub(tmp_path, during=compact)
    (replica,) = verdict["replicas"]
    assert (verdict["status"], replica["status"]) == ("identical", "identical"), verdict
    assert _spans_asked(rpc) == spans
    assert (replica["lo"], replica["hi"]) == (0, spans[-1][1]), replica
    assert all(hi - lo <= LEAF_OFFSETS for lo, hi in built), built


@pytest.mark.parametrize(("start_index", "spans"), [
    (20, [(0, 4096), (4096, 8192), (6000, 8192)]),  # log start 6000: asked again from there
    (39, [(0, 4096), (4096, 8192)]),  # log start 11,700: nothing of the span is left to compare
])
def test_retention_past_the_span_a_follower_answered_asks_it_again(tmp_path: Path, one_leaf: None, start_index: int,
                                                                   spans: list[tuple[int, int]]) -> None:
    # A follower behind (applied to 6600) answers [4096, 6600) for the second span; the
    # leader builds its own tree of that span after the answer, and by then retention has
    # moved its log start past 4096. The follower is asked again from the new start, if
    # the span still holds anything.
    def compact(method: str, request: dict[str, Any], store: Any, registry: Any) -> None:
        if method == "scrub.tree" and request["lo"] == 4096:
            store.compact(Index(start_index))

    verdict, rpc, _, repaired = _scrub(tmp_path, follower_high_watermark=6600, during=compact)
    (replica,) = verdict["replicas"]
    assert (replica["status"], replica["lo"], replica["hi"]) == ("behind", 0, 6600), verdict
    assert _spans_asked(rpc) == spans and repaired == {LEADER: [], FOLLOWER: []}
    if start_index == 39:
        assert "not compared" in replica["detail"], replica


@pytest.mark.parametrize("change", ["leader", "store"])
def test_a_verify_whose_leader_changed_under_it_is_not_leader(tmp_path: Path, one_leaf: None, change: str) -> None:
    # During the first span's follower call, another node is elected (the leader's runtime
    # goes) or the replica reopens (another store, perhaps cut below the span): the verify
    # answers NotLeader, as a verify asked of a node that does not lead, and repairs nothing.
    def move(method: str, request: dict[str, Any], store: Any, registry: Any) -> None:
        if method != "scrub.tree":
            return
        if change == "leader":
            registry.leading = lambda group_id: None
        else:
            registry.stores[GROUP] = SimpleNamespace()

    with pytest.raises(NotLeader, match="during the verify"):
        _scrub(tmp_path, during=move)


@pytest.mark.parametrize(("answered", "asked_lo", "status", "detail"), [
    # Below the span asked: a span this leader never asked for, whatever its length.
    ((100, 100), 4096, "unreachable", "answered the span [100, 100) for [4096, 8192)"),
    # Past the span (its log starts at 20,000): nothing of it to differ, no tree built.
    ((20_000, 20_000), None, "identical", "it holds nothing of the span: its log starts at 20000"),
])
def test_an_empty_span_answered_is_taken_only_from_the_span_asked_on(tmp_path: Path, one_leaf: None,
                                                                     answered: tuple[int, int], asked_lo: int | None,
                                                                     status: str, detail: str) -> None:
    # A follower's empty answer `[x, x)` is checked as a longer one is: it starts where the
    # span asked does or later. One past the span is compared with the empty tree: the
    # leader never builds over offsets it does not hold (its build would assert).
    def skewed(method: str, request: dict[str, Any], answer: bytes) -> bytes:
        if method != "scrub.tree" or asked_lo not in (None, request["lo"]):
            return answer
        return json.dumps({"lo": answered[0], "hi": answered[1], "depth": 1, "root": "00" * 16,
                           "damaged": []}).encode()

    verdict, _, built, repaired = _scrub(tmp_path, rewrite=skewed)
    (replica,) = verdict["replicas"]
    assert (verdict["status"], replica["status"]) == (status, status), verdict
    assert detail in replica["detail"], replica
    assert all(lo <= APPLIED for lo, _ in built) and repaired == {LEADER: [], FOLLOWER: []}, built  # none past


def test_the_rpcs_keep_to_the_bound(tmp_path: Path, one_leaf: None) -> None:
    # `scrub.tree` cuts the span it answers; `scrub.nodes` refuses a span over the bound
    # (it would build one); a build asked over the bound is a programmer's error.
    harness, registry = _replica(tmp_path, APPLIED)
    rpc, trees = _Rpc(), ReplicaTrees(registry, lambda group_id: None)
    trees.serve(rpc)  # type: ignore[arg-type]

    def call(method: str, request: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        status, body = asyncio.run(rpc.handlers[method](LEADER, json.dumps(request).encode()))
        return status, json.loads(body)

    try:
        status, summary = call("scrub.tree", {"group_id": GROUP, "lo": 0, "hi": APPLIED})
        assert status == STATUS_OK and (summary["lo"], summary["hi"]) == (0, 4096), summary
        status, summary = call("scrub.tree", {"group_id": GROUP, "lo": 5000, "hi": APPLIED})
        assert status == STATUS_OK and (summary["lo"], summary["hi"]) == (5000, 8192), summary
        status, body = call("scrub.nodes", {"group_id": GROUP, "lo": 0, "hi": 8192, "level": 0, "positions": [0]})
        assert status != STATUS_OK and body["error_code"] == "INVALID_REQUEST", body
        with pytest.raises(AssertionError, match="bounds its span"):
            asyncio.run(trees.build(GROUP, 0, 8192, fresh=True))
    finally:
        harness.close()


def test_a_mirror_source_answering_a_span_over_the_bound_is_unreachable(tmp_path: Path, one_leaf: None) -> None:
    # A mirror's sink leader builds its own tree over the span its source answered
    # (multiraft/node/mirror_verify.py): an answer over the bound is refused, not built.
    from multiraft.node.mirror_verify import MirrorVerifier

    harness, registry = _replica(tmp_path, APPLIED)
    registry.partitions[GROUP].state.mirror = True
    registry.leading = lambda group_id: object()

    class Source:
        async def tree(self, topic: str, partition: int, lo: int, hi: int, deep: bool = False) -> dict[str, Any]:
            return {"lo": 0, "hi": 2 * LEAF_OFFSETS, "depth": 1, "root": "00" * 16, "damaged": [],
                    "log_start_offset": 0, "high_watermark": APPLIED}

        async def close(self) -> None:
            pass

    topic = SimpleNamespace(mirror_link="dr", is_mirror=True)
    catalog = SimpleNamespace(catalog=SimpleNamespace(topic=lambda name: topic,
                                                      mirror_links={"dr": SimpleNamespace(name="dr", record_filter=None)}),
                              partition_group=lambda name, partition: GROUP)
    logger = SimpleNamespace(info=lambda *a, **k: None)
    verifier = MirrorVerifier(registry, catalog, SimpleNamespace(id=NodeId(LEADER)), None,  # type: ignore[arg-type]
                              ReplicaTrees(registry, lambda group_id: None), None, logger,  # type: ignore[arg-type]
                              new_client=lambda link: Source())  # type: ignore[arg-type,return-value]
    try:
        verdict = asyncio.run(verifier.verify_partition("t", 0, repair=True))
    finally:
        harness.close()
    assert verdict.status == "unreachable" and "answered the span [0, 8192): over" in verdict.detail, verdict
