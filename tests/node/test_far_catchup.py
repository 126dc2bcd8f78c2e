"""Far-horizon catch-up (multiraft/node/catchup_leader.py, catchup_follower.py): a follower
far behind gets the leader's closed segments whole, then replays the rest.

In-process three-node clusters (tests/node/test_node_cluster.py's helpers)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import os
import shutil
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import structlog

from multiraft.node import catchup_leader, catchup_stream
from multiraft.node.catchup_wire import Offer
from multiraft.node.node import Node
from raftlog.types import Term
from storage.node_state import StartPoint, encode_start
from storage.transfer import list_closed_segments
from tests.node.test_node_cluster import (
    batch,
    configs,
    leader_of,
    produce_retrying,
    running_cluster,
    until,
    values_at,
)
from tests.tls_pki import make_pki

TOPIC = "far"


def _segment_digests(node: Node, upto: int) -> dict[int, str]:
    """Closed segments wholly at or below entry `upto`, by first index: a digest each."""
    store = node.stores[node.partition_group(TOPIC, 0)]
    return {s.first_index: hashlib.sha256(Path(s.path).read_bytes()).hexdigest()
            for s in store.segments if s.closed and s.last_index <= upto}


def _holds(node: Node, values: list[bytes]) -> bool:
    with contextlib.suppress(Exception):  # a restarted node learns the topic, then opens its group
        return values_at(node, TOPIC, 0) == values
    return False


async def _write(node: Node, first: int, count: int) -> list[bytes]:
    values = []
    for i in range(first, first + count):
        value = b"value-%06d-" % i + b"x" * 2000
        await produce_retrying(node, TOPIC, 0, batch(value))
        values.append(value)
    return values


def _corrupt_the_first_file_sent(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The stream's first sendfile call sends its bytes with one of them flipped (a disk or
    a network that lies); the rest go as they are. Returns the calls made, counted."""
    calls: list[int] = []
    original = catchup_stream._send_file_part

    def send(sock: socket.socket, fd: int, position: int, size: int) -> None:
        calls.append(size)
        if len(calls) > 1:
            return original(sock, fd, position, size)
        data = bytearray(os.pread(fd, size, position))
        data[len(data) // 2] ^= 0x01
        sock.sendall(data)

    monkeypatch.setattr(catchup_stream, "_send_file_part", send)
    return calls


@contextlib.asynccontextmanager
async def _tls_cluster(tmp_path: Path, **overrides: int) -> AsyncIterator[list[Node]]:
    """running_cluster's three nodes, speaking mutual TLS to each other (tests/tls_pki.py)."""
    pki = make_pki(tmp_path / "pki")
    nodes = [Node(dataclasses.replace(c, peer_tls_ca=pki.ca.cert, peer_tls_cert=pki.nodes[c.raft_addr.host].cert,
                                      peer_tls_key=pki.nodes[c.raft_addr.host].key))
             for c in configs(tmp_path, **overrides)]
    try:
        async with asyncio.timeout(90):
            for node in nodes:
                await node.start()
            await until(lambda: all(len(n.catalog.nodes) == 3 for n in nodes), "registration")
            yield nodes
    finally:
        for node in nodes:
            if node.db is not None:
                await node.stop()


async def _far_behind_then_back(tmp_path: Path, wipe: bool, monkeypatch: pytest.MonkeyPatch,
                                stream: bool = True, corrupt: bool = False, tls: bool = False) -> None:
    # The leader looks every 10 ms, not every second: 300 small entries replay in less.
    monkeypatch.setattr(catchup_leader, "ROUND_S", 0.01)
    cluster = _tls_cluster if tls else running_cluster
    async with cluster(tmp_path, far_catchup_lag_entries=60) as nodes:
        await nodes[0].create_topic(TOPIC, 1, 3, {"segment_bytes": 16384})
        for node in nodes:
            await node.wait_for_topic(TOPIC)
        await until(lambda: leader_of(nodes, TOPIC, 0) is not None, "a leader")
        values = await _write(nodes[0], 0, 20)
        leader = leader_of(nodes, TOPIC, 0)
        assert leader is not None
        position, away = next((i, n) for i, n in enumerate(nodes) if n is not leader)
        await until(lambda: values_at(away, TOPIC, 0) == values, "the follower holds the first records")
        group = away.partition_group(TOPIC, 0)
        await away.stop()
        if wipe:  # its disk replaced: the log is gone, the node's database says it had one
            shutil.rmtree(away.config.data_dir / "groups" / str(group))
        values += await _write(leader, 20, 600)  # 1.2 MB, about 75 segments of 16 KiB: more than one append
        nodes[position] = back = Node(away.config)
        if not stream and not tls:  # as with TLS between peers: no side connections, files by chunks
            monkeypatch.setattr(leader.catchup_leader, "_side", None)
        sent = _corrupt_the_first_file_sent(monkeypatch) if corrupt else []
        # No hook holds its appends back: the leader's core finds it far behind when its
        # probe succeeds and waits for the far-horizon round (Config.far_wait_lag_entries),
        # which holds it for files before replay starts.
        await back.start()
        await until(lambda: _holds(back, values), "the follower caught up", 60)
        counts = leader.catchup_leader.counts
        if corrupt:  # nothing installed from the damaged stream; replay or chunks brought the rest
            assert sent and back.api.catchup_counts["follower_failed"] >= 1
            # One stream failed, the damaged one; an earlier stream cut unfailed (the hold ended
            # under it) would be offered again, so more streams than one may have started.
            assert counts["streams_failed"] == 1 <= counts["streams"], counts
            assert back.id in leader.catchup_leader._no_stream, "the next offers go by chunks"
            if counts["installed"] == 0:  # replayed: its files roll where it rolled them
                values += await _write(leader, 620, 5)
                await until(lambda: _holds(back, values), "new records reach it")
                return
            return await _same_files_then_appends(leader, back, group, values)
        assert counts["installed"] >= 1 and counts["bytes_sent"] > 100_000, counts
        # By a side connection (catchup_stream.py), or by chunks when there is none.
        assert (counts["streams"] >= 1) is stream and counts["streams_failed"] == 0, counts
        assert back.api.catchup_counts["follower_installed"] >= 1 and leader.api.catchup_counts["installed"] >= 1
        # Back from an outage it kept the files it had (the first records'); wiped, it had none.
        assert (back.api.catchup_counts["bytes_reused"] > 0) is not wipe
        # The files it took are the leader's, byte for byte, and with them the leader's state
        # at their end (its checkpoint): the reopen replayed none of them.
        store = back.stores[group]
        assert store.starts_from is not None and store.starts_from.snapshot.meta.index > 500
        await _same_files_then_appends(leader, back, group, values)


async def _same_files_then_appends(leader: Node, back: Node, group: int, values: list[bytes]) -> None:
    store = back.stores[group]
    upto = max(s.last_index for s in store.segments if s.closed)
    mine, theirs = _segment_digests(back, upto), _segment_digests(leader, upto)
    shared = set(mine) & set(theirs)
    assert len(shared) >= 50 and all(mine[f] == theirs[f] for f in shared)
    # And it goes on replicating by appends.
    values += await _write(leader, 620, 5)
    await until(lambda: _holds(back, values), "new records reach it")


@pytest.mark.integration
@pytest.mark.asyncio
async def test_a_follower_back_from_a_long_outage_catches_up_by_files(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    await _far_behind_then_back(tmp_path, False, monkeypatch)


@pytest.mark.integration
@pytest.mark.asyncio
async def test_a_follower_whose_log_was_wiped_catches_up_by_files(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    await _far_behind_then_back(tmp_path, True, monkeypatch)


@pytest.mark.integration
@pytest.mark.asyncio
async def test_without_side_connections_the_files_go_by_chunks(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    # The fallback: a leader without side connections (TLS between peers) offers the files
    # by catchup.chunk calls, their CRCs in the offer, as before the stream.
    await _far_behind_then_back(tmp_path, True, monkeypatch, stream=False)


@pytest.mark.integration
@pytest.mark.asyncio
async def test_with_tls_between_peers_the_files_go_by_chunks_through_it(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    # A side connection would bypass the peers' TLS: with TLS on there is none, and the
    # files go by catchup.chunk calls on the TLS connections.
    await _far_behind_then_back(tmp_path, True, monkeypatch, stream=False, tls=True)


@pytest.mark.integration
@pytest.mark.asyncio
async def test_a_damaged_file_on_the_stream_is_refused_then_sent_by_chunks(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    # A byte flipped on its way: the follower's frame check refuses the file before it is
    # written, the transfer fails, nothing is installed from it; the leader's next offers to
    # it go by chunks (here replay, 10 ms rounds, is first) and the follower ends with the
    # leader's files, byte for byte. The follower is not wiped: a wiped follower's repair
    # request can end the first transfer before its stream sends anything, and it then
    # catches up by replay (from the leader's entry cache) with no damaged stream to refuse.
    await _far_behind_then_back(tmp_path, False, monkeypatch, corrupt=True)


@pytest.mark.integration
@pytest.mark.asyncio
async def test_no_install_where_the_follower_holds_the_installs_end(tmp_path: Path) -> None:
    # Review regression: the "it holds that entry already" check ran on the closed store
    # (which holds nothing), so an install went ahead over a follower that had caught up by
    # appends meanwhile, and cut entries it had acknowledged past the install's end. The
    # check runs on the stopped group's open store: the install is not made, nothing changes.
    async with running_cluster(tmp_path) as nodes:
        await nodes[0].create_topic(TOPIC, 1, 3, {"segment_bytes": 16384})
        for node in nodes:
            await node.wait_for_topic(TOPIC)
        await until(lambda: leader_of(nodes, TOPIC, 0) is not None, "a leader")
        values = await _write(nodes[0], 0, 60)
        leader = leader_of(nodes, TOPIC, 0)
        follower = next(n for n in nodes if n is not leader)
        await until(lambda: _holds(follower, values), "the follower holds every record")
        group = follower.partition_group(TOPIC, 0)
        store = follower.stores[group]
        upto = max(s.last_index for s in store.segments if s.closed)
        start = StartPoint(store.snapshot(), store.offset_after(store.snapshot().meta.index))
        offer = Offer(group, Term(store.initial_state().hard_state.term), upto, store.term(upto),
                      encode_start(start), tuple(d for d in list_closed_segments(store) if d.last_index <= upto))
        last = store.last_index()
        assert not await follower.catchup_follower._install(offer, [], structlog.get_logger())
        await until(lambda: group in follower.groups, "the group opened again")
        assert follower.stores[group].last_index() >= last
        values += await _write(leader, 60, 3)
        await until(lambda: _holds(follower, values), "it goes on replicating")
