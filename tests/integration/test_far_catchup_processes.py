"""Goal: a follower whose copy of a partition was deleted from disk (a replaced disk)
catches up by the leader's segment files, then by appends (issue 25's far horizon), in
real `raftlog serve` processes: its log says the file path was taken, its segment files
are byte-identical to the leader's, and records written after it came back reach it.

The nodes run with low thresholds (a config file: 100 entries, 1 MiB) and the topic with
256 KiB segments, so a few MiB make a follower far behind. Its own ports (17290/18290).
"""

from __future__ import annotations

import asyncio
import hashlib
import shutil
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from multiraft.cli.launcher import LocalCluster
from storage.batch import Record, encode_batch
from storage.segment import parse_segment_name
from tests.free_ports import require_free_ports, running
from tests.integration.conftest import call, create_topic, until

pytestmark = pytest.mark.integration
HOSTS = ["127.0.0.1", "127.0.0.2", "127.0.0.3"]
RAFT_PORT, HTTP_PORT = 17290, 18290
TOPIC = "far"
BATCH = "application/vnd.raftlog.batch"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    directory: Path = tmp_path_factory.mktemp("far-catchup-processes")
    require_free_ports(HOSTS, (RAFT_PORT, HTTP_PORT), "the far catch-up integration test")
    config = directory / "node.toml"
    config.write_text("far_catchup_lag_entries = 100\nfar_catchup_lag_bytes = 1048576\n")
    local = LocalCluster(directory / "data", 3, raft_port=RAFT_PORT, http_port=HTTP_PORT,
                         extra_args=("--tick-ms", "20", "--config", str(config)))
    with running(local, 30.0):
        yield local


async def _write(session: aiohttp.ClientSession, server: str, batches: int, seed: int) -> None:
    for i in range(batches):
        body = encode_batch([Record(None, b"%d-%d-" % (seed, i) + b"x" * 1000)] * 32, first_timestamp_ms=1)
        for _ in range(100):
            status, _ = await call(session, server, "POST", f"/v1/topics/{TOPIC}/partitions/0/records",
                                   data=body, headers={"Content-Type": BATCH})
            if status == 200:
                break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError(f"batch {i} was never acknowledged")


async def _partition(session: aiohttp.ClientSession, server: str) -> dict | None:
    try:
        status, body = await call(session, server, "GET", f"/v1/topics/{TOPIC}")
    except (aiohttp.ClientError, TimeoutError):
        return None
    return body["partitions"][0] if status == 200 else None


def _digests(group_dir: Path, upto_first: int) -> dict[int, str]:
    """Segment files starting at or below `upto_first`, by first index: a digest each."""
    found = {}
    for path in group_dir.iterdir():
        first = parse_segment_name(path.name)
        if first is not None and first <= upto_first:
            found[first] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


@pytest.mark.asyncio
async def test_a_wiped_follower_catches_up_by_files_then_appends(cluster: LocalCluster) -> None:
    servers = cluster.http_addresses
    async with aiohttp.ClientSession() as session:
        await create_topic(session, cluster, TOPIC, 1, config={"segment_bytes": 262144})
        view = await until(lambda: _partition(session, servers[0]), "the partition")
        leader = await until(lambda: _leader(session, servers[0]), "a leader")
        await _write(session, servers[leader - 1], 160, seed=1)  # about 5 MiB: 20 segments
        follower = next(n for n in (1, 2, 3) if n != leader)
        node = cluster.nodes[follower - 1]
        cluster.kill_node(follower)
        group_dir = node.data_dir / "groups" / str(view["group_id"])
        shutil.rmtree(group_dir)
        cluster.start_node(follower)

        async def caught_up() -> bool | None:
            theirs, mine = await _partition(session, servers[leader - 1]), await _partition(session, servers[follower - 1])
            if theirs is None or mine is None or mine["high_watermark"] is None:
                return None
            return True if mine["high_watermark"] == theirs["high_watermark"] else None

        await until(caught_up, "the wiped follower caught up", 90)
        log = node.log_file.read_text(errors="replace")
        assert "far_catchup_installed" in log, "the file path was taken"
        leader_dir = cluster.nodes[leader - 1].data_dir / "groups" / str(view["group_id"])
        mine = _digests(group_dir, 2**63)
        theirs = _digests(leader_dir, max(mine))
        closed_shared = sorted(set(mine) & set(theirs))[:-1]  # the newest of either may still grow
        assert len(closed_shared) >= 10
        assert all(mine[first] == theirs[first] for first in closed_shared), "byte-identical files"
        # And appends after: records written now reach it.
        await _write(session, servers[leader - 1], 10, seed=2)
        await until(caught_up, "records written after reach it", 30)


async def _leader(session: aiohttp.ClientSession, server: str) -> int | None:
    view = await _partition(session, server)
    return view["leader"] if view is not None and view["leader"] else None
