"""Goal (issue 22, typed edges): acks is one typed value; unknown text or codes are refused."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from multiraft.errors import InvalidRequest
from multiraft.node.acks import Acks
from multiraft.node.node import Node
from multiraft.transport.rpc import STATUS_ERROR
from tests.node.test_node_cluster import configs


def test_text_and_codes_round_trip() -> None:
    for acks in Acks:
        assert Acks.parse(acks.value) is acks
        assert Acks.from_code(acks.code) is acks
    assert Acks.QUORUM == "quorum"  # compares as the text the API speaks


@pytest.mark.parametrize("text", ["QUORUM", "1", "", None, 2])
def test_unknown_text_is_refused(text: object) -> None:
    with pytest.raises(InvalidRequest, match="acks must be one of"):
        Acks.parse(text)


def test_an_unknown_code_from_a_peer_is_refused_not_turned_into_quorum() -> None:
    with pytest.raises(InvalidRequest, match="unknown acks code 9"):
        Acks.from_code(9)


@pytest.mark.asyncio
async def test_a_forwarded_produce_with_an_unknown_code_is_answered_with_an_error(tmp_path: Path) -> None:
    node = Node(configs(tmp_path)[0])
    status, body = await node.producer.serve(2, struct.pack(">QB", 1, 9) + b"batch")
    assert status == STATUS_ERROR and json.loads(body)["error_code"] == "INVALID_REQUEST"
