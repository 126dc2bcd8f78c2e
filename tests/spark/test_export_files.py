"""Goal: `raftlog export`'s temporary file (the log4j2 configuration its Spark JVM
loads) is private: made 0600 in a directory of its own (0700, a fresh name under
the temporary directory, not a fixed name in the shared /tmp that another user
could plant or point elsewhere), and gone when the export is done; and the token
of `--token-file` reaches the connector's clients. Spark itself is replaced by a
double that looks at the file when the session would start."""

from __future__ import annotations

import argparse
import os
import stat
import tempfile
from pathlib import Path
from typing import Any

import pytest

import spark_connector.export as export
import spark_connector.session as session
from spark_connector.errors import OptionError


class _SparkDouble:
    def stop(self) -> None:
        pass


def test_the_log4j_file_of_an_export_is_private_and_removed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[Path, int, int, str]] = []

    def spark_session(master: str, app_name: str, *, conf: dict[str, str]) -> _SparkDouble:
        assert os.environ.get("RAFTLOG_TOKEN") == "token-from-its-file", "--token-file reaches the connector"
        path = Path(conf["spark.driver.extraJavaOptions"].removeprefix("-Dlog4j2.configurationFile="))
        seen.append((path, stat.S_IMODE(path.stat().st_mode), stat.S_IMODE(path.parent.stat().st_mode),
                     path.read_text()))
        return _SparkDouble()

    def run_export(*args: Any, **kwargs: Any) -> None:
        raise OptionError("--to", "stop here: the file is what this test is about")

    monkeypatch.setattr(session, "spark_session", spark_session)
    monkeypatch.setattr(export, "run_export", run_export)
    monkeypatch.delenv("RAFTLOG_TOKEN", raising=False)  # restored after the test
    token_file = tmp_path / "token"
    token_file.write_text("token-from-its-file\n")
    token_file.chmod(0o600)
    arguments = argparse.Namespace(master="local[1]", topic="t", to="parquet:/nowhere", format=None, start=None,
                                   until=None, group=None, skip_lost=False, token_file=token_file)
    before = os.umask(0o022)  # the commonest umask would leave a default-mode file readable by all
    try:
        assert export.export_command(arguments, ["127.0.0.1:1"]) == 2
        assert export.export_command(arguments, ["127.0.0.1:1"]) == 2
    finally:
        os.umask(before)

    (first, file_mode, directory_mode, text), (second, *_) = seen
    assert (file_mode, directory_mode) == (0o600, 0o700)
    assert "rootLogger.level = error" in text
    assert first.parent.parent == Path(tempfile.gettempdir()), "a directory of its own in the temporary one"
    assert first.parent != second.parent, "a fresh name every time"
    assert not first.exists() and not first.parent.exists() and not second.parent.exists(), "removed after"
