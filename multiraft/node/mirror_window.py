"""The pipeline of one mirror partition's pull: which chunks are proposed and not yet applied.

Pure: no I/O, no clock. The pull (multiraft/node/mirror_pull.py) reads the source from
`read_position` (the end of what it proposed) while earlier chunks commit, proposes each
chunk as it comes (`add`), and takes their outcomes oldest first (`applied`), so
`committed` is the replicated position as this pull last saw it. It reads only while
`has_room`: at most `proposals_max` proposals and `bytes_max` bytes in flight.

Why a window and not one proposal at a time: a 1 MiB commit of the sink's group (three
replicas writing and syncing it) takes several times the source's read of it
(docs/mirror.md, "Where the time goes"), so with one in flight the copy runs at the rate
of one commit round after another; with several, the leader appends the next while the
previous ones replicate, and writes and syncs them together. Order and exactness are not
the window's job: each proposal carries the offset it must start at and is appended only
there (multiraft/node/mirror_append.py), so a failed one makes the later ones fail too,
and the pull starts again from the applied position.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

# Proposals in flight per mirror partition. Four: enough for the leader to append the
# next chunk while three replicate (one 1 MiB commit is 12-16 ms against a 1.8 ms read);
# etcd's MaxInflightMsgs is the same kind of bound, on a follower's appends.
PROPOSALS_IN_FLIGHT_MAX = 4
CHUNK_BYTES = 1024 * 1024  # one proposal at most (a chunk of whole batches)
BYTES_IN_FLIGHT_MAX = PROPOSALS_IN_FLIGHT_MAX * CHUNK_BYTES  # per partition, the memory a pull holds


@dataclass(frozen=True, slots=True)
class InFlight:
    """A proposed chunk: offsets [start, end), its bytes and batches."""

    start: int
    end: int
    size_bytes: int
    batches: int

    def __post_init__(self) -> None:
        assert 0 <= self.start < self.end and self.size_bytes > 0 and self.batches > 0


@dataclass(slots=True)
class Window:
    """Chunks in flight, oldest first; `committed` <= every chunk's start, and the chunks
    follow one another from it without a gap (each starts where the previous ends)."""

    committed: int
    proposals_max: int = PROPOSALS_IN_FLIGHT_MAX
    bytes_max: int = BYTES_IN_FLIGHT_MAX
    chunk_bytes_max: int = CHUNK_BYTES
    chunks: deque[InFlight] = field(default_factory=deque)
    bytes_in_flight: int = 0

    def __post_init__(self) -> None:
        assert self.committed >= 0 and self.proposals_max >= 1
        assert self.chunk_bytes_max >= 1 and self.bytes_max >= self.chunk_bytes_max

    @property
    def read_position(self) -> int:
        """Where the next read starts: after the last chunk proposed."""
        return self.chunks[-1].end if self.chunks else self.committed

    def has_room(self) -> bool:
        """Another chunk (of up to `chunk_bytes_max`) fits in both bounds. An empty window
        always has room: a single batch larger than a chunk (the source's answer holds at
        least one whole batch) still goes, alone."""
        if not self.chunks:
            return True
        return (len(self.chunks) < self.proposals_max
                and self.bytes_in_flight + self.chunk_bytes_max <= self.bytes_max)

    def add(self, chunk: InFlight) -> None:
        assert chunk.start == self.read_position, "a chunk starts where the last one proposed ends"
        assert self.has_room()
        self.chunks.append(chunk)
        self.bytes_in_flight += chunk.size_bytes

    def applied(self) -> InFlight:
        """The oldest chunk is committed and applied: the position moves to its end."""
        chunk = self.chunks.popleft()
        assert chunk.start == self.committed
        self.committed = chunk.end
        self.bytes_in_flight -= chunk.size_bytes
        assert self.bytes_in_flight >= 0
        return chunk


@dataclass(frozen=True, slots=True)
class PipelineBounds:
    """The bounds of every pull's window on a node (tests shrink the chunk to pipeline small logs)."""

    proposals_max: int = PROPOSALS_IN_FLIGHT_MAX
    bytes_max: int = BYTES_IN_FLIGHT_MAX
    chunk_bytes_max: int = CHUNK_BYTES

    def __post_init__(self) -> None:
        if self.proposals_max < 1 or self.chunk_bytes_max < 1 or self.bytes_max < self.chunk_bytes_max:
            raise ValueError("a pipeline holds at least one chunk, and chunks fit its bytes")

    def window(self, committed: int) -> Window:
        return Window(committed, proposals_max=self.proposals_max, bytes_max=self.bytes_max,
                      chunk_bytes_max=self.chunk_bytes_max)
