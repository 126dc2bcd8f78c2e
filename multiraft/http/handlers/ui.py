"""GET /ui: the cluster page, one self-contained HTML page to open in a browser.

Rendered on the server from the views the JSON API answers with
(multiraft/http/view.py), so it says what `GET /v1/cluster` and `GET /v1/topics/{t}`
say on this node: leaders, ISR and offsets as this node knows them. No script and
no external assets (it works on a machine without internet); the browser reloads
it every few seconds. Every value is HTML-escaped (a rack name is free text), and
the page lists at most `PARTITION_ROWS_MAX` partitions, saying how many it left out.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from html import escape
from typing import Any

from aiohttp import web

from multiraft.http.handlers.common import node_of
from multiraft.http.view import cluster_view, topic_view

PARTITION_ROWS_MAX = 2_000
REFRESH_S = 5

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: left; }
th { background: #f2f2f2; }
.bad { color: #b00; font-weight: bold; }
.muted { color: #777; }
"""


def _cell(value: Any) -> str:
    if value is None:
        return '<td class="muted">-</td>'
    if isinstance(value, list | tuple):
        value = ", ".join(str(v) for v in value)
    return f"<td>{escape(str(value))}</td>"


def _table(headers: Sequence[str], rows: Iterable[str]) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    return f"<table><tr>{head}</tr>{''.join(rows)}</table>"


def _partition_row(partition: dict[str, Any]) -> str:
    isr, replicas = partition.get("isr"), partition.get("replicas") or []
    under = isr is not None and len(isr) < len(replicas)
    isr_cell = f'<td class="bad">{escape(", ".join(map(str, isr)))} (under-replicated)</td>' if under else _cell(isr)
    leader = partition.get("leader")
    leader_cell = '<td class="bad">none</td>' if leader is None else _cell(leader)
    return ("<tr>" + _cell(partition["partition"]) + leader_cell + _cell(replicas) + isr_cell
            + _cell(partition.get("high_watermark")) + _cell(partition.get("log_end_offset"))
            + _cell(partition.get("role")) + "</tr>")


def render_page(cluster: dict[str, Any], topics: Sequence[dict[str, Any]], omitted: int = 0) -> str:
    """The page for this node's `cluster_view` and the `topic_view`s to show."""
    nodes = _table(
        ["node", "raft address", "HTTP address", "rack", "status"],
        ("<tr>" + _cell(n["node_id"]) + _cell(n["raft_addr"]) + _cell(n["http_addr"]) + _cell(n["rack"])
         + (_cell(n["status"]) if n["status"] == "alive" else f'<td class="bad">{escape(n["status"])}</td>')
         + "</tr>" for n in cluster["nodes"]),
    )
    sections = []
    for topic in topics:
        config = ", ".join(f"{k}={v}" for k, v in sorted(topic["config"].items())) or "defaults"
        sections.append(
            f"<h3>{escape(topic['name'])}</h3><p class=\"muted\">replication factor "
            f"{escape(str(topic['replication_factor']))}; config {escape(config)}</p>"
            + _table(["partition", "leader", "replicas", "ISR", "high watermark", "log end", "role here"],
                     (_partition_row(p) for p in topic["partitions"]))
        )
    if not topics:
        sections.append('<p class="muted">No topics yet.</p>')
    if omitted:
        sections.append(f'<p class="muted">{omitted} more partitions not shown (GET /v1/topics/{{topic}} has '
                        "them all).</p>")
    leader = cluster["metadata_leader"]
    leader_html = escape(str(leader)) if leader is not None else '<span class="bad">none</span>'
    return (
        "<!DOCTYPE html><html><head><meta charset=\"utf-8\">"
        f"<meta http-equiv=\"refresh\" content=\"{REFRESH_S}\"><title>raftlog node {cluster['node_id']}</title>"
        f"<style>{_STYLE}</style></head><body>"
        f"<h1>raftlog cluster, as node {cluster['node_id']} sees it</h1>"
        f"<p>metadata leader: {leader_html}"
        f"; term {cluster['term']}; commit index {cluster['commit_index']}. Leaders, ISR and offsets are this "
        "node's view; the ISR is known where the partition leader is.</p>"
        f"<h2>Nodes</h2>{nodes}<h2>Topics</h2>{''.join(sections)}</body></html>"
    )


async def page(request: web.Request) -> web.Response:
    node = node_of(request)
    shown: list[dict[str, Any]] = []
    rows = omitted = 0
    for _, topic in sorted(node.catalog.topics.items()):
        if rows + len(topic.partitions) > PARTITION_ROWS_MAX:
            omitted += len(topic.partitions)
            continue
        rows += len(topic.partitions)
        shown.append(topic_view(node, topic))
    return web.Response(text=render_page(cluster_view(node), shown, omitted), content_type="text/html")
