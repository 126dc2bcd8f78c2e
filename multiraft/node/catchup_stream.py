"""Far-horizon catch-up's files by a side connection of their own (the stream), not by
`catchup.chunk` calls through the frame path.

Why: through the frame path each MiB was read by the leader, framed, CRC'd and queued on
its event loop, then parsed, CRC'd again and copied on the follower's, written, and
every file read back once more to check it: 240-280 MB/s on this machine, both cores
busy. The stream sends the files' own bytes with os.sendfile (the kernel copies them),
the follower receives them into large buffers on a thread and checks every frame as it
arrives (storage/far_receive.py), so the file is never read back.

The connection (multiraft/transport/side_channel.py) is authenticated by the cluster
secret both ways; with TLS between peers there is none and the chunk path is used. On it,
after the handshake:

    follower -> leader  request: u32 length, then JSON {"group_id", "transfer",
                        "files": [[first_index, send], ...]}: every file of the offer,
                        in order; `send` 0 for a file the follower holds already
    leader -> follower  per file of the request, in order: first_index u64, size u64
                        (the file's size when sent, else 0), the file's bytes, then the
                        CRC of the whole file u32 (which the offer may not have had:
                        the leader computes it, on a thread, while the file goes)
    then the leader closes the connection.

Bounds: sockets time out after STALL_S without progress (both ends: a stalled peer fails
the transfer, never a loop); every blocking call runs on a small executor of the
catch-up's own (`StreamThreads`), so a stall ties up none of the loop's default threads,
and the receiver's disk writes on another (a receive never waits for a thread a write
holds, nor the reverse), each waited for WRITE_S at most; BLOCK_BYTES a read (two such
buffers per receiving stream, for all its files), SEND_BYTES a sendfile call;
REQUEST_BYTES_MAX a request.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import mmap
import os
import select
import socket
import struct
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from multiraft.errors import InvalidRequest
from multiraft.node.catchup_wire import natural, request
from storage.far_receive import ArrivingSegment

BLOCK_BYTES = 4 * 1024 * 1024  # a receive buffer
# A sendfile call: the leader checks its hold between two (at most this much goes after it
# ended, as four chunks did); 1 MiB under the move throttle, as a chunk.
SEND_BYTES = 16 * 1024 * 1024
STALL_S = 10.0  # a socket that moves nothing this long fails the transfer
# The follower's listener waits this long for the leader's connection. The leader dials as
# soon as the answer reaches it (milliseconds on a LAN), but a loaded node may take up to
# the transport's own bounds for it: connect_timeout_s + handshake_timeout_s (5 s + 5 s,
# transport_config.py). Shorter, a busy leader's stream fails and that follower's files go
# by chunks for NO_STREAM_S (catchup_leader.py).
ACCEPT_S = 10.0
# A disk write of one block (BLOCK_BYTES): a device that takes longer has stalled, and the
# transfer fails rather than hold its thread and the hold on the leader.
WRITE_S = 30.0
REQUEST_BYTES_MAX = 4 * 1024 * 1024  # catchup_wire.SEGMENTS_MAX files' [first_index, send]: about 2 MiB
_LENGTH = struct.Struct(">I")
_HEAD = struct.Struct(">QQ")
_CRC = struct.Struct(">I")


class StreamError(ConnectionError):
    """The stream broke its protocol, or ended early."""


class WriteStalled(OSError):
    """A receiver's disk write took more than WRITE_S: the disk's trouble, not the stream's."""


async def settle(future: asyncio.Future[Any]) -> Any:
    """Wait for `future`, which its owner cancelled or gave up on, to end; its result, or
    None whatever it raised. Our own cancellation (the task stopping meanwhile) goes on."""
    try:
        return await future
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            raise
    except Exception:  # its failure is its owner's news, reported where it happened
        pass
    return None


class StreamThreads:
    """The blocking half of every stream on this node: at most `threads` calls at once,
    and at most `writers` receivers' disk writes on threads of their own (a write never
    waits behind a receive it is needed by)."""

    def __init__(self, threads: int, name: str, writers: int = 0) -> None:
        self.executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix=name)
        self.writer = ThreadPoolExecutor(max_workers=writers, thread_name_prefix=f"{name}-write") \
            if writers else None

    def close(self) -> None:
        """The node stops: threads still blocked end within STALL_S (their sockets closed)."""
        self.executor.shutdown(wait=False, cancel_futures=True)
        if self.writer is not None:
            self.writer.shutdown(wait=False, cancel_futures=True)


class _Stream:
    """One end's socket and the files it sends from, and every blocking call it made.
    `close` shuts the socket down (a blocked call returns at once), waits for each call,
    and only then closes the socket and the files: a descriptor closed under a running
    call could be reused by another file or connection meanwhile."""

    def __init__(self, sock: socket.socket, threads: StreamThreads) -> None:
        sock.settimeout(STALL_S)
        self._sock = sock
        self._threads = threads
        self._running: set[concurrent.futures.Future[Any]] = set()
        self._fds: set[int] = set()
        self._releasing = threading.Lock()  # the socket and files are closed once: by the loop or a thread

    def _run(self, function: Callable[..., Any], *args: Any,
             on_cancel: Callable[[], None] | None = None) -> asyncio.Future[Any]:
        future = self._threads.executor.submit(function, *args)
        if on_cancel is not None:  # cancelled before it ran: it cannot clean up after itself
            future.add_done_callback(lambda done: on_cancel() if done.cancelled() else None)
        self._running.add(future)
        future.add_done_callback(self._running.discard)
        return asyncio.wrap_future(future)

    def open_fd(self, fd: int) -> int:
        """A descriptor of our own for a store's file: the store may close its handle (a
        compaction, a close) while the file goes; it stays readable through this one."""
        own = os.dup(fd)
        self._fds.add(own)
        return own

    def close_fd(self, fd: int) -> None:
        """A file sent whole: no call of ours uses `fd` any more."""
        self._fds.discard(fd)
        os.close(fd)

    async def close(self) -> None:
        """(Twice is harmless.) Cancelled while it waits (its task stops meanwhile), the
        socket and the files are closed by the last call to end, on its thread, and the
        cancellation goes on: nothing leaks, nothing is closed under a running call."""
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        running = [future for future in list(self._running) if not future.cancel()]  # returns now the socket is shut
        if running:
            waiting = asyncio.gather(*(asyncio.wrap_future(future) for future in running), return_exceptions=True)
            try:
                await asyncio.shield(waiting)
            except asyncio.CancelledError:
                self._release_after(running)
                raise
        self._release()

    def _release_after(self, running: list[concurrent.futures.Future[Any]]) -> None:
        left = [len(running)]
        counting = threading.Lock()

        def ended(_: concurrent.futures.Future[Any]) -> None:  # on the call's thread, or here if ended
            with counting:
                left[0] -= 1
                last = left[0] == 0
            if last:
                self._release()

        for future in running:
            future.add_done_callback(ended)

    def _release(self) -> None:
        with self._releasing:
            self._sock.close()
            fds, self._fds = self._fds, set()
        for fd in fds:
            os.close(fd)


def _receive_exactly(sock: socket.socket, size: int) -> bytes:
    buffer = bytearray(size)
    view, got = memoryview(buffer), 0
    while got < size:
        received = sock.recv_into(view[got:], size - got)
        if not received:
            raise StreamError(f"the stream ended {size - got} bytes early")
        got += received
    return bytes(buffer)


def _written(writing: concurrent.futures.Future[None]) -> None:
    try:
        writing.result(timeout=WRITE_S)
    except TimeoutError:
        raise WriteStalled(f"a block's write took more than {WRITE_S} s") from None


def _receive_file(sock: socket.socket, arriving: ArrivingSegment, write: Callable[[memoryview], None],
                  submit: Callable[..., concurrent.futures.Future[None]], buffers: list[memoryview]) -> None:
    """A whole file, BLOCK_BYTES at a time: received and checked (`arriving`: every frame
    as it completes) on this thread, written (`write`) on another (`submit`), so the next
    block comes while the device takes this one; the two `buffers` (BLOCK_BYTES each), one
    write at a time, in order. zlib and the system calls release the GIL: the event loop
    is hardly touched. A block that fails its check is not written."""
    size = arriving.descriptor.size_bytes
    length = BLOCK_BYTES
    writing: concurrent.futures.Future[None] | None = None  # the previous block's write
    done, turn = 0, 0
    try:
        while done < size:
            block = min(length, size - done)
            view = buffers[turn][:block]  # its last write ended before the previous one began
            got = 0
            while got < block:
                received = sock.recv_into(view[got:], block - got)
                if not received:
                    raise StreamError(f"the stream ended {size - done - got} bytes before its file's end")
                got += received
            arriving.feed(view)
            if writing is not None:
                _written(writing)
            writing = submit(write, view)
            done += block
            turn ^= 1
    finally:
        if writing is not None:  # the file is its owner's again after this (or after close, stalled)
            _written(writing)


def _send_file_part(sock: socket.socket, fd: int, position: int, size: int) -> None:
    """`size` bytes of `fd` from `position`, by os.sendfile. A loop of our own, not
    `socket.sendfile`: that one falls back to reading the file through Python when its
    first call fails (a peer gone), which needs a file object. The socket is
    non-blocking under its timeout: each call waits for room at most STALL_S."""
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLOUT)
    sent = 0
    while sent < size:
        if not poller.poll(STALL_S * 1000):
            raise TimeoutError(f"the stream took nothing for {STALL_S} s")
        try:
            count = os.sendfile(sock.fileno(), fd, position + sent, size - sent)
        except BlockingIOError:
            continue
        except OSError as error:  # the peer gone (EPIPE, ECONNRESET), the socket shut
            raise StreamError(f"the stream broke while a file went: {error!r}") from error
        if count == 0:
            raise StreamError(f"the file ended {size - sent} bytes early")
        sent += count


def _file_row(row: Any) -> bool:
    return isinstance(row, list) and len(row) == 2 and row[1] in (0, 1) and not isinstance(row[1], bool) \
        and isinstance(row[0], int) and not isinstance(row[0], bool) and 0 < row[0] < 2**64


class StreamReceiver(_Stream):
    """The follower's end of an authenticated side connection (side_channel.py); `close` it."""

    def __init__(self, sock: socket.socket, threads: StreamThreads) -> None:
        super().__init__(sock, threads)
        self._buffers: list[memoryview] | None = None  # two blocks, for every file of this stream

    def _submit_write(self, write: Callable[[memoryview], None], view: memoryview) -> concurrent.futures.Future[None]:
        """A block's write on the writers' threads (on the receiving thread); `close` waits for it too."""
        executor = self._threads.writer or self._threads.executor
        future = executor.submit(write, view)
        self._running.add(future)
        future.add_done_callback(self._running.discard)
        return future

    async def ask(self, group_id: int, transfer: int, files: list[tuple[int, bool]]) -> None:
        body = json.dumps({"group_id": group_id, "transfer": transfer,
                           "files": [[first, int(send)] for first, send in files]}).encode()
        assert len(body) <= REQUEST_BYTES_MAX
        await self._run(self._sock.sendall, _LENGTH.pack(len(body)) + body)

    async def head(self, first_index: int, size: int) -> None:
        """The next file's head: it must be the one asked for, with that size."""
        got = _HEAD.unpack(await self._run(_receive_exactly, self._sock, _HEAD.size))
        if got != (first_index, size):
            raise StreamError(f"the leader sent file {got[0]} of {got[1]} bytes for {first_index} of {size}")

    async def file(self, arriving: ArrivingSegment, write: Callable[[memoryview], None]) -> None:
        """The next file's bytes, checked and written by `write` on a thread of the stream:
        `write` must be safe there (it writes to a file no one else touches meanwhile).
        Failed or cancelled, `close` this receiver before the file is touched again."""
        if self._buffers is None:  # page-aligned, as O_DIRECT wants
            self._buffers = [memoryview(mmap.mmap(-1, BLOCK_BYTES)) for _ in range(2)]
        await self._run(_receive_file, self._sock, arriving, write, self._submit_write, self._buffers)

    async def crc(self) -> int:
        return _CRC.unpack(await self._run(_receive_exactly, self._sock, _CRC.size))[0]


class StreamSender(_Stream):
    """The leader's end of an authenticated side connection (side_channel.py); `close` it."""

    async def asked(self, idle_s: float) -> tuple[int, int, list[tuple[int, bool]]]:
        """The follower's request: (group, transfer, [(first_index, send)])."""
        self._sock.settimeout(idle_s)  # the follower copies its own files first
        try:
            (length,) = _LENGTH.unpack(await self._run(_receive_exactly, self._sock, _LENGTH.size))
            if length > REQUEST_BYTES_MAX:
                raise InvalidRequest(f"a stream request of {length} bytes")
            fields = request(await self._run(_receive_exactly, self._sock, length))
        finally:
            self._sock.settimeout(STALL_S)
        files = fields.get("files")
        if not isinstance(files, list) or not all(_file_row(row) for row in files):
            raise InvalidRequest("files: [[first_index, 0 or 1], ...]")
        return natural(fields, "group_id"), natural(fields, "transfer"), [(row[0], row[1] == 1) for row in files]

    async def send(self, first_index: int, fd: int, size: int, send: bool, crc: Awaitable[int],
                   before: Callable[[int], Awaitable[int]]) -> None:
        """One file of the request: its head, its bytes when `send` (each part once `before(size)`
        allowed it: at most the size it returns), then `crc` (computed meanwhile)."""
        await self._run(self._sock.sendall, _HEAD.pack(first_index, size if send else 0))
        position = 0
        while send and position < size:
            part = await before(min(SEND_BYTES, size - position))
            await self._run(_send_file_part, self._sock, fd, position, part)
            position += part
        await self._run(self._sock.sendall, _CRC.pack(await crc))

    def crc_of(self, fd: int, size: int, compute: Callable[[int, int], int]) -> asyncio.Future[int]:
        """`compute(fd, size)` on a thread, through a descriptor of its own (closed by it)."""
        own = os.dup(fd)

        def job() -> int:
            try:
                return compute(own, size)
            finally:
                os.close(own)

        return self._run(job, on_cancel=lambda: os.close(own))
