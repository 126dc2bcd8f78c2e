"""A peer link writes the frames enqueued in one event-loop turn in one write, in order,
at the end of that turn (multiraft/transport/peer_link.py, `_flush_pending`), within the
writer batch bounds; frames pending when the connection goes are queued, not lost."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from multiraft.transport.frames import FrameType
from tests.transport.helpers import FAST, Inbox, make_transport, until


def count_writes(link) -> list[int]:  # type: ignore[no-untyped-def]
    """Wrap the connected link's real StreamWriter.write: the sizes of the writes made."""
    writer = link._writer
    assert writer is not None
    sizes: list[int] = []
    real = writer.write

    def write(data: bytes) -> None:
        sizes.append(len(data))
        real(data)

    writer.write = write
    return sizes


async def connected_pair(stopper, config=FAST):  # type: ignore[no-untyped-def]
    inbox = Inbox()
    receiver = make_transport(2, 0, {}, inbox, config=config)
    stopper.append(receiver)
    await receiver.start()
    sender = make_transport(1, 0, {2: receiver.listen_address}, Inbox(), config=config)
    stopper.append(sender)
    await sender.start()
    await until(lambda: sender.peer_connected(2), what="connected")
    return sender, inbox


# Goal: frames for many groups enqueued in one turn leave in one write at the end of the
# turn (not before it), arrive in order, and a heartbeat frame joins the same write.
@pytest.mark.asyncio
async def test_one_turns_frames_leave_in_one_write_in_order(stopper) -> None:  # type: ignore[no-untyped-def]
    async with asyncio.timeout(10):
        sender, inbox = await connected_pair(stopper)
        link = sender._links[2]
        writes = count_writes(link)
        sent = [(1, FrameType.RAFT_MESSAGE, group, b"append %d" % group) for group in range(20)]
        sent.append((1, FrameType.HEARTBEATS, 0, b"beats"))
        for _, frame_type, group, body in sent:
            assert sender.send(2, frame_type, group, body)
        assert writes == [], "nothing is written before the turn ends"
        await asyncio.sleep(0)
        assert len(writes) == 1, "one write for the turn's frames"
        await until(lambda: len(inbox.frames) == len(sent))
        assert inbox.frames == sent
        assert sender.stats().frames_out == len(sent)


# Goal: frames of two turns take two writes, each holding its own turn's frames.
@pytest.mark.asyncio
async def test_each_turn_takes_its_own_write(stopper) -> None:  # type: ignore[no-untyped-def]
    async with asyncio.timeout(10):
        sender, inbox = await connected_pair(stopper)
        writes = count_writes(sender._links[2])
        for turn in range(3):
            for group in range(4):
                assert sender.send(2, FrameType.RAFT_MESSAGE, group, b"turn %d" % turn)
            await asyncio.sleep(0)
            assert len(writes) == turn + 1
        await until(lambda: len(inbox.frames) == 12)
        assert [frame[3] for frame in inbox.frames] == [b"turn %d" % (i // 4) for i in range(12)]


# Goal: pending frames stay within the writer batch bound: the frame that reaches it
# writes the batch at once, the rest of the turn goes at its end, order intact.
@pytest.mark.asyncio
async def test_pending_frames_are_bounded_by_the_writer_batch(stopper) -> None:  # type: ignore[no-untyped-def]
    async with asyncio.timeout(10):
        config = dataclasses.replace(FAST, write_batch_frames_max=8)
        sender, inbox = await connected_pair(stopper, config)
        writes = count_writes(sender._links[2])
        for group in range(10):
            assert sender.send(2, FrameType.RAFT_MESSAGE, group, b"g%d" % group)
        assert len(writes) == 1, "the eighth frame wrote the batch"
        assert len(sender._links[2]._pending) <= 8
        await asyncio.sleep(0)
        await until(lambda: len(inbox.frames) == 10)
        assert [frame[2] for frame in inbox.frames] == list(range(10))


# Goal: frames pending when the connection drops are queued, not lost, and arrive in
# order on the next connection.
@pytest.mark.asyncio
async def test_frames_pending_when_the_connection_drops_go_out_on_the_next(stopper) -> None:  # type: ignore[no-untyped-def]
    async with asyncio.timeout(10):
        sender, inbox = await connected_pair(stopper)
        link = sender._links[2]
        for group in range(5):
            assert sender.send(2, FrameType.RAFT_MESSAGE, group, b"before the drop")
        link._writer.transport.abort()  # closing before the turn ends: the flush queues
        await asyncio.sleep(0)
        assert len(link.queue) == 5 and not link._pending
        await until(lambda: len(inbox.frames) == 5, what="delivered after reconnecting")
        assert [frame[2] for frame in inbox.frames] == list(range(5))
        assert sender.stats().peers[2].connects == 2
