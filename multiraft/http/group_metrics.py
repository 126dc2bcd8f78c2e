"""Consumer group figures on /metrics, read for each scrape (multiraft/node/group_admin.py).

Unlike the node's own figures (metrics.py, read synchronously from memory), lag in
seconds needs a read of the record at each committed offset, so the scrape handler
awaits `NodeApi.group_metrics()` (bounded) and renders its result through this
collector, registered for that one scrape. Series (docs/http.md "Metrics"):

- `raftlog_consumer_group_members{group}` and `raftlog_consumer_group_state{group,
  state}` (1 for the group's state, 0 for the other), from the metadata leader;
- `raftlog_consumer_group_committed_offset`, `_lag_records` and `_lag_seconds`
  `{group, topic, partition}`, from each partition's leader, at most
  `METRICS_GROUP_PARTITIONS_MAX` series per node;
- `raftlog_consumer_group_series_truncated`: 1 when this node left series out.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from multiraft.node.api import GroupMetrics

GROUP_STATES = ("stable", "reconciling")


class GroupsCollector(Collector):
    def __init__(self, figures: GroupMetrics) -> None:
        self.figures = figures

    def collect(self) -> Iterator[Metric]:
        figures = self.figures
        members = GaugeMetricFamily("raftlog_consumer_group_members", "members of the consumer group "
                                    "(metadata leader only)", labels=["group"])
        state = GaugeMetricFamily("raftlog_consumer_group_state", "1 for the group's state: stable (every member "
                                  "holds its target) or reconciling (metadata leader only)",
                                  labels=["group", "state"])
        for gauge in figures.groups:
            members.add_metric([gauge.group], gauge.members)
            for name in GROUP_STATES:
                state.add_metric([gauge.group, name], int(gauge.state == name))
        labels = ["group", "topic", "partition"]
        committed = GaugeMetricFamily("raftlog_consumer_group_committed_offset",
                                      "the group's committed offset (partition leader only)", labels=labels)
        lag = GaugeMetricFamily("raftlog_consumer_group_lag_records", "high watermark less the committed offset "
                                "(the log start without one; partition leader only)", labels=labels)
        lag_seconds = GaugeMetricFamily("raftlog_consumer_group_lag_seconds", "age of the oldest unconsumed record "
                                        "(0 when caught up; partition leader only)", labels=labels)
        for row in figures.partitions:
            values = [row.group, row.topic, str(row.partition)]
            if row.committed_offset is not None:
                committed.add_metric(values, row.committed_offset)
            lag.add_metric(values, row.lag)
            if row.lag_seconds is not None:
                lag_seconds.add_metric(values, row.lag_seconds)
        yield from (members, state, committed, lag, lag_seconds)
        yield GaugeMetricFamily("raftlog_consumer_group_series_truncated",
                                "1 when this node left (group, partition) series out (past its bound)",
                                value=int(figures.truncated))


def groups_registry(figures: GroupMetrics) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(GroupsCollector(figures))
    return registry
