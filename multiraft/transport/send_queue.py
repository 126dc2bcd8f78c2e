"""A bounded per-peer send queue that sheds instead of blocking.

Why shed: Raft tolerates lost messages (a leader resends appends, heartbeats
recur every interval), but it does not tolerate a node whose event loop blocks
behind one slow peer, nor one whose memory grows until it dies. So when a peer
falls behind, the oldest frames go: heartbeat frames first (the next beat makes
the old one worthless), then the oldest frames of any type.

Frames keep their order. Heartbeat-type frames and the rest live in two deques,
each entry tagged with a sequence number; the writer always pops whichever head
is older, so shedding the oldest heartbeat, the oldest frame, or popping the next
frame are all O(1).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

__all__ = ["QueuedFrame", "SendQueue"]


@dataclass(frozen=True, slots=True)
class QueuedFrame:
    sequence: int
    frame_type: int
    group_id: int
    body: bytes


class SendQueue:
    """Bounded by frame count and by body bytes; every shed frame is counted."""

    def __init__(self, *, frames_max: int, bytes_max: int, shed_first_types: frozenset[int]):
        assert frames_max >= 1 and bytes_max >= 1
        self.frames_max = frames_max
        self.bytes_max = bytes_max
        self._shed_first_types = shed_first_types
        self._heartbeats: deque[QueuedFrame] = deque()
        self._others: deque[QueuedFrame] = deque()
        self._next_sequence = 0
        self.bytes = 0  # invariant: the sum of len(body) over queued frames
        self.heartbeats_shed = 0
        self.frames_shed = 0  # frames other than heartbeats

    def __len__(self) -> int:
        return len(self._heartbeats) + len(self._others)

    def push(self, frame_type: int, group_id: int, body: bytes) -> int:
        """Queue a frame, shedding older ones to stay within bounds; returns how many."""
        assert len(body) <= self.bytes_max, "the transport checks frame_bytes_max first"
        frame = QueuedFrame(self._next_sequence, frame_type, group_id, body)
        self._next_sequence += 1
        if frame_type in self._shed_first_types:
            self._heartbeats.append(frame)
        else:
            self._others.append(frame)
        self.bytes += len(body)
        shed = 0
        while len(self) > self.frames_max or self.bytes > self.bytes_max:
            self._shed_one()
            shed += 1
        assert len(self) <= self.frames_max and self.bytes <= self.bytes_max
        return shed

    def _shed_one(self) -> None:
        if self._heartbeats:
            frame = self._heartbeats.popleft()
            self.heartbeats_shed += 1
        else:
            frame = self._pop_oldest()
            self.frames_shed += 1
        self.bytes -= len(frame.body)

    def _pop_oldest(self) -> QueuedFrame:
        heartbeats, others = self._heartbeats, self._others
        if heartbeats and (not others or heartbeats[0].sequence < others[0].sequence):
            return heartbeats.popleft()
        return others.popleft()

    def pop_batch(self, frames_max: int, bytes_max: int) -> list[QueuedFrame]:
        """The oldest frames, in order: at most `frames_max`, and no more than
        `bytes_max` body bytes unless the first frame alone is larger."""
        assert frames_max >= 1
        batch: list[QueuedFrame] = []
        batch_bytes = 0
        while len(self) and len(batch) < frames_max:
            heartbeats, others = self._heartbeats, self._others
            if heartbeats and (not others or heartbeats[0].sequence < others[0].sequence):
                head = heartbeats[0]
            else:
                head = others[0]
            if batch and batch_bytes + len(head.body) > bytes_max:
                break
            frame = self._pop_oldest()
            assert frame is head
            batch.append(frame)
            batch_bytes += len(frame.body)
        self.bytes -= batch_bytes
        assert self.bytes >= 0
        return batch

    def clear(self) -> int:
        """Drop everything (the peer was removed); returns how many frames went."""
        dropped = len(self)
        self._heartbeats.clear()
        self._others.clear()
        self.bytes = 0
        return dropped
