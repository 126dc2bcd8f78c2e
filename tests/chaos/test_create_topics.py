"""The runner's topic creation survives its own retried create (chaos/runner.py).

A loaded box once answered a chaos run's create with a timeout after the create had
committed; the client asked again, met TOPIC_EXISTS, and the whole controls suite
stopped with a traceback. Three real nodes (in-process, loopback) and the real client.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from chaos.runner import create_fresh_topic
from multiraft.client import AsyncClient, RaftlogError
from tests.node.test_node_cluster import running_cluster_with_http

pytestmark = pytest.mark.asyncio


async def test_a_repeated_create_of_the_same_topic_is_done(tmp_path: Path) -> None:
    async with running_cluster_with_http(tmp_path) as (_, servers), \
            AsyncClient([s.url for s in servers], timeout_s=30, attempts=20) as client:
        await create_fresh_topic(client, "t", 3, 3, {})
        await create_fresh_topic(client, "t", 3, 3, {})  # what the client's retry meets
        assert len((await client.describe_topic("t"))["partitions"]) == 3


async def test_an_existing_topic_of_another_shape_still_stops_the_run(tmp_path: Path) -> None:
    async with running_cluster_with_http(tmp_path) as (_, servers), \
            AsyncClient([s.url for s in servers], timeout_s=30, attempts=20) as client:
        await create_fresh_topic(client, "t", 2, 3, {})
        with pytest.raises(RuntimeError, match="2 partitions, not the 3"):
            await create_fresh_topic(client, "t", 3, 3, {})
        with pytest.raises(RaftlogError) as refused:
            await create_fresh_topic(client, "bad name!", 1, 3, {})
        assert refused.value.code != "TOPIC_EXISTS"
