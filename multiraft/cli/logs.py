"""structlog set-up for a node: JSON lines when not on a terminal, readable when on one.

The core and the runtime receive bound loggers (node, group, term) and never
configure logging themselves; only the process entry point calls `configure`.
"""

from __future__ import annotations

import logging
import sys

import structlog


def configure(level: str = "info", stream=None) -> None:
    stream = stream or sys.stderr
    processors: list = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    if stream.isatty():
        processors.append(structlog.dev.ConsoleRenderer())
    else:
        processors += [structlog.processors.format_exc_info, structlog.processors.JSONRenderer()]
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, level.upper())),
        logger_factory=structlog.PrintLoggerFactory(file=stream),
        cache_logger_on_first_use=True,
    )
