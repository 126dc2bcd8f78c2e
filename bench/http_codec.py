"""The HTTP layer's per-record work, checkout A against checkout B, interleaved.

JSON produce parses a body, checks and encodes every record (`parse_records`,
`encode_records`); JSON consume decodes stored batches and renders every record
(`render_batch`) into one `orjson` answer; binary produce validates a batch
(`validate_batch`). Those are the only per-record Python steps between the socket
and Raft, so a change to them shows here first, without the noise of three nodes
sharing two cores. Each round runs A then B (then B then A), each in its own
process importing its own checkout, so every moment of the machine falls on both.

    .venv/bin/python bench/http_codec.py --a CHECKOUT [--b CHECKOUT] [--rounds 6]

Prints per step the median records/s of A and B and the ratio B/A.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]

# Runs inside one checkout: prints {"step": records_per_s, ...} for one round.
_ROUND = r'''
import json, sys, time
sys.path.insert(0, sys.argv[1])
import orjson
from multiraft.http.records import encode_records, parse_records, render_batch
from storage.batch import validate_batch

RECORDS = 10_000
body = json.dumps({"records": [{"key": f"user-{i}", "value": {"id": i, "name": "n" * 20, "tags": ["a", "b"],
                                                             "nested": {"x": i % 7, "y": [1, 2, 3]}}}
                               for i in range(RECORDS)]}).encode()

def best(step, repeat=5):
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        step()
        times.append(time.perf_counter() - started)
    return RECORDS / min(times)

def produce():
    document = json.loads(body)
    encode_records(parse_records(document["records"], "json", RECORDS))

batch = encode_records(parse_records(json.loads(body)["records"], "json", RECORDS))

def consume():
    out = []
    render_batch(0, batch, "json", out, RECORDS)
    orjson.dumps({"records": out})

def validate():
    validate_batch(batch)

print(json.dumps({"json produce (parse+encode)": best(produce), "json consume (render)": best(consume),
                  "binary produce (validate)": best(validate)}))
'''


def _round(checkout: Path) -> dict[str, float]:
    answer = subprocess.run([sys.executable, "-c", _ROUND, str(checkout)], capture_output=True, text=True,
                            timeout=300, check=True, cwd="/")
    return json.loads(answer.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--a", type=Path, required=True, help="baseline checkout")
    parser.add_argument("--b", type=Path, default=HERE, help="checkout under test (default: this one)")
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    figures: dict[str, dict[str, list[float]]] = {"A": {}, "B": {}}
    for i in range(args.rounds):
        order = (("A", args.a), ("B", args.b)) if i % 2 == 0 else (("B", args.b), ("A", args.a))
        for name, checkout in order:
            for step, rate in _round(checkout.resolve()).items():
                figures[name].setdefault(step, []).append(rate)
    print(f"http_codec: A={args.a} B={args.b}, {args.rounds} interleaved rounds, medians (records/s)")
    for step in figures["A"]:
        a, b = statistics.median(figures["A"][step]), statistics.median(figures["B"][step])
        print(f"  {step:28s} A {a:12,.0f}   B {b:12,.0f}   B/A {b / a:5.3f}")


if __name__ == "__main__":
    main()
