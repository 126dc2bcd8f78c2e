"""The checks over the version order: the log's content, reads and sends in order.

Each takes what `chaos/version_order.py` built and returns the anomalies of its
classes (`chaos/checker.py` defines them); each is one linear pass.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import defaultdict
from collections.abc import Iterable, Mapping

from chaos.anomalies import LISTED_MAX, Anomaly, anomaly, listing, offset_runs
from chaos.history import Outcome, PartitionKey, Poll, Send, Value
from chaos.version_order import FinalRead, VersionOrder, Writers


def log_anomalies(orders: Mapping[PartitionKey, VersionOrder]) -> list[Anomaly]:
    anomalies = []
    for key, order in orders.items():
        for offset, claims in order.conflicts.items():
            listed = ", ".join(f"{value!r} (op {op})" for value, op in claims.items())
            anomalies.append(
                anomaly(
                    "inconsistent-offsets",
                    key,
                    f"offset {offset} holds {len(claims)} values: {listed}",
                    tuple(claims.values()),
                )
            )
        for value, offsets in order.duplicates.items():
            listed = ", ".join(f"{offset} (op {op})" for offset, op in offsets.items())
            anomalies.append(
                anomaly(
                    "duplicate",
                    key,
                    f"value {value!r} at {len(offsets)} offsets: {listed}",
                    tuple(offsets.values()),
                )
            )
    return anomalies


def read_validity(
    orders: Mapping[PartitionKey, VersionOrder], writers: Writers
) -> list[Anomaly]:
    """`unexpected` (read, never sent) and `G1a` (read, every send of it failed)."""
    anomalies = []
    for key, order in orders.items():
        first_writers = writers.first.get(key, {})
        for value, reader in order.read_by.items():
            first = first_writers.get(value)
            if first is None:
                explanation = f"op {reader} read {value!r}, which no op sent to {key}"
                anomalies.append(anomaly("unexpected", key, explanation, (reader,)))
            elif first.outcome is Outcome.FAIL:
                sent_by = writers.of(key, value)
                if all(op.outcome is Outcome.FAIL for op in sent_by):
                    ops = (*(op.index for op in sent_by), reader)
                    explanation = f"op {reader} read {value!r}, whose send failed (op {ops[0]})"
                    anomalies.append(anomaly("G1a", key, explanation, ops))
    return anomalies


def lost_writes(
    orders: Mapping[PartitionKey, VersionOrder],
    acknowledged: Mapping[PartitionKey, Mapping[Value, int]],
) -> list[Anomaly]:
    """Jepsen's lost-write: someone read dense index `bound`, so every acknowledged
    value that sits wholly at or below it must have been read by someone."""
    anomalies = []
    for key, of_key in acknowledged.items():
        order = orders.get(key)
        if order is None or not order.read_by:
            continue
        first_index = order.first_index
        bound_value = max(order.read_by, key=first_index.__getitem__)
        bound = first_index[bound_value]
        for value, writer in of_key.items():
            if value in order.read_by:
                continue
            last = order.last_index(value)
            if last is not None and last <= bound:
                explanation = (
                    f"{value!r} (sent by op {writer}) at index {last} was never read, "
                    f"though op {order.read_by[bound_value]} read index {bound}"
                )
                ops = (writer, order.read_by[bound_value])
                anomalies.append(anomaly("lost-write", key, explanation, ops))
    return anomalies


def values_not_judged(
    finals: Mapping[PartitionKey, FinalRead],
    orders: Mapping[PartitionKey, VersionOrder],
    acknowledged: Mapping[PartitionKey, Mapping[Value, int]],
    incomplete: Mapping[PartitionKey, str],
) -> dict[PartitionKey, set[Value]]:
    """Per partition whose final read is incomplete, the acknowledged values it cannot
    vouch for: those not at a known offset below the high watermark the read reached."""
    beyond: dict[PartitionKey, set[Value]] = {}
    for key in incomplete:
        final, order = finals.get(key), orders.get(key)
        reached = final.high_watermark if final is not None else 0
        offset_of = order.offset_of if order is not None else {}
        beyond[key] = {value for value in acknowledged.get(key, {})
                       if offset_of.get(value, reached) >= reached}
    return beyond


def unseen(
    finals: Mapping[PartitionKey, FinalRead],
    acknowledged: Mapping[PartitionKey, Mapping[Value, int]],
    not_judged: Mapping[PartitionKey, set[Value]],
) -> list[Anomaly]:
    """`not_judged`: per partition with an incomplete final read, the values beyond it."""
    anomalies = []
    for key, of_key in acknowledged.items():
        final = finals.get(key)
        if final is None:
            continue  # reported as unchecked by the caller
        beyond = not_judged.get(key, set())
        for value, writer in of_key.items():
            if value not in final.values and value not in beyond:
                explanation = f"{value!r} (sent by op {writer}) is missing from the final read"
                anomalies.append(anomaly("unseen", key, explanation, (writer,)))
    return anomalies


def incomplete_reads(
    finals: Mapping[PartitionKey, FinalRead],
    not_judged: Mapping[PartitionKey, set[Value]],
    incomplete: Mapping[PartitionKey, str],
) -> list[Anomaly]:
    anomalies = []
    for key, why in sorted(incomplete.items()):
        final = finals.get(key)
        reached = final.high_watermark if final is not None else 0
        explanation = (f"final read incomplete: {why}; {len(not_judged.get(key, ()))} acknowledged "
                       f"values at or beyond HW {reached} not judged")
        ops = tuple(final.ops[-LISTED_MAX:]) if final is not None else ()
        anomalies.append(anomaly("final-read-incomplete", key, explanation, ops))
    return anomalies


def offset_holes(
    finals: Mapping[PartitionKey, FinalRead],
    refused_ranges: Mapping[PartitionKey, Iterable[tuple[int, int]]],
) -> list[Anomaly]:
    anomalies = []
    for key, final in finals.items():
        legal = {
            offset
            for base, count in refused_ranges.get(key, ())
            for offset in range(base, base + count)
        }
        missing = [
            o for o in range(final.high_watermark) if o not in final.offsets and o not in legal
        ]
        for first, last in offset_runs(missing):
            explanation = (
                f"offsets {first}..{last} are below the final high watermark {final.high_watermark} "
                f"but the final read (ops {listing(final.ops)}) did not return them"
            )
            ops = tuple(final.ops[:LISTED_MAX])
            anomalies.append(anomaly("offset-hole", key, explanation, ops))
    return anomalies


def poll_order(orders: Mapping[PartitionKey, VersionOrder], polls: list[Poll]) -> list[Anomaly]:
    """Where a poll started against its position, then record to record within it."""
    anomalies = []
    for op in polls:
        if not op.records:
            continue
        order = orders[op.key]
        index_of = order.index_of_offset
        expected = bisect_left(order.offsets, op.position)
        previous = index_of[op.records[0][0]]
        if previous != expected:
            anomalies.append(_external_poll_anomaly(op, order, expected, previous))
        for offset, _ in op.records[1:]:
            index = index_of[offset]
            if index != previous + 1:
                name = "int-poll-skip" if index > previous + 1 else "int-nonmonotonic-poll"
                explanation = f"op {op.index} read index {index} (offset {offset}) right after index {previous}"
                anomalies.append(anomaly(name, op.key, explanation, (op.index,)))
            previous = index
    return anomalies


def _external_poll_anomaly(op: Poll, order: VersionOrder, expected: int, got: int) -> Anomaly:
    first_offset = op.records[0][0]
    if got > expected:
        skipped = [order.value_at(index) for index in range(expected, got)]
        explanation = (
            f"op {op.index} polled from position {op.position} but started at offset {first_offset}, "
            f"skipping {listing(skipped)}"
        )
        return anomaly("poll-skip", op.key, explanation, (op.index,))
    explanation = f"op {op.index} polled from position {op.position} but started earlier, at offset {first_offset}"
    return anomaly("nonmonotonic-poll", op.key, explanation, (op.index,))


def send_order(orders: Mapping[PartitionKey, VersionOrder], sends: list[Send]) -> list[Anomaly]:
    anomalies: list[Anomaly] = []
    # (process, key) -> (dense index of the last value, op) of its last ok plain send.
    last_ok: dict[tuple[int, PartitionKey], tuple[int | None, int]] = {}
    # (producer id, epoch, key) -> sequence -> (first index, last index, op).
    batches: dict[tuple[int, int, PartitionKey], dict[int, tuple[int | None, int | None, int]]] = (
        defaultdict(dict)
    )
    for op in sends:
        order = orders.get(op.key)
        if op.outcome is Outcome.FAIL or order is None:
            continue
        indexes = [order.first_index.get(value) for value in op.values]
        anomalies += _internal_send_anomalies(op, indexes)
        if op.producer is not None:
            stamp = op.producer
            batches[stamp.producer_id, stamp.epoch, op.key].setdefault(
                stamp.sequence, (indexes[0], indexes[-1], op.index)
            )
            continue
        previous = last_ok.get((op.process, op.key))
        if previous is not None and _out_of_order(previous[0], indexes[0]):
            anomalies.append(
                _nonmonotonic_send(op.key, previous[1], op.index, "its process's previous ok send")
            )
        if op.outcome is Outcome.OK:
            last_ok[op.process, op.key] = (indexes[-1], op.index)
    for (_, _, key), by_sequence in batches.items():
        previous_batch = None
        for sequence in sorted(by_sequence):
            batch = by_sequence[sequence]
            if previous_batch is not None and _out_of_order(previous_batch[1], batch[0]):
                anomalies.append(
                    _nonmonotonic_send(key, previous_batch[2], batch[2], "the previous sequence")
                )
            previous_batch = batch
    return anomalies


def _out_of_order(earlier: int | None, later: int | None) -> bool:
    return earlier is not None and later is not None and later <= earlier


def _nonmonotonic_send(key: PartitionKey, earlier: int, later: int, what: str) -> Anomaly:
    explanation = f"op {later} landed at or before {what} (op {earlier})"
    return anomaly("nonmonotonic-send", key, explanation, (earlier, later))


def _internal_send_anomalies(op: Send, indexes: list[int | None]) -> list[Anomaly]:
    anomalies = []
    for position in range(1, len(indexes)):
        earlier, later = indexes[position - 1], indexes[position]
        if earlier is None or later is None or later == earlier + 1:
            continue
        name = "int-send-skip" if later > earlier + 1 else "int-nonmonotonic-send"
        explanation = (
            f"op {op.index} sent {op.values[position - 1]!r} then {op.values[position]!r}, "
            f"which sit at indexes {earlier} and {later}"
        )
        anomalies.append(anomaly(name, op.key, explanation, (op.index,)))
    return anomalies


def high_watermarks(polls: list[Poll]) -> list[Anomaly]:
    anomalies = []
    # (process, key, server incarnation) -> (highest high watermark seen, op).
    highest: dict[tuple[int, PartitionKey, str | None], tuple[int, int]] = {}
    for op in polls:
        high_watermark = op.high_watermark
        assert high_watermark is not None
        beyond = [offset for offset, _ in op.records if offset >= high_watermark]
        if beyond:
            explanation = f"op {op.index} read offsets {listing(beyond)} with a high watermark of {high_watermark}"
            anomalies.append(anomaly("read-beyond-hw", op.key, explanation, (op.index,)))
        view = (op.process, op.key, op.node)
        previous = highest.get(view)
        if previous is not None and high_watermark < previous[0]:
            server = "" if op.node is None else f" from {op.node}"
            explanation = f"op {op.index} saw high watermark {high_watermark}{server} after op {previous[1]} saw {previous[0]}"
            ops = (previous[1], op.index)
            anomalies.append(anomaly("nonmonotonic-hw", op.key, explanation, ops))
        if previous is None or high_watermark > previous[0]:
            highest[view] = (high_watermark, op.index)
    return anomalies

