"""Regression (found by the simulator's membership races, seed 1078 of the focused mix):
after a removal from two voters to one, no leader could ever be elected again.

Configurations take effect when applied, and a restarted node knows only the
commit index it synced (Raft stores it lazily). Voters {1, 2}; node 1's removal is
committed. If node 1 learns that and applies it, it stops campaigning; if node 2,
the last voter, does not know it (it restarted, or never heard the commit), node 2
counts votes in {1, 2} and needs node 1's vote, which node 1 refuses for ever
whenever its log is longer than node 2's. Two ways the simulator got there:

- leader 2 commits the removal and proposes more in the same Ready; the append
  telling node 1 the commit carries the new entries; node 2 crashes before that
  write is durable, losing the entries and its commit index;
- node 1 (its removal in its log, not yet known committed) wins an election,
  appends proposals, commits its removal with node 2's help, and steps down when it
  applies it; the append that would have told node 2 the commit is lost.

The fix: a leader takes no proposals while its log holds a removal it has not
applied. A removed node then never holds entries the remaining voters lack.
"""

from __future__ import annotations

import contextlib
import random

import pytest

from raftlog.core.config import Config
from raftlog.core.raft import RaftCore
from raftlog.errors import ProposalDropped
from raftlog.messages import ConfChange, ConfChangeOp, Message, Role
from raftlog.types import NodeId
from storage.memory import MemoryStorage
from tests.unit.driver import bootstrapped_core, handle_ready

CONFIG = {"pre_vote": False, "check_quorum": False}


class Cluster:
    def __init__(self) -> None:
        self.cores = {node: bootstrapped_core(node, 2, **CONFIG) for node in (1, 2)}
        self.outbox: list[Message] = []

    def process(self, node: int) -> None:
        core = self.cores[node]
        while core.has_ready():
            self.outbox += handle_ready(core, lambda entry: None)

    def deliver(self) -> None:
        messages, self.outbox = self.outbox, []
        for message in messages:
            self.cores[message.target].step(message)

    def settle(self) -> None:
        for _ in range(20):
            for node in (1, 2):
                self.process(node)
            if not self.outbox:
                return
            self.deliver()

    def elect(self, node: int) -> RaftCore:
        self.cores[node].campaign()
        self.settle()
        assert self.cores[node].role is Role.LEADER
        return self.cores[node]

    def restart(self, node: int) -> None:
        storage = self.cores[node].log.storage
        assert isinstance(storage, MemoryStorage)
        storage.crash(random.Random(0))
        config = Config(node_id=NodeId(node), applied=storage.snapshot().meta.index, **CONFIG)  # type: ignore[arg-type]
        self.cores[node] = RaftCore(config, storage, random.Random(node))

    def last_voter_leads(self) -> None:
        """Node 2 leads the configuration {2} within 200 ticks."""
        for _ in range(200):
            for core in self.cores.values():
                core.tick()
            self.settle()
            last_voter = self.cores[2]
            if last_voter.role is Role.LEADER and last_voter.membership.voters == {2}:
                return
        states = {n: (c.role.name, c.term, c.commit_index, sorted(c.membership.voters)) for n, c in self.cores.items()}
        raise AssertionError(f"node 2 never leads its configuration {{2}}: {states}")


def propose_unless_refused(core: RaftCore, payload: bytes) -> None:
    with contextlib.suppress(ProposalDropped):  # refused since the fix
        core.propose([payload])


def test_the_last_voter_leads_again_after_a_crash_lost_the_commit_of_a_removal() -> None:
    cluster = Cluster()
    cluster.settle()
    leader = cluster.elect(2)
    leader.propose([b"a"])
    cluster.settle()
    _, removal = leader.propose_membership(ConfChange(ConfChangeOp.REMOVE, NodeId(1)))
    for node in (2, 1):  # the leader sends the removal, node 1 acknowledges it
        cluster.process(node)
        cluster.deliver()
    assert leader.commit_index == removal

    propose_unless_refused(leader, b"lost")
    ready = leader.ready()  # written and sent, never synced: the leader crashes first
    storage = leader.log.storage
    assert isinstance(storage, MemoryStorage)
    storage.append(ready.entries)
    if ready.hard_state is not None:
        storage.set_hard_state(ready.hard_state)
    cluster.outbox += ready.messages
    cluster.deliver()
    cluster.process(1)
    assert cluster.cores[1].membership.voters == {2}, "node 1 applied its removal"
    cluster.outbox.clear()  # its answers find the leader gone
    cluster.restart(2)
    cluster.last_voter_leads()


def test_the_last_voter_leads_after_a_removed_leader_stepped_down_unheard() -> None:
    cluster = Cluster()
    cluster.settle()
    leader = cluster.elect(2)
    leader.propose_membership(ConfChange(ConfChangeOp.REMOVE, NodeId(1)))
    for node in (2, 1):  # node 1 holds its removal; the leader crashes before committing it
        cluster.process(node)
        cluster.deliver()
    cluster.outbox.clear()
    cluster.restart(2)
    cluster.process(2)

    removed = cluster.cores[1]  # the removal is not known committed: node 1 is a voter
    removed.campaign()
    for node in (1, 2, 1):  # the vote request, the vote, the new leader's NOOP
        cluster.process(node)
        cluster.deliver()
    assert removed.role is Role.LEADER
    propose_unless_refused(removed, b"x")
    cluster.process(2)
    cluster.deliver()  # node 2's acknowledgement of the NOOP commits the removal
    cluster.process(1)  # sends x and the commit, applies the removal and steps down
    cluster.outbox.clear()  # that append is lost
    assert removed.role is Role.FOLLOWER and removed.membership.voters == {2}
    assert cluster.cores[2].membership.voters == {1, 2}, "node 2 did not hear of the commit"
    cluster.last_voter_leads()


def test_a_leader_takes_no_proposal_until_it_applied_a_removal() -> None:
    cluster = Cluster()
    cluster.settle()
    leader = cluster.elect(2)
    leader.propose_membership(ConfChange(ConfChangeOp.REMOVE, NodeId(1)))
    with pytest.raises(ProposalDropped):
        leader.propose([b"x"])
    cluster.settle()
    assert leader.membership.voters == {2}
    leader.propose([b"x"])
