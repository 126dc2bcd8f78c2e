"""Marks for bench/legs.py, loaded by every Python process started with this
directory on PYTHONPATH and RAFTLOG_TRACE_LEGS=<output directory> set.

Wraps a few named functions of the node (and aiohttp's) as their modules are
imported, so that each call appends (wall clock, thread CPU clock, tag) to a list
in memory; the list is written to <output directory>/<pid>.legs at exit. A mark
costs about a microsecond. A name that no longer exists is reported and skipped:
the node still starts, its legs are just missing from the table.

A development tool, never loaded by `raftlog serve` unless asked this way.
"""

from __future__ import annotations

import atexit
import importlib.abc
import importlib.util
import os
import sys
import time

_OUTPUT = os.environ.get("RAFTLOG_TRACE_LEGS")

# module -> [(class or "" for a module function, function, tag, also mark the return)]
POINTS = {
    "aiohttp.web_protocol": [("RequestHandler", "data_received", "request", False)],
    "aiohttp.web": [("", "json_response", "answer", False)],
    "aiohttp.web_response": [("StreamResponse", "write_eof", "written", False)],
    "multiraft.http.handlers.produce": [("", "produce_partition", "handler", False)],
    "multiraft.transport.inbound": [("InboundConnection", "data_received", "frame", False)],
    "multiraft.runtime.group": [("GroupRuntime", "propose", "propose", False)],
    "multiraft.runtime.group_host": [("GroupHost", "_apply", "apply", False)],
    "multiraft.transport.peer_link": [("PeerLink", "enqueue", "send", False)],
    "multiraft.runtime.flusher": [("Flusher", "_finish", "flushed", True)],
    "storage.files": [("", "write_all", "append", False)],
}

if _OUTPUT:
    _marks: list[tuple[float, float, str]] = []
    _wall, _cpu = time.perf_counter, time.thread_time

    def _wrap(owner: object, name: str, tag: str, on_return: bool) -> None:
        original = getattr(owner, name)

        def marked(*args, **kwargs):  # type: ignore[no-untyped-def]
            if tag == "request" and not args[1]:
                return original(*args, **kwargs)  # aiohttp's empty call when reading resumes
            _marks.append((_wall(), _cpu(), tag))
            result = original(*args, **kwargs)
            if on_return:
                _marks.append((_wall(), _cpu(), tag + ".end"))
            return result

        setattr(owner, name, marked)

    _fsync = os.fsync

    def _marked_fsync(fd: int) -> None:
        _marks.append((_wall(), _cpu(), "fsync"))
        _fsync(fd)
        _marks.append((_wall(), _cpu(), "fsync.end"))

    os.fsync = _marked_fsync

    class _Finder(importlib.abc.MetaPathFinder):
        """Wraps the points of a module right after it executed."""

        def find_spec(self, name, path, target=None):  # type: ignore[no-untyped-def]
            if name not in POINTS:
                return None
            sys.meta_path.remove(self)
            try:
                spec = importlib.util.find_spec(name)
            finally:
                sys.meta_path.insert(0, self)
            if spec is None or spec.loader is None:
                return spec
            execute = spec.loader.exec_module

            def exec_module(module):  # type: ignore[no-untyped-def]
                execute(module)
                for owner_name, function, tag, on_return in POINTS[name]:
                    owner = getattr(module, owner_name) if owner_name else module
                    if not hasattr(owner, function):
                        print(f"trace_legs: {name}.{owner_name or ''}.{function} is gone; skipped", file=sys.stderr)
                        continue
                    _wrap(owner, function, tag, on_return)

            spec.loader.exec_module = exec_module  # type: ignore[method-assign]
            return spec

    sys.meta_path.insert(0, _Finder())

    def _write() -> None:
        with open(os.path.join(_OUTPUT, f"{os.getpid()}.legs"), "w") as out:
            out.writelines(f"{wall:.6f} {cpu:.6f} {tag}\n" for wall, cpu, tag in _marks)

    atexit.register(_write)
