"""The run's HTML page: what happened at a glance, as Jepsen's reports do.

Two plots share a time axis with every fault window shaded and labelled by kind:
acknowledged sends per second (and failed/indeterminate ones), and send latency
(median and worst per second). Below them: the summary line, the fault windows,
the anomalies, and links to the history and the node logs.
"""

from __future__ import annotations

import html
import statistics
from pathlib import Path
from typing import Any

from chaos.workload import Stats

COLOURS = {"kill": "#e57373", "pause": "#ffb74d", "partition": "#64b5f6", "loss": "#9575cd",
           "clock": "#4db6ac", "disk-full": "#a1887f", "corrupt": "#f06292"}


def _plot(out: Path, details: dict[str, Any], stats: Stats) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    seconds = range(0, max((s for s, _ in stats.counts), default=0) + 1)
    figure, (rate, latency) = plt.subplots(2, 1, figsize=(11, 6), sharex=True)
    for kind, style in (("send-ok", "-"), ("send-info", ":"), ("send-fail", "--"), ("poll-ok", "-.")):
        rate.plot(list(seconds), [stats.counts.get((s, kind), 0) for s in seconds], style, label=kind)
    rate.set_ylabel("ops / s")
    rate.legend(loc="upper right", fontsize=8)
    medians = [statistics.median(stats.latencies[s]) if s in stats.latencies else float("nan") for s in seconds]
    worst = [max(stats.latencies[s]) if s in stats.latencies else float("nan") for s in seconds]
    latency.plot(list(seconds), medians, label="median")
    latency.plot(list(seconds), worst, label="max")
    latency.set_yscale("log")
    latency.set_ylabel("send latency, ms")
    latency.set_xlabel("seconds since start")
    latency.legend(loc="upper right", fontsize=8)
    for window in details.get("windows", []):
        end = window["end_s"] if window["end_s"] is not None else window["start_s"] + 1
        for axis in (rate, latency):
            axis.axvspan(window["start_s"], end, color=COLOURS.get(window["kind"], "#bdbdbd"), alpha=0.3)
        rate.text(window["start_s"], rate.get_ylim()[1] * 0.95, window["kind"], fontsize=7, rotation=90, va="top")
    figure.tight_layout()
    name = "timeline.png"
    figure.savefig(out / name, dpi=90)
    plt.close(figure)
    return name


def _seconds(value: float | None) -> str:
    return "" if value is None else f"{value:.1f}"


def write_report(out: Path, details: dict[str, Any], stats: Stats) -> Path:
    image = _plot(out, details, stats)
    windows = "".join(
        f"<tr><td>{w['start_s']:.1f}</td><td>{_seconds(w['end_s'])}</td>"
        f"<td>{html.escape(w['kind'])}</td><td>{html.escape(w['detail'])}</td></tr>"
        for w in details.get("windows", []))
    anomalies = (out / "anomalies.txt").read_text() if (out / "anomalies.txt").exists() else ""
    logs = "".join(f'<a href="{p.name}">{p.name}</a> ' for p in sorted(out.glob("node*.log")))
    page = f"""<!doctype html><meta charset="utf-8"><title>raftlog chaos run, seed {details['seed']}</title>
<style>body{{font-family:sans-serif;margin:2em}} td,th{{padding:2px 8px;text-align:left}}
pre{{background:#f5f5f5;padding:1em;white-space:pre-wrap}}</style>
<h1>raftlog chaos run, seed {details['seed']}</h1>
<pre>{html.escape(details.get('summary', ''))}</pre>
{f'<img src="{image}" alt="throughput and latency over time, fault windows shaded">' if image else
 '<p>(matplotlib is not installed: no plots)</p>'}
<h2>Fault windows</h2><table><tr><th>start s</th><th>end s</th><th>kind</th><th>targets</th></tr>{windows}</table>
<h2>Anomalies</h2><pre>{html.escape(anomalies.strip() or 'none')}</pre>
<h2>Files</h2><p><a href="history.jsonl">history.jsonl</a> <a href="details.json">details.json</a> {logs}</p>
"""
    path = out / "index.html"
    path.write_text(page)
    return path
