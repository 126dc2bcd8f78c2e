"""The cluster page's rendering (multiraft/http/handlers/ui.py), apart from a node."""

from __future__ import annotations


def test_the_cluster_page_escapes_what_it_shows_and_flags_trouble() -> None:
    # Goal: free text (a rack) cannot inject markup; a dead node, a partition without a
    # leader and an ISR short of its replicas are marked; omitted partitions are counted.
    from multiraft.http.handlers.ui import render_page

    cluster = {"node_id": 1, "metadata_leader": None, "term": 3, "commit_index": 9, "nodes": [
        {"node_id": 1, "raft_addr": "h:1", "http_addr": "h:2", "rack": "<script>x</script>", "status": "dead"}]}
    topic = {"name": "t", "replication_factor": 3, "config": {}, "partitions": [
        {"partition": 0, "leader": None, "replicas": [1, 2, 3], "isr": None},
        {"partition": 1, "leader": 2, "replicas": [1, 2, 3], "isr": [2, 3], "role": "leader"}]}
    page = render_page(cluster, [topic], omitted=7)
    assert "<script>" not in page and "&lt;script&gt;x&lt;/script&gt;" in page
    assert '<td class="bad">dead</td>' in page and '<td class="bad">none</td>' in page
    assert '<td class="bad">2, 3 (under-replicated)</td>' in page
    assert "metadata leader: <span class=\"bad\">none</span>" in page and "7 more partitions" in page
