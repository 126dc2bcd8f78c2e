"""Goal: the feature gate through a rolling upgrade on three real `raftlog serve` processes
(multiraft/node/features.py, docs/node.md "Upgrading").

Every node starts with RAFTLOG_CHAOS_FEATURE_LEVEL=0 (multiraft/node/unsafe.py: it says it
supports level 0, as a node of a build from before the gate), so the cluster stays at level
0: `raftlog cluster features` lists each node at 0, and an HTTPS mirror link (the cheapest
gated command: one catalog entry, no source needed) is refused, 409
FEATURE_LEVEL_UNSUPPORTED. Nodes 1 and 2 are restarted without the knob ("upgraded", this
build: level 2): a finalize is refused naming node 3 and its level (the CLI exits 1 with
the code; HTTP 409). Node 3 restarted as a build of level 1 (the knob at 1): every node
says it supports level 1 at least and the cluster stays at 0 (nothing but the operator
finalizes an upgraded cluster); `raftlog cluster features finalize` raises it to level 1
(the highest every node supports), every node sees it, and the same HTTPS link is created;
its `on_source_truncated` (level 2) is refused, and so is a finalize at 2 naming node 3.
Node 3 upgraded too, a finalize raises the cluster to 2, and the link's policy changes.
Last, node 3 is rolled back (restarted with the knob at 0): it says it supports less than
the finalized level in `/v1/health` and is not ready, the listing flags it, and a finalize
names it.

Its own ports (17230/18230), so it never meets the other integration modules.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from multiraft.cli.launcher import LocalCluster
from multiraft.metadata.features import SUPPORTED_LEVEL
from tests.free_ports import require_free_ports, running
from tests.integration.conftest import call, until
from tests.integration.test_live_ops_processes import raftlog

pytestmark = pytest.mark.integration
HOSTS = ["127.0.0.1", "127.0.0.2", "127.0.0.3"]
RAFT_PORT, HTTP_PORT = 17230, 18230
OLDER = {"RAFTLOG_CHAOS_FEATURE_LEVEL": "0"}
LEVEL_1 = {"RAFTLOG_CHAOS_FEATURE_LEVEL": "1"}  # a build from before level 2 (MIRROR_FOLLOW)
NEW = int(SUPPORTED_LEVEL)
HTTPS_LINK = {"name": "dr", "sources": ["127.0.0.9:9443"], "topics": "orders*", "source_tls": True}
RESYNC = {"on_source_truncated": "resync"}
TEST_TIMEOUT_S = 240


@pytest.fixture(scope="module")
def older_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalCluster, dict[int, dict[str, str]]]]:
    directory: Path = tmp_path_factory.mktemp("features-processes")
    require_free_ports(HOSTS, (RAFT_PORT, HTTP_PORT), "the feature gate integration test")
    environments = {node_id: dict(OLDER) for node_id in range(1, len(HOSTS) + 1)}
    local = LocalCluster(directory / "data", len(HOSTS), raft_port=RAFT_PORT, http_port=HTTP_PORT,
                         extra_args=("--tick-ms", "20"), node_env=lambda node_id: environments[node_id])
    with running(local, 30.0):
        yield local, environments


def _restart(cluster: LocalCluster, environments: dict[int, dict[str, str]], node_id: int,
             environment: dict[str, str]) -> None:
    cluster.kill_node(node_id)
    environments[node_id] = environment
    cluster.start_node(node_id)
    cluster.wait_healthy(60, nodes=[node_id])


async def _levels(session: aiohttp.ClientSession, server: str) -> dict[str, Any]:
    status, report = await call(session, server, "GET", "/v1/admin/features")
    assert status == 200, report
    return report


def _supported(report: dict[str, Any]) -> dict[int, int | None]:
    return {node["node_id"]: node["supported"] for node in report["nodes"]}


async def _everyone_at(session: aiohttp.ClientSession, servers: list[str], level: int,
                       supported: dict[int, int]) -> None:
    async def applied() -> bool | None:
        for node_id, server in enumerate(servers, start=1):
            _, health = await call(session, server, "GET", "/v1/health")
            if health["feature_level"] != {"supported": supported[node_id], "finalized": level, "unsupported": False}:
                return None
        return True

    await until(applied, f"every node to apply the finalize at {level}", 30)


@pytest.mark.asyncio
async def test_a_cluster_from_before_the_gate_is_finalized_once_every_node_is_upgraded(
        older_cluster: tuple[LocalCluster, dict[int, dict[str, str]]]) -> None:
    cluster, environments = older_cluster
    servers = cluster.http_addresses
    async with asyncio.timeout(TEST_TIMEOUT_S), aiohttp.ClientSession() as session:
        report = await _levels(session, servers[0])
        assert (report["finalized"], report["highest_common"], _supported(report)) == (0, 0, {1: 0, 2: 0, 3: 0})
        listed = raftlog("cluster", "features", server=servers[1])
        assert listed.returncode == 0 and "finalized feature level: 0" in listed.stdout, listed.stderr
        status, refused = await call(session, servers[2], "POST", "/v1/admin/mirrors", json=HTTPS_LINK)
        assert (status, refused["error_code"]) == (409, "FEATURE_LEVEL_UNSUPPORTED"), refused
        assert "finalized at 0" in refused["message"]

        for node_id in (1, 2):  # a rolling upgrade, node 3 still on the older build
            await asyncio.to_thread(_restart, cluster, environments, node_id, {})

        async def two_upgraded() -> dict[str, Any] | None:
            # Asked through nodes 1 and 2 both: the refusals below go through each, and a node
            # just restarted may not have heard from node 3 yet (its ask then fails at once
            # as "silent", which CI met through node 2).
            got = [await _levels(session, server) for server in servers[:2]]
            return got[0] if all(_supported(g) == {1: NEW, 2: NEW, 3: 0} for g in got) else None

        report = await until(two_upgraded, f"nodes 1 and 2 to say they support level {NEW}", 60)
        assert NEW == 3 and (report["finalized"], report["highest_common"]) == (0, 0)
        finalize = raftlog("cluster", "features", "finalize", server=servers[0])
        assert finalize.returncode == 1 and "FEATURE_LEVEL_UNSUPPORTED" in finalize.stderr, finalize
        assert "node 3 (alive, supports 0)" in finalize.stderr and "node 1" not in finalize.stderr
        status, refused = await call(session, servers[1], "POST", "/v1/admin/features", json={"level": 1})
        assert (status, refused["error_code"]) == (409, "FEATURE_LEVEL_UNSUPPORTED") and \
            "node 3 (alive, supports 0)" in refused["message"], refused
        assert (await _levels(session, servers[2]))["finalized"] == 0

        await asyncio.to_thread(_restart, cluster, environments, 3, LEVEL_1)

        async def three_upgraded() -> dict[str, Any] | None:
            got = await _levels(session, servers[1])
            return got if _supported(got) == {1: NEW, 2: NEW, 3: 1} else None

        report = await until(three_upgraded, "node 3 to say it supports level 1", 60)
        # Every node supports level 1 now, and still nothing finalizes it but the operator.
        assert (report["finalized"], report["highest_common"]) == (0, 1), report
        await asyncio.sleep(1.0)
        assert (await _levels(session, servers[0]))["finalized"] == 0
        done = raftlog("cluster", "features", "finalize", server=servers[2])
        assert done.returncode == 0 and "finalized at feature level 1 (was 0)" in done.stdout, done
        await _everyone_at(session, servers, 1, {1: NEW, 2: NEW, 3: 1})
        status, created = await call(session, servers[0], "POST", "/v1/admin/mirrors", json=HTTPS_LINK)
        assert status == 201 and created["source_tls"] is True, created
        status, refused = await call(session, servers[0], "PATCH", "/v1/admin/mirrors/dr", json=RESYNC)
        assert (status, refused["error_code"]) == (409, "FEATURE_LEVEL_UNSUPPORTED"), refused
        assert "needs feature level 2" in refused["message"] and "finalized at 1" in refused["message"]
        finalize = raftlog("cluster", "features", "finalize", "--level", "2", server=servers[0])
        assert finalize.returncode == 1 and "node 3 (alive, supports 1)" in finalize.stderr, finalize

        await asyncio.to_thread(_restart, cluster, environments, 3, {})

        async def all_upgraded() -> dict[str, Any] | None:
            got = await _levels(session, servers[1])
            return got if _supported(got) == {1: NEW, 2: NEW, 3: NEW} else None

        await until(all_upgraded, f"node 3 to say it supports level {NEW}", 60)
        done = raftlog("cluster", "features", "finalize", server=servers[1])
        assert done.returncode == 0 and f"finalized at feature level {NEW} (was 1)" in done.stdout, done
        await _everyone_at(session, servers, NEW, {1: NEW, 2: NEW, 3: NEW})
        status, changed = await call(session, servers[2], "PATCH", "/v1/admin/mirrors/dr", json=RESYNC)
        assert status == 200 and changed["on_source_truncated"] == "resync", changed
        status, _ = await call(session, servers[1], "DELETE", "/v1/admin/mirrors/dr")
        assert status == 204

        await asyncio.to_thread(_restart, cluster, environments, 3, OLDER)  # rolled back after the finalize

        async def flagged() -> dict[str, Any] | None:
            _, health = await call(session, servers[2], "GET", "/v1/health")
            return health if health["feature_level"]["unsupported"] else None

        health = await until(flagged, "node 3 to see the level it does not support", 30)
        assert health["feature_level"] == {"supported": 0, "finalized": NEW, "unsupported": True}
        assert health["chaos_feature_level"] == 0
        status, not_ready = await call(session, servers[2], "GET", "/v1/health", params={"ready": "cluster"})
        assert (status, not_ready["error_code"]) == (503, "CLUSTER_NOT_READY"), not_ready
        assert "supports feature level 0" in not_ready["message"]
        listed = raftlog("cluster", "features", server=servers[0])
        assert listed.returncode == 0 and "supports less than the finalized level: upgrade it" in listed.stdout
        refused = raftlog("cluster", "features", "finalize", server=servers[0])
        assert refused.returncode == 1 and "node 3 (alive, supports 0)" in refused.stderr
    assert "feature_level_unsupported" in cluster.nodes[2].log_file.read_text()
