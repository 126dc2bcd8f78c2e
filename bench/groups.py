"""Consumer groups on a real 3-node cluster (issue 23): rebalance times and group fetch throughput.

A real 3-node cluster (the local launcher, 127.0.0.1-3, ports 19400/19480 unless told
otherwise), one topic of `--partitions` partitions (12), RF 3, filled with
`--records` 100-byte records per partition. Members run in this process, each a
loop that long-polls its partitions (`POST .../records`, `wait_ms` 100, which keeps
it alive and tells it its assignment) and heartbeats what it owns whenever its
answer is not `stable` (giving back what it must, taking what it may), as a KIP-848
consumer does. Prints:

- rebalance after a member **joins** (3 members, a fourth joins) and after one
  **leaves** gracefully (`DELETE`): the time from the call's answer until every
  partition is in a live member's `assignment` and the group is `stable` (goal
  <= 1 s);
- rebalance after a member is **killed** (its loop stops without a word): from
  the kill until every partition is held by the survivors again, with the
  group's session timeout (`--session-ms`, printed; goal <= session + 1 s);
- group fetch throughput: one member owning every partition reads all the data
  from offset 0 (`max_records` per call over all its partitions), against the plain
  partition read of the same data in the same run (`GET .../partitions/{p}/records`
  from 0, partition after partition, the same `max_records` per call), both JSON
  with base64 values (`format=binary`), both through the group coordinator's node
  (the metadata leader) and both through another node, whose member calls the
  coordinator over the transport first (goal ratio >= 0.8).

Ownership is read from `GET /v1/groups/{group}` every 10 ms (auth is off, so owners
are shown). The box is shared: run it under the scale lock, and repeat (`--rounds`).

    flock /tmp/raftlog-scale.lock .venv/bin/python bench/groups.py [--rounds 3] [--session-ms 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from multiraft.cli.launcher import LocalCluster
from multiraft.client.http import AsyncClient, RaftlogError
from storage.batch import Record, encode_batch

TOPIC = "groups-bench"
RECORD_BYTES = 100
BATCH_RECORDS = 1000
POLL_S = 0.01
WAIT_MS = 100
SETTLE_TIMEOUT_S = 30.0


async def call(client: AsyncClient, method: str, path: str, body: Any = None) -> Any:
    _, raw, _ = await client.request(method, path, json_body=body)
    return json.loads(raw)


@dataclass
class Member:
    """One KIP-848 member in this process (see the module docstring)."""

    client: AsyncClient
    group: str
    session_ms: int
    member_id: str = ""
    epoch: int = 0
    assigned: list[tuple[str, int]] = field(default_factory=list)
    task: asyncio.Task[None] | None = None

    async def join(self) -> None:
        answer = await call(self.client, "POST", f"/v1/groups/{self.group}/members", {
            "topics": [TOPIC], "session_timeout_ms": self.session_ms, "rebalance_timeout_ms": 10_000})
        self._learn(answer)

    def _learn(self, view: dict[str, Any]) -> bool:
        self.member_id, self.epoch = view["member_id"], int(view["member_epoch"])
        self.assigned = [(a["topic"], p) for a in view["assignment"] for p in a["partitions"]]
        return view["state"] != "stable"

    async def run(self) -> None:
        path = f"/v1/groups/{self.group}/members/{self.member_id}"
        while True:
            try:
                answer = await call(self.client, "POST", path + "/records", {
                    "member_epoch": self.epoch, "wait_ms": WAIT_MS, "max_records": 1, "auto_offset_reset": "latest"})
                if self._learn(answer["member"]):
                    owned = [{"topic": TOPIC, "partitions": sorted(p for _, p in self.assigned)}]
                    self._learn(await call(self.client, "POST", path + "/heartbeat", {
                        "member_epoch": self.epoch, "owned": owned}))
            except RaftlogError:
                await asyncio.sleep(0.05)

    def start(self) -> None:
        self.task = asyncio.create_task(self.run())

    async def stop(self) -> None:
        """Stop calling (a killed consumer): no leave."""
        assert self.task is not None
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)

    async def leave(self) -> None:
        await self.stop()
        await self.client.request("DELETE", f"/v1/groups/{self.group}/members/{self.member_id}",
                                  params={"member_epoch": self.epoch})


async def settled(client: AsyncClient, group: str, live: set[str], partitions: int, began: float) -> float:
    """Seconds from `began` until every partition is in a live member's assignment and the group is stable."""
    deadline = began + SETTLE_TIMEOUT_S
    while time.monotonic() < deadline:
        described = await call(client, "GET", f"/v1/groups/{group}")
        owned = {p for m in described["members"] if m["member_id"] in live
                 for a in m["assignment"] for p in a["partitions"]}
        members = {m["member_id"] for m in described["members"]}
        if described["state"] == "stable" and members == live and len(owned) == partitions:
            return time.monotonic() - began
        await asyncio.sleep(POLL_S)
    return float("inf")


async def start_members(client: AsyncClient, group: str, count: int, session_ms: int) -> list[Member]:
    members = [Member(client, group, session_ms) for _ in range(count)]
    for member in members:
        await member.join()
        member.start()
    return members


async def rebalances(client: AsyncClient, round_number: int, partitions: int, session_ms: int) -> dict[str, float]:
    group = f"bench-{round_number}"
    members = await start_members(client, group, 3, session_ms)
    live = {m.member_id for m in members}
    result = {"initial_s": await settled(client, group, live, partitions, time.monotonic())}
    newcomer = Member(client, group, session_ms)
    await newcomer.join()
    began = time.monotonic()
    newcomer.start()
    members.append(newcomer)
    live.add(newcomer.member_id)
    result["join_s"] = await settled(client, group, live, partitions, began)
    leaving = members.pop(0)
    await leaving.leave()
    began = time.monotonic()
    live.discard(leaving.member_id)
    result["leave_s"] = await settled(client, group, live, partitions, began)
    victim = members.pop(0)
    await victim.stop()
    began = time.monotonic()
    live.discard(victim.member_id)
    result["kill_s"] = await settled(client, group, live, partitions, began)
    for member in members:
        await member.leave()
    return result


async def fill(client: AsyncClient, partitions: int, records: int) -> None:
    value = b"x" * RECORD_BYTES
    batch = encode_batch([Record(None, value)] * BATCH_RECORDS, first_timestamp_ms=int(time.time() * 1000))

    async def one(partition: int) -> None:
        for _ in range(records // BATCH_RECORDS):
            await client.produce_batch(TOPIC, partition, batch)

    await asyncio.gather(*(one(p) for p in range(partitions)))


CALLS: dict[str, int] = {"plain": 0, "group": 0}  # read calls made, for records per call


async def plain_read(client: AsyncClient, server: str, partitions: int, max_records: int) -> tuple[int, float]:
    began = time.monotonic()
    total = 0
    for partition in range(partitions):
        offset = 0
        while True:
            answer = await client.consume(TOPIC, partition, offset, max_records=max_records, format="binary",
                                          server=server)
            CALLS["plain"] += 1
            total += len(answer["records"])
            offset = int(answer["next_offset"])
            if offset >= int(answer["high_watermark"]):
                break
    return total, time.monotonic() - began


async def group_read(client: AsyncClient, server: str, partitions: int, max_records: int, session_ms: int,
                     group: str) -> tuple[int, float]:
    """One member owning every partition reads everything from 0 (positions kept by the member)."""
    member = Member(client, group, session_ms)
    await member.join()
    path = f"/v1/groups/{group}/members/{member.member_id}/records"
    positions = {p: 0 for p in range(partitions)}
    ends = {p: -1 for p in range(partitions)}
    total = 0
    began = time.monotonic()
    while any(positions[p] < ends[p] or ends[p] < 0 for p in range(partitions)):
        body = {"member_epoch": member.epoch, "max_records": max_records, "format": "binary",
                "positions": [{"topic": TOPIC, "partition": p, "offset": o} for p, o in positions.items()]}
        _, raw, _ = await client.request("POST", path, json_body=body, server=server)
        CALLS["group"] += 1
        answer = json.loads(raw)
        member._learn(answer["member"])
        total += len(answer["records"])
        for read in answer["positions"]:
            positions[read["partition"]] = int(read["next_offset"])
            ends[read["partition"]] = int(read["high_watermark"])
    elapsed = time.monotonic() - began
    await client.request("DELETE", f"/v1/groups/{group}/members/{member.member_id}",
                         params={"member_epoch": member.epoch})
    return total, elapsed


def _stats(values: list[float]) -> str:
    finite = sorted(v for v in values if v != float("inf"))
    if not finite:
        return "never settled"
    return (f"median {statistics.median(finite) * 1000:.0f} ms, max {finite[-1] * 1000:.0f} ms"
            + (f", {len(values) - len(finite)} never settled" if len(finite) < len(values) else ""))


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--partitions", type=int, default=12)
    parser.add_argument("--records", type=int, default=20_000, help="records per partition")
    parser.add_argument("--max-records", type=int, default=5_000, help="records per read call")
    parser.add_argument("--session-ms", type=int, default=2_000)
    parser.add_argument("--raft-port", type=int, default=19400)
    parser.add_argument("--http-port", type=int, default=19480)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="raftlog-groups-") as directory:
        cluster = LocalCluster(Path(directory), 3, raft_port=args.raft_port, http_port=args.http_port)
        cluster.start()
        try:
            await asyncio.to_thread(cluster.wait_healthy, 60)
            return await measure(cluster, args)
        finally:
            cluster.stop()


async def measure(cluster: LocalCluster, args: argparse.Namespace) -> int:
    async with AsyncClient(cluster.http_addresses, timeout_s=30, attempts=20) as client:
        await client.create_topic(TOPIC, partitions=args.partitions, replication_factor=3)
        began = time.monotonic()
        await fill(client, args.partitions, args.records)
        print(f"filled {args.partitions} partitions x {args.records} records of {RECORD_BYTES} B in "
              f"{time.monotonic() - began:.1f} s; session timeout {args.session_ms} ms", flush=True)
        rounds = []
        for number in range(args.rounds):
            result = await rebalances(client, number, args.partitions, args.session_ms)
            rounds.append(result)
            print("round " + ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in result.items()), flush=True)
        print(f"rebalance after a join: {_stats([r['join_s'] for r in rounds])} (goal <= 1000 ms)")
        print(f"rebalance after a leave: {_stats([r['leave_s'] for r in rounds])} (goal <= 1000 ms)")
        print(f"rebalance after a kill: {_stats([r['kill_s'] for r in rounds])} "
              f"(goal <= session {args.session_ms} + 1000 ms)")
        coordinator = int((await client.cluster())["metadata_leader"])
        ratios: dict[str, list[float]] = {"coordinator": [], "other": []}
        for number in range(args.rounds):
            for where, node in (("coordinator", coordinator), ("other", coordinator % 3 + 1)):
                server = cluster.http_addresses[node - 1]
                CALLS.update(plain=0, group=0)
                plain_records, plain_s = await plain_read(client, server, args.partitions, args.max_records)
                group_records, group_s = await group_read(client, server, args.partitions, args.max_records,
                                                          args.session_ms, f"bench-read-{number}-{where}")
                expected = args.partitions * args.records
                assert plain_records == group_records == expected, (plain_records, group_records)
                plain_rate, group_rate = plain_records / plain_s, group_records / group_s
                ratios[where].append(group_rate / plain_rate)
                print(f"read {plain_records} records through node {node} ({where}): plain {plain_rate:,.0f} rec/s "
                      f"({plain_s:.2f} s), group {group_rate:,.0f} rec/s ({group_s:.2f} s), "
                      f"ratio {ratios[where][-1]:.2f}; records per call: plain {plain_records / CALLS['plain']:,.0f}, "
                      f"group {group_records / CALLS['group']:,.0f}", flush=True)
        for where, values in ratios.items():
            print(f"group fetch / plain read through the {where}'s node: median ratio "
                  f"{statistics.median(values):.2f} (goal >= 0.8)")
        print("groups_result " + json.dumps({"rounds": rounds, "ratios": ratios, "session_ms": args.session_ms}))
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.default_int_handler)
    raise SystemExit(uvloop.run(main()))
