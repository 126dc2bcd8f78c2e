"""The history writer: appends a chaos history's events to its file as the workload runs.

The operations and their meaning are in `chaos/history.py`; the file format in
`chaos/history_file.py`, which reads what this writes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, BinaryIO

import orjson

from chaos.group_events import keys_json, offsets_json, reads_json, records_json, view_json
from chaos.history import (
    GroupRecord,
    MemberAction,
    MemberView,
    Outcome,
    PartitionKey,
    PartitionRead,
    ProducerStamp,
    Record,
    Value,
)

# The writer's file buffer. The workload writes from the asyncio loop, where a
# write system call per event (a few hundred per second, polls up to kilobytes)
# would be blocking I/O on the loop; with 1 MiB, one write lands every few
# seconds, and a crashed run loses at most that much of its tail.
WRITE_BUFFER_BYTES = 1 << 20


class HistoryWriter:
    """Appends events to a JSON-lines history as the workload runs.

    Cheap enough to call from asyncio tasks inline: one `orjson.dumps` and one
    buffered write per event, no system call (the buffer flushes on `flush`,
    `close` or when full). Misuse (completing an op twice, or as another kind,
    starting a second op on a busy process) is a runner bug and asserts.
    """

    def __init__(self, stream: BinaryIO, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._stream = stream
        self._clock = clock
        self._next_index = 0
        # index -> (kind, process, values sent) of every invoked, not yet completed op.
        self._open: dict[int, tuple[str, int, int]] = {}
        self._busy_processes: set[int] = set()

    @classmethod
    def open(
        cls, path: str | Path, *, clock: Callable[[], float] = time.monotonic
    ) -> HistoryWriter:
        return cls(open(path, "wb", buffering=WRITE_BUFFER_BYTES), clock=clock)

    def __enter__(self) -> HistoryWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def invoke_send(
        self,
        process: int,
        key: PartitionKey,
        values: Sequence[Value],
        *,
        producer: ProducerStamp | None = None,
    ) -> int:
        fields: dict[str, Any] = {
            "topic": key.topic,
            "partition": key.partition,
            "values": list(values),
        }
        if producer is not None:
            fields |= {
                "producer_id": producer.producer_id,
                "epoch": producer.epoch,
                "sequence": producer.sequence,
            }
        return self._invoke("send", process, fields, len(values))

    def invoke_poll(
        self, process: int, key: PartitionKey, position: int, *, final: bool = False
    ) -> int:
        fields: dict[str, Any] = {
            "topic": key.topic,
            "partition": key.partition,
            "position": position,
        }
        if final:
            fields["final"] = True
        return self._invoke("poll", process, fields)

    def invoke_commit(self, process: int, group: str, key: PartitionKey, offset: int) -> int:
        fields = {"group": group, "topic": key.topic, "partition": key.partition, "offset": offset}
        return self._invoke("commit", process, fields)

    def invoke_fetch(self, process: int, group: str, key: PartitionKey) -> int:
        return self._invoke(
            "fetch", process, {"group": group, "topic": key.topic, "partition": key.partition}
        )

    def ok_send(
        self, index: int, offsets: Sequence[int | None], *, duplicate: bool = False
    ) -> None:
        open_op = self._open.get(index)
        if open_op is not None and open_op[0] == "send":
            assert open_op[2] == len(offsets), (
                f"op {index}: {open_op[2]} values, {len(offsets)} offsets"
            )
        fields: dict[str, Any] = {"offsets": list(offsets)}
        if duplicate:
            fields["duplicate"] = True
        self._complete(index, "send", Outcome.OK, fields)

    def ok_poll(
        self, index: int, records: Sequence[Record], high_watermark: int, *, node: str | None = None
    ) -> None:
        fields: dict[str, Any] = {"records": list(records), "high_watermark": high_watermark}
        if node is not None:
            fields["node"] = node
        self._complete(index, "poll", Outcome.OK, fields)

    def ok_commit(self, index: int) -> None:
        self._complete(index, "commit", Outcome.OK, {})

    def ok_fetch(self, index: int, offset: int | None) -> None:
        self._complete(index, "fetch", Outcome.OK, {"offset": offset})

    # -- consumer group members (chaos/group_workload.py) ---------------------------

    def invoke_member(
        self,
        process: int,
        group: str,
        action: MemberAction,
        member_id: str | None,
        *,
        epoch: int | None = None,
        topics: Sequence[str] = (),
        owned: Sequence[PartitionKey] | None = None,
        session_timeout_ms: int | None = None,
        rebalance_timeout_ms: int | None = None,
    ) -> int:
        fields: dict[str, Any] = {"group": group, "action": str(action), "member_id": member_id,
                                  "epoch": epoch}
        if topics:
            fields["topics"] = list(topics)
        if session_timeout_ms is not None:
            fields["session_timeout_ms"] = session_timeout_ms
        if rebalance_timeout_ms is not None:
            fields["rebalance_timeout_ms"] = rebalance_timeout_ms
        if owned is not None:
            fields["owned"] = keys_json(list(owned))
        return self._invoke("member", process, fields)

    def ok_member(self, index: int, view: MemberView | None) -> None:
        """A join's or heartbeat's answer (`view`), or a leave's (None)."""
        self._complete(index, "member", Outcome.OK, {} if view is None else {"view": view_json(view)})

    def invoke_group_fetch(
        self,
        process: int,
        group: str,
        member_id: str,
        epoch: int,
        positions: Sequence[tuple[PartitionKey, int]],
        *,
        final: bool = False,
    ) -> int:
        fields: dict[str, Any] = {"group": group, "member_id": member_id, "epoch": epoch,
                                  "positions": offsets_json(list(positions))}
        if final:
            fields["final"] = True
        return self._invoke("group-fetch", process, fields)

    def ok_group_fetch(self, index: int, view: MemberView, records: Sequence[GroupRecord],
                       reads: Sequence[PartitionRead]) -> None:
        self._complete(index, "group-fetch", Outcome.OK, {
            "view": view_json(view), "records": records_json(records), "reads": reads_json(reads)})

    def invoke_group_commit(
        self,
        process: int,
        group: str,
        member_id: str | None,
        epoch: int | None,
        offsets: Sequence[tuple[PartitionKey, int]],
        *,
        admin_reset: bool = False,
    ) -> int:
        fields: dict[str, Any] = {"group": group, "member_id": member_id, "epoch": epoch,
                                  "offsets": offsets_json(list(offsets))}
        if admin_reset:
            fields["admin_reset"] = True
        return self._invoke("group-commit", process, fields)

    def ok_group_commit(self, index: int) -> None:
        self._complete(index, "group-commit", Outcome.OK, {})

    def fail(self, index: int, error: str | None = None) -> None:
        """The op definitely did not happen (the server refused it before applying)."""
        self._complete(index, None, Outcome.FAIL, {} if error is None else {"error": error})

    def info(self, index: int, error: str | None = None) -> None:
        """The op may or may not have happened (timeout, outcome unknown)."""
        self._complete(index, None, Outcome.INFO, {} if error is None else {"error": error})

    def flush(self) -> None:
        self._stream.flush()

    def close(self) -> None:
        """Flush and close. Ops still open read back as info (outcome unknown)."""
        self._stream.close()

    def _invoke(self, kind: str, process: int, fields: dict[str, Any], values: int = 0) -> int:
        assert process not in self._busy_processes, f"process {process} already has an op open"
        index = self._next_index
        self._next_index += 1
        self._open[index] = (kind, process, values)
        self._busy_processes.add(process)
        event = {
            "type": "invoke",
            "index": index,
            "process": process,
            "time": self._clock(),
            "f": kind,
        }
        self._stream.write(orjson.dumps(event | fields) + b"\n")
        return index

    def _complete(
        self, index: int, kind: str | None, outcome: Outcome, fields: dict[str, Any]
    ) -> None:
        assert index in self._open, f"op {index} is not open"
        open_kind, process, _ = self._open.pop(index)
        if kind is not None:
            assert open_kind == kind, f"op {index} is a {open_kind}, completed as a {kind}"
        self._busy_processes.remove(process)
        event = {"type": str(outcome), "index": index, "process": process, "time": self._clock()}
        self._stream.write(orjson.dumps(event | fields) + b"\n")


