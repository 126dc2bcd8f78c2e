"""The Spark connector: the PySpark data source `raftlog` and the `raftlog export` job.

    from spark_connector import spark_session
    spark = spark_session("local[2]")            # registers the format
    df = (spark.read.format("raftlog").option("servers", "127.0.0.1:8080")
          .option("topic", "events").load())     # Spark's Kafka source schema
    df.write.parquet("/tmp/events")

Modules: `options` (parsing), `planning` (pure range planning), `cluster` (the
driver's lookups), `decode` (batches to Arrow), `reader` (executors' fetch
loop), `writer`, `source` (the DataSource classes), `session`, `export`.
The public names load lazily, so importing the pure modules needs no PySpark.
See docs/spark.md.
"""

from __future__ import annotations

from typing import Any

__all__ = ["RaftlogDataSource", "register", "run_export", "spark_session"]

_LAZY = {"RaftlogDataSource": "spark_connector.source", "register": "spark_connector.source",
         "spark_session": "spark_connector.session", "run_export": "spark_connector.export"}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'spark_connector' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_LAZY[name]), name)
