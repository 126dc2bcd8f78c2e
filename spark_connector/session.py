"""A SparkSession set up for raftlog: the environment Spark needs lives here, not in the shell.

- Python workers run `sys.executable` (this venv), not whatever `python3` is on
  PATH: without it the workers lack pyarrow and die (`spark.pyspark.python`,
  and `PYSPARK_PYTHON` for the JVM that is about to start).
- Local masters bind to loopback (`SPARK_LOCAL_IP`, `spark.driver.host` and
  `spark.driver.bindAddress`): nothing listens on outside addresses.
- No web UI (port 4040) unless asked; session time zone UTC, so the
  `timestamp` column reads the same everywhere.
- The `raftlog` format is registered.

For a cluster master (`spark://`, `yarn`, `k8s://`) only the UI, time zone and
registration apply: the cluster decides its executors' Python and addresses.
"""

from __future__ import annotations

import os
import sys
from typing import Any

LOOPBACK = "127.0.0.1"


def is_local(master: str) -> bool:
    return master == "local" or master.startswith("local[")


def spark_session(master: str = "local[2]", app_name: str = "raftlog", *, ui: bool = False,
                  conf: dict[str, str] | None = None) -> Any:
    """Get or create the session (an existing one is reused as it is, not reconfigured)."""
    from pyspark.sql import SparkSession

    from spark_connector.source import register

    active = SparkSession.getActiveSession()
    if active is not None:
        register(active)
        return active
    builder = SparkSession.builder.master(master).appName(app_name)
    settings = {
        "spark.ui.enabled": "true" if ui else "false",
        "spark.ui.showConsoleProgress": "false",  # `raftlog export` prints its own progress
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.shuffle.partitions": "8",
    }
    if is_local(master):
        os.environ["PYSPARK_PYTHON"] = sys.executable
        os.environ["SPARK_LOCAL_IP"] = LOOPBACK
        settings |= {"spark.pyspark.python": sys.executable, "spark.driver.host": LOOPBACK,
                     "spark.driver.bindAddress": LOOPBACK}
    for key, value in (settings | (conf or {})).items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    register(session)
    return session
