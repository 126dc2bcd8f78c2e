"""Prometheus metrics read from the node at scrape time (DESIGN.md section 10).

A custom collector, not counters updated on the hot path: every figure here is
already kept by the node (core positions, ISR, store offsets, transport
counters), so a scrape reads them and the produce path does no metric work.
Each app gets its own registry, so several nodes can share one process (tests).
Durations (replicate, apply, fsync) are node-wide histograms the runtime fills
(multiraft/runtime/histograms.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from multiraft.http.connections import ConnectionGate
from multiraft.http.connections import Refusal as HttpRefusal
from multiraft.node.api import TransportRefusal, TransportStats
from raftlog.messages import Role

if TYPE_CHECKING:
    from multiraft.node.api import NodeApi, ScrubCounts

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_ROLES = {Role.FOLLOWER: 0, Role.PRE_CANDIDATE: 1, Role.CANDIDATE: 2, Role.LEADER: 3}


class NodeCollector(Collector):
    def __init__(self, node: NodeApi) -> None:
        self.node = node

    def collect(self) -> Iterator[Metric]:
        yield from self._groups()
        yield from self._node()
        yield from self._latencies()
        yield from self._mirrors()

    def _mirrors(self) -> Iterator[Metric]:
        """The mirror partitions this node pulls (docs/mirror.md): lag, bytes and records
        copied while it led them, and how many pulls are in each state."""
        labels = ["link", "topic", "partition"]
        lag = GaugeMetricFamily("raftlog_mirror_lag_records", "source high watermark minus the mirror's position "
                                "(at the last read of the source)", labels=labels)
        copied = CounterMetricFamily("raftlog_mirror_bytes_copied", "batch bytes this node appended to the mirror",
                                     labels=labels)
        records = CounterMetricFamily("raftlog_mirror_records_copied", "records this node appended to the mirror",
                                      labels=labels)
        states: dict[str, int] = {}
        for pull in self.node.mirror_pulls():
            values = [pull["link"], pull["topic"], str(pull["partition"])]
            if pull["lag_records"] is not None:
                lag.add_metric(values, pull["lag_records"])
            copied.add_metric(values, pull["bytes_copied"])
            records.add_metric(values, pull["records_copied"])
            states[pull["state"]] = states.get(pull["state"], 0) + 1
        pulls = GaugeMetricFamily("raftlog_mirror_partitions", "mirror partitions pulled here, by state",
                                  labels=["state"])
        for state, count in sorted(states.items()):
            pulls.add_metric([state], count)
        resyncs = CounterMetricFamily("raftlog_mirror_truncated_resyncs", "mirror partitions this node replaced "
                                      "by a new incarnation because the source's retention deleted offsets they "
                                      "had not copied (on_source_truncated: resync)", labels=["link"])
        for link, count in self.node.mirror_truncated_resyncs().items():
            resyncs.add_metric([link], count)
        yield from (lag, copied, records, pulls, resyncs)
        yield from self._mirror_verifies()

    def _mirror_verifies(self) -> Iterator[Metric]:
        """The full syncs this node ran as a mirror partition's sink leader (docs/mirror.md
        "Full sync"), by link (and verdict): bounded by the links, never per partition."""
        verifies = CounterMetricFamily("raftlog_mirror_verifies", "mirror partitions this node compared with "
                                       "their source, by verdict", labels=["link", "verdict"])
        labels = ["link"]
        ranges = CounterMetricFamily("raftlog_mirror_verify_differing_ranges", "differing offset ranges "
                                     "(leaves) the full syncs found", labels=labels)
        digests = CounterMetricFamily("raftlog_mirror_verify_digests_fetched", "tree digests fetched from the "
                                      "source (one root per span of identical copies)", labels=labels)
        spans = CounterMetricFamily("raftlog_mirror_verify_spans", "trees compared (each a span of at most "
                                    "65,536 leaves)", labels=labels)
        hashed = CounterMetricFamily("raftlog_mirror_verify_bytes_hashed", "stored batch bytes this node hashed "
                                     "into its own trees for full syncs", labels=labels)
        resyncs = CounterMetricFamily("raftlog_mirror_resyncs_started", "mirror partitions the full syncs "
                                      "replaced by a new incarnation (a resync)", labels=labels)
        seconds = HistogramMetricFamily("raftlog_mirror_verify_seconds", "one mirror partition's verify, "
                                        "from its start to its verdict", labels=labels)
        for link, counts in self.node.mirror_verify_counts().items():
            for verdict, count in counts.verifies.items():
                verifies.add_metric([link, verdict], count)
            ranges.add_metric([link], counts.differing_ranges)
            digests.add_metric([link], counts.digests_fetched)
            spans.add_metric([link], counts.spans)
            hashed.add_metric([link], counts.bytes_hashed)
            resyncs.add_metric([link], counts.resyncs_started)
            seconds.add_metric([link], counts.seconds.cumulative(), counts.seconds.total)
        yield from (verifies, ranges, digests, spans, hashed, resyncs, seconds)

    def _groups(self) -> Iterator[Metric]:
        node = self.node
        labels = ["group_id", "topic", "partition"]
        families = {
            "role": GaugeMetricFamily("raftlog_group_role", "0 follower, 1 pre-candidate, 2 candidate, 3 leader",
                                      labels=labels),
            "term": GaugeMetricFamily("raftlog_group_term", "Raft term", labels=labels),
            "commit": GaugeMetricFamily("raftlog_group_commit_index", "commit index", labels=labels),
            "applied": GaugeMetricFamily("raftlog_group_applied_index", "applied index", labels=labels),
            "last": GaugeMetricFamily("raftlog_group_last_index", "last log index", labels=labels),
            "isr": GaugeMetricFamily("raftlog_group_isr_size", "in-sync replicas (leader only)", labels=labels),
            "under": GaugeMetricFamily("raftlog_group_under_replicated", "1 if ISR < voters (leader only)",
                                       labels=labels),
            "hwm": GaugeMetricFamily("raftlog_partition_high_watermark", "high watermark", labels=labels),
            "leo": GaugeMetricFamily("raftlog_partition_log_end_offset", "log end offset", labels=labels),
            "shed": CounterMetricFamily("raftlog_group_messages_shed", "inbox messages shed", labels=labels),
            "refused": CounterMetricFamily("raftlog_group_appends_refused",
                                           "appends dropped for holding an invalid batch", labels=labels),
            "lag": GaugeMetricFamily("raftlog_group_follower_lag_entries",
                                     "entries the furthest-behind follower lacks (leader only)", labels=labels),
            "lag_time": GaugeMetricFamily("raftlog_group_follower_lag_seconds",
                                          "time since the furthest-behind follower was last caught up "
                                          "(leader only; tick granularity)", labels=labels),
            "elections": CounterMetricFamily("raftlog_group_elections", "times this replica stood for election",
                                             labels=labels),
            "changes": CounterMetricFamily("raftlog_group_leader_changes", "times this replica saw a new leader",
                                           labels=labels),
        }
        for status in node.group_statuses():
            group_id = status.group_id
            offsets = node.partition_status(group_id)
            values = [str(group_id), offsets.topic if offsets else "", str(offsets.partition) if offsets else ""]
            families["role"].add_metric(values, _ROLES.get(status.role, 0))
            families["term"].add_metric(values, status.term)
            families["commit"].add_metric(values, status.commit_index)
            families["applied"].add_metric(values, status.applied_index)
            families["last"].add_metric(values, status.last_index)
            families["shed"].add_metric(values, status.messages_shed)
            families["refused"].add_metric(values, status.appends_refused)
            families["elections"].add_metric(values, status.elections)
            families["changes"].add_metric(values, status.leader_changes)
            if status.in_sync is not None:
                isr = status.in_sync & status.voters
                families["isr"].add_metric(values, len(isr))
                families["under"].add_metric(values, int(len(isr) < len(status.voters)))
                families["lag"].add_metric(values, status.follower_lag_entries or 0)
                families["lag_time"].add_metric(values, (status.follower_lag_ticks or 0) * node.config.tick_ms / 1000)
            if offsets is not None:
                families["hwm"].add_metric(values, offsets.high_watermark)
                families["leo"].add_metric(values, offsets.log_end_offset)
        yield from families.values()

    def _latencies(self) -> Iterator[Metric]:
        for name, histogram, help_text in (
            ("raftlog_fsync_seconds", self.node.latencies.fsync, "one group-commit flush: segment fsyncs + state write"),
            ("raftlog_replicate_seconds", self.node.latencies.replicate, "leader: proposal to applied (committed)"),
            ("raftlog_apply_seconds", self.node.latencies.apply, "applying one batch of committed entries"),
            ("raftlog_event_loop_lag_seconds", self.node.latencies.loop_lag,
             "how late the event loop ran a timer due now (a request or task holding the loop)"),
        ):
            yield HistogramMetricFamily(name, help_text, buckets=histogram.cumulative(), sum_value=histogram.total)

    def _node(self) -> Iterator[Metric]:
        node = self.node
        statuses = node.group_statuses()
        yield GaugeMetricFamily("raftlog_node_groups", "Raft groups hosted", value=len(statuses))
        leaders = sum(1 for status in statuses if status.role is Role.LEADER)
        yield GaugeMetricFamily("raftlog_node_leaders", "groups this node leads", value=leaders)
        yield GaugeMetricFamily("raftlog_node_topics", "topics in the catalog", value=len(node.catalog.topics))
        yield GaugeMetricFamily("raftlog_quiesced_groups", "idle groups that stopped ticking",
                                value=node.quiesced_groups())
        yield CounterMetricFamily("raftlog_peer_silences", "peers silent long enough to wake quiet groups",
                                  value=node.peer_silences)
        yield CounterMetricFamily("raftlog_groups_back_to_quiet", "groups a peer's silence woke for nothing",
                                  value=node.groups_back_to_quiet)
        sent, dropped, queued = node.move_throttle_counts  # copies being made (move_throttle.py)
        yield CounterMetricFamily("raftlog_move_throttle_sent_bytes", "bytes sent to learners through the throttle",
                                  value=sent)
        yield CounterMetricFamily("raftlog_move_throttle_dropped", "appends to learners dropped past the queue's bounds",
                                  value=dropped)
        yield GaugeMetricFamily("raftlog_move_throttle_queued", "appends to learners waiting for the rate",
                                value=queued)
        scrub = node.scrub_counts  # the scrubber's verifies led here (docs/mirror.md)
        yield CounterMetricFamily("raftlog_scrub_partitions_verified", "partitions whose replicas this node verified",
                                  value=scrub.partitions_verified)
        yield CounterMetricFamily("raftlog_scrub_differing_ranges", "differing offset ranges the scrubber found",
                                  value=scrub.ranges_found)
        yield CounterMetricFamily("raftlog_scrub_repairs_started", "replica repairs the scrubber started",
                                  value=scrub.repairs_started)
        yield CounterMetricFamily("raftlog_scrub_bytes_hashed", "stored batch bytes hashed into tictac trees here",
                                  value=scrub.bytes_hashed)
        yield from _scheduled_scrubs(scrub)
        sidecars = scrub.sidecars  # closed segments' tree sidecars (docs/mirror.md "Incremental trees")
        for name, what in (("written", "tree sidecars written (after a build, and by the warmer)"),
                           ("write_failures", "tree sidecar writes that failed (the segment is read instead)"),
                           ("writes_dropped", "tree sidecars computed by builds and not written: the queue was full"),
                           ("warmer_bytes_hashed", "closed segment bytes the sidecar warmer read and hashed"),
                           ("segments_from_sidecars", "closed segments tree builds took from their sidecars"),
                           ("ignored", "tree sidecars there that did not match their segment (it was read)"),
                           ("mismatched", "deep builds: sidecars whose stamp matched and bytes did not")):
            yield CounterMetricFamily(f"raftlog_tree_sidecar_{name}", what, value=getattr(sidecars, name))
        catchup = node.catchup_counts  # far-horizon catch-up (multiraft/node/catchup_leader.py)
        for name, what in (("started", "far-horizon transfers this node's leaders started"),
                           ("installed", "far-horizon transfers from this node its followers installed"),
                           ("failed", "far-horizon transfers from this node that failed or timed out"),
                           ("bytes_sent", "segment bytes this node's leaders sent to far followers"),
                           ("streams", "far-horizon transfers from this node whose files went by a side connection (dialled)"),
                           ("streams_failed", "of which the stream broke (the next offers to that follower go by chunks)"),
                           ("follower_installed", "far-horizon installs this node's replicas made"),
                           ("follower_failed", "far-horizon installs this node's replicas gave up"),
                           ("bytes_received", "segment bytes this node's replicas fetched from leaders"),
                           ("bytes_reused", "segment bytes this node's replicas had already and kept")):
            yield CounterMetricFamily(f"raftlog_far_catchup_{name}", what, value=catchup.get(name, 0))
        stats = node.transport_stats()
        for name in ("frames_in", "bytes_in", "frames_out", "bytes_out", "heartbeats_shed", "frames_shed",
                     "connects", "connect_failures", "protocol_errors"):
            yield CounterMetricFamily(f"raftlog_transport_{name}", f"transport {name.replace('_', ' ')}",
                                      value=getattr(stats, name))
        for name in ("connections_inbound", "connections_outbound"):
            yield GaugeMetricFamily(f"raftlog_transport_{name}", f"transport {name.replace('_', ' ')}",
                                    value=getattr(stats, name))
        yield from _transport_connections(stats)


def _scheduled_scrubs(scrub: ScrubCounts) -> Iterator[Metric]:
    """Scheduled scrubs led here (docs/mirror.md "Scheduled scrubs"): by verdict, never by
    partition, so the series are bounded at any partition count."""
    scheduled = scrub.scheduled
    verdicts = CounterMetricFamily("raftlog_scrub_scheduled_verifies", "scheduled scrubs this node led, by verdict",
                                   labels=["verdict"])
    for verdict, count in scheduled.verdicts.items():
        verdicts.add_metric([verdict], count)
    yield verdicts
    yield CounterMetricFamily("raftlog_scrub_scheduled_skipped", "scheduled scrubs led here cut short by a leadership "
                              "change, reopen or retention, nothing compared (not a verdict)", value=scheduled.skipped)
    yield CounterMetricFamily("raftlog_scrub_scheduled_differing_ranges",
                              "differing offset ranges scheduled scrubs led here found", value=scheduled.differing_ranges)
    yield CounterMetricFamily("raftlog_scrub_scheduled_repairs_started",
                              "replica repairs scheduled scrubs led here started", value=scheduled.repairs_started)
    yield CounterMetricFamily("raftlog_scrub_scheduled_seconds", "time spent in scheduled scrubs led here",
                              value=scheduled.seconds)
    yield CounterMetricFamily("raftlog_scrub_scheduled_bytes_hashed",
                              "bytes read within the scrub byte rate here: scheduled scrubs led and served",
                              value=scrub.paced_bytes_hashed)
    yield GaugeMetricFamily("raftlog_scrub_scheduled_partitions", "partitions led here with a scrub due time",
                            value=scrub.scheduled_partitions)


def _transport_connections(stats: TransportStats) -> Iterator[Metric]:
    """The raft port's defences against hostile connections (docs/transport.md)."""
    yield GaugeMetricFamily("raftlog_transport_handshakes_pending",
                            "inbound raft connections admitted and not yet authenticated",
                            value=stats.handshakes_pending)
    yield CounterMetricFamily("raftlog_transport_handshakes_refused",
                              "inbound raft handshakes that failed (timeouts included)",
                              value=stats.handshakes_refused)
    yield CounterMetricFamily("raftlog_transport_handshake_timeouts",
                              "inbound raft connections closed for not finishing the handshake in time",
                              value=stats.handshake_timeouts)
    yield CounterMetricFamily("raftlog_transport_tls_handshakes_refused",
                              "inbound raft TLS handshakes that failed: not TLS, no client certificate "
                              "or one the CA did not sign (timeouts apart)",
                              value=stats.tls_handshakes_refused)
    refused = CounterMetricFamily("raftlog_transport_inbound_refused",
                                  "inbound raft connections closed at once, by the bound they hit",
                                  labels=["reason"])
    for reason in TransportRefusal:
        refused.add_metric([reason.value], stats.inbound_refused_by_reason.get(reason, 0))
    yield refused


class ConnectionsCollector(Collector):
    """The HTTP port's connections (multiraft/http/server.py): open, and those refused
    or dropped on a deadline. Registered by the server, which owns the gate."""

    def __init__(self, gate: ConnectionGate) -> None:
        self.gate = gate

    def collect(self) -> Iterator[Metric]:
        stats = self.gate.stats()
        yield GaugeMetricFamily("raftlog_http_connections", "open HTTP connections", value=stats.open)
        refused = CounterMetricFamily("raftlog_http_connections_refused",
                                      "HTTP connections closed at once, by the bound they hit",
                                      labels=["reason"])
        for reason in HttpRefusal:
            refused.add_metric([reason.value], stats.refused_by_reason.get(reason, 0))
        yield refused
        yield CounterMetricFamily("raftlog_http_header_timeouts",
                                  "HTTP connections dropped for not sending a request's headers in time",
                                  value=stats.header_timeouts)
        yield CounterMetricFamily("raftlog_http_write_timeouts",
                                  "HTTP connections dropped because the client stopped reading its answer",
                                  value=stats.write_timeouts)
        yield CounterMetricFamily("raftlog_http_tls_handshakes_failed",
                                  "HTTPS connections closed because their TLS handshake failed (timeouts "
                                  "included): plain HTTP on the TLS port, a client that refused the certificate",
                                  value=stats.tls_handshakes_failed)
        yield CounterMetricFamily("raftlog_http_tls_handshake_timeouts",
                                  "HTTPS connections closed for not finishing the TLS handshake in time",
                                  value=stats.tls_handshake_timeouts)


def node_registry(node: NodeApi) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(NodeCollector(node))
    return registry


def render(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)
