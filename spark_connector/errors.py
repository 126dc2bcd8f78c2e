"""The connector's errors: bad options, data lost to retention, replicas that do not serve.

Each message names what the user can change (the option, the partition, the
offsets), because Spark wraps it in a long Python traceback and the message is
the part a user reads. `raftlog export` prints just the message.
"""

from __future__ import annotations


class ConnectorError(Exception):
    """Base of the connector's operating errors."""


class OptionError(ConnectorError, ValueError):
    """An option is missing, unknown, malformed or contradicts another; names the option."""

    def __init__(self, option: str, problem: str) -> None:
        # A command-line flag (--from) reads better bare; a data source option is named as one.
        super().__init__(f"{option}: {problem}" if option.startswith("-") else
                         f"raftlog option '{option}': {problem}")
        self.option = option


class DataLossError(ConnectorError):
    """Records of the requested range are gone (retention moved the log start past them)."""


class ReadTimeoutError(ConnectorError):
    """No replica served a partition's range within `pollTimeoutMs`."""


class DataLossWarning(UserWarning):
    """`failOnDataLoss=false`: records the retention removed were skipped."""
