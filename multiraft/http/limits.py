"""Bounds of the HTTP API, each with the precedent it follows (STYLE.md section 10).

Exceeding one answers a clear 4xx at once; nothing waits without a deadline.
"""

from __future__ import annotations

from storage.batch import BATCH_BYTES_MAX

# A binary batch may be as large as storage accepts, plus room for nothing else.
REQUEST_BYTES_MAX = BATCH_BYTES_MAX
# JSON bodies inflate binary data by 4/3 (base64); 16 MiB of JSON is ~12 MiB of data.
JSON_BYTES_MAX = BATCH_BYTES_MAX
# Confluent REST Proxy has no explicit cap; 10,000 records keeps one request's
# Python work (encode, group, answer) in the tens of milliseconds.
RECORDS_PER_REQUEST_MAX = 10_000
# Kafka's default message.max.bytes is ~1 MiB: one record (key + value + headers).
RECORD_BYTES_MAX = 1024 * 1024
HEADERS_PER_RECORD_MAX = 64
# A client must deliver its whole body within this time (slowloris guard).
BODY_READ_TIMEOUT_S = 30.0
# The cluster must answer within this time (produce, admin, offsets); beyond it 504.
REQUEST_TIMEOUT_S = 15.0
# Consume defaults (the maxima live in multiraft.partition_ops).
CONSUME_MAX_RECORDS_DEFAULT = 500
CONSUME_MAX_BYTES_DEFAULT = 1024 * 1024
GROUP_COMMITS_PER_REQUEST_MAX = 10_000
BATCH_CONTENT_TYPE = "application/vnd.raftlog.batch"
