"""How long one large JSON body holds a node's event loop (issue 21, hostile input).

One node with its HTTP server runs in one process (the checkout given); a second
thread of that process sends one large body, blocking on its socket, while the
loop's own sampler wakes every millisecond and records how late it woke, and a
tiny request (`GET /v1/topics/t`) is timed every 5 ms on the same loop. Per body:
the answer's status, its wall time, the longest loop stall and the slowest tiny
request. Each body is sent five times; the medians are printed, and the worst stall.
The same records as binary batches show what the node's produce path costs without
JSON. The box's other load shows as stalls too: compare rows of one run.

    flock /tmp/raftlog-scale.lock .venv/bin/python bench/json_bodies.py [--checkout PATH]

The bodies: 15 MiB of `[]` as a topic creation and as a produce (10,000 records
whose values are arrays of `[]`), 250,000 values in one record (the most a produce
may hold), 10,000 keyed records with small object values (~1.3 MiB) and 10,000
records of 1.5 KiB strings (~15 MiB).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]

_RUN = r'''
import asyncio, http.client, json, secrets, socket, statistics, sys, tempfile, threading, time
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from multiraft.http import HttpServer
from multiraft.node.config import Address, NodeConfig
from multiraft.node.node import Node
from raftlog.types import NodeId

MiB = 1 << 20
ROUNDS = 5

def port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]

def empties(size: int) -> str:
    return "[" + ",".join(["[]"] * (size // 3)) + "]"

BODIES = {
    "create, 15 MiB of []": ("/v1/topics", empties(15 * MiB)),
    "produce, 15 MiB of [] in 10,000 records": (
        "/v1/topics/t/partitions/0/records",
        '{"records":[' + ",".join(['{"value":' + empties(1570) + "}"] * 10_000) + "]}"),
    "produce, 124,000 [] in one record (at the bound)": (
        "/v1/topics/t/partitions/0/records", '{"records":[{"value":' + empties(3 * 124_000) + "}]}"),
    "produce, 10,000 small records (legit)": ("/v1/topics/t/partitions/0/records", json.dumps({"records": [
        {"key": f"user-{i}", "value": {"id": i, "name": "n" * 20, "tags": ["a", "b"],
                                       "nested": {"x": i % 7, "y": [1, 2, 3]}}} for i in range(10_000)]})),
    "produce, 10,000 records of 1.5 KiB strings (legit)": ("/v1/topics/t/partitions/0/records", json.dumps(
        {"records": [{"value": "v" * 1500} for _ in range(10_000)]})),
}
# The same small records as one binary batch: what the node's produce path costs without JSON.
from multiraft.http.records import encode_records, parse_records
def binary(name: str) -> tuple[str, bytes]:
    records = json.loads(BODIES[name][1])["records"]
    return "/v1/topics/t/partitions/0/records", encode_records(parse_records(records, "json", 10_000))

BINARY = {"binary batch of the 10,000 small records": binary("produce, 10,000 small records (legit)"),
          "binary batch of the 1.5 KiB strings": binary("produce, 10,000 records of 1.5 KiB strings (legit)")}

def send(http_port: int, path: str, body: bytes, out: dict) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", http_port, timeout=120)
    started = time.perf_counter()
    kind = "application/json" if body[:1] in b"[{" else "application/vnd.raftlog.batch"
    connection.request("POST", path, body=body, headers={"Content-Type": kind})
    answer = connection.getresponse()
    answer.read()
    out["status"], out["seconds"] = answer.status, time.perf_counter() - started
    connection.close()

async def main() -> None:
    data = Path(tempfile.mkdtemp(prefix="json-bodies-"))
    raft = Address("127.0.0.1", port())
    config = NodeConfig(node_id=NodeId(1), data_dir=data, raft_addr=raft, http_addr=Address("127.0.0.1", port()),
                        initial_cluster={NodeId(1): raft}, cluster_secret=secrets.token_urlsafe(33).encode())
    node = Node(config)
    server = HttpServer(node.api, "127.0.0.1", config.http_addr.port)
    await node.start()
    await server.start()
    import aiohttp
    async with aiohttp.ClientSession() as session:
        base = f"http://127.0.0.1:{config.http_addr.port}"
        while True:
            async with session.post(base + "/v1/topics", json={"name": "t", "partitions": 1,
                                                              "replication_factor": 1}) as answer:
                if answer.status in (201, 409):
                    break
            await asyncio.sleep(0.1)
        while True:
            async with session.post(base + "/v1/topics/t/partitions/0/records",
                                    json={"records": [{"value": 1}]}) as answer:
                if answer.status == 200:
                    break
            await asyncio.sleep(0.1)
        results = {}
        for name, (path, text) in {**BODIES, **BINARY}.items():
            body = text.encode() if isinstance(text, str) else text
            runs = []
            for _ in range(ROUNDS):
                out: dict = {}
                thread = threading.Thread(target=send, args=(config.http_addr.port, path, body, out))
                clock = asyncio.get_running_loop().time
                stall = tiny = 0.0
                thread.start()
                last_tiny = clock()
                while thread.is_alive():
                    due = clock() + 0.001
                    await asyncio.sleep(0.001)
                    stall = max(stall, clock() - due)
                    if clock() - last_tiny > 0.005:
                        began = clock()
                        async with session.get(base + "/v1/topics/t") as answer:
                            await answer.read()
                        tiny = max(tiny, clock() - began)
                        last_tiny = clock()
                thread.join()
                runs.append({"status": out["status"], "seconds": out["seconds"], "stall_ms": stall * 1000,
                             "tiny_ms": tiny * 1000})
            results[name] = {"bytes": len(body), "status": runs[0]["status"],
                             **{k: statistics.median(r[k] for r in runs) for k in ("seconds", "stall_ms", "tiny_ms")},
                             "stall_ms_max": max(r["stall_ms"] for r in runs)}
    await server.stop()
    await node.stop()
    print(json.dumps(results))

asyncio.run(main())
'''


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkout", default=str(HERE), help="the checkout whose node serves (default: this one)")
    args = parser.parse_args()
    output = subprocess.run([sys.executable, "-c", _RUN, args.checkout], check=True, capture_output=True,
                            text=True, cwd=args.checkout).stdout
    results = json.loads(output.strip().splitlines()[-1])
    print(f"{'body':52} {'bytes':>10} {'status':>6} {'answer s':>9} {'stall ms':>9} {'(max)':>6} {'tiny ms':>8}")
    for name, row in results.items():
        print(f"{name:52} {row['bytes']:>10,} {row['status']:>6} {row['seconds']:>9.3f} {row['stall_ms']:>9.1f} "
              f"{row['stall_ms_max']:>6.1f} {row['tiny_ms']:>8.1f}")


if __name__ == "__main__":
    main()
