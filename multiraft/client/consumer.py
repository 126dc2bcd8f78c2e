"""A consumer of one topic: by explicit partitions, or as a member of a consumer group.

It reads binary batches (the stored bytes, decoded here), so values come back
exactly as produced. Positions start from the group's committed offsets when a
group is given, else from `start` ("earliest", "latest", or {partition: offset}).
A position that falls out of the log (retention) resets per `start`'s policy.
`poll` reads every assigned partition once without waiting and, when none had
records, long-polls one of them (round-robin) for up to `wait_ms`.
`commit` stores the positions (the next offset to read) for the group.
"""

from __future__ import annotations

from dataclasses import dataclass

from multiraft.client.http import AsyncClient, RaftlogError
from multiraft.client.wakeup import Wakeup
from storage.batch import decode_batch


@dataclass(frozen=True, slots=True)
class ConsumedRecord:
    topic: str
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]


class AsyncConsumer:
    def __init__(self, client: AsyncClient, topic: str, *, group: str | None = None,
                 partitions: list[int] | None = None, start: str | dict[int, int] = "earliest",
                 max_records: int = 1000, wait_ms: int = 1000) -> None:
        assert isinstance(start, dict) or start in ("earliest", "latest")
        self.client = client
        self.topic = topic
        self.group = group
        self.start_policy = start
        self.max_records = max_records
        self.wait_ms = wait_ms
        self._requested = partitions
        self.positions: dict[int, int] = {}
        self._turn = 0
        self._wakeup = Wakeup()

    async def __aenter__(self) -> AsyncConsumer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    async def start(self) -> None:
        described = await self.client.describe_topic(self.topic)
        partitions = self._requested if self._requested is not None else [
            p["partition"] for p in described["partitions"]]
        committed = await self.client.fetch_offsets(self.group, self.topic) if self.group else {}
        missing = [p for p in partitions if p not in committed]
        initial = await self._initial(missing) if missing else {}
        self.positions = {p: committed.get(p, initial.get(p, 0)) for p in partitions}

    async def _initial(self, partitions: list[int]) -> dict[int, int]:
        if isinstance(self.start_policy, dict):
            return {p: self.start_policy.get(p, 0) for p in partitions}
        bounds = await self.client.partition_offsets(self.topic)
        index = 0 if self.start_policy == "earliest" else 1
        return {p: bounds.get(p, (0, 0))[index] for p in partitions}

    async def poll(self) -> list[ConsumedRecord]:
        """The next records of the assigned partitions (at most `max_records` per partition)."""
        records: list[ConsumedRecord] = []
        for partition in sorted(self.positions):
            records += await self._read(partition, 0)
        if not records and self.positions:
            order = sorted(self.positions)
            partition = order[self._turn % len(order)]
            self._turn += 1
            records += await self._read(partition, self.wait_ms)
        return records

    async def _read(self, partition: int, wait_ms: int) -> list[ConsumedRecord]:
        position = self.positions[partition]
        try:
            call = self.client.consume_batches(self.topic, partition, position, max_records=self.max_records,
                                               wait_ms=wait_ms)
            read = await (self._wakeup.wait_for(call) if wait_ms else call)
            if read is None:
                return []  # woken during the long poll: nothing read, nothing moved
        except RaftlogError as error:
            if error.code != "OFFSET_OUT_OF_RANGE":
                raise
            reset = await self._initial([partition]) if self.start_policy != "latest" else None
            self.positions[partition] = (reset or {}).get(partition, position)
            return []
        out = []
        for base, batch in read.batches:
            header, records = decode_batch(batch)
            for i, record in enumerate(records):
                offset = base + i
                if offset < position or len(out) >= self.max_records:
                    continue
                out.append(ConsumedRecord(self.topic, partition, offset,
                                          header.first_timestamp_ms + record.timestamp_delta_ms,
                                          record.key, record.value, record.headers))
        self.positions[partition] = out[-1].offset + 1 if out else max(position, read.next_offset)
        return out

    def wakeup(self) -> None:
        """End the long poll in progress (or the next one) early: that poll returns no
        records and moves no position (wakeup.py). Call on the client's loop."""
        self._wakeup.set()

    def seek(self, partition: int, offset: int) -> None:
        """Read `partition` from `offset` next (e.g. to give back records not processed)."""
        assert partition in self.positions and offset >= 0
        self.positions[partition] = offset

    async def commit(self) -> None:
        """Store the positions for the group (the next offset each partition will read)."""
        if self.group is None:
            raise ValueError("commit needs a consumer group")
        await self.client.commit_offsets(self.group, [
            {"topic": self.topic, "partition": p, "offset": o} for p, o in sorted(self.positions.items())])
