"""The pure parts of the transport: send queue shedding, frame headers, config limits."""

from __future__ import annotations

import pytest

from multiraft.transport.frames import (
    FRAME_HEADER_BYTES,
    FrameError,
    FrameTooLarge,
    FrameType,
    check_frame_crc,
    encode_frame,
    parse_frame_header,
)
from multiraft.transport.send_queue import SendQueue
from multiraft.transport.transport import Transport
from multiraft.transport.transport_config import TransportConfig

HEARTBEAT = int(FrameType.HEARTBEATS)
MESSAGE = int(FrameType.RAFT_MESSAGE)


def _queue(frames_max: int = 4, bytes_max: int = 1000) -> SendQueue:
    return SendQueue(
        frames_max=frames_max, bytes_max=bytes_max, shed_first_types=frozenset({HEARTBEAT})
    )


def _drain(queue: SendQueue) -> list[tuple[int, int]]:
    return [(f.frame_type, f.group_id) for f in queue.pop_batch(1000, 10**9)]


# Goal: with room to spare, frames come out in the order they went in, types mixed.
def test_queue_keeps_order_across_types() -> None:
    queue = _queue(frames_max=10)
    pushed = [(MESSAGE, 1), (HEARTBEAT, 0), (MESSAGE, 2), (HEARTBEAT, 0), (MESSAGE, 3)]
    for frame_type, group_id in pushed:
        assert queue.push(frame_type, group_id, b"x") == 0
    assert _drain(queue) == pushed
    assert len(queue) == 0 and queue.bytes == 0


# Goal: when full, the oldest heartbeat goes first, even if older messages are queued.
def test_queue_sheds_oldest_heartbeat_first() -> None:
    queue = _queue(frames_max=3)
    queue.push(MESSAGE, 1, b"a")
    queue.push(HEARTBEAT, 10, b"h")
    queue.push(MESSAGE, 2, b"b")
    assert queue.push(MESSAGE, 3, b"c") == 1
    assert _drain(queue) == [(MESSAGE, 1), (MESSAGE, 2), (MESSAGE, 3)]
    assert (queue.heartbeats_shed, queue.frames_shed) == (1, 0)


# Goal: with no heartbeat left to shed, the oldest frame of any type goes.
def test_queue_sheds_oldest_frame_when_no_heartbeats() -> None:
    queue = _queue(frames_max=2)
    for group_id in range(5):
        queue.push(MESSAGE, group_id, b"m")
    assert _drain(queue) == [(MESSAGE, 3), (MESSAGE, 4)]
    assert (queue.heartbeats_shed, queue.frames_shed) == (0, 3)


# Goal: the byte bound holds as well as the frame bound.
def test_queue_byte_bound() -> None:
    queue = _queue(frames_max=100, bytes_max=250)
    for group_id in range(5):
        queue.push(MESSAGE, group_id, bytes(100))
        assert queue.bytes <= 250
    assert len(queue) == 2 and queue.frames_shed == 3


# Goal: pop_batch respects its frame and byte caps, but always returns at least one frame.
def test_pop_batch_caps() -> None:
    queue = _queue(frames_max=10, bytes_max=10_000)
    for group_id in range(6):
        queue.push(MESSAGE, group_id, bytes(300))
    assert [f.group_id for f in queue.pop_batch(2, 10**6)] == [0, 1]
    assert [f.group_id for f in queue.pop_batch(10, 700)] == [2, 3]
    assert [f.group_id for f in queue.pop_batch(10, 10)] == [4]
    assert queue.bytes == 300
    assert queue.clear() == 1 and queue.bytes == 0


# Goal: a frame round trips through header parsing and the CRC check.
def test_frame_round_trip() -> None:
    frame = encode_frame(MESSAGE, 2**64 - 1, b"body")
    header = parse_frame_header(frame[:FRAME_HEADER_BYTES], 1024)
    assert (header.frame_type, header.group_id, header.body_bytes) == (MESSAGE, 2**64 - 1, 4)
    check_frame_crc(header, frame[FRAME_HEADER_BYTES:])
    with pytest.raises(FrameError, match="CRC"):
        check_frame_crc(header, b"bodz")


# Goal: a header declaring more than frame_bytes_max is refused from the header alone.
def test_frame_header_limits() -> None:
    frame = encode_frame(MESSAGE, 1, bytes(100))
    with pytest.raises(FrameTooLarge):
        parse_frame_header(frame[:FRAME_HEADER_BYTES], FRAME_HEADER_BYTES + 99)
    parse_frame_header(frame[:FRAME_HEADER_BYTES], FRAME_HEADER_BYTES + 100)
    with pytest.raises(FrameError, match="below"):
        parse_frame_header(b"\x00\x00\x00\x01" + frame[4:FRAME_HEADER_BYTES], 1024)


# Goal: inconsistent limits are refused when the config is built, not at run time.
@pytest.mark.parametrize(
    "fields",
    [
        {"send_queue_frames_max": 0},
        {"frame_bytes_max": 10},
        {"send_queue_bytes_max": 1024, "frame_bytes_max": 4096},
        {"reconnect_backoff_initial_s": 1.0, "reconnect_backoff_max_s": 0.5},
        {"handshake_timeout_s": 0},
        {"handshakes_pending_max": 0},
        {"inbound_connections_max": 16, "handshakes_pending_max": 16},
        {"handshakes_pending_max": 2, "handshakes_pending_per_address_max": 3},
    ],
)
def test_config_validation(fields: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        TransportConfig(**fields)  # type: ignore[arg-type]


# Goal: a transport refuses a short secret and a non-positive node id at construction.
def test_transport_construction_checks() -> None:
    with pytest.raises(ValueError, match="secret"):
        Transport(1, "127.0.0.1", 0, {}, b"short", lambda *args: None)
    with pytest.raises(ValueError, match="node_id"):
        Transport(0, "127.0.0.1", 0, {}, bytes(32), lambda *args: None)
