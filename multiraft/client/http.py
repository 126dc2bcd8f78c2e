"""The async HTTP client of a raftlog cluster: one call per endpoint, with retries.

Retries follow the error table: a retriable code (NOT_LEADER, LEADER_NOT_AVAILABLE, PROPOSAL_DROPPED,
NOT_ENOUGH_REPLICAS, ...) or a connection that could not be made is retried on
the next server with backoff, a bounded number of times. An answer cut off after
the request was sent, or one saying OUTCOME_UNKNOWN or TIMEOUT (a forward whose
leader died), is ambiguous: a read or an idempotent produce retries it
(the cluster deduplicates), a plain produce raises `OutcomeUnknownError`,
because retrying could store the records twice. A 421 answer names the leader
(`Raftlog-Leader` header) and the next attempt goes there.

HTTPS: servers given as `https://HOST:PORT`, or any server at all once a CA is
given (`ca_file=`, else $RAFTLOG_CA), as NATS clients turn TLS on with a CA.
Addresses the cluster hands back (leader hints, node addresses) are HOST:PORT and
take the client's scheme. A certificate that does not verify is not retried
(`TLS_VERIFICATION_FAILED`), as Kafka clients treat an SSL handshake failure
as fatal: another attempt would meet the same certificate.
"""

from __future__ import annotations

import asyncio
import json
import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from multiraft.client.connection import (
    CertificateRefused,
    ConnectFailed,
    ConnectionPool,
    ExchangeFailed,
)
from multiraft.client.credentials import check_token, client_context, read_token_file
from multiraft.client.mirrors import MirrorCalls
from multiraft.errors import error_table

BATCH_CONTENT_TYPE = "application/vnd.raftlog.batch"
DEFAULT_SERVER = "127.0.0.1:8080"
_FRAME = struct.Struct(">qI")
_LENGTH = struct.Struct(">I")  # the JSON part of a member's binary fetch


class RaftlogError(Exception):
    """An error answer of the cluster (`code`, `message`, HTTP `status`)."""

    def __init__(self, code: str, message: str, status: int = 0, retriable: bool = False) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.status = status
        self.retriable = retriable


class UnavailableError(RaftlogError):
    """No server could be reached (or every attempt met a retriable error)."""


_AMBIGUOUS_CODES = frozenset({"OUTCOME_UNKNOWN", "TIMEOUT"})


class OutcomeUnknownError(RaftlogError):
    """A produce was sent but its answer was lost: it may or may not be stored."""


@dataclass(frozen=True, slots=True)
class BatchRead:
    """A binary read: stored batches (base offset, bytes) and the read's positions."""

    batches: list[tuple[int, bytes]]
    next_offset: int
    high_watermark: int
    log_start_offset: int


def bearer_token(token: str | None, token_file: str | os.PathLike[str] | None) -> str | None:
    """The token given, else the one in `token_file`, else $RAFTLOG_TOKEN (None or empty:
    no auth). Never a command-line argument: other users see those (`ps`), shells keep them."""
    if token is not None and token_file is not None:
        raise ValueError("give a token or a token file, not both")
    if token_file is not None:
        return read_token_file(Path(token_file))
    where = "token" if token is not None else "$RAFTLOG_TOKEN"
    token = token if token is not None else os.environ.get("RAFTLOG_TOKEN")
    return check_token(token, where) if token else None


def normalize(server: str, scheme: str = "http") -> str:
    """`server` as a base URL: HOST:PORT gets `scheme`; a URL keeps its own."""
    server = server.strip().rstrip("/")
    return server if "://" in server else f"{scheme}://{server}"


def cluster_scheme(servers: Sequence[str], ca_file: str | os.PathLike[str] | None) -> str:
    """"https" when a server says so or a CA is given, else "http"; mixed schemes are refused."""
    schemes = {s.strip().split("://", 1)[0].lower() for s in servers if "://" in s}
    if len(schemes) > 1:
        raise ValueError(f"servers mix schemes ({', '.join(sorted(schemes))}); a cluster serves one")
    if ca_file is not None and schemes == {"http"}:
        raise ValueError("a CA file is given for TLS, but the servers say http://; use https:// or no scheme")
    return "https" if ca_file is not None or schemes == {"https"} else "http"


def parse_frames(payload: bytes) -> list[tuple[int, bytes]]:
    batches, position = [], 0
    while position < len(payload):
        base, size = _FRAME.unpack_from(payload, position)
        position += _FRAME.size
        batches.append((base, payload[position : position + size]))
        position += size
    return batches


class AsyncClient(MirrorCalls):
    """Talks to any node of a cluster. Use as `async with AsyncClient([...]) as client`."""

    def __init__(self, servers: str | Sequence[str] = DEFAULT_SERVER, *, timeout_s: float = 30.0,
                 attempts: int = 8, backoff_s: float = 0.05, backoff_max_s: float = 1.0,
                 local_host: str | None = None, token: str | None = None,
                 token_file: str | os.PathLike[str] | None = None,
                 ca_file: str | os.PathLike[str] | None = None) -> None:
        """`token`: a bearer token for a cluster that requires one; or `token_file`, a file
        holding it (refused when others may read it); by default $RAFTLOG_TOKEN.
        `ca_file`: the CA that signs the cluster's HTTPS certificates (by default
        $RAFTLOG_CA); with one, every server is reached over HTTPS and trusted only if
        that CA signed its certificate. `https://` servers without one: the system's CAs."""
        listed = [s for s in (servers.split(",") if isinstance(servers, str) else list(servers)) if s.strip()]
        if ca_file is None:
            ca_file = os.environ.get("RAFTLOG_CA") or None
        self.scheme = cluster_scheme(listed, ca_file)
        self.servers = [normalize(s, self.scheme) for s in listed]
        if not self.servers:
            raise ValueError("at least one server address is needed")
        assert attempts >= 1 and timeout_s > 0
        self.timeout_s = timeout_s
        self.attempts = attempts
        self.backoff_s = backoff_s
        self.backoff_max_s = backoff_max_s
        self._next = 0
        tls = client_context(Path(ca_file)) if self.scheme == "https" and ca_file is not None else None
        self._pool = ConnectionPool(local_host, tls)  # local_host: the source address fault rules match
        self._table = error_table()
        token = bearer_token(token, token_file)
        self._auth = {"Authorization": f"Bearer {token}"} if token else {}

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._pool.close()

    def _error(self, status: int, body: bytes) -> RaftlogError:
        try:
            decoded = json.loads(body)
            code, message = str(decoded["error_code"]), str(decoded["message"])
        except (ValueError, KeyError, TypeError):
            code, message = f"HTTP_{status}", body[:200].decode("utf-8", "replace")
        retriable = self._table.get(code, (status, status in (502, 503)))[1]
        return RaftlogError(code, message, status, retriable)

    async def request(self, method: str, path: str, *, json_body: Any = None, data: bytes | None = None,
                      params: dict[str, Any] | None = None, headers: dict[str, str] | None = None,
                      ambiguous_retry: bool = True, server: str | None = None) -> tuple[int, bytes, Any]:
        """One call with retries; returns (status, body, response headers)."""
        delay = self.backoff_s
        last: RaftlogError | None = None
        target = normalize(server, self.scheme) if server else None
        for attempt in range(self.attempts):
            base = target or self.servers[(self._next + attempt) % len(self.servers)]
            target = None
            try:
                return await self._once(method, base + path, json_body, data, params, headers)
            except RaftlogError as error:
                # An answer saying the outcome is unknown (a forward whose leader died, a
                # cluster timeout) is as ambiguous as a lost answer: a request that may be
                # repeated (a read, an idempotent produce) goes again, as it would then.
                if not (error.retriable or (ambiguous_retry and error.code in _AMBIGUOUS_CODES)):
                    raise
                last = error
                target = getattr(error, "leader_url", None)
            except CertificateRefused as error:
                raise RaftlogError("TLS_VERIFICATION_FAILED", f"{base}: {error}") from None
            except ConnectFailed as error:
                last = UnavailableError("UNAVAILABLE", f"{base}: {error}", 0, True)
            except (ExchangeFailed, TimeoutError) as error:
                if not ambiguous_retry:
                    raise OutcomeUnknownError("OUTCOME_UNKNOWN", f"{base}: the answer was lost ({error!r}); "
                                              "the request may or may not have been applied") from None
                last = UnavailableError("UNAVAILABLE", f"{base}: {error!r}", 0, True)
            self._next = (self._next + 1) % len(self.servers)
            if attempt + 1 < self.attempts:
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.backoff_max_s)
        assert last is not None
        raise last

    async def _once(self, method: str, url: str, json_body: Any, data: bytes | None,
                    params: dict[str, Any] | None, headers: dict[str, str] | None) -> tuple[int, bytes, Any]:
        query = tuple((k, str(item).lower() if isinstance(item, bool) else str(item))
                      for k, v in (params or {}).items() if v is not None
                      for item in (v if isinstance(v, list | tuple) else (v,)))  # a list: the name repeats
        body = data if data is not None else b""
        if json_body is not None:
            body = json.dumps(json_body).encode()
            headers = {"Content-Type": "application/json", **(headers or {})}
        if self._auth:
            headers = {**self._auth, **(headers or {})}
        response = await self._pool.request(method, url, body=body, query=query, headers=headers,
                                            timeout_s=self.timeout_s)
        if response.status >= 400:
            error = self._error(response.status, response.body)
            leader = response.headers.get("Raftlog-Leader")
            if leader:
                error.leader_url = normalize(leader, self.scheme)  # type: ignore[attr-defined]
            raise error
        return response.status, response.body, response.headers

    async def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        _, body, _ = await self.request(method, path, **kwargs)
        return json.loads(body) if body else None

    # ---- cluster and topics ---------------------------------------------------

    async def health(self, server: str | None = None, ready: str | None = None) -> dict[str, Any]:
        """The node's health; with `ready="cluster"`, its readiness (RaftlogError
        CLUSTER_NOT_READY, naming what is missing, until the cluster is ready)."""
        return await self._json("GET", "/v1/health", server=server, params={"ready": ready})

    async def cluster(self, server: str | None = None) -> dict[str, Any]:
        return await self._json("GET", "/v1/cluster", server=server)

    async def create_topic(self, name: str, partitions: int = 1, replication_factor: int | None = None,
                           config: dict[str, Any] | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {"name": name, "partitions": partitions, "config": config or {}}
        if replication_factor is not None:
            body["replication_factor"] = replication_factor
        # A create whose answer was lost may have happened: a retry then meets TOPIC_EXISTS, which is clear.
        return await self._json("POST", "/v1/topics", json_body=body)

    async def list_topics(self) -> list[dict[str, Any]]:
        return (await self._json("GET", "/v1/topics"))["topics"]

    async def describe_topic(self, name: str, server: str | None = None) -> dict[str, Any]:
        return await self._json("GET", f"/v1/topics/{name}", server=server)

    async def alter_topic_config(self, name: str, changes: dict[str, Any]) -> dict[str, Any]:
        """Set settings, or remove them with a None value; returns the topic."""
        return await self._json("PATCH", f"/v1/topics/{name}", json_body={"config": changes})

    async def delete_topic(self, name: str) -> None:
        await self.request("DELETE", f"/v1/topics/{name}")

    async def balance_leaders(self) -> dict[str, Any]:
        return await self._json("POST", "/v1/admin/leadership/balance")

    async def create_partitions(self, name: str, count: int) -> dict[str, Any]:
        """Grow topic `name` to `count` partitions (the new total; increase only). Keyed
        records may map to other partitions afterwards, as in Kafka. Returns the topic."""
        return await self._json("POST", f"/v1/topics/{name}/partitions", json_body={"count": count})

    async def drain_node(self, node_id: int) -> dict[str, Any]:
        """Move every leadership off `node_id` (for a rolling restart); its drain status."""
        return await self._json("POST", f"/v1/admin/nodes/{int(node_id)}/drain")

    async def undrain_node(self, node_id: int) -> dict[str, Any]:
        """Let `node_id` lead again; its drain status."""
        return await self._json("DELETE", f"/v1/admin/nodes/{int(node_id)}/drain")

    async def promote_node(self, node_id: int, replace: int | None = None) -> dict[str, Any]:
        """Make metadata learner `node_id` a voter (in place of dead voter `replace`)."""
        params = {} if replace is None else {"replace": str(int(replace))}
        return await self._json("POST", f"/v1/admin/nodes/{int(node_id)}/promote", params=params)

    async def cluster_settings(self) -> dict[str, Any]:
        """The run-time cluster settings: per key, this node's value and the cluster's."""
        return await self._json("GET", "/v1/admin/config")

    async def set_cluster_settings(self, settings: dict[str, Any]) -> dict[str, Any]:
        """Set cluster settings (None: back to each node's own); the settings after."""
        return await self._json("PATCH", "/v1/admin/config", json_body=settings)

    async def features(self) -> dict[str, Any]:
        """The cluster's finalized feature level and the level each registered node supports."""
        return await self._json("GET", "/v1/admin/features")

    async def finalize_features(self, level: int | None = None) -> dict[str, Any]:
        """Raise the finalized feature level: to `level`, or the highest every node supports."""
        return await self._json("POST", "/v1/admin/features", json_body={} if level is None else {"level": level})

    async def decommission_node(self, node_id: int) -> dict[str, Any]:
        """Start taking `node_id` out of the cluster (its replicas move away); its status."""
        return await self._json("POST", f"/v1/admin/nodes/{int(node_id)}/decommission")

    async def recommission_node(self, node_id: int) -> dict[str, Any]:
        """Cancel `node_id`'s decommission; its status."""
        return await self._json("DELETE", f"/v1/admin/nodes/{int(node_id)}/decommission")

    async def decommission_status(self, node_id: int) -> dict[str, Any]:
        """How far `node_id`'s decommission got, as the node asked sees it."""
        return await self._json("GET", f"/v1/admin/nodes/{int(node_id)}/decommission")

    async def verify(self, topics: list[str] | None = None, start: int = 0, deep: bool = True) -> dict[str, Any]:
        """One call of the scrubber (admin): up to 16 partitions; go on from `next_start`. `deep` (the
        default) reads every segment again (finds rot); false takes closed segments' tree sidecars (fast).
        Sent only when false: an earlier version refuses fields it does not know, and reads everything."""
        body: dict[str, Any] = {"start": start} if topics is None else {"topics": topics, "start": start}
        if not deep:
            body["deep"] = False
        return await self._json("POST", "/v1/admin/verify", json_body=body)

    # ---- bearer tokens (admin) ----------------------------------------------------

    async def create_token(self, name: str, rights: list[str]) -> dict[str, Any]:
        """A new token (an existing name is replaced); its value is in this answer only.
        Not retried when the answer is lost: a retry would draw yet another token."""
        return await self._json("POST", "/v1/admin/tokens", json_body={"name": name, "rights": rights},
                                ambiguous_retry=False)

    async def list_tokens(self) -> list[dict[str, Any]]:
        return (await self._json("GET", "/v1/admin/tokens"))["tokens"]

    async def delete_token(self, name: str) -> None:
        await self.request("DELETE", f"/v1/admin/tokens/{name}")

    # ---- produce and consume ----------------------------------------------------

    async def produce(self, topic: str, records: list[dict[str, Any]], *, format: str = "json",
                      acks: str = "quorum") -> list[dict[str, Any]]:
        """JSON records, partitioned by the server; offsets in request order. Not retried when ambiguous."""
        answer = await self._json("POST", f"/v1/topics/{topic}/records", ambiguous_retry=False,
                                  json_body={"format": format, "acks": acks, "records": records})
        return answer["offsets"]

    async def produce_batch(self, topic: str, partition: int, batch: bytes, *, acks: str = "quorum",
                            idempotent: bool = False) -> dict[str, Any]:
        """A binary batch to one partition. `idempotent`: the batch carries a producer id, so
        an ambiguous send is retried with the same bytes and the cluster deduplicates."""
        return await self._json("POST", f"/v1/topics/{topic}/partitions/{partition}/records", data=batch,
                                params={"acks": acks}, headers={"Content-Type": BATCH_CONTENT_TYPE},
                                ambiguous_retry=idempotent)

    async def consume(self, topic: str, partition: int, offset: int, *, max_records: int | None = None,
                      max_bytes: int | None = None, wait_ms: int = 0, isolation: str = "committed",
                      format: str = "json", server: str | None = None) -> dict[str, Any]:
        params = {"offset": offset, "max_records": max_records, "max_bytes": max_bytes, "wait_ms": wait_ms,
                  "isolation": isolation, "format": format}
        return await self._json("GET", f"/v1/topics/{topic}/partitions/{partition}/records", params=params,
                                server=server)

    async def consume_batches(self, topic: str, partition: int, offset: int, *, max_records: int | None = None,
                              max_bytes: int | None = None, wait_ms: int = 0, isolation: str = "committed",
                              server: str | None = None) -> BatchRead:
        params = {"offset": offset, "max_records": max_records, "max_bytes": max_bytes, "wait_ms": wait_ms,
                  "isolation": isolation}
        _, body, headers = await self.request(
            "GET", f"/v1/topics/{topic}/partitions/{partition}/records", params=params,
            headers={"Accept": BATCH_CONTENT_TYPE}, server=server)
        return BatchRead(parse_frames(body), int(headers["Raftlog-Next-Offset"]),
                         int(headers["Raftlog-High-Watermark"]), int(headers["Raftlog-Log-Start-Offset"]))

    async def allocate_producer(self) -> tuple[int, int]:
        answer = await self._json("POST", "/v1/producers")
        return int(answer["producer_id"]), int(answer["producer_epoch"])

    async def commit_offsets(self, group: str, offsets: list[dict[str, Any]], *, member_id: str | None = None,
                             member_epoch: int | None = None) -> None:
        """Commits are idempotent (the same offset again changes nothing), so they retry freely.
        A group member names itself (`member_id`, `member_epoch`)."""
        body: dict[str, Any] = {"offsets": offsets}
        if member_id is not None:
            body.update(member_id=member_id, member_epoch=member_epoch)
        await self.request("POST", f"/v1/groups/{group}/offsets", json_body=body)

    # ---- consumer group membership and admin (docs/http.md "Consumer group members") ----

    async def join_group(self, group: str, member_id: str, *, topics: list[str] | None = None,
                         topic_pattern: str | None = None, **settings: Any) -> dict[str, Any]:
        """Join (or join again) as `member_id`, drawn by the caller (KIP-848's client-made
        ids), so a join whose answer was lost retries as the same member, not a second one.
        `settings`: session_timeout_ms, rebalance_timeout_ms, assignor (None: the group's)."""
        body: dict[str, Any] = {"member_id": member_id, **{k: v for k, v in settings.items() if v is not None}}
        if topic_pattern is not None:
            body["topic_pattern"] = topic_pattern
        else:
            body["topics"] = topics
        return await self._json("POST", f"/v1/groups/{group}/members", json_body=body)

    async def group_heartbeat(self, group: str, member_id: str, member_epoch: int,
                              owned: list[dict[str, Any]] | None) -> dict[str, Any]:
        body: dict[str, Any] = {"member_epoch": member_epoch}
        if owned is not None:
            body["owned"] = owned
        return await self._json("POST", f"/v1/groups/{group}/members/{member_id}/heartbeat", json_body=body)

    async def group_fetch(self, group: str, member_id: str, body: dict[str, Any]) -> dict[str, Any]:
        """A member's fetch (positions are in the body, so a retry reads the same records)."""
        return await self._json("POST", f"/v1/groups/{group}/members/{member_id}/records", json_body=body)

    async def group_fetch_batches(self, group: str, member_id: str,
                                  body: dict[str, Any]) -> tuple[dict[str, Any], list[tuple[str, int, int, bytes]]]:
        """A member's fetch answered in binary: the answer's JSON part (member, positions,
        errors) and the stored batches as (topic, partition, base offset, bytes). Batches
        are whole: skip records below each partition's `positions[].offset`."""
        _, payload, _ = await self.request("POST", f"/v1/groups/{group}/members/{member_id}/records",
                                           json_body=body, headers={"Accept": BATCH_CONTENT_TYPE})
        (length,) = _LENGTH.unpack_from(payload)
        header = json.loads(payload[_LENGTH.size:_LENGTH.size + length])
        position = _LENGTH.size + length
        batches = []
        for topic, partition, base, size in header.pop("batches"):
            batches.append((topic, partition, base, payload[position:position + size]))
            position += size
        return header, batches

    async def leave_group(self, group: str, member_id: str, member_epoch: int) -> None:
        """Leave; a member already gone (a retried leave, an expiry) counts as left."""
        try:
            await self.request("DELETE", f"/v1/groups/{group}/members/{member_id}",
                               params={"member_epoch": member_epoch})
        except RaftlogError as error:
            if error.code != "UNKNOWN_MEMBER_ID":
                raise

    async def list_groups(self) -> list[dict[str, Any]]:
        return (await self._json("GET", "/v1/groups"))["groups"]

    async def describe_group(self, group: str, topics: Sequence[str] = ()) -> dict[str, Any]:
        """Members, assignment, committed offsets and lag; `topics` adds those topics' rows
        (and describes a group without members by its offsets there)."""
        return await self._json("GET", f"/v1/groups/{group}", params={"topic": list(topics)})

    async def reset_offsets(self, group: str, strategy: str, topics: list[dict[str, Any]], *,
                            value: int | None = None, execute: bool = False) -> dict[str, Any]:
        """Kafka's --reset-offsets (admin): the plan; written only with `execute`. Retried
        freely: the same reset again writes the same offsets (a shift is recomputed, though)."""
        body: dict[str, Any] = {"strategy": strategy, "topics": topics, "execute": execute}
        if value is not None:
            body["value"] = value
        return await self._json("POST", f"/v1/groups/{group}/offsets/reset", json_body=body,
                                ambiguous_retry=strategy != "shift" or not execute)

    async def fetch_offsets(self, group: str, topic: str) -> dict[int, int]:
        answer = await self._json("GET", f"/v1/groups/{group}/offsets", params={"topic": topic})
        return {int(o["partition"]): int(o["offset"]) for o in answer["offsets"]}

    async def delete_group(self, group: str) -> None:
        """Remove the group's committed offsets everywhere (RaftlogError UNKNOWN_GROUP if none)."""
        await self.request("DELETE", f"/v1/groups/{group}")

    async def node_addresses(self, alive_only: bool = True) -> dict[int, str]:
        """{node id: HTTP address} of the cluster's nodes (only those alive, by default)."""
        cluster = await self.cluster()
        return {int(n["node_id"]): n["http_addr"] for n in cluster["nodes"]
                if n["status"] == "alive" or not alive_only}

    async def partition_views(self, topic: str) -> dict[int, list[dict[str, Any]]]:
        """Every reachable alive node's view of each partition of `topic` (as `describe_topic`
        gives it; views differ: leader, ISR and offsets are each node's own knowledge)."""
        views: dict[int, list[dict[str, Any]]] = {}
        servers = [normalize(a, self.scheme) for a in (await self.node_addresses()).values()]
        for server in servers or self.servers:
            try:
                described = await self.describe_topic(topic, server=server)
            except UnavailableError:
                continue
            for view in described["partitions"]:
                views.setdefault(int(view["partition"]), []).append(view)
        return views

    async def partition_offsets(self, topic: str) -> dict[int, tuple[int, int]]:
        """(log start, high watermark) per partition, from the views of the nodes hosting it."""
        found: dict[int, tuple[int, int]] = {}
        for partition, views in (await self.partition_views(topic)).items():
            hosting = [v for v in views if v["high_watermark"] is not None]
            if hosting:
                found[partition] = (min(v["log_start_offset"] for v in hosting),
                                    max(v["high_watermark"] for v in hosting))
        return found
