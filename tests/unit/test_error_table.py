"""Goal (issue 21, family 9): the one error table is explicit and the same in every
process: every ClientError the project defines is in it, whatever was imported."""

from __future__ import annotations

import importlib
import pkgutil
import subprocess
import sys

import multiraft
import raftlog
import storage
from multiraft.errors import error_table
from multiraft.transport.remote_errors import RemoteClientError
from raftlog.errors import ClientError


def _every_module() -> None:
    for package in (raftlog, storage, multiraft):
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            if info.name.endswith("__main__"):
                continue
            importlib.import_module(info.name)


def _all_subclasses(cls: type) -> set[type]:
    found = set(cls.__subclasses__())
    for sub in list(found):
        found |= _all_subclasses(sub)
    return found


def test_every_client_error_of_the_project_is_in_the_table() -> None:
    _every_module()
    table = error_table()
    missing = {cls.__qualname__: cls.__module__ for cls in _all_subclasses(ClientError)
               if cls is not RemoteClientError and cls.code not in table}
    assert not missing, f"ClientErrors defined outside the table's modules: {missing}"
    for cls in _all_subclasses(ClientError) - {RemoteClientError}:
        assert table[cls.code][0] == cls.http_status, cls


def test_a_client_process_sees_the_same_table_as_a_node() -> None:
    script = ("import json; from multiraft.client import Client; from multiraft.errors import error_table; "
              "print(json.dumps(sorted(error_table())))")
    answer = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    _every_module()
    assert answer.stdout.strip() == str(sorted(error_table())).replace("'", '"')
