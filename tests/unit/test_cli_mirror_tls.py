"""`raftlog mirror create --source-tls [--source-ca FILE]` (multiraft/cli/mirror_commands.py):
the flags parse, the CA file's PEM text reaches the client, a CA without --source-tls, a file
too large or not text are refused before any call; `mirror list` shows the scheme and the CA
summed up, never the bundle."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from multiraft.cli import mirror_commands
from multiraft.cli.main import build_parser

PEM = "-----BEGIN CERTIFICATE-----\nMAA=\n-----END CERTIFICATE-----\n"
FINGERPRINT = "AB:" * 31 + "AB"


class _Client:
    def __init__(self) -> None:
        self.created: list[tuple[Any, ...]] = []

    def create_mirror(self, *arguments: Any, record_filter: Any = None) -> dict[str, Any]:
        self.created.append(arguments)
        assert record_filter is None
        tls, ca = arguments[6], arguments[7]
        return {"name": arguments[0], "sources": arguments[1], "topics": arguments[2], "priority": arguments[3],
                "state": "running", "credentials": False, "scheme": "https" if tls else "http",
                "source_ca": {"certificates": 1, "fingerprints_sha256": [FINGERPRINT]} if ca else None}

    def list_mirrors(self) -> list[dict[str, Any]]:
        return [{"name": "old", "sources": ["a:1"], "topics": "t", "priority": "normal", "state": "running",
                 "credentials": True}]  # a sink of an earlier version: no scheme field


def _args(*argv: str) -> Any:
    return build_parser().parse_args(["mirror", "create", "dr", "--source", "s1:8080,s2:8080", "--topics", "o*",
                                      *argv])


def test_source_tls_and_ca_reach_the_client_and_are_shown(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text(PEM)
    client = _Client()
    assert mirror_commands.mirror_create(client, _args("--source-tls", "--source-ca", str(ca))) == 0  # type: ignore[arg-type]
    assert mirror_commands.mirror_create(client, _args("--source-tls")) == 0  # type: ignore[arg-type]
    assert mirror_commands.mirror_create(client, _args()) == 0  # type: ignore[arg-type]
    assert [c[6:8] for c in client.created] == [(True, PEM), (True, None), (False, None)]
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:3] == ["LINK", "SCHEME", "SOURCES"] and "CA" in lines[0].split()
    assert "https" in lines[1] and "1 cert(s), sha256 AB:AB:AB:AB:AB:AB:AB:AB.." in lines[1]
    assert "https" in lines[3] and "system" in lines[3]
    assert " http " in lines[5] and "MAA=" not in "\n".join(lines)
    assert mirror_commands.mirror_list(client, None) == 0  # type: ignore[arg-type]
    assert " http " in capsys.readouterr().out.splitlines()[1]


def test_a_ca_without_tls_or_not_a_small_text_file_is_refused_before_any_call(tmp_path: Path) -> None:
    client = _Client()
    ca, big, binary = tmp_path / "ca.pem", tmp_path / "big.pem", tmp_path / "ca.der"
    ca.write_text(PEM)
    big.write_text("x" * (64 * 1024 + 1))
    binary.write_bytes(b"\x30\x82\x01\xff\xfe")
    for argv, message in ((("--source-ca", str(ca)), "add --source-tls"),
                          (("--source-tls", "--source-ca", str(big)), "larger than 65536 bytes"),
                          (("--source-tls", "--source-ca", str(binary)), "not PEM text"),
                          (("--source-tls", "--source-ca", str(tmp_path / "none.pem")), "cannot read")):
        with pytest.raises(ValueError, match=message):
            mirror_commands.mirror_create(client, _args(*argv))  # type: ignore[arg-type]
    assert client.created == []
