"""Far-horizon catch-up's offer (multiraft/node/catchup_wire.py).

Goal: an offer round-trips; a file's CRC may be CRC_UNKNOWN only in an offer by stream
(a file fetched by chunks is checked against the offer's CRC, so it must be there), and a
CRC is 32 bits otherwise; an old `catchup.done` without `stream_failed` still decodes.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import structlog

from multiraft.errors import InvalidRequest
from multiraft.node.catchup_leader import CatchUpLeader, Transfer
from multiraft.node.catchup_wire import Offer, decode_offer, encode_offer
from raftlog.types import GroupId, Index, NodeId, Offset, Term
from storage.far_receive import CRC_UNKNOWN
from storage.transfer import SegmentDescriptor


def _offer(crc: int, stream: bool) -> Offer:
    segment = SegmentDescriptor(Index(11), Index(20), 4096, crc, Offset(10), Offset(20))
    return Offer(GroupId(3), Term(2), Index(20), Term(2), b"start", (segment,), b"", 7, stream)


@pytest.mark.parametrize("stream", [False, True])
def test_an_offer_round_trips(stream: bool) -> None:
    offer = _offer(0xDEADBEEF, stream)
    assert decode_offer(encode_offer(offer)) == offer


def test_an_unknown_crc_only_by_stream() -> None:
    assert decode_offer(encode_offer(_offer(CRC_UNKNOWN, True))).segments[0].crc == CRC_UNKNOWN
    with pytest.raises(InvalidRequest, match="CRCs in the offer"):
        decode_offer(encode_offer(_offer(CRC_UNKNOWN, False)))


@pytest.mark.parametrize("stream", [False, True])
def test_a_crc_past_32_bits_is_refused(stream: bool) -> None:
    with pytest.raises(InvalidRequest, match="32 bits"):
        decode_offer(encode_offer(_offer(CRC_UNKNOWN + 1, stream)))


@pytest.mark.asyncio
@pytest.mark.parametrize(("field", "turned_off"), [({}, True), ({"stream_failed": True}, True),
                                                   ({"stream_failed": False}, False)])
async def test_a_done_without_stream_failed_counts_as_before(field: dict[str, bool], turned_off: bool) -> None:
    # A follower of an earlier version does not say whether its stream broke: its failed
    # stream transfer turns streams off as it did; a newer one's says.
    registry = SimpleNamespace(groups={})
    leader = CatchUpLeader(registry, rpc=None, lag=(60, 0), acquire=None, is_live=lambda node: True,  # type: ignore[arg-type]
                           start_task=lambda coroutine, name: None, logger=structlog.get_logger())
    try:
        leader._active[(GroupId(3), NodeId(2))] = Transfer(Index(20), False, 0.0, 7, stream=True, dialled=True)
        await leader._done(NodeId(2), json.dumps({"group_id": 3, "transfer": 7, "upto": 20, "ok": False,
                                                  **field}).encode())
        assert not leader._active
        assert (NodeId(2) in leader._no_stream) is turned_off
        assert leader.counts["streams_failed"] == int(turned_off)
    finally:
        leader.close()
