"""Auto-registration of the `raftlog` format: PySpark imports every top-level
module named `pyspark_*` it finds and registers its `DefaultSource` (see
pyspark/sql/worker/lookup_data_sources.py). Editable installs are not listed
by that scan; call `spark_connector.register(spark)` there."""

from spark_connector.source import RaftlogDataSource as DefaultSource

__all__ = ["DefaultSource"]
