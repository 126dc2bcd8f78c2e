"""Far-horizon catch-up, the follower's side: fetch the leader's closed segments, then
install them in place of the log (catchup_leader.py says when and why).

An offer is taken when this node hosts the partition, does not lead it, does not hold
the offer's last entry already (then it is not behind, and nothing is replaced), and
fewer than INSTALLS_MAX installs run here. Then, in one owned task:

1. **Stage.** The files go next to the log, named `<segment>.incoming` (recovery and
   the log ignore them), through the node's `Files`, so the chaos runner's
   write-behind double sees them as any other file: a file this replica holds already
   (same entries and size; a follower back from an outage holds most of them) is
   copied from its own, the others fetched (`catchup.chunk`, FETCH_WINDOW asked at
   once, written in order; the leader's throttle paces them); each is fsynced, named,
   its directory synced, then read once on a thread (while the next file comes) and
   checked whole (storage/far_install.py: every frame's CRC, the announced size, CRC,
   indexes and offsets). Interrupted, the next offer resumes: a complete staged file is
   checked and kept; staged files the new offer does not name are removed.
2. **Install.** The group closes: its task stops and its files are synced, and, its
   store still open, the check is made again (it may have caught up by appends
   meanwhile: then nothing is replaced). Then `replace_log` swaps the log in:
   the leader's start point and files, the commit at their end, this replica's term
   and vote kept, and the leader's state at the end (its checkpoint) when it sent it.
   The reconciler opens the group again.
3. **Say so.** `catchup.done` tells the leader, which probes past the install; on a
   failure it probes from where it was, and the entries come by appends. A failed
   stream's done says whether the stream itself broke (`stream_failed`: the side
   connection never came, ended early, stalled): only that turns the leader's next offers
   to this node to chunks; a replica caught up meanwhile, a full disk or a damaged file
   of its own do not.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

from multiraft.errors import InvalidRequest
from multiraft.node.catchup_stream import (
    ACCEPT_S,
    StreamError,
    StreamReceiver,
    StreamThreads,
    settle,
)
from multiraft.node.catchup_wire import CHUNK_BYTES_MAX, Offer, decode_offer
from multiraft.transport.rpc import RPC_TIMEOUT_S, Rpc, RpcError, answer
from multiraft.transport.side_channel import SideChannel, SideListener
from raftlog.messages import Role
from raftlog.storage import CompactedError, UnavailableError
from raftlog.types import GroupId, Index, NodeId, Term
from storage.errors import CorruptionError
from storage.far_install import (
    StagedSegment,
    check_staged,
    is_staged,
    replace_log,
    staged_name,
)
from storage.far_receive import ArrivingSegment
from storage.files import FileHandle
from storage.node_state import decode_start
from storage.segment import PARTIAL_SUFFIX
from storage.transfer import SegmentDescriptor

if TYPE_CHECKING:
    from multiraft.node.catalog_holder import CatalogHolder
    from multiraft.node.local_storage import LocalStorage
    from multiraft.node.registry import GroupRegistry
    from storage.segments import SegmentStore

INSTALLS_MAX = 2
FETCH_WINDOW = 4  # chunks asked at once: 4 MiB in flight per install
COPY_CHUNK_BYTES = 4 * 1024 * 1024  # a replica's own file copied this much a loop turn


def _not_connected(error: BaseException | None) -> StreamError:
    return StreamError(f"the leader's stream did not connect (within {ACCEPT_S} s): {error!r}")


def _first_index(staged: StagedSegment) -> Index:
    return staged.descriptor.first_index


def holds(store: SegmentStore, upto: Index, term: Term) -> bool:
    """Whether `store` holds entry `upto` of `term` (or has compacted past it): then the
    install would bring nothing, and entries after it that may be committed must stay."""
    try:
        return store.term(upto) == term
    except CompactedError:
        return True
    except UnavailableError:
        return False


class CatchUpFollower:
    def __init__(self, registry: GroupRegistry, catalog: CatalogHolder, storage: LocalStorage, rpc: Rpc,
                 close_group: Callable[[GroupId, bool, Callable[[SegmentStore], None]], Awaitable[None]],
                 start_task: Callable[[Any, str], None], logger: Any, side: SideChannel | None = None) -> None:
        """`side`: the transport's side connections (None: files by chunks only)."""
        self._registry = registry
        self._catalog = catalog
        self._storage = storage
        self._rpc = rpc
        self._close_group = close_group
        self._start_task = start_task
        self._logger = logger
        self._installing: set[GroupId] = set()
        self._side = side
        # A receiver each (and as many for ones ending, within STALL_S), a writer each.
        self._threads = StreamThreads(2 * INSTALLS_MAX, "far-stream-receive", writers=INSTALLS_MAX)
        self.counts = {"installed": 0, "failed": 0, "bytes_received": 0, "bytes_reused": 0}

    def close(self) -> None:
        self._threads.close()

    def serve(self, rpc: Rpc) -> None:
        async def offer(source: int, body: bytes) -> tuple[int, bytes]:
            return await answer(self._offer(NodeId(source), body), lambda value: json.dumps(value).encode())

        rpc.register("catchup.offer", offer)

    async def _offer(self, source: NodeId, body: bytes) -> dict[str, Any]:
        offer = decode_offer(body)
        try:
            start = decode_start(offer.start)
        except (ValueError, TypeError) as error:
            raise InvalidRequest(f"an offer's start point does not decode: {error}") from None
        if start.snapshot.meta.index + 1 != offer.segments[0].first_index:
            raise InvalidRequest("an offer's segments start right after its start point")
        try:
            checkpoint = decode_start(offer.checkpoint) if offer.checkpoint else None
        except (ValueError, TypeError) as error:
            raise InvalidRequest(f"an offer's checkpoint does not decode: {error}") from None
        if checkpoint is not None and checkpoint.snapshot.meta.index != offer.upto:
            raise InvalidRequest("an offer's checkpoint stands at its upto")
        group_id = offer.group_id
        runtime = self._registry.groups.get(group_id)
        store = self._registry.stores.get(group_id)
        reason, retry = None, True  # retry: the leader may ask again shortly
        if runtime is None or store is None or group_id not in self._registry.partitions:
            reason = "no replica of that partition open here"
        elif group_id in self._installing or len(self._installing) >= INSTALLS_MAX:
            reason = "installs under way here"
        elif runtime.core.role is Role.LEADER:
            reason, retry = "this replica leads", False
        elif holds(store, offer.upto, offer.upto_term):
            reason, retry = "it holds that entry already", False
        if reason is not None:
            return {"accepted": False, "retry": retry, "reason": reason}
        listener = None
        if offer.stream:  # the leader dials this listener next (catchup_stream.py)
            try:
                if self._side is None:
                    raise OSError("no side connections here (TLS between peers)")
                listener = self._side.listen(source)
            except OSError as error:
                return {"accepted": False, "retry": False, "stream_refused": True, "reason": repr(error)}
        self._installing.add(group_id)
        self._start_task(self._catch_up(source, offer, listener), "far-catchup-install")
        return {"accepted": True, "reason": ""} if listener is None else \
            {"accepted": True, "reason": "", "stream_port": listener.port}

    async def _catch_up(self, source: NodeId, offer: Offer, listener: SideListener | None) -> None:
        log = self._logger.bind(group_id=offer.group_id, leader=source, upto=offer.upto)
        began, ok, stream_failed = time.monotonic(), False, False
        try:
            staged = await self._stage(source, offer, listener)
            staged_at = time.monotonic()
            ok = await self._install(offer, staged, log)
            if ok:
                log.info("far_catchup_installed", files=len(staged), bytes=sum(s.descriptor.size_bytes for s in staged),
                         stage_s=round(staged_at - began, 3), install_s=round(time.monotonic() - staged_at, 3))
        except (RpcError, OSError, CorruptionError, ValueError, TimeoutError) as error:
            # The socket's errors (ConnectionError, TimeoutError: the accept's, a stall's),
            # not the disk's (a plain OSError, catchup_stream.WriteStalled) nor a check's.
            stream_failed = offer.stream and isinstance(error, ConnectionError | TimeoutError)
            log.warning("far_catchup_failed", error=repr(error), stream=offer.stream, stream_failed=stream_failed)
        finally:
            if listener is not None:
                listener.close()
            self._installing.discard(offer.group_id)
            self.counts["installed" if ok else "failed"] += 1
            done = json.dumps({"group_id": offer.group_id, "transfer": offer.transfer, "upto": offer.upto,
                               "ok": ok, "stream_failed": stream_failed}).encode()
            with contextlib.suppress(RpcError):
                await self._rpc.call(source, "catchup.done", done, RPC_TIMEOUT_S)

    def _directory(self, group_id: GroupId) -> str:
        return str(self._storage.groups_directory / str(group_id))

    async def _stage(self, source: NodeId, offer: Offer, listener: SideListener | None) -> list[StagedSegment]:
        files = self._storage.files
        assert files is not None
        directory = self._directory(offer.group_id)
        wanted = {staged_name(d.first_index) for d in offer.segments}
        for name in files.list_dir(directory):  # an earlier offer's files this one does not name
            if is_staged(name) and name.removesuffix(PARTIAL_SUFFIX) not in wanted:
                files.unlink(os.path.join(directory, name))
        files.sync_dir(directory)
        # The leader dials the listener at once: the handshake is answered while this
        # replica's own files are copied.
        accepting = None if listener is None else asyncio.ensure_future(listener.accept(ACCEPT_S))
        # Each file fetched by chunks is checked on a thread while the next one comes.
        checks: list[asyncio.Future[StagedSegment]] = []
        try:
            held: dict[Index, StagedSegment] = {}
            for descriptor in offer.segments:
                path = os.path.join(directory, staged_name(descriptor.first_index))
                if accepting is not None and accepting.done() and accepting.exception() is not None:
                    raise _not_connected(accepting.exception())  # no copying on: the stream is off
                if (kept := await self._kept(path, descriptor)) is not None:  # from an interrupted transfer
                    held[descriptor.first_index] = kept
                elif (own := await self._copy_own(offer.group_id, descriptor, path)) is not None:
                    held[descriptor.first_index] = own
                elif accepting is None:
                    await self._write(path, descriptor, self._fetched(source, offer, descriptor))
                    checks.append(asyncio.ensure_future(asyncio.to_thread(check_staged, path, descriptor)))
            if accepting is None:
                return sorted([*held.values(), *await asyncio.gather(*checks)], key=_first_index)
            try:
                sock, accepting = await accepting, None  # the receiver's from here
            except OSError as error:  # (TimeoutError: nobody came)
                raise _not_connected(error) from error
            receiver = StreamReceiver(sock, self._threads)
            try:
                return await self._received(receiver, offer, held)
            finally:
                await receiver.close()
        finally:
            for check in checks:
                check.cancel()
            if accepting is not None:  # this failed before the stream was used
                accepting.cancel()
                if (sock := await settle(accepting)) is not None:
                    sock.close()  # (accepted meanwhile)

    async def _kept(self, path: str, descriptor: SegmentDescriptor) -> StagedSegment | None:
        """A complete staged file of an interrupted transfer, checked; None (and gone) if damaged."""
        files = self._storage.files
        assert files is not None
        if not files.exists(path):
            return None
        try:
            return await asyncio.to_thread(check_staged, path, descriptor)
        except CorruptionError:
            self._drop(path)
            return None

    async def _received(self, receiver: StreamReceiver, offer: Offer,
                        held: dict[Index, StagedSegment]) -> list[StagedSegment]:
        """Every file of the offer by the stream: the ones not held come whole, checked as they
        arrive; each held one's CRC must be the leader's (which its offer may not have had)."""
        directory = self._directory(offer.group_id)
        await receiver.ask(offer.group_id, offer.transfer,
                           [(d.first_index, d.first_index not in held) for d in offer.segments])
        staged: list[StagedSegment] = []
        sealing: asyncio.Future[None] | None = None  # the previous file's fsync, while this one comes
        # Where the time went, for the log: receiving, checking and writing files; waiting for an fsync.
        times = {"began": time.monotonic(), "receiving_s": 0.0, "sealing_s": 0.0}
        files = self._storage.files
        assert files is not None
        try:
            for descriptor in offer.segments:
                kept = held.get(descriptor.first_index)
                await receiver.head(descriptor.first_index, 0 if kept is not None else descriptor.size_bytes)
                if kept is not None:
                    if await receiver.crc() != kept.crc:
                        self._drop(kept.path)
                        raise CorruptionError(f"held segment {descriptor.first_index}: its CRC differs from the leader's")
                    staged.append(kept)
                    continue
                path = os.path.join(directory, staged_name(descriptor.first_index))
                arriving = ArrivingSegment(descriptor)
                handle = self._create_partial(path)
                # Past the page cache where the files allow it (storage/files.py DirectAppender):
                # a gigabyte of fresh pages cost more than the copy into them.
                direct = files.direct_appender(handle)
                began = time.monotonic()
                try:  # received, checked and written on the stream's thread, the loop free meanwhile
                    await receiver.file(arriving, direct.append if direct is not None else
                                        lambda view, handle=handle: files.append(handle, [view]))
                    times["receiving_s"] += time.monotonic() - began
                    frames = arriving.finish(await receiver.crc())
                except CorruptionError as error:  # what came is not the leader's file: the stream's fault
                    await receiver.close()
                    self._abandon(handle, path)
                    raise StreamError(f"a damaged file came by the stream: {error}") from error
                except BaseException:
                    await receiver.close()  # its thread ended: the handle is the loop's again
                    self._abandon(handle, path)
                    raise
                finally:
                    if direct is not None:
                        direct.close()
                self.counts["bytes_received"] += descriptor.size_bytes
                began = time.monotonic()
                if sealing is not None:
                    await sealing
                sealing = asyncio.ensure_future(self._seal(handle, path))
                times["sealing_s"] += time.monotonic() - began
                staged.append(StagedSegment(descriptor, path, frames, arriving.crc))
            began = time.monotonic()
            if sealing is not None:
                await sealing
            times["sealing_s"] += time.monotonic() - began
            self._logger.info("far_stream_received", group_id=offer.group_id, files=len(staged) - len(held),
                              seconds=round(time.monotonic() - times.pop("began"), 3),
                              **{name: round(value, 3) for name, value in times.items()})
            return staged
        finally:
            if sealing is not None and not sealing.done():
                sealing.cancel()
                await settle(sealing)

    async def _copy_own(self, group_id: GroupId, descriptor: SegmentDescriptor, path: str) -> StagedSegment | None:
        """Stage this replica's own copy of a file it holds already (a follower back from
        an outage holds most of them: same frames, same rolls), checked; None when it has
        none that matches. A copy, not a link: the replica runs until the install and could
        still cut its own file (a conflict after an election); the check reads the copy."""
        store = self._registry.stores.get(group_id)
        own = None if store is None else next(
            (s for s in store.segments if s.closed and (s.first_index, s.last_index, s.size)
             == (descriptor.first_index, descriptor.last_index, descriptor.size_bytes)), None)
        if own is None or store is None:
            return None

        async def chunks() -> AsyncIterator[bytes]:
            for position in range(0, descriptor.size_bytes, COPY_CHUNK_BYTES):
                if store.closed:
                    raise CorruptionError("the replica closed while its file was copied")
                yield store.files.read(own.handle, position, min(COPY_CHUNK_BYTES, descriptor.size_bytes - position))
                await asyncio.sleep(0)  # a chunk per loop turn

        try:
            await self._write(path, descriptor, chunks())
            checked = await asyncio.to_thread(check_staged, path, descriptor)
        except (OSError, CorruptionError):
            self._drop(path)
            return None
        self.counts["bytes_reused"] += descriptor.size_bytes
        return checked

    async def _fetched(self, source: NodeId, offer: Offer, descriptor: SegmentDescriptor,
                       position: int = 0) -> AsyncIterator[bytes]:
        """A file's bytes from `position`, FETCH_WINDOW chunks asked at once, in order."""
        asked: collections.deque[tuple[int, asyncio.Future[bytes]]] = collections.deque()
        try:
            while position < descriptor.size_bytes or asked:
                while len(asked) < FETCH_WINDOW and position < descriptor.size_bytes:
                    size = min(CHUNK_BYTES_MAX, descriptor.size_bytes - position)
                    request = json.dumps({"group_id": offer.group_id, "transfer": offer.transfer,
                                          "first_index": descriptor.first_index, "position": position,
                                          "size": size}).encode()
                    asked.append((size, asyncio.ensure_future(
                        self._rpc.call(source, "catchup.chunk", request, RPC_TIMEOUT_S))))
                    position += size
                size, call = asked.popleft()
                chunk = await call
                if len(chunk) != size:
                    raise CorruptionError(f"the leader sent {len(chunk)} bytes of segment "
                                          f"{descriptor.first_index} for {size} asked")
                self.counts["bytes_received"] += len(chunk)
                yield chunk
        finally:
            for _, call in asked:
                call.cancel()

    async def _write(self, path: str, descriptor: SegmentDescriptor, chunks: AsyncIterator[bytes]) -> None:
        """Write a staged file through the node's `Files` (the chaos runner's write-behind
        double sees it as any other), fsync it, give it its name, sync the directory."""
        await self._seal(await self._write_blocks(path, descriptor, chunks), path)

    def _create_partial(self, path: str) -> FileHandle:
        """A staged file's partial name, created empty (one left by an interrupted transfer
        goes: transfers resume by whole files)."""
        files = self._storage.files
        assert files is not None
        partial = path + PARTIAL_SUFFIX
        if files.exists(partial):
            files.unlink(partial)
        return files.create(partial)

    async def _write_blocks(self, path: str, descriptor: SegmentDescriptor,
                            chunks: AsyncIterator[bytes]) -> FileHandle:
        """A staged file's bytes, written under its partial name; its handle, open."""
        files = self._storage.files
        assert files is not None
        handle = self._create_partial(path)
        try:
            async for chunk in chunks:
                if handle.size + len(chunk) > descriptor.size_bytes:
                    raise CorruptionError(f"segment {descriptor.first_index} runs past its announced size")
                files.append(handle, [chunk])
        except BaseException:
            self._abandon(handle, path)
            raise
        return handle

    async def _seal(self, handle: FileHandle, path: str) -> None:
        """Fsync a staged file written whole, give it its name, sync the directory."""
        files = self._storage.files
        assert files is not None
        try:
            files.to_os(handle)
            await asyncio.to_thread(files.detached_fsync(handle))
        except BaseException:
            self._abandon(handle, path)
            raise
        files.close(handle)
        files.rename(path + PARTIAL_SUFFIX, path)
        files.sync_dir(os.path.dirname(path))

    def _abandon(self, handle: FileHandle, path: str) -> None:
        files = self._storage.files
        assert files is not None
        if handle.fd != -1:
            files.close(handle)
        self._drop(path + PARTIAL_SUFFIX)

    def _drop(self, path: str) -> None:
        files = self._storage.files
        assert files is not None
        with contextlib.suppress(OSError):
            if files.exists(path):
                files.unlink(path)
                files.sync_dir(os.path.dirname(path))

    async def _install(self, offer: Offer, staged: list[StagedSegment], log: Any) -> bool:
        group_id = offer.group_id
        if group_id not in self._registry.stores:
            return False
        verdict: list[str] = []

        def check(store: SegmentStore, _synced: bool) -> None:  # the group stopped, its store still open
            if holds(store, offer.upto, offer.upto_term):
                verdict.append("caught up by appends meanwhile")

        await self._close_group(group_id, False, check)
        # Nothing awaited from here to the end: the reconciler cannot open the group
        # between its close and the swap.
        try:
            if verdict:
                log.info("far_catchup_not_needed", reason=verdict[0])
                self._remove_staged(group_id)
                return False
            files, db = self._storage.files, self._storage.db
            assert files is not None and db is not None
            replace_log(group_id, self._directory(group_id), db, files, staged, decode_start(offer.start),
                        offer.term, int(time.time() * 1000),
                        decode_start(offer.checkpoint) if offer.checkpoint else None)
            return True
        finally:
            self._catalog.changed()  # the reconciler opens it again

    def _remove_staged(self, group_id: GroupId) -> None:
        files = self._storage.files
        assert files is not None
        directory = self._directory(group_id)
        for name in files.list_dir(directory):
            if is_staged(name):
                files.unlink(os.path.join(directory, name))
        files.sync_dir(directory)
