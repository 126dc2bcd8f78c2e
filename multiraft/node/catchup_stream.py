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
catch-up's own (`StreamThreads`), so a stall ties up none of the loop's default threads;
BLOCK_BYTES a read or a sendfile call; REQUEST_BYTES_MAX a request.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import mmap
import os
import socket
import struct
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
ACCEPT_S = 1.0  # the leader dials as soon as the follower answers: loopback or a LAN, milliseconds
REQUEST_BYTES_MAX = 4 * 1024 * 1024  # catchup_wire.SEGMENTS_MAX files' [first_index, send]: about 2 MiB
_LENGTH = struct.Struct(">I")
_HEAD = struct.Struct(">QQ")
_CRC = struct.Struct(">I")


class StreamError(ConnectionError):
    """The stream broke its protocol, or ended early."""


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
    """The blocking half of every stream on this node: at most `threads` at once."""

    def __init__(self, threads: int, name: str) -> None:
        self.executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix=name)

    def close(self) -> None:
        """The node stops: threads still blocked end within STALL_S (their sockets closed)."""
        self.executor.shutdown(wait=False, cancel_futures=True)


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
        """(Twice is harmless.)"""
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        for future in list(self._running):
            if not future.cancel():  # running: returns now that the socket is shut
                await settle(asyncio.wrap_future(future))
        self._sock.close()
        for fd in self._fds:
            os.close(fd)
        self._fds.clear()


def _receive_exactly(sock: socket.socket, size: int) -> bytes:
    buffer = bytearray(size)
    view, got = memoryview(buffer), 0
    while got < size:
        received = sock.recv_into(view[got:], size - got)
        if not received:
            raise StreamError(f"the stream ended {size - got} bytes early")
        got += received
    return bytes(buffer)


def _receive_file(sock: socket.socket, arriving: ArrivingSegment, write: Callable[[memoryview], None],
                  submit: Callable[..., concurrent.futures.Future[None]]) -> None:
    """A whole file, BLOCK_BYTES at a time: received and checked (`arriving`: every frame
    as it completes) on this thread, written (`write`) on another (`submit`), so the next
    block comes while the device takes this one; two buffers, one write at a time, in
    order. zlib and the system calls release the GIL: the event loop is hardly touched.
    A block that fails its check is not written."""
    size = arriving.descriptor.size_bytes
    length = min(BLOCK_BYTES, size)
    buffers = [memoryview(mmap.mmap(-1, length)) for _ in range(2)]  # page-aligned, as O_DIRECT wants
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
                writing.result()
            writing = submit(write, view)
            done += block
            turn ^= 1
    finally:
        if writing is not None:
            writing.result()  # (a disk write: bounded) the file is its owner's again after this


class _Fd:
    """A file descriptor as `socket.sendfile` takes it (fileno; seek, which it calls after)."""

    def __init__(self, fd: int) -> None:
        self._fd = fd

    def fileno(self) -> int:
        return self._fd

    def seek(self, position: int) -> None:
        pass  # sendfile is given its offsets


def _send_file_part(sock: socket.socket, fd: int, position: int, size: int) -> None:
    sent = sock.sendfile(_Fd(fd), position, size)  # type: ignore[arg-type]
    if sent != size:
        raise StreamError(f"the file ended {size - sent} bytes early")


def _file_row(row: Any) -> bool:
    return isinstance(row, list) and len(row) == 2 and row[1] in (0, 1) and not isinstance(row[1], bool) \
        and isinstance(row[0], int) and not isinstance(row[0], bool) and 0 < row[0] < 2**64


class StreamReceiver(_Stream):
    """The follower's end of an authenticated side connection (side_channel.py); `close` it."""

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
        await self._run(_receive_file, self._sock, arriving, write, self._threads.executor.submit)

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
