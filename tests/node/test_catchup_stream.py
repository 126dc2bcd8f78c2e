"""The stream's two ends (multiraft/node/catchup_stream.py) over a socket pair.

Goal: files go whole and checked, each followed by its CRC; a peer that stops reading or
sending fails the stream within STALL_S while the event loop goes on ticking (every
blocking call is on the stream's threads); `close` ends a call blocked meanwhile before
it closes anything (no descriptor is closed under a running call).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import socket
import threading
import zlib
from pathlib import Path

import pytest

from multiraft.node import catchup_stream
from multiraft.node.catchup_stream import StreamError, StreamReceiver, StreamSender, StreamThreads
from raftlog.messages import Entry, EntryKind
from raftlog.types import Index, Offset, Term
from storage.far_receive import CRC_UNKNOWN, ArrivingSegment
from storage.frames import encode_frame
from storage.transfer import SegmentDescriptor, descriptor_crc


def _file(path: Path, entries: int, payload_bytes: int) -> SegmentDescriptor:
    parts = []
    for index in range(1, entries + 1):
        parts += encode_frame(Entry(index=Index(index), term=Term(1), kind=EntryKind.DATA,
                                    payload=bytes([index % 251]) * payload_bytes), Offset(index - 1), 1)
    data = b"".join(parts)
    path.write_bytes(data)
    return SegmentDescriptor(Index(1), Index(entries), len(data), CRC_UNKNOWN, Offset(0), Offset(entries))


async def _ticking(ticks: list[float]) -> None:
    loop = asyncio.get_running_loop()
    while True:
        ticks.append(loop.time())
        await asyncio.sleep(0.01)


def _largest_gap(ticks: list[float]) -> float:
    return max((after - before for before, after in itertools.pairwise(ticks)), default=0.0)


@pytest.mark.asyncio
async def test_a_file_goes_whole_checked_and_followed_by_its_crc(tmp_path: Path) -> None:
    descriptor = _file(tmp_path / "segment", 300, 20_000)  # 6 MB: more than a block
    threads = StreamThreads(4, "test")
    one, two = socket.socketpair()
    sender, receiver = StreamSender(one, threads), StreamReceiver(two, threads)
    fd = os.open(tmp_path / "segment", os.O_RDONLY)
    written = bytearray()
    try:
        async with asyncio.timeout(20):
            asking = asyncio.ensure_future(receiver.ask(7, 3, [(1, True)]))
            assert await sender.asked(5.0) == (7, 3, [(1, True)])
            await asking

            async def before(part: int) -> int:
                return part

            crc = sender.crc_of(fd, descriptor.size_bytes, descriptor_crc)
            sending = asyncio.ensure_future(sender.send(1, fd, descriptor.size_bytes, True, crc, before))
            await receiver.head(1, descriptor.size_bytes)
            arriving = ArrivingSegment(descriptor)
            await receiver.file(arriving, lambda view: written.extend(view))
            frames = arriving.finish(await receiver.crc())
            await sending
        assert bytes(written) == (tmp_path / "segment").read_bytes()
        assert len(frames) == 300 and arriving.crc == zlib.crc32(written)
    finally:
        os.close(fd)
        await sender.close()
        await receiver.close()
        threads.close()


@pytest.mark.asyncio
async def test_a_receiver_that_stops_reading_fails_the_sender_not_its_loop(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(catchup_stream, "STALL_S", 0.3)
    descriptor = _file(tmp_path / "segment", 1000, 60_000)  # 60 MB: far more than the socket buffers
    threads = StreamThreads(4, "test")
    one, two = socket.socketpair()
    sender = StreamSender(one, threads)
    fd = sender.open_fd(os.open(tmp_path / "segment", os.O_RDONLY))
    ticks: list[float] = []
    ticker = asyncio.ensure_future(_ticking(ticks))

    async def before(part: int) -> int:
        return part

    try:
        async with asyncio.timeout(10):
            done = asyncio.get_running_loop().create_future()
            done.set_result(0)
            with pytest.raises(TimeoutError):
                await sender.send(1, fd, descriptor.size_bytes, True, done, before)
            await sender.close()
        assert len(ticks) > 20 and _largest_gap(ticks) < 0.2, "the loop went on meanwhile"
    finally:
        ticker.cancel()
        two.close()
        threads.close()


@pytest.mark.asyncio
async def test_a_sender_that_stops_fails_the_receiver_and_close_ends_its_thread(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(catchup_stream, "STALL_S", 0.3)
    descriptor = _file(tmp_path / "segment", 100, 60_000)
    data = (tmp_path / "segment").read_bytes()
    threads = StreamThreads(4, "test")
    one, two = socket.socketpair()
    receiver = StreamReceiver(two, threads)
    written = bytearray()
    try:
        async with asyncio.timeout(10):
            one.sendall(data[:65_536])  # (within the socket's buffer) then nothing
            with pytest.raises(TimeoutError):
                await receiver.file(ArrivingSegment(descriptor), lambda view: written.extend(view))
            await receiver.close()
        assert not written, "a block is written once whole and checked"
    finally:
        one.close()
        threads.close()


def _open_fd(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


@pytest.mark.asyncio
async def test_close_cancelled_while_a_crc_runs_closes_the_socket_and_files_once_it_ends(tmp_path: Path) -> None:
    # Goal (review M1): the sender's task cancelled while `close` waits for a running CRC
    # thread (a transfer ending as its last file goes) neither leaks its socket and its
    # files nor closes them under the running call: the last call to end closes them.
    (tmp_path / "segment").write_bytes(b"x" * 4096)
    threads = StreamThreads(4, "test")
    one, two = socket.socketpair()
    sender = StreamSender(one, threads)
    store_fd = os.open(tmp_path / "segment", os.O_RDONLY)
    fd = sender.open_fd(store_fd)
    started, release = threading.Event(), threading.Event()
    used: list[bool] = []

    def slow_crc(own: int, size: int) -> int:
        started.set()
        release.wait(10)
        used.append(_open_fd(fd) and one.fileno() != -1)  # still open while the call runs
        return 0

    try:
        async with asyncio.timeout(10):
            crc = sender.crc_of(fd, 4096, slow_crc)
            while not started.is_set():
                await asyncio.sleep(0.01)
            closing = asyncio.ensure_future(sender.close())
            await asyncio.sleep(0.05)
            closing.cancel()
            with pytest.raises(asyncio.CancelledError):
                await closing
            assert _open_fd(fd), "not closed under the running call"
            release.set()
            await asyncio.wait({crc})
            while _open_fd(fd) or one.fileno() != -1:
                await asyncio.sleep(0.01)
        assert used == [True]
    finally:
        release.set()
        os.close(store_fd)
        two.close()
        threads.close()


@pytest.mark.asyncio
async def test_a_file_sent_to_a_closed_peer_fails_with_the_stream_error(tmp_path: Path) -> None:
    # Goal (review L1): sendfile failing on its first call (the peer gone) is a StreamError,
    # not socket.sendfile's fallback to reading a file object it was not given.
    (tmp_path / "segment").write_bytes(b"x" * 1_000_000)
    threads = StreamThreads(2, "test")
    one, two = socket.socketpair()
    two.close()
    sender = StreamSender(one, threads)
    fd = sender.open_fd(os.open(tmp_path / "segment", os.O_RDONLY))

    try:
        async with asyncio.timeout(10):
            with pytest.raises(StreamError):
                await sender._run(catchup_stream._send_file_part, one, fd, 0, 1_000_000)
    finally:
        await sender.close()
        threads.close()


@pytest.mark.asyncio
async def test_a_receiver_maps_its_two_buffers_once_for_all_its_files(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    # Goal (review L6): the receive buffers (4 MiB each) are mapped once per stream, not
    # twice per file; the files still arrive whole.
    descriptor = _file(tmp_path / "segment", 50, 1_000)
    data = (tmp_path / "segment").read_bytes()
    mapped: list[int] = []
    real_mmap = catchup_stream.mmap.mmap

    def counting(*args: object) -> object:
        mapped.append(1)
        return real_mmap(*args)

    monkeypatch.setattr(catchup_stream.mmap, "mmap", counting)
    threads = StreamThreads(2, "test", writers=1)
    one, two = socket.socketpair()
    receiver = StreamReceiver(two, threads)
    try:
        async with asyncio.timeout(10):
            for _ in range(3):
                written = bytearray()
                one.sendall(data)
                await receiver.file(ArrivingSegment(descriptor), lambda view, written=written: written.extend(view))
                assert bytes(written) == data
        assert len(mapped) == 2
    finally:
        await receiver.close()
        one.close()
        threads.close()
