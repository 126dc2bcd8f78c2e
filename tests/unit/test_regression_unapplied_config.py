"""Regression: a voter with committed but unapplied CONFIG entries must not campaign.

Found in review (scenario by a reviewer, kept here as a test): five voters;
node 3 is cut off; the leader commits six entries, then "remove 5", then
"remove 4" (voters {1,2,3}), then E with nodes 1 and 2. Node 3 receives one
append carrying everything up to the second removal with commit = E's index, so
it has two committed, unapplied membership changes. If its election timer fires
before it applies them, it counts votes among {1..5}, wins with {3,4,5} (a
majority of the old config, disjoint from the majority {1,2} of the current
one) and overwrites E: two nodes apply different entries at one index.
"""

from __future__ import annotations

from raftlog.messages import ConfChange, ConfChangeOp, Message, MessageType, Role
from raftlog.types import Index, NodeId
from tests.unit.driver import bootstrapped_core, handle_ready


class Harness:
    def __init__(self) -> None:
        config = {"pre_vote": False, "check_quorum": False, "committed_bytes_per_ready_max": 40}
        self.cores = {node: bootstrapped_core(node, 5, **config) for node in range(1, 6)}
        self.applied: dict[int, dict[int, tuple[int, bytes]]] = {i: {} for i in range(1, 6)}
        self.outbox: list[Message] = []

    def process(self, node: int, once: bool = False) -> None:
        core = self.cores[node]
        applied = self.applied[node]
        while core.has_ready():
            self.outbox += handle_ready(core, lambda e: applied.__setitem__(e.index, (e.term, e.payload)))
            if once:
                return

    def run(self, up: set[int], rounds: int = 50) -> None:
        for _ in range(rounds):
            for node in sorted(up):
                self.process(node)
            if not self.outbox:
                return
            messages, self.outbox = self.outbox, []
            for message in messages:
                if message.source in up and message.target in up:
                    self.cores[message.target].step(message)


def test_lagging_voter_does_not_campaign_under_a_stale_membership() -> None:
    h = Harness()
    everyone = {1, 2, 3, 4, 5}
    h.run(everyone)
    leader = h.cores[1]
    for _ in range(30):
        leader.tick()
        if leader.role is not Role.FOLLOWER:
            break
    h.run(everyone)
    assert leader.role is Role.LEADER
    for k in range(6):
        leader.propose([b"D%d" % k])
        h.run({1, 2, 4, 5})
    leader.propose_membership(ConfChange(ConfChangeOp.REMOVE, NodeId(5)))
    h.run({1, 2, 4, 5})
    leader.propose_membership(ConfChange(ConfChangeOp.REMOVE, NodeId(4)))
    h.run({1, 2, 4})
    second_removal = leader.log.last_index()
    leader.propose([b"E"])
    h.run({1, 2})
    e_index = leader.commit_index
    assert h.applied[1][e_index] == (leader.term, b"E")

    lagging = h.cores[3]
    previous = lagging.log.last_index()
    lagging.step(
        Message(
            type=MessageType.APPEND, source=NodeId(1), target=NodeId(3), term=leader.term, index=previous,
            log_term=leader.log.term_or_none(previous),
            entries=tuple(leader.log.slice(Index(previous + 1), Index(second_removal + 1), 1 << 30)),
            commit=leader.commit_index,
        )
    )
    for _ in range(30):  # its election timer fires before its next Ready applies the changes
        lagging.tick()
    assert lagging.role is Role.FOLLOWER, "it must not campaign with unapplied membership changes"

    h.process(3, once=True)
    h.run({3, 4, 5}, rounds=5)
    h.run(everyone)
    for node in (1, 2, 3):
        if e_index in h.applied[node]:
            assert h.applied[node][e_index] == (leader.term, b"E"), f"node {node} diverged at {e_index}"
