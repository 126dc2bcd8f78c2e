"""The sink's side of a link: talking to the source cluster over its public HTTP API.

A sink reads a source exactly as any client with a token would: `GET /v1/topics`
(which topics exist), `GET /v1/topics/{topic}` (partition count, config) and the
mirror's read, `GET /v1/topics/{topic}/partitions/{p}/log` (the stored batches with
the skipped ones named; docs/http.md). Any source node answers any of them (a node
without a replica forwards the read), so the client rotates over the link's
addresses when one fails. Every call is bounded in time and bytes.

Backoff (`backoff_s`) is a pure function of the failure count and a random draw:
exponential from 0.2 s to 30 s, with "equal jitter" (half fixed, half random), so
sinks retrying a source that came back do not all arrive at once.

The source's token never reaches a message. aiohttp's `ClientResponseError` (and
`TooManyRedirects`, one of them) puts the request's headers, `Authorization`
included, in its repr, so an error is described by its type and its own message,
never its repr; redirects are not followed (a redirect could take the token to
another host); and every message the client raises is scrubbed of the token
anyway (a source may echo it in a body, or a header), since messages end up in
status answers and logs (`PullStatus.last_error`, `Discovery.last_error`).

TLS (docs/mirror.md "TLS to the source"): a link with `source_tls` reads its source over
HTTPS with `multiraft.net.tls.source_context` (the link's CA bundle, or the system's
trust store; the certificate verified and its host checked, TLS 1.2 at least), so the
token crosses the network encrypted. Every sink component reading a source (discovery,
the pulls, the full sync) makes its client with `source_client(link, ...)`, which takes
the link's TLS settings. A certificate the sink does not trust, a name that does not
match, or a source that does not speak TLS is a `SourceError` like any other, named in
the status (`tls_hint` says what to check) and retried after the same backoff; a CA
bundle this node's OpenSSL refuses makes every call of the link's client fail the same
way, without a connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import random
import ssl
import struct
from dataclasses import dataclass
from typing import Any

import aiohttp

from multiraft.errors import InvalidRequest
from multiraft.metadata.mirror_commands import OFFSET_MAX, MirrorLink
from multiraft.net.tls import TlsError, source_context
from storage.tictac import DIGEST_BYTES

BACKOFF_BASE_S = 0.2
BACKOFF_MAX_S = 30.0
CALL_TIMEOUT_S = 10.0  # a call's bound beyond its long-poll wait
JSON_BYTES_MAX = 4 * 1024 * 1024  # a topic list or description from the source
JSON_ON_LOOP_BYTES_MAX = 256 * 1024  # a larger JSON answer is parsed in a thread, off the event loop
# A topic's description read from every address serves all its partitions' confirmations for
# this long (those asking while it is read wait for that read), and at most this many topics'
# are read at once per link: 10,000 truncated partitions of a topic cost one read of it per
# address every 2 s, not 10,000.
DESCRIPTION_FRESH_S = 2.0
DESCRIPTIONS_IN_FLIGHT_MAX = 4
LOG_CONTENT_TYPE = "application/vnd.raftlog.batch"
TREE_BUILD_S = 50.0  # a tree call may read the partition's whole span at the source first
_FRAME = struct.Struct(">qI")  # as the binary consume answer: base offset, batch bytes


def backoff_s(failures: int, rng: random.Random, base_s: float = BACKOFF_BASE_S,
              max_s: float = BACKOFF_MAX_S) -> float:
    """The pause after `failures` (>= 1) consecutive failures: `base_s` (0.2 s) doubling
    to `max_s` (30 s), half of it drawn at random."""
    assert failures >= 1
    assert 0 < base_s <= max_s
    ceiling = min(max_s, base_s * 2 ** min(failures - 1, 16))
    return ceiling / 2 + rng.uniform(0, ceiling / 2)


REDACTED = "<redacted>"


def redact(text: str, token: str | None) -> str:
    """`text` without `token` (the source's bearer token) anywhere in it."""
    return text.replace(token, REDACTED) if token else text


def describe_error(error: BaseException) -> str:
    """An exception as a status may show it: its type and its own message, never its repr
    (aiohttp's `ClientResponseError` repr holds the request's headers, the token's too);
    a TLS failure leads with what to check (`tls_hint`)."""
    if isinstance(error, aiohttp.ClientResponseError):  # str() would show the URL; status and message suffice
        return f"{type(error).__name__}: {error.status} {error.message}"
    hint = tls_hint(error)
    return f"{hint}{type(error).__name__}: {error}"


def tls_hint(error: BaseException) -> str:
    """What a failed TLS connection to the source most likely means, as a prefix ("" for
    anything else): the sink's trust in the source's certificate, or a source that does not
    serve HTTPS on that port (it answers a TLS hello with plain HTTP, or hangs up)."""
    if isinstance(error, aiohttp.ClientConnectorCertificateError):
        return ("TLS: the source's certificate is not trusted or does not name the host dialled "
                "(the link's source_ca, or the system's trust store): ")
    if isinstance(error, aiohttp.ClientSSLError | ssl.SSLError):
        return "TLS: the handshake with the source failed (does it serve HTTPS on this port?): "
    return ""


class SourceError(Exception):
    """The source could not be read (down, slow, refused): back off and try again."""


class Diverged(SourceError):
    """The source's log is not the one this mirror copied: its batches do not continue the
    mirror's log, or its partition is another one (a source topic deleted and made again)."""


@dataclass(frozen=True, slots=True)
class LogChunk:
    """One read of a source partition's log: whole batches as stored, in offset order."""

    batches: list[tuple[int, bytes]]  # (base offset, batch bytes)
    skipped: tuple[tuple[int, int], ...]  # (base offset, record count) the source leaves out of reads
    next_offset: int
    high_watermark: int
    log_start_offset: int


def parse_log_answer(body: bytes, headers: Any) -> LogChunk:
    """Decode the log route's binary answer (frames of base offset, length, batch) and
    its position headers; anything malformed is a `SourceError`, whichever call read it
    (discovery, a pull): so are offsets outside 0..2**63-1, in the positions or the skipped
    ranges (no log has one; a mirror's start offsets and positions are bounded so), and a
    log start past the high watermark (no replica holds such a log: its retention deletes
    only what it applied), which a sink would otherwise take for a truncation."""
    try:
        positions = [int(headers[h]) for h in ("Raftlog-Next-Offset", "Raftlog-High-Watermark",
                                                "Raftlog-Log-Start-Offset")]
        skipped_text = headers.get("Raftlog-Skipped", "")
        skipped = tuple(tuple(int(v) for v in pair.split(":")) for pair in skipped_text.split(",") if pair)
    except (KeyError, ValueError) as error:
        raise SourceError(f"the source's log answer has malformed headers: {error!r}") from None
    next_offset, high_watermark, log_start = positions
    if not all(0 <= value <= OFFSET_MAX for value in (*positions, *(v for pair in skipped for v in pair))):
        raise SourceError(f"the source's log answer has offsets outside 0..2**63-1: next {next_offset}, "
                          f"high watermark {high_watermark}, log start {log_start}, skipped {list(skipped)[:4]}")
    if log_start > high_watermark:
        raise SourceError(f"the source's log answer starts its log at {log_start}, past its high watermark "
                          f"{high_watermark}")
    batches: list[tuple[int, bytes]] = []
    view, position = memoryview(body), 0
    while position < len(body):
        if position + _FRAME.size > len(body):
            raise SourceError("the source's log answer is truncated")
        base, size = _FRAME.unpack_from(view, position)
        position += _FRAME.size
        if position + size > len(body):
            raise SourceError("the source's log answer is truncated")
        batches.append((base, bytes(view[position:position + size])))
        position += size
    if any(len(pair) != 2 for pair in skipped):
        raise SourceError("the source's skipped ranges are malformed")
    return LogChunk(batches, skipped, *positions)  # type: ignore[arg-type]


@dataclass(slots=True)
class _Description:
    """One read of a topic's description from each of a link's addresses, shared by its
    partitions: per address, the node that answered and its entries by partition, or why not."""

    task: asyncio.Future[list[tuple[int, dict[Any, list[Any]]] | str]]
    done_at: float | None = None  # the loop's clock when the read ended (None: under way)


@dataclass(frozen=True, slots=True)
class PartitionView:
    """A source partition as one source node describes it (`GET /v1/topics/{topic}`): its
    group id, the partition's identity at the source (group ids are never reused there: a
    topic deleted and made again gets new ones), its replicas (node ids), and, where that node
    hosts a replica of it, the replica's log start and high watermark (None elsewhere);
    `node_id`: the node that answered (`GET /v1/cluster`), None when not asked."""

    group_id: int
    log_start_offset: int | None
    high_watermark: int | None
    replicas: tuple[int, ...]
    node_id: int | None = None


def _is_offset(value: Any) -> bool:
    return type(value) is int and 0 <= value <= OFFSET_MAX


def index_partitions(described: Any) -> dict[Any, list[Any]]:
    """A source topic's description's partition entries by their `partition` (several under
    one: malformed, as `partition_entry_view` says); `SourceError` when it has no list."""
    entries = described.get("partitions") if isinstance(described, dict) else None
    if not isinstance(entries, list):
        raise SourceError("the source's description has no partition list")
    index: dict[Any, list[Any]] = {}
    for entry in entries:
        key = entry.get("partition") if isinstance(entry, dict) else None
        with contextlib.suppress(TypeError):  # an unhashable one names no partition
            index.setdefault(key, []).append(entry)
    return index


def parse_partition_view(described: Any, partition: int, node_id: int | None = None) -> PartitionView:
    """`partition` of a source topic's description (as node `node_id` answered it)."""
    return partition_entry_view(index_partitions(described).get(partition, []), partition, node_id)


def partition_entry_view(entries: list[Any], partition: int, node_id: int | None) -> PartitionView:
    """`partition` from its entries in a source topic's description (one, as node `node_id`
    answered it); anything malformed or impossible (no entry or two, a log start past the high
    watermark, no replicas, one twice) is a `SourceError`."""
    try:
        [view] = entries
        found = PartitionView(view["group_id"], view["log_start_offset"], view["high_watermark"],
                              tuple(view["replicas"]), node_id)
    except (KeyError, TypeError, ValueError):
        raise SourceError(f"the source's description of partition {partition} is malformed") from None
    start, high, replicas = found.log_start_offset, found.high_watermark, found.replicas
    if not _is_offset(found.group_id) or found.group_id < 1 or (start is None) != (high is None) or (
            start is not None and not (_is_offset(start) and _is_offset(high) and start <= high)) or (  # type: ignore[operator]
            not replicas or len(set(replicas)) != len(replicas) or not all(_is_node(n) for n in replicas)):
        raise SourceError(f"the source's description of partition {partition} has impossible values: {found}")
    return found


def _is_node(value: Any) -> bool:
    return _is_offset(value) and value >= 1


def binds_to(local_host: str | None, sources: tuple[str, ...]) -> str | None:
    """The address to bind the source's connections to: `local_host` when it and every
    source host are IPv4 loopback literals (clusters sharing one host, where the OS would
    pick 127.0.0.1 whoever holds it), else None. Bound to a loopback address, a connection
    to a remote source would fail; bound to a name or another family, every connection."""
    if not local_host or not _is_loopback_v4(local_host):
        return None
    return local_host if all(_is_loopback_v4(address.rpartition(":")[0]) for address in sources) else None


def _is_loopback_v4(host: str) -> bool:
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    return address.version == 4 and address.is_loopback


def source_client(link: MirrorLink, rng: random.Random | None = None,
                  local_host: str | None = None) -> SourceClient:
    """The client of `link`'s source, with the link's TLS settings (every caller makes its
    client here, so none reads an HTTPS source over plain HTTP). A CA bundle this node's
    OpenSSL refuses is not raised: the client fails each call with it (the link's status)."""
    if not link.source_tls:
        return SourceClient(link.sources, link.token, rng, local_host)
    try:
        context = source_context(link.source_ca)
    except TlsError as error:
        return SourceClient(link.sources, link.token, rng, local_host, tls_error=f"TLS: {error}")
    return SourceClient(link.sources, link.token, rng, local_host, tls=context)


class SourceClient:
    """HTTP(S) calls to one link's source addresses; `close` when done (its owner does)."""

    def __init__(self, sources: tuple[str, ...], token: str | None, rng: random.Random | None = None,
                 local_host: str | None = None, tls: ssl.SSLContext | None = None,
                 tls_error: str | None = None) -> None:
        """`local_host`: the address connections to the source are made from (the node's own,
        as its Raft links: firewall rules between clusters on one host match it), used only
        when it and every source address are loopback IP literals (`binds_to`); else the OS
        picks, as it must for a remote source, a name, or another address family.
        `tls`: HTTPS with this context (`source_context`); None: plain HTTP. `tls_error`: the
        link wants HTTPS but its context could not be made: every call fails with this."""
        assert sources
        assert tls is None or (tls.verify_mode == ssl.CERT_REQUIRED and tls.check_hostname)
        self._tls = tls
        self._tls_error = tls_error
        self.scheme = "https" if tls is not None or tls_error is not None else "http"
        self._sources = list(sources)
        self._next = (rng or random.Random()).randrange(len(sources))
        self._token = token
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._session: aiohttp.ClientSession | None = None
        self._local_host = binds_to(local_host, sources)
        self._descriptions: dict[str, _Description] = {}  # by topic: the last read shared (DESCRIPTION_FRESH_S)
        self._describing = asyncio.Semaphore(DESCRIPTIONS_IN_FLIGHT_MAX)

    def scrub(self, text: str) -> str:
        """`text` as it may be shown or logged: without this link's token."""
        return redact(text, self._token)

    async def close(self) -> None:
        for description in self._descriptions.values():
            description.task.cancel()
        self._descriptions.clear()
        if self._session is not None:
            await self._session.close()
            self._session = None

    def rotate(self) -> None:
        """The next call goes to the next address (as after a failure)."""
        self._next += 1

    async def _get(self, path: str, params: dict[str, str], accept: str, wait_s: float,
                   bytes_max: int, source: str | None = None) -> tuple[int, bytes, Any]:
        try:
            return await self._get_once(path, params, accept, wait_s, bytes_max, source)
        except SourceError as error:
            raise SourceError(self.scrub(str(error))) from None

    async def _get_once(self, path: str, params: dict[str, str], accept: str, wait_s: float,
                        bytes_max: int, source: str | None) -> tuple[int, bytes, Any]:
        """`source`: the address asked (one of the link's; None: the current one)."""
        if self._tls_error is not None:
            raise SourceError(self._tls_error)
        if self._session is None:
            local = {"local_addr": (self._local_host, 0)} if self._local_host else {}
            tls = {"ssl": self._tls} if self._tls is not None else {}
            connector = aiohttp.TCPConnector(**local, **tls) if local or tls else None  # type: ignore[arg-type]
            self._session = aiohttp.ClientSession(headers=self._headers, connector=connector)
        assert source is None or source in self._sources
        source = source or self._sources[self._next % len(self._sources)]
        try:
            async with self._session.get(f"{self.scheme}://{source}{path}", params=params, headers={"Accept": accept},
                                         allow_redirects=False,
                                         timeout=aiohttp.ClientTimeout(total=CALL_TIMEOUT_S + wait_s)) as answer:
                if (answer.content_length or 0) > bytes_max:
                    raise SourceError(f"the source's answer to {path} exceeds {bytes_max} bytes")
                parts, size = [], 0
                async for part in answer.content.iter_chunked(256 * 1024):
                    size += len(part)
                    if size > bytes_max:
                        raise SourceError(f"the source's answer to {path} exceeds {bytes_max} bytes")
                    parts.append(part)
                return answer.status, b"".join(parts), answer.headers
        except (aiohttp.ClientError, TimeoutError, OSError) as error:
            self._next += 1  # the next call tries the next address
            hint = ("the source hung up (if it serves HTTPS, the link needs source_tls): "
                    if self.scheme == "http" and isinstance(error, aiohttp.ServerDisconnectedError) else "")
            raise SourceError(f"source {source} did not answer {path}: {hint}{describe_error(error)}") from None

    async def get_json(self, path: str, params: dict[str, str] | None = None, wait_s: float = 0.0,
                       source: str | None = None) -> Any:
        """A JSON read; `wait_s` more than the call's bound when the source must work first (a
        tree); `source`: the address asked (None: the current one)."""
        status, body, _ = await self._get(path, params or {}, "application/json", wait_s, JSON_BYTES_MAX, source)
        if status != 200:
            self._next += status >= 500
            raise SourceError(self.scrub(f"the source answered {path} with {status}: {body[:200]!r}"))
        try:
            if len(body) > JSON_ON_LOOP_BYTES_MAX:  # 10,000 partitions' description: tens of ms of parsing
                return await asyncio.to_thread(json.loads, body)
            return json.loads(body)
        except Exception as error:  # hostile input: a RecursionError too (`[` * 5000), not only ValueError
            raise SourceError(f"the source's answer to {path} is not JSON we read ({type(error).__name__})") from None

    async def partition_views(self, topic: str, partition: int) -> list[PartitionView]:
        """`partition` of `topic` as each of the link's addresses describes it (`GET
        /v1/cluster`, which node answers, then `GET /v1/topics/{topic}?consistency=linearizable`,
        the source node's catalog caught up with its metadata leader's, of each, all addresses at
        once: a source node gives its own replica's offsets), those that answered; a
        `SourceError` when none did. Only the link's addresses are asked, never others the
        source names (the token goes nowhere else). The topic's read is shared by its
        partitions asking within `DESCRIPTION_FRESH_S` of it (`_described`)."""
        views: list[PartitionView] = []
        errors: list[str] = []
        for answer in await self._described(topic):
            if isinstance(answer, str):
                errors.append(answer)
                continue
            try:
                views.append(partition_entry_view(answer[1].get(partition, []), partition, answer[0]))
            except SourceError as error:
                errors.append(self.scrub(str(error)))
        if not views:
            raise SourceError(errors[0])
        return views

    async def _described(self, topic: str) -> list[tuple[int, dict[Any, list[Any]]] | str]:
        """Each address's node and description of `topic`: the last read of it if it ended less
        than `DESCRIPTION_FRESH_S` ago or is under way (a single flight: every partition asking
        meanwhile waits for the one read), else a new one (at most `DESCRIPTIONS_IN_FLIGHT_MAX`
        topics read at once). A caller cancelled leaves the read to the others waiting for it."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        held = self._descriptions.get(topic)
        if held is None or (held.done_at is not None and now - held.done_at >= DESCRIPTION_FRESH_S):
            self._descriptions = {t: d for t, d in self._descriptions.items()  # those gone stale leave
                                  if d.done_at is None or now - d.done_at < DESCRIPTION_FRESH_S}
            held = self._descriptions[topic] = _Description(asyncio.ensure_future(self._describe(topic)))
            held.task.add_done_callback(lambda _, held=held: setattr(held, "done_at", loop.time()))
        return await asyncio.shield(held.task)

    async def _describe(self, topic: str) -> list[tuple[int, dict[Any, list[Any]]] | str]:
        async def one(source: str) -> tuple[int, dict[Any, list[Any]]]:
            cluster = await self.get_json("/v1/cluster", source=source)
            node_id = cluster.get("node_id") if isinstance(cluster, dict) else None
            if not _is_node(node_id):
                raise SourceError(f"source {source} did not name its node id (/v1/cluster)")
            # Linearizable: a source node whose catalog lags would describe an older identity.
            described = await self.get_json(f"/v1/topics/{topic}", {"consistency": "linearizable"}, source=source)
            return node_id, index_partitions(described)

        async with self._describing:
            # Side by side (one call's bound); one address failing fails only its own answer.
            answers = await asyncio.gather(*(one(source) for source in self._sources), return_exceptions=True)
        return [a if isinstance(a, tuple) else self.scrub(str(a) if isinstance(a, SourceError) else describe_error(a))
                for a in answers]

    async def tree(self, topic: str, partition: int, lo: int, hi: int, deep: bool = False) -> dict[str, Any]:
        """The source's tree of a partition over `[lo, hi)` cut to what it holds (multiraft/node/
        mirror_trees.py): lo, hi, depth, root, damaged, log_start_offset, high_watermark. `deep`:
        the source reads every segment (a source of an earlier version ignores the parameter
        and reads them all anyway)."""
        query = {"lo": str(lo), "hi": str(hi), **({"deep": "true"} if deep else {})}
        return await self.get_json(f"/v1/topics/{topic}/partitions/{partition}/tree", query, TREE_BUILD_S)

    async def tree_nodes(self, topic: str, partition: int, lo: int, hi: int, level: int,
                         positions: list[int]) -> list[bytes]:
        answer = await self.get_json(f"/v1/topics/{topic}/partitions/{partition}/tree/nodes", {
            "lo": str(lo), "hi": str(hi), "level": str(level), "positions": ",".join(map(str, positions))},
            TREE_BUILD_S)
        try:
            digests = [bytes.fromhex(d) for d in answer["digests"]]
        except (KeyError, TypeError, ValueError):
            raise SourceError("the source's tree nodes are malformed") from None
        if len(digests) != len(positions) or any(len(d) != DIGEST_BYTES for d in digests):
            raise SourceError("the source answered other tree nodes than asked for")
        return digests

    async def read_log(self, topic: str, partition: int, offset: int, max_bytes: int, wait_ms: int) -> LogChunk:
        """Committed batches of the source's partition from `offset` (whole batches, at most
        about `max_bytes`, at least one); waits up to `wait_ms` at its high watermark."""
        if not 0 <= wait_ms <= 30_000:
            raise InvalidRequest("wait_ms is 0..30000")
        params = {"offset": str(offset), "max_bytes": str(max_bytes), "wait_ms": str(wait_ms)}
        # One batch may be up to 16 MiB whatever max_bytes says: room for it and its frame.
        status, body, headers = await self._get(f"/v1/topics/{topic}/partitions/{partition}/log", params,
                                                LOG_CONTENT_TYPE, wait_ms / 1000, max_bytes + 17 * 1024 * 1024)
        if status != 200:
            self._next += status >= 500 or status == 421
            raise SourceError(self.scrub(f"the source answered a read of {topic}/{partition} with {status}: "
                                         f"{body[:200]!r}"))
        try:
            return parse_log_answer(body, headers)
        except SourceError as error:  # a malformed header's value is quoted: scrubbed too
            raise SourceError(self.scrub(str(error))) from None
