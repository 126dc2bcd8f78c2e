"""Goal (issue 21, "Done means"): a hostile-client run against a real 3-node cluster.

Three `raftlog serve` processes hold a topic of known content. Then more than fifteen
kinds of hostile traffic are sent to them, each the way a careless or malicious
client would: the poisons of the issue (deep JSON, inflating batches, unsigned node
admissions, cross-site posts, NaN configs, records hidden in batches, oversized
forwarded reads) and others (lying batches, rebound host names, lone surrogates,
raft-port junk, a connection flood, a trickled header, a long-poll on a topic deleted
under it). Every answer must be a 4xx in the one error shape (never a 5xx), and
afterwards:
- no node's event loop was held past 100 ms while the probes ran (the nodes' own
  `raftlog_event_loop_lag_seconds` histograms, read before and after: the sampler
  wakes every PERIOD_S (25 ms), so a stall of S shows as a lag of at least
  S - PERIOD_S, and lags above 100 ms - PERIOD_S (75 ms) are counted), the probe
  that creates and deletes a topic included;
- no election was caused (every group's term and election count unchanged, over a
  non-empty set of series);
- every partition on every node holds exactly what it held before (the committed
  batches each replica serves, byte for byte).
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import re
import struct
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from multiraft.cli.launcher import LocalCluster
from multiraft.runtime.histograms import BUCKETS
from multiraft.runtime.loop_lag import PERIOD_S
from multiraft.transport.transport_config import TransportConfig
from storage.batch import Record, encode_batch
from tests.free_ports import process_cluster
from tests.integration.conftest import BATCH, call, create_topic
from tests.storage.helpers import max_compressed

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

RAFT_PORT = 17700
HTTP_PORT = 18700
HOSTS = ["127.0.0.1", "127.0.0.2", "127.0.0.3"]
TOPIC = "precious"
PARTITIONS = 3
JSON = {"Content-Type": "application/json"}
STALL_S = 0.1
# A stall of STALL_S shows as a lag above this bucket bound whenever it starts in the sampler's sleep.
STALL_BUCKET_S = round(STALL_S - PERIOD_S, 6)
assert STALL_BUCKET_S in BUCKETS
# Partition 0 holds more than a raft frame (16 MiB + 64 KiB), so a forwarded read of all of it
# could only be answered if the leader caps it (partition_ops.FORWARDED_READ_BYTES_MAX).
WIDE_BATCHES, WIDE_RECORDS, WIDE_RECORD_BYTES = 3, 7, 1_000_000
FRAME_BYTES_MAX = TransportConfig().frame_bytes_max
assert WIDE_BATCHES * WIDE_RECORDS * WIDE_RECORD_BYTES > FRAME_BYTES_MAX


@pytest.fixture(scope="module")
def hostile_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    directory: Path = tmp_path_factory.mktemp("hostile")
    with process_cluster(directory, HOSTS, RAFT_PORT, HTTP_PORT, "the hostile-client test") as local:
        yield local




def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def _empties(size: int) -> bytes:
    return b"[" + b",".join([b"[]"] * (size // 3)) + b"]"


# ------------------------------------------------------------------ what the cluster holds


async def _holdings(session: aiohttp.ClientSession, cluster: LocalCluster) -> dict[tuple[str, int], str]:
    """Per node and partition, a digest of the committed batches that replica serves."""
    held = {}
    for node in cluster.nodes:
        for partition in range(PARTITIONS):
            digest, offset = hashlib.sha256(), 0
            while True:
                status, body = await call(session, node.http_addr, "GET",
                                          f"/v1/topics/{TOPIC}/partitions/{partition}/records",
                                          params={"offset": offset, "wait_ms": 0}, headers={"Accept": BATCH})
                assert status == 200, body
                if not body:
                    break
                position = 0
                while position < len(body):
                    base, size = struct.unpack_from(">qI", body, position)
                    batch = body[position + 12 : position + 12 + size]
                    digest.update(body[position : position + 12 + size])
                    position += 12 + size
                    offset = base + struct.unpack_from(">I", batch, 6)[0]  # after its last record
            held[(node.http_addr, partition)] = f"{offset}:{digest.hexdigest()}"
    return held


_SAMPLE = re.compile(r'^(raftlog_\w+?)(\{[^}]*\})? ([0-9.e+-]+|NaN|\+Inf)$')


async def _metrics(session: aiohttp.ClientSession, cluster: LocalCluster) -> dict[str, dict[str, float]]:
    out = {}
    for node in cluster.nodes:
        status, text = await call(session, node.http_addr, "GET", "/metrics")
        assert status == 200
        samples = {}
        for line in text.decode().splitlines():
            match = _SAMPLE.match(line)
            if match:
                samples[match.group(1) + (match.group(2) or "")] = float(match.group(3))
        out[node.http_addr] = samples
    return out


def _stalls(samples: dict[str, float]) -> float:
    """Loop-lag observations that may be a stall past STALL_S (see STALL_BUCKET_S)."""
    return samples["raftlog_event_loop_lag_seconds_count"] - samples[
        f'raftlog_event_loop_lag_seconds_bucket{{le="{STALL_BUCKET_S}"}}']


def _elections(samples: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in samples.items()
            if k.startswith(("raftlog_group_term{", "raftlog_group_elections_total{", "raftlog_group_elections{"))}


# ------------------------------------------------------------------ the probes

Probe = Callable[[aiohttp.ClientSession, LocalCluster], Awaitable[None]]
PROBES: dict[str, Probe] = {}


def probe(name: str) -> Callable[[Probe], Probe]:
    def register(function: Probe) -> Probe:
        PROBES[name] = function
        return function
    return register


async def _refused(session: aiohttp.ClientSession, server: str, method: str, path: str, status: int,
                   code: str, **kwargs: Any) -> None:
    got, body = await call(session, server, method, path, **kwargs)
    assert isinstance(body, dict) and (got, body.get("error_code")) == (status, code), (got, body)
    assert set(body) >= {"error_code", "message"}


def _records(partition: int = 0) -> str:
    return f"/v1/topics/{TOPIC}/partitions/{partition}/records"


@probe("a JSON value nested 300 deep")
async def _deep_value(session: aiohttp.ClientSession, cluster: LocalCluster) -> None:
    await _refused(session, cluster.http_addresses[0], "POST", _records(), 400, "INVALID_REQUEST",
                   data=f'{{"records":[{{"value":{_nested(300)}}}]}}', headers=JSON)


@probe("a body nested 100,000 deep")
async def _deep_body(session: aiohttp.ClientSession, cluster: LocalCluster) -> None:
    await _refused(session, cluster.http_addresses[1], "POST", "/v1/topics", 400, "INVALID_REQUEST",
                   data=_nested(100_000), headers=JSON)


@probe("16 KB of zlib declaring 980,000 records")
async def _inflating(session: aiohttp.ClientSession, cluster: LocalCluster) -> None:
    await _refused(session, cluster.http_addresses[2], "POST", _records(1), 400, "INVALID_BATCH",
                   data=max_compressed([Record(None, None)] * 980_000), headers={"Content-Type": BATCH})


@probe("a 2 MiB record inside a binary batch")
async def _big_record(session: aiohttp.ClientSession, cluster: LocalCluster) -> None:
    batch = encode_batch([Record(None, b"x" * (2 << 20))], first_timestamp_ms=1)
    await _refused(session, cluster.http_addresses[0], "POST", _records(2), 400, "INVALID_BATCH",
                   data=io.BytesIO(batch), headers={"Content-Type": BATCH})


@probe("a batch with a flipped byte, and one whose lengths lie")
async def _lying_batches(session: aiohttp.ClientSession, cluster: LocalCluster) -> None:
    good = encode_batch([Record(b"k", b"v")] * 3, first_timestamp_ms=1)
    flipped = good[:-2] + bytes([good[-2] ^ 0x55]) + good[-1:]
    lying = bytearray(good)
    struct.pack_into(">I", lying, 6, 2)  # record count 2 of 3
    for data in (flipped, bytes(lying), good[:20], b"\x00" * 64):
        await _refused(session, cluster.http_addresses[1], "POST", _records(0), 400, "INVALID_BATCH",
                       data=data, headers={"Content-Type": BATCH})


@probe("an unsigned node admission moving node 2")
async def _hijack(session: aiohttp.ClientSession, cluster: LocalCluster) -> None:
    await _refused(session, cluster.http_addresses[0], "POST", "/v1/admin/nodes", 403, "NOT_AUTHORIZED",
                   json={"node_id": 2, "raft_addr": "127.0.0.9:1", "http_addr": "127.0.0.9:2"})
    await _refused(session, cluster.http_addresses[0], "POST", "/v1/admin/nodes", 403, "NOT_AUTHORIZED",
                   json={"node_id": 99, "raft_addr": "127.0.0.9:1", "http_addr": "127.0.0.9:2"})


@probe("a cross-site text/plain and form POST")
async def _csrf(session: aiohttp.ClientSession, cluster: LocalCluster) -> None:
    for content_type in ("text/plain", "application/x-www-form-urlencoded"):
        await _refused(session, cluster.http_addresses[2], "POST", "/v1/topics", 415, "UNSUPPORTED_MEDIA_TYPE",
                       data='{"name": "csrf-made"}', headers={"Content-Type": content_type})


@probe("a foreign Origin")
async def _origin(session: aiohttp.ClientSession, cluster: LocalCluster) -> None:
    await _refused(session, cluster.http_addresses[0], "POST", _records(), 403, "FORBIDDEN_ORIGIN",
                   json={"records": [{"value": 1}]}, headers={"Origin": "https://evil.example"})


@probe("a rebound Host name")
async def _rebinding(session: aiohttp.ClientSession, cluster: LocalCluster) -> None:
    await _refused(session, cluster.http_addresses[1], "DELETE", f"/v1/topics/{TOPIC}", 403, "FORBIDDEN_HOST",
                   headers={"Host": "evil.example"})


@probe("NaN and unknown keys in a topic's config")
async def _configs(session: aiohttp.ClientSession, cluster: LocalCluster) -> None:
    await _refused(session, cluster.http_addresses[2], "PATCH", f"/v1/topics/{TOPIC}", 400, "INVALID_REQUEST",
                   data='{"config":{"retention_ms":NaN}}', headers=JSON)
    await _refused(session, cluster.http_addresses[2], "PATCH", f"/v1/topics/{TOPIC}", 400, "INVALID_CONFIG",
                   json={"config": {"retention.ms": 1}})


@probe("lone surrogates in a key and a header name")
async def _surrogates(session: aiohttp.ClientSession, cluster: LocalCluster) -> None:
    for record in ({"key": "\ud800", "value": 1}, {"value": 1, "headers": [{"name": "\udfff", "value": "v"}]}):
        await _refused(session, cluster.http_addresses[0], "POST", f"/v1/topics/{TOPIC}/records", 400,
                       "INVALID_REQUEST", data=json.dumps({"records": [record]}), headers=JSON)


@probe("a 64 MiB uncommitted read, forwarded from followers, of a partition larger than a frame")
async def _wide_forward(session: aiohttp.ClientSession, cluster: LocalCluster) -> None:
    sizes = []
    for server in cluster.http_addresses:  # two of the three are followers of partition 0
        status, body = await call(session, server, "GET", _records(0), headers={"Accept": BATCH},
                                  params={"offset": 0, "isolation": "uncommitted", "max_bytes": 64 << 20})
        assert status == 200 and body, body[:200]
        sizes.append(len(body))
    assert max(sizes) > FRAME_BYTES_MAX and min(sizes) < FRAME_BYTES_MAX, sizes  # the leader's and a forward


@probe("15 MiB of empty arrays as a topic creation")
async def _empties_create(session: aiohttp.ClientSession, cluster: LocalCluster) -> None:
    await _refused(session, cluster.http_addresses[0], "POST", "/v1/topics", 413, "REQUEST_TOO_LARGE",
                   data=io.BytesIO(_empties(15 << 20)), headers=JSON)


@probe("15 MiB of empty arrays as 10,000 records of a produce")
async def _empties_produce(session: aiohttp.ClientSession, cluster: LocalCluster) -> None:
    body = b'{"records":[' + b",".join([b'{"value":' + _empties(1570) + b"}"] * 10_000) + b"]}"
    for path in (_records(2), f"/v1/topics/{TOPIC}/records"):
        await _refused(session, cluster.http_addresses[1], "POST", path, 413, "REQUEST_TOO_LARGE",
                       data=io.BytesIO(body), headers=JSON)


@probe("impossible reads: offsets, sizes, partitions, formats")
async def _bad_reads(session: aiohttp.ClientSession, cluster: LocalCluster) -> None:
    server = cluster.http_addresses[1]
    await _refused(session, server, "GET", _records(0), 400, "INVALID_REQUEST", params={"offset": "-1"})
    await _refused(session, server, "GET", _records(0), 400, "INVALID_REQUEST", params={"offset": 0, "max_bytes": 0})
    await _refused(session, server, "GET", _records(0), 400, "INVALID_REQUEST", params={"offset": 2**70})
    await _refused(session, server, "GET", _records(99), 404, "UNKNOWN_TOPIC", params={"offset": 0})
    await _refused(session, server, "GET", _records(0), 400, "INVALID_REQUEST", params={"offset": 0, "format": "x"})


@probe("offset commits beyond the high watermark and to nowhere")
async def _commits(session: aiohttp.ClientSession, cluster: LocalCluster) -> None:
    server = cluster.http_addresses[2]
    got, body = await call(session, server, "POST", "/v1/groups/g/offsets",
                           json={"offsets": [{"topic": TOPIC, "partition": 0, "offset": 2**40}]})
    assert 400 <= got < 500, body
    await _refused(session, server, "POST", "/v1/groups/g/offsets", 404, "UNKNOWN_TOPIC",
                   json={"offsets": [{"topic": "nowhere", "partition": 0, "offset": 0}]})


@probe("an invented producer id, and a delete of a group nobody has")
async def _invented_ids(session: aiohttp.ClientSession, cluster: LocalCluster) -> None:
    await _refused(session, cluster.http_addresses[0], "POST", _records(1), 400, "UNKNOWN_PRODUCER_ID",
                   json={"records": [{"value": 1}], "producer_id": 2**62, "producer_epoch": 0, "base_sequence": 0})
    await _refused(session, cluster.http_addresses[1], "DELETE", "/v1/groups/nobody-has-it", 404, "UNKNOWN_GROUP")


@probe("junk and a stalled handshake on the raft port")
async def _raft_junk(session: aiohttp.ClientSession, cluster: LocalCluster) -> None:
    host = HOSTS[0]
    writers = []
    for junk in (b"GET / HTTP/1.1\r\n\r\n", b"\xff" * 4096, b"\x00\x00\x00\x10" + b"A" * 16, b""):
        reader, writer = await asyncio.open_connection(host, RAFT_PORT)
        writer.write(junk)
        await writer.drain()
        writers.append((reader, writer))
    for reader, writer in writers:
        async with asyncio.timeout(15):  # the handshake deadline (5 s) closes even the silent one
            while await reader.read(4096):
                pass
        writer.close()


@probe("a flood of 300 connections to one node")
async def _flood(session: aiohttp.ClientSession, cluster: LocalCluster) -> None:
    host = HOSTS[1]
    opened = []
    for _ in range(300):
        try:
            opened.append(await asyncio.open_connection(host, HTTP_PORT))
        except OSError:
            break
    for _, writer in opened:
        writer.close()
    status, _ = await call(session, cluster.http_addresses[1], "GET", "/v1/health")
    assert status == 200


@probe("a long-poll on a topic deleted under it")
async def _vanishing(session: aiohttp.ClientSession, cluster: LocalCluster) -> None:
    await create_topic(session, cluster, "vanishing", 1)
    polls = [asyncio.create_task(call(session, server, "GET", "/v1/topics/vanishing/partitions/0/records",
                                      params={"offset": 0, "wait_ms": 20_000}))
             for server in cluster.http_addresses]
    await asyncio.sleep(0.3)
    status, _ = await call(session, cluster.http_addresses[0], "DELETE", "/v1/topics/vanishing")
    assert status == 204
    for status, body in await asyncio.gather(*polls):
        assert status in (200, 404), body


@probe("a request line and headers trickled without end")
async def _slowloris(session: aiohttp.ClientSession, cluster: LocalCluster) -> None:
    reader, writer = await asyncio.open_connection(HOSTS[2], HTTP_PORT)
    writer.write(b"GET /v1/health HTTP/1.1\r\nHost: localhost\r\n")
    started = time.monotonic()
    try:
        async with asyncio.timeout(20):
            while True:
                writer.write(b"X-Drip: 1\r\n")
                await writer.drain()
                if reader.at_eof() or await _closed(reader):
                    break
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()
    assert time.monotonic() - started < 15, "the header deadline (10 s) dropped the client"


async def _closed(reader: asyncio.StreamReader) -> bool:
    try:
        async with asyncio.timeout(1):
            return await reader.read(1) == b""
    except TimeoutError:
        return False


# ------------------------------------------------------------------ the run


async def _settled(session: aiohttp.ClientSession,
                   cluster: LocalCluster) -> tuple[dict[tuple[str, int], str], dict[str, dict[str, float]]]:
    """What the cluster holds once it is quiet: the same holdings and terms twice, 2 s apart
    (every replica applied the last write; leadership balancing after creation is over)."""
    deadline = time.monotonic() + 60
    previous = None
    while True:
        held, metrics = await _holdings(session, cluster), await _metrics(session, cluster)
        terms = {server: _elections(samples) for server, samples in metrics.items()}
        if previous == (held, terms):
            return held, metrics
        assert time.monotonic() < deadline, "the cluster did not settle within 60 s"
        previous = (held, terms)
        await asyncio.sleep(2)


async def test_hostile_clients_lose_nothing_and_stall_no_node(hostile_cluster: LocalCluster) -> None:
    cluster = hostile_cluster
    assert len(PROBES) >= 15
    async with aiohttp.ClientSession() as session:
        await create_topic(session, cluster, TOPIC, PARTITIONS)
        for partition in range(PARTITIONS):
            records = [{"key": f"k{i}", "value": {"n": i, "tags": ["a", "b"]}} for i in range(100)]
            status, body = await call(session, cluster.http_addresses[partition], "POST", _records(partition),
                                      json={"records": records})
            assert status == 200, body
            batch = encode_batch([Record(b"b%d" % i, b"v" * 50) for i in range(100)], first_timestamp_ms=1)
            status, body = await call(session, cluster.http_addresses[0], "POST", _records(partition), data=batch,
                                      headers={"Content-Type": BATCH})
            assert status == 200, body
        for _ in range(WIDE_BATCHES):
            batch = encode_batch([Record(None, b"w" * WIDE_RECORD_BYTES)] * WIDE_RECORDS, first_timestamp_ms=1)
            status, body = await call(session, cluster.http_addresses[0], "POST", _records(0),
                                      data=io.BytesIO(batch), headers={"Content-Type": BATCH})
            assert status == 200, body
        before, metrics_before = await _settled(session, cluster)

        slowloris = asyncio.create_task(PROBES["a request line and headers trickled without end"](session, cluster))
        failures = {}
        for name, run in PROBES.items():
            if run is _slowloris:
                continue
            try:
                await run(session, cluster)
            except AssertionError as error:
                failures[name] = str(error)[:500]
        await slowloris

        metrics_after = await _metrics(session, cluster)
        after = await _holdings(session, cluster)
    lag = {server: (metrics_after[server]["raftlog_event_loop_lag_seconds_count"]
                    - metrics_before[server]["raftlog_event_loop_lag_seconds_count"]) for server in metrics_after}
    print(f"\nhostile: {len(PROBES)} kinds of hostile traffic; loop-lag samples during them {lag}; "
          f"{len(_elections(metrics_after[cluster.http_addresses[0]]))} term/election series compared; "
          f"holdings {sorted(set(before.values()))}")
    assert not failures, json.dumps(failures, indent=1)
    assert after == before, "a replica's committed log changed"
    for server in cluster.http_addresses:
        assert len(_elections(metrics_before[server])) >= PARTITIONS, f"{server}: no term series to compare"
        stalls = _stalls(metrics_after[server]) - _stalls(metrics_before[server])
        assert stalls == 0, (f"{server}: the event loop was late by more than {STALL_BUCKET_S * 1000:.0f} ms "
                             f"{stalls:.0f} times (a stall may have passed {STALL_S * 1000:.0f} ms)")
        elections_before, elections_after = _elections(metrics_before[server]), _elections(metrics_after[server])
        changed = {k: (elections_before.get(k), v) for k, v in elections_after.items()
                   if k in elections_before and elections_before[k] != v}
        assert not changed, f"{server}: elections or terms moved: {changed}"
