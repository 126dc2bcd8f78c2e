"""Bounds of the HTTP API, each with the precedent it follows (STYLE.md section 10).

Exceeding a request bound answers a clear 4xx at once; exceeding a connection
bound closes that connection (`ConnectionLimits`, applied by
multiraft/http/server.py); nothing waits without a deadline.
"""

from __future__ import annotations

from dataclasses import dataclass

from storage.batch import BATCH_BYTES_MAX
from storage.batch import (
    RECORD_BYTES_MAX as RECORD_BYTES_MAX,  # one record, JSON or binary (see below)
)

# A binary batch may be as large as storage accepts, plus room for nothing else.
REQUEST_BYTES_MAX = BATCH_BYTES_MAX
# A JSON body other than a produce or an offset commit (settings, assignments, group
# membership, tokens): 413 beyond it, before the body is read when it declares its length.
# The largest such body, a 10,000-partition replica assignment at 7 replicas, is ~0.8 MiB.
# Kafka's broker refuses requests above socket.request.max.bytes (100 MB) but parses none as
# text; Elasticsearch's http.max_content_length is 100 MB for bulk bodies, and it too bounds
# the parse by tokens rather than bytes (StreamReadConstraints).
JSON_BYTES_MAX = 1024 * 1024
# Produce and offset-commit bodies may take the whole REQUEST_BYTES_MAX (JSON inflates binary
# data by 4/3 with base64: 16 MiB of JSON is ~12 MiB of data), but hold at most this many JSON
# values (multiraft/http/jsontext.py: parsing costs per value, not per byte). 25 per record
# at RECORDS_PER_REQUEST_MAX (a keyed record with a small object value and a header uses 15);
# a request beyond it is 413 and belongs in a binary batch.
JSON_BULK_VALUES_MAX = 250_000
# Confluent REST Proxy has no explicit cap; 10,000 records keeps one request's
# Python work (encode, group, answer) in the tens of milliseconds.
RECORDS_PER_REQUEST_MAX = 10_000
# One record (key + value + headers), JSON or binary, is storage's RECORD_BYTES_MAX (1 MiB,
# Kafka's message.max.bytes), imported above so the two paths cannot drift apart.
HEADERS_PER_RECORD_MAX = 64
# A client must deliver its whole body within this time (slowloris guard).
BODY_READ_TIMEOUT_S = 30.0
# The cluster must answer within this time (produce, admin, offsets); beyond it 504.
REQUEST_TIMEOUT_S = 15.0
# Consume defaults (the maxima live in multiraft.node.partition_ops).
CONSUME_MAX_RECORDS_DEFAULT = 500
CONSUME_MAX_BYTES_DEFAULT = 1024 * 1024
GROUP_COMMITS_PER_REQUEST_MAX = 10_000
BATCH_CONTENT_TYPE = "application/vnd.raftlog.batch"

# --- Connections (multiraft/http/server.py). Each bound protects the node from
# clients that hold sockets without doing work; a connection beyond one is closed.

# Open connections, all clients together: bounds sockets (file descriptors: keep the
# process's open-file limit well above this plus storage's files) and per-connection
# buffers. nginx's stock configuration has 1,024 worker_connections; Apache's
# MaxRequestWorkers is 256.
CONNECTIONS_MAX = 1024
# Open connections from one client address: one host (or one runaway client) cannot
# take every slot from the others. Above the Python client's pool of 100 per server,
# so one client process fits twice over. Kafka's max.connections.per.ip, nginx's
# limit_conn.
CONNECTIONS_PER_ADDRESS_MAX = 256
# A request line and headers must arrive within this time from the connection's
# first byte (or from its opening, for a new connection): a client that trickles
# them, or never sends them, is dropped (slowloris). nginx's client_header_timeout
# (60 s), Apache mod_reqtimeout's header=20-40, Go's http.Server ReadHeaderTimeout.
HEADER_READ_TIMEOUT_S = 10.0
# An answer that cannot make progress this long (the socket's buffer stays above its
# high-water mark: the client stopped reading) is abandoned: the connection is reset
# and the answer's memory freed, however large it was. nginx's send_timeout (60 s,
# between two successive writes); the raft transport's write_stall_timeout_s.
WRITE_STALL_TIMEOUT_S = 30.0
# Idle keep-alive connections are closed after this (aiohttp's default is 75 s);
# shorter frees sockets of abandoned clients sooner. The Python client drops idle
# connections after 15 s, before the server does, so it never sends on a connection
# the server is closing.
KEEPALIVE_TIMEOUT_S = 30.0


@dataclass(frozen=True, slots=True, kw_only=True)
class ConnectionLimits:
    """The connection bounds of one HTTP server (the constants above are the
    defaults; tests shrink them). Validated on construction."""

    connections_max: int = CONNECTIONS_MAX
    connections_per_address_max: int = CONNECTIONS_PER_ADDRESS_MAX
    header_read_timeout_s: float = HEADER_READ_TIMEOUT_S
    write_stall_timeout_s: float = WRITE_STALL_TIMEOUT_S
    keepalive_timeout_s: float = KEEPALIVE_TIMEOUT_S

    def __post_init__(self) -> None:
        for name in ("connections_max", "connections_per_address_max", "header_read_timeout_s",
                     "write_stall_timeout_s", "keepalive_timeout_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.connections_per_address_max > self.connections_max:
            raise ValueError("connections_per_address_max must be <= connections_max")
