"""The outbound side of the transport: one connection to one peer, and its queue.

A `PeerLink` owns one task that loops: dial the peer (bound to our own raft host),
run the handshake, then write queued frames until the connection fails; then
back off (exponential, jittered, bounded) and dial again. `enqueue` never
blocks and never awaits: while the link is connected, idle and its socket keeps
up, the frame joins the link's *pending* frames, which go out together in one
write at the end of this event-loop turn (`_flush_pending`, scheduled by
`call_soon` when the first of them arrives); otherwise it pushes onto the bounded
`SendQueue` (which sheds) and wakes the writer.

Why a turn's frames share one write: a node's groups each run their Ready in
their own task, and a produce over 8 partitions wakes 8 of them in one turn, each
sending an append to the same two peers. One `send` per frame was 8.6 % of a
leader's event-loop thread (docs/scale.md); one per peer per turn costs what one
frame did. Heartbeats were already one frame per peer per tick (heartbeats.py);
they join the turn's write like any frame.

Order and bounds: while frames are pending every `enqueue` appends to them (the
queue is empty then: pending starts only when it is, and nothing else pushes to
it meanwhile), so frames leave in the order they were enqueued, before anything
queued later. Pending frames are bounded as a writer batch is
(`write_batch_frames_max`, `write_batch_bytes_max`): reaching either writes them
at once. The delay is bounded but not nil: the flush is a `call_soon` callback,
so it runs in the loop's next iteration, after that iteration's I/O poll (a zero
timeout: a callback is ready) and after every callback queued before it (the
tasks woken earlier in the turn, the I/O callbacks the poll made ready, timers
due), whose own frames join the same write. If the connection went before the
flush, or its write raises (uvloop on a transport closed under us), the pending
frames go to the queue (shed and counted as any frame would be) and leave on the
next connection; so they do if anything is queued already, after it.

The connection is write-only after the handshake, but a watcher reads it too:
a peer that restarts closes its end, and reading is how we notice at once
rather than at the next failed write.

With TLS (`tls_context`), the dialled connection is upgraded before the
secret's handshake, both within `handshake_timeout_s`: the peer's certificate
must chain to the cluster's CA and name the host dialled, and ours goes with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import ssl
from collections.abc import Callable
from typing import Any, Protocol

from multiraft.transport.frames import TransportError, encode_frame_header
from multiraft.transport.handshake import connect_handshake
from multiraft.transport.send_queue import SendQueue
from multiraft.transport.transport_config import PeerStats, TransportConfig, TransportCounters

__all__ = ["PeerLink", "enable_keepalive"]

# A connection that ends sooner than this counts toward backing off (see PeerLink._run).
YOUNG_CONNECTION_S = 0.25


class ConnectionLost(TransportError):
    """The outbound connection ended (peer closed it, or broke the protocol)."""


class PeerLink:
    def __init__(
        self,
        *,
        node_id: int,
        peer_id: int,
        address: tuple[str, int],
        source_host: str | None,
        secret: bytes,
        config: TransportConfig,
        counters: TransportCounters,
        logger: Any,
        rng: random.Random,
        tls_context: ssl.SSLContext | None = None,
    ) -> None:
        self.node_id = node_id
        self.peer_id = peer_id
        self.address = address
        self._source_host = source_host
        self._secret = secret
        self._config = config
        self._counters = counters
        self._logger = logger.bind(peer_id=peer_id)
        self._rng = rng
        self._tls_context = tls_context
        self.on_refused: Callable[[int], None] | None = None  # see Transport.on_peer_refused
        self.queue = SendQueue(
            frames_max=config.send_queue_frames_max,
            bytes_max=config.send_queue_bytes_max,
            shed_first_types=config.heartbeat_frame_types,
        )
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._writer: asyncio.StreamWriter | None = None  # set while connected
        # Frames for this turn's one write (see the module docstring), and its bytes.
        self._pending: list[tuple[int, int, bytes]] = []
        self._pending_bytes = 0
        self._flush_handle: asyncio.Handle | None = None
        self._frames_out = 0
        self._bytes_out = 0
        self._connects = 0
        self._connect_failures = 0

    @property
    def connected(self) -> bool:
        return self._writer is not None

    def start(self) -> None:
        assert self._task is None, "a link is started once"
        self._task = asyncio.create_task(self._run(), name=f"transport-peer-{self.peer_id}")

    def cancel(self) -> asyncio.Task[None] | None:
        """Stop the link; the caller awaits the returned task. Queued frames are dropped."""
        self.queue.clear()
        self._drop_pending()
        if self._writer is not None:
            self._writer.transport.abort()
        if self._task is not None:
            self._task.cancel()
        return self._task

    def enqueue(self, frame_type: int, group_id: int, body: bytes) -> None:
        pending = self._pending
        if pending:
            self._add_pending(frame_type, group_id, body)
            return
        writer = self._writer
        if (
            writer is not None
            and not self.queue
            and writer.transport.get_write_buffer_size() == 0
            and not writer.transport.is_closing()
        ):
            # The fast path: nothing is waiting and the socket keeps up, so the frame
            # goes out with this turn's other frames in one write at the end of the turn,
            # instead of through the writer task. Order holds: only an empty queue and
            # buffer are bypassed.
            self._flush_handle = asyncio.get_running_loop().call_soon(self._flush_pending)
            self._add_pending(frame_type, group_id, body)
            return
        self._push(frame_type, group_id, body)

    def _add_pending(self, frame_type: int, group_id: int, body: bytes) -> None:
        self._pending.append((frame_type, group_id, body))
        self._pending_bytes += len(body)
        config = self._config
        if len(self._pending) >= config.write_batch_frames_max or self._pending_bytes >= config.write_batch_bytes_max:
            self._flush_pending()  # a full batch goes now: pending frames stay bounded

    def _flush_pending(self) -> None:
        """The turn's pending frames, in one write (or onto the queue if the connection went)."""
        frames = self._pending
        self._drop_pending()
        if not frames:
            return
        writer = self._writer
        # Frames already queued (none are, by the docstring's argument) must not be
        # overtaken by a direct write: then these join the queue's end instead, in order.
        if writer is not None and not writer.transport.is_closing() and not self.queue:
            try:
                self._write(writer, frames)
                return
            except (RuntimeError, OSError) as error:
                # A transport closed under us before is_closing() says so: uvloop refuses
                # the write (RuntimeError). Nothing of it was sent; the frames are queued
                # for the next connection, and the writer task sees the closed transport.
                self._logger.debug("peer_flush_failed", error=repr(error))
                writer.transport.abort()
        for frame in frames:
            self._push(*frame)

    def _drop_pending(self) -> None:
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        self._pending = []
        self._pending_bytes = 0

    def _push(self, frame_type: int, group_id: int, body: bytes) -> None:
        queue = self.queue
        heartbeats_before, frames_before = queue.heartbeats_shed, queue.frames_shed
        if queue.push(frame_type, group_id, body):
            self._counters.heartbeats_shed += queue.heartbeats_shed - heartbeats_before
            self._counters.frames_shed += queue.frames_shed - frames_before
        self._wakeup.set()

    def set_address(self, address: tuple[str, int]) -> None:
        """Dial `address` from now on; a live connection to the old one is dropped."""
        if address == self.address:
            return
        self.address = address
        if self._writer is not None:
            self._writer.transport.abort()

    def stats(self) -> PeerStats:
        return PeerStats(
            peer_id=self.peer_id,
            address=self.address,
            connected=self.connected,
            queued_frames=len(self.queue) + len(self._pending),
            queued_bytes=self.queue.bytes + self._pending_bytes,
            frames_out=self._frames_out,
            bytes_out=self._bytes_out,
            heartbeats_shed=self.queue.heartbeats_shed,
            frames_shed=self.queue.frames_shed,
            connects=self._connects,
            connect_failures=self._connect_failures,
        )

    # ------------------------------------------------------------------ the link task

    async def _run(self) -> None:
        # The backoff step is the failed dials since the last connection plus the
        # connections in a row that died young (YOUNG_CONNECTION_S): a peer that was
        # down a while and is back starts from scratch, a flapping one does not.
        attempt = 0
        short_lived = 0
        was_connected = False  # connected since the last refusal we reported
        loop = asyncio.get_running_loop()
        while True:
            try:
                reader, writer = await self._connect()
            except Exception as error:  # whatever one dial does, the link dials again
                if not isinstance(error, (OSError, TimeoutError, TransportError, asyncio.IncompleteReadError)):
                    self._logger.error("peer_link_unexpected_error", phase="connect", error=repr(error))
                attempt += 1
                self._connect_failures += 1
                self._counters.connect_failures += 1
                # The first failure in a row is news; the retries that follow are not.
                log = self._logger.info if attempt == 1 else self._logger.debug
                log("peer_connect_failed", address=self.address, attempt=attempt, error=repr(error))
                if isinstance(error, ConnectionRefusedError) and was_connected:
                    # We were connected and now nothing listens there: the peer's process
                    # went away. (A peer refusing before it ever answered may just be
                    # starting later than us: that is no news.) Said once per loss.
                    was_connected = False
                    if self.on_refused is not None:
                        self.on_refused(self.peer_id)
                await asyncio.sleep(self._backoff_s(attempt))
                continue
            started = loop.time()
            attempt = 0
            self._connects += 1
            self._counters.connects += 1
            self._writer = writer
            was_connected = True
            self._logger.info("peer_connected", address=self.address)
            reason = "closed"
            try:
                await self._write_loop(reader, writer)
            except (OSError, TimeoutError, TransportError) as error:
                reason = repr(error)
            except Exception as error:  # a link ends only when cancelled, never silently
                self._logger.error("peer_link_unexpected_error", phase="write", error=repr(error))
                reason = repr(error)
            finally:
                self._writer = None
                writer.transport.abort()
            self._logger.info("peer_disconnected", address=self.address, reason=reason)
            # Redial at once: a peer whose process died refuses in well under a
            # millisecond here, and that refusal is what fails its groups over
            # (`on_refused`); a wait of one backoff step delayed it past the election
            # timeout whenever the connection had lived under two seconds. Only
            # connections dying young twice in a row (a peer that accepts and hangs up:
            # flapping) back off, so the link never spins. Young is a fraction of a
            # second: a peer restarted and killed again a second later (a rolling
            # restart, a leader moved home and killed) is no flapping peer.
            lived_s = loop.time() - started
            young_s = min(YOUNG_CONNECTION_S, self._config.reconnect_backoff_max_s)
            short_lived = 0 if lived_s >= young_s else short_lived + 1
            attempt = max(short_lived - 1, 0)
            if attempt:
                await asyncio.sleep(self._backoff_s(attempt))

    def _backoff_s(self, attempt: int) -> float:
        config = self._config
        ceiling = config.reconnect_backoff_initial_s * 2 ** min(attempt - 1, 30)
        # "Equal jitter": at least half the step, so peers that failed together spread out.
        return min(config.reconnect_backoff_max_s, ceiling) * self._rng.uniform(0.5, 1.0)

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        config = self._config
        host, port = self.address
        local_addr = (self._source_host, 0) if self._source_host is not None else None
        async with asyncio.timeout(config.connect_timeout_s):
            reader, writer = await asyncio.open_connection(
                host, port, local_addr=local_addr, limit=config.read_buffer_bytes
            )
        try:
            enable_keepalive(writer)
            async with asyncio.timeout(config.handshake_timeout_s):
                if self._tls_context is not None:
                    await writer.start_tls(self._tls_context, server_hostname=host,
                                           ssl_handshake_timeout=config.handshake_timeout_s + 1.0)
                await connect_handshake(
                    reader, writer, secret=self._secret, node_id=self.node_id, peer_id=self.peer_id
                )
        except BaseException:
            writer.transport.abort()
            raise
        return reader, writer

    async def _write_loop(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        watch = asyncio.create_task(reader.read(1), name=f"transport-watch-{self.peer_id}")
        watch.add_done_callback(lambda _: self._wakeup.set())
        try:
            await self._write_frames(watch, writer)
        finally:
            watch.cancel()
            await reap(watch)

    async def _write_frames(self, watch: asyncio.Task[bytes], writer: asyncio.StreamWriter) -> None:
        config = self._config
        queue = self.queue
        while True:
            if watch.done():
                data = watch.result()  # raises the read's OSError, if any
                raise ConnectionLost("peer sent bytes after the handshake" if data else "eof")
            if writer.transport.is_closing():
                # Closed under us (a reset seen by the loop) before the watch could say so:
                # uvloop refuses writes on a closed transport with a RuntimeError.
                raise ConnectionLost("closed")
            batch = queue.pop_batch(config.write_batch_frames_max, config.write_batch_bytes_max)
            if not batch:
                self._wakeup.clear()
                if not queue and not watch.done():
                    await self._wakeup.wait()
                continue
            self._write(writer, [(f.frame_type, f.group_id, f.body) for f in batch])
            async with asyncio.timeout(config.write_stall_timeout_s):
                await writer.drain()

    def _write(self, writer: asyncio.StreamWriter, frames: list[tuple[int, int, bytes]]) -> None:
        parts: list[bytes] = []
        for frame_type, group_id, body in frames:
            parts.append(encode_frame_header(frame_type, group_id, body))
            parts.append(body)
        data = b"".join(parts)
        writer.write(data)
        self._frames_out += len(frames)
        self._bytes_out += len(data)
        self._counters.frames_out += len(frames)
        self._counters.bytes_out += len(data)


class _HasSocket(Protocol):
    def get_extra_info(self, name: str, default: Any = None, /) -> Any: ...


def enable_keepalive(writer: _HasSocket) -> None:
    """TCP keepalive, so an idle connection to a vanished host is eventually noticed."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)


async def reap(task: asyncio.Task[bytes]) -> None:
    """Wait for `task`, which we cancelled, to end. Our own cancellation (the link stopped
    meanwhile) goes on: suppressing every CancelledError here took the link's stop for the
    watch's end and swallowed it, and the link dialled its peer again forever after its stop
    (a transport test hung on it beside a chaos run)."""
    try:
        await task
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            raise
    except OSError:
        pass  # the read's own failure: the connection is gone either way
