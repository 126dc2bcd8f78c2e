"""Goal: the feature-level routes (multiraft/http/handlers/features.py) answer the contract
over real HTTP on every node of a new cluster: it starts finalized at its build's level (its
first metadata leader proposed it, multiraft/node/features.py), every node says it supports
that level and sees the cluster at it (`GET /v1/admin/features`, `/v1/health`,
`/v1/cluster`); `POST` of the same level changes nothing, one above what the nodes support
is 409 FEATURE_LEVEL_UNSUPPORTED naming each node and its level, and a malformed body is
400. A cluster at level 0 and its finalize: tests/integration/test_features_processes.py."""

from __future__ import annotations

import pytest

from multiraft.metadata.features import SUPPORTED_LEVEL
from tests.http.conftest import Cluster

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="package")]


async def test_a_new_cluster_starts_at_its_builds_level(cluster: Cluster) -> None:
    # The fixture waited for the first metadata leader's finalize (tests/node/test_node_cluster.py at_build_level).
    for index, node in enumerate(cluster.nodes):
        status, report = await cluster.call("GET", index, "/v1/admin/features")
        assert status == 200, report
        assert (report["finalized"], report["supported_here"], report["highest_common"], report["not_answered"]) \
            == (SUPPORTED_LEVEL, SUPPORTED_LEVEL, SUPPORTED_LEVEL, [])
        assert [(n["node_id"], n["supported"], n["finalized"], n["answered"]) for n in report["nodes"]] == [
            (n.id, SUPPORTED_LEVEL, SUPPORTED_LEVEL, True) for n in cluster.nodes]
        assert [level["level"] for level in report["levels"]] == list(range(SUPPORTED_LEVEL + 1))
        assert report["finalized"] == 3 and report["levels"][3]["name"] == "mirror_filter", report["levels"]
        status, health = await cluster.call("GET", index, "/v1/health")
        assert health["feature_level"] == {"supported": SUPPORTED_LEVEL, "finalized": SUPPORTED_LEVEL,
                                           "unsupported": False}
        status, view = await cluster.call("GET", index, "/v1/cluster")
        assert view["feature_level"] == SUPPORTED_LEVEL and node.catalog_holder.readable


async def test_a_finalize_never_goes_above_what_every_node_supports(cluster: Cluster) -> None:
    for body in ({}, {"level": SUPPORTED_LEVEL}, {"level": None}):
        status, report = await cluster.call("POST", 1, "/v1/admin/features", json=body)
        assert status == 200 and (report["finalized"], report["previous"]) == (SUPPORTED_LEVEL, SUPPORTED_LEVEL)
    status, empty = await cluster.call("POST", 2, "/v1/admin/features")  # no body at all
    assert status == 200 and empty["finalized"] == SUPPORTED_LEVEL, empty
    status, refused = await cluster.call("POST", 0, "/v1/admin/features", json={"level": SUPPORTED_LEVEL + 1})
    assert (status, refused["error_code"]) == (409, "FEATURE_LEVEL_UNSUPPORTED"), refused
    for node in cluster.nodes:
        assert f"node {node.id} (alive, supports {SUPPORTED_LEVEL})" in refused["message"]
    for body in ({"level": 0}, {"level": "1"}, {"level": True}, {"level": 1, "force": True}, {"level": 10_001}):
        status, answer = await cluster.call("POST", 0, "/v1/admin/features", json=body)
        assert (status, answer["error_code"]) == (400, "INVALID_REQUEST"), (body, answer)
    status, answer = await cluster.call("POST", 0, "/v1/admin/features", data=b"level=1")
    assert status in (400, 415), answer
    assert all(n.catalog.feature_level == SUPPORTED_LEVEL for n in cluster.nodes)
