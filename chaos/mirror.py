"""`--mirror`: a second cluster mirrors the workload's topics, under faults of its own.

Mirrors (docs/mirror.md) copy a *source* cluster's topic into a *sink* cluster with the
same offsets and bytes; each mirror partition's pull position is replicated state of
the sink. With this option the runner:

- starts a sink cluster of SINK_NODES nodes on 127.0.0.<SINK_FIRST_HOST..> inside its
  own network namespace (the source keeps 127.0.0.1..N), node labels `s1#1`, logs
  `sink-node<i>.log`;
- creates the link LINK on the sink for every workload topic (PATTERN) once the topics
  exist, and waits until the mirror topics are discovered and have leaders;
- adds fault kinds to the nemesis (`MIRROR_KINDS`): `sink-kill` and `sink-pause` (one
  sink node, or the sink leader of a mirror partition; restarted / resumed at the heal),
  `link-cut` (firewall rules between the two clusters' address sets: both ways, one way,
  or one sink node cut from the source; needs the `partition` mechanism) and
  `link-pause` (`POST .../pause`, `.../resume` at the heal), and, from
  chaos/mirror_follow.py, `source-grow` (a source topic's partition increase the mirror
  must follow) and `source-truncate` (the source's retention deleting past a second
  link's mirror, which must resync);
- samples the link's status (`GET /v1/admin/mirrors/{name}`, every SAMPLE_INTERVAL_S
  from a serving sink node) for every partition's position, state and pulling node;
- after the final reads: waits (CATCH_UP_S at most) until every mirror partition reaches
  the source's end, reads both logs whole through the `/log` route, checks them
  (chaos/mirror_checks.py), then promotes MIRROR_PROMOTED and writes one record to its
  partition 0, which must land at the mirror's end.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from chaos.cluster import ChaosCluster, copy_logs
from chaos.history import PartitionKey
from chaos.mirror_checks import LogCopy, PositionSample, check_mirror
from chaos.mirror_filtered import LINK as FILTER_LINK
from chaos.mirror_filtered import Filtered
from chaos.mirror_follow import KINDS as FOLLOW_KINDS
from chaos.mirror_follow import RESYNC_LINK, Follow
from chaos.mirror_reads import read_pair
from chaos.stopping import sleep_or_stop
from chaos.workload import CLIENT_HOST
from multiraft.client import AsyncClient, RaftlogError

SINK_NODES = 3
SINK_FIRST_HOST = 11  # sink node i on 127.0.0.<10 + i>: clear of the source's 1..5 and the client's 100
LINK = "chaos-link"
PATTERN = "chaos-*"
MIRROR_PROMOTED = "chaos-a"
MIRROR_KINDS = ("sink-kill", "sink-pause", "link-cut", "link-pause", *FOLLOW_KINDS)
SAMPLE_INTERVAL_S = 0.5
CATCH_UP_S = 60.0
DISCOVERY_S = 60.0
PROMOTE_S = 30.0

Healer = Callable[[], Awaitable[None]]


class MirrorRun:
    def __init__(self, out: Path, node_env: Callable[[int], dict[str, str]], rng: random.Random,
                 network: Any, started: float) -> None:
        """`network`: the injectors' `chaos.netfaults.Network` (None: no `link-cut`)."""
        self.out = out
        self.sink = ChaosCluster(out / "sink-data", SINK_NODES, node_env, first_host=SINK_FIRST_HOST, name="s")
        self.rng = rng
        self.network = network
        self.started = started
        self.samples: list[PositionSample] = []
        self.diverged: dict[PartitionKey, str] = {}
        self.sample_errors = 0
        # The source's partition increase and truncation (chaos/mirror_follow.py).
        self.follow = Follow(self.sink, random.Random(rng.random()), self._client,
                             lambda link, action: self._action(action, link))
        # A third link, with a record filter (chaos/mirror_filtered.py).
        self.filtered = Filtered(self.sink, random.Random(rng.random()))
        self.kinds: dict[str, Callable[[], Awaitable[tuple[str, Healer]]]] = {
            "sink-kill": self._sink_kill, "sink-pause": self._sink_pause, "link-pause": self._link_pause,
            "source-grow": self.follow.grow, "source-truncate": self.follow.truncate}
        if network is not None:
            self.kinds["link-cut"] = self._link_cut
        self.source: ChaosCluster | None = None
        self.keys: list[PartitionKey] = []

    def _client(self, attempts: int = 3, timeout_s: float = 5.0) -> AsyncClient:
        return AsyncClient([self.sink.http(n) for n in self.sink.ids], timeout_s=timeout_s, attempts=attempts,
                           local_host=CLIENT_HOST)

    # -- set-up -----------------------------------------------------------------

    async def start(self, source: ChaosCluster, keys: list[PartitionKey]) -> None:
        """Start the sink, create the link, wait until every mirror partition has a leader."""
        self.source, self.keys = source, keys
        await asyncio.to_thread(self.sink.start_all, 90.0)
        await self.follow.create_topics(source, min(3, len(source.ids)))
        await self.filtered.create_topic(source, min(3, len(source.ids)))
        async with self._client(attempts=20, timeout_s=30) as client:
            await client.create_mirror(LINK, [source.http(n) for n in source.ids], PATTERN, priority="high")
            await self.follow.create_link(client)
            await self.filtered.create_link(client)
            deadline = time.monotonic() + DISCOVERY_S
            for key in [*keys, *self.follow.keys, *self.filtered.keys]:
                while True:
                    try:
                        await client.consume(key.topic, key.partition, 0, max_records=1)
                        break
                    except RaftlogError:
                        if time.monotonic() > deadline:
                            raise
                        await asyncio.sleep(0.2)

    # -- positions ----------------------------------------------------------------

    async def sample(self, stop: asyncio.Event) -> None:
        """The link's status every SAMPLE_INTERVAL_S until `stop`: each partition's position.
        From the client's address (127.0.0.100), so link cuts never hide the sink from it."""
        async with self._client(attempts=1, timeout_s=4.0) as client:
            while not stop.is_set():
                await sleep_or_stop(stop, SAMPLE_INTERVAL_S)
                serving = self.sink.serving()
                if not serving:
                    continue
                node = self.rng.choice(serving)
                for link in (LINK, RESYNC_LINK, FILTER_LINK):
                    before = dict(self.sink.incarnation)
                    try:
                        _, body, _ = await client.request("GET", f"/v1/admin/mirrors/{link}",
                                                          server=self.sink.http(node))
                        status = json.loads(body)
                    except (RaftlogError, OSError, ValueError):
                        self.sample_errors += 1
                        continue
                    self._record(status, before, time.monotonic() - self.started)

    def _record(self, status: dict[str, Any], before: dict[int, int], at_s: float) -> None:
        for topic in status.get("topics", []):
            for pull in topic["partitions"]:
                puller = pull.get("node")
                if puller is None or "position" not in pull or before.get(puller) != self.sink.incarnation[puller]:
                    continue  # not pulled now, or its node restarted meanwhile: whose was it?
                key = PartitionKey(topic["topic"], int(pull["partition"]))
                self.samples.append(PositionSample(at_s, self.sink.label(puller), key, str(pull["state"]),
                                                   int(pull["position"])))
                if pull["state"] == "diverged":
                    self.diverged.setdefault(key, str(pull.get("last_error")))

    # -- faults -------------------------------------------------------------------

    async def _sink_target(self) -> tuple[str, int]:
        alive = self.sink.serving() or self.sink.ids
        if self.rng.random() < 0.5:
            key = self.rng.choice([*self.keys, *self.filtered.keys])
            leader = await asyncio.to_thread(self.sink.leader_of, key.topic, key.partition)
            if leader:
                return f"sink leader of {key}", leader
        return "one", self.rng.choice(alive)

    async def _sink_kill(self) -> tuple[str, Healer]:
        how, node = await self._sink_target()
        self.sink.kill(node)

        async def restart() -> None:
            if node in self.sink.down:
                self.sink.start(node)
        return f"{how}: s{node}", restart

    async def _sink_pause(self) -> tuple[str, Healer]:
        how, node = await self._sink_target()
        self.sink.pause(node)

        async def resume() -> None:
            self.sink.resume(node)
        return f"{how}: s{node}", resume

    async def _link_cut(self) -> tuple[str, Healer]:
        assert self.source is not None
        sources = [self.source.host(n) for n in self.source.ids]
        sinks = [self.sink.host(n) for n in self.sink.ids]
        how = self.rng.choice(["both ways", "sink -> source", "source -> sink", "one sink node"])
        if how == "both ways":
            fault = self.network.split(sources, sinks)
        elif how == "one sink node":
            node = self.rng.choice(self.sink.ids)
            how = f"s{node} from the source"
            fault = self.network.split(sources, [self.sink.host(node)])
        else:
            pairs = [(a, b) for a in sinks for b in sources] if how == "sink -> source" else \
                [(b, a) for a in sinks for b in sources]
            fault = self.network.block(pairs, f"link {how} dropped")

        async def undo() -> None:
            self.network.undo(fault)
        return how, undo

    async def _link_pause(self) -> tuple[str, Healer]:
        """The workload's link and the filtered one, paused together."""
        answer = await self._action("pause")
        filtered = await self._action("pause", FILTER_LINK)

        async def resume() -> None:
            await self._action("resume")
            await self._action("resume", FILTER_LINK)
        return f"links paused ({LINK}: {answer}, {FILTER_LINK}: {filtered})", resume

    async def _action(self, action: str, link: str = LINK) -> str:
        try:
            async with self._client(attempts=10) as client:
                await client.mirror_action(link, action)
            return "ok"
        except RaftlogError as error:
            return f"{error.code}"

    async def heal(self) -> None:
        """Every sink node serving, the link running (the network is the injectors' to heal)."""
        for node in list(self.sink.paused):
            self.sink.resume(node)
        for node in list(self.sink.down):
            self.sink.start(node)
        await asyncio.to_thread(self.sink.wait_healthy, 90.0)
        await self.follow.heal()
        for link in (LINK, FILTER_LINK):
            for _ in range(10):
                if await self._action("resume", link) == "ok":
                    break
                await asyncio.sleep(1.0)

    # -- the end ------------------------------------------------------------------

    async def finish(self, source: ChaosCluster, source_ends: dict[PartitionKey, int]) -> dict[str, Any]:
        """Wait for the mirror, read both sides, check, promote. `source_ends`: the source's
        high watermark the final read confirmed per partition (its log ends there or later)."""
        began = time.monotonic()
        deadline = began + CATCH_UP_S
        sources = [source.http(n) for n in source.ids]
        sinks = [self.sink.http(n) for n in self.sink.ids]
        sink_logs: dict[PartitionKey, LogCopy | None] = {}
        async with AsyncClient(sources, timeout_s=10, attempts=1, local_host=CLIENT_HOST) as source_client, \
                AsyncClient(sinks, timeout_s=10, attempts=1, local_host=CLIENT_HOST) as client:
            source_logs: dict[PartitionKey, LogCopy | None] = {}
            for key in self.keys:
                source_logs[key], sink_logs[key] = await read_pair(source_client, sources, client, sinks, key,
                                                                   source_ends.get(key, 0), deadline)
        waited = time.monotonic() - began
        present = {key: log for key, log in source_logs.items() if log is not None}
        ours = set(self.keys)  # the follow's partitions' positions are judged with their logs
        filtered_keys = set(self.filtered.keys)
        verdicts = check_mirror(present, sink_logs, [s for s in self.samples if s.key in ours],
                                sorted((k, v) for k, v in self.diverged.items() if k not in filtered_keys), waited)
        found, follow = await self.follow.finish([s for s in self.samples
                                                  if s.key not in ours and s.key not in filtered_keys])
        verdicts.anomalies += found
        found, filtered = await self.filtered.finish([s for s in self.samples if s.key in filtered_keys],
                                                     sorted((k, v) for k, v in self.diverged.items()
                                                            if k in filtered_keys))
        verdicts.anomalies += found
        promote = await self._promote(sink_logs.get(PartitionKey(MIRROR_PROMOTED, 0)))
        with open(self.out / "mirror-positions.jsonl", "w") as positions:  # every sample, for forensics
            for sample in self.samples:
                positions.write(json.dumps([round(sample.at_s, 2), sample.node, str(sample.key), sample.state,
                                            sample.position]) + "\n")
        return {"verdicts": verdicts, "promote": promote, "waited_s": round(waited, 1), "follow": follow,
                "filtered": filtered,
                "source_unread": sorted(str(k) for k, log in source_logs.items() if log is None),
                "samples": len(self.samples), "sample_errors": self.sample_errors,
                "ends": {str(k): [None if log is None else log.high_watermark,
                                  None if sink_logs[k] is None else sink_logs[k].high_watermark]  # type: ignore[union-attr]
                         for k, log in source_logs.items()}}

    async def _promote(self, copy: LogCopy | None) -> str:
        """Promote MIRROR_PROMOTED; one write to its partition 0 must land at the mirror's end."""
        if copy is None:
            return "not tried (the mirror of its partition 0 was not read)"
        async with self._client(attempts=10, timeout_s=10) as client:
            try:
                await client.mirror_action(LINK, "promote", MIRROR_PROMOTED)
            except RaftlogError as error:
                return f"FAILED: promote answered {error.code}"
            deadline = time.monotonic() + PROMOTE_S
            last = ""
            while time.monotonic() < deadline:
                try:
                    answer = await client.produce(MIRROR_PROMOTED, [{"value": "after-promote", "partition": 0}])
                except RaftlogError as error:
                    last = error.code
                    await asyncio.sleep(0.2)
                    continue
                offset = int(answer[0]["offset"])
                if offset != copy.high_watermark:
                    return f"FAILED: the first write landed at {offset}, the mirror ended at {copy.high_watermark}"
                return f"{MIRROR_PROMOTED}/0 took a write at offset {offset} (the mirror's end)"
            return f"FAILED: no write taken in {PROMOTE_S:.0f} s (last {last})"

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.sink.stop()
        copy_logs(self.sink, self.out, "sink-")
