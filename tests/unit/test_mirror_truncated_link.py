"""A link's `on_source_truncated` in the catalog and on the command line (docs/mirror.md
"States"): the command's and the snapshot's encodings (round trips with and without it;
encodings from before it decode as `stop`; a `stop` link is written byte for byte as
before), every malformed value refused with the one error type, the change in place
(`SetMirrorLinkPolicy`), what a link shows, and the CLI's flags."""

from __future__ import annotations

import argparse
import dataclasses
import json
from typing import Any

import pytest

from multiraft.cli import mirror_commands
from multiraft.cli.main import build_parser
from multiraft.errors import InvalidRequest, SnapshotFormatError, UnknownMirrorLink
from multiraft.metadata.catalog import Catalog
from multiraft.metadata.commands import decode_command, encode_command
from multiraft.metadata.mirror_commands import (
    CreateMirrorLink,
    LinkState,
    MirrorLink,
    OnSourceTruncated,
    Priority,
    SetMirrorLinkPolicy,
)
from multiraft.node.mirror_source import source_client
from raftlog.types import Index
from tests.unit.test_mirror_catalog import _catalog
from tests.unit.test_mirror_link_tls import _link

# What a link command encoded before TLS and on_source_truncated existed (as
# tests/unit/test_mirror_link_tls.py has it): a `stop` link is still written so.
OLDER = (b'{"name":"dr","pattern":"t","priority":"normal","sources":["h:1"],"token":null,'
         b'"type":"create_mirror_link","v":1,"verify_interval_s":null}')
CA = "-----BEGIN CERTIFICATE-----\nMAA=\n-----END CERTIFICATE-----\n"  # a DER SEQUENCE: the shape check's minimum


# Goal: the field survives the command's encoding; `stop` (given or not) is written exactly as
# before the field existed, so an older node applies it; an older node's command decodes as
# `stop`; the change in place round-trips too.
def test_command_round_trips_and_the_default_is_written_as_before() -> None:
    for command in (_link(on_source_truncated="resync"), _link(on_source_truncated=OnSourceTruncated.RESYNC),
                    _link(on_source_truncated="resync", source_tls=True, source_ca=CA, verify_interval_s=60),
                    _link(on_source_truncated="stop"), SetMirrorLinkPolicy(name="dr", on_source_truncated="stop"),
                    SetMirrorLinkPolicy(name="dr", on_source_truncated="resync")):
        assert decode_command(encode_command(command)) == command  # type: ignore[arg-type]
    assert encode_command(_link()) == encode_command(_link(on_source_truncated="stop")) == OLDER
    older = decode_command(OLDER)
    assert isinstance(older, CreateMirrorLink) and older.link().on_source_truncated is OnSourceTruncated.STOP
    resync = json.loads(encode_command(_link(on_source_truncated="resync")))
    assert resync["on_source_truncated"] == "resync" and "source_tls" not in resync


# Goal: the snapshot keeps the policy in the link row's eighth element, beside TLS; a catalog of
# `stop` links snapshots as before (rows of six, or seven with an interval); rows from before it
# (six, seven, eight with TLS only) restore as `stop`; a malformed eighth element is refused.
def test_snapshot_round_trip_and_older_rows_decode() -> None:
    catalog = _catalog(_link(), _link(name="re", on_source_truncated="resync"),
                       _link(name="tls", on_source_truncated="resync", source_tls=True, source_ca=CA,
                             verify_interval_s=60),
                       _link(name="timed", verify_interval_s=60))
    restored = Catalog.restore(catalog.snapshot())
    assert restored.mirror_links == catalog.mirror_links
    assert restored.mirror_links["re"].on_source_truncated is OnSourceTruncated.RESYNC
    rows = {row[0]: row for row in json.loads(catalog.snapshot())["mirror_links"]}
    assert rows["dr"] == ["dr", ["h:1"], "t", "normal", "running", None]
    assert rows["timed"][6:] == [60]
    assert rows["re"][6:] == [None, {"on_source_truncated": "resync"}]
    assert rows["tls"][6:] == [60, {"tls": True, "ca": CA, "on_source_truncated": "resync"}]

    document = json.loads(_catalog().snapshot())
    document["mirror_links"] = [["old6", ["h:1"], "t", "normal", "paused", None],
                                ["old7", ["h:2"], "t*", "low", "running", "tok", 3600],
                                ["old8", ["h:3"], "t", "high", "running", None, None, {"tls": True}]]
    older = Catalog.restore(json.dumps(document).encode())
    assert {name: link.on_source_truncated for name, link in older.mirror_links.items()} == dict.fromkeys(
        ("old6", "old7", "old8"), OnSourceTruncated.STOP)
    assert older.mirror_links["old8"].source_tls is True
    for bad_extra in ({"on_source_truncated": "earliest"}, {"on_source_truncated": None}, {},
                      {"on_source_truncated": "resync", "ca": CA}, {"on_source_truncated": "resync", "x": 1}):
        document["mirror_links"] = [["bad", ["h:1"], "t", "normal", "running", None, None, bad_extra]]
        with pytest.raises(SnapshotFormatError):
            Catalog.restore(json.dumps(document).encode())


# Goal: a malformed value is refused by the commands themselves (so by the HTTP route, the
# decoder of a committed entry and the snapshot alike) with InvalidRequest (400), naming the field.
@pytest.mark.parametrize("value", ["", "Resync", "earliest", "RESYNC", None, 1, True, ["resync"], {"resync": 1}])
def test_a_malformed_policy_is_refused(value: Any) -> None:
    for make in (lambda: _link(on_source_truncated=value),
                 lambda: SetMirrorLinkPolicy(name="dr", on_source_truncated=value)):
        with pytest.raises(InvalidRequest, match="on_source_truncated is stop or resync"):
            make()
    committed = OLDER.replace(b'"v":1', b'"v":1,"on_source_truncated":' + json.dumps(value).encode())
    with pytest.raises(InvalidRequest):
        decode_command(committed)
    assert InvalidRequest("x").http_status == 400


# Goal: the policy changes in place and nothing else of the link does; an unknown link is refused;
# the link shows its policy.
def test_the_policy_changes_in_place_and_is_shown() -> None:
    catalog = _catalog(_link(token="t0k", priority="high"), SetMirrorLinkPolicy(name="dr", on_source_truncated="resync"))
    link = catalog.mirror_links["dr"]
    assert link.on_source_truncated is OnSourceTruncated.RESYNC and link.describe()["on_source_truncated"] == "resync"
    assert link.priority == "high" and link.token == "t0k" and link.state is LinkState.RUNNING
    assert catalog.apply(Index(10), SetMirrorLinkPolicy(name="dr", on_source_truncated="stop")).ok
    assert catalog.mirror_links["dr"].describe()["on_source_truncated"] == "stop"
    assert catalog.mirror_links["dr"].reads_like(link), "a policy change keeps the source's client"
    with pytest.raises(UnknownMirrorLink):
        catalog.validate(SetMirrorLinkPolicy(name="nope", on_source_truncated="resync"))


class _Client:
    def __init__(self) -> None:
        self.created: list[tuple[Any, ...]] = []
        self.altered: list[tuple[str, str]] = []

    def _link(self, name: str, policy: str | None) -> dict[str, Any]:
        return {"name": name, "sources": ["s1:8080"], "topics": "o*", "priority": "normal", "state": "running",
                "credentials": False, "scheme": "http", "source_ca": None, "on_source_truncated": policy or "stop"}

    def create_mirror(self, *arguments: Any, record_filter: Any = None) -> dict[str, Any]:
        self.created.append(arguments)
        assert record_filter is None
        return self._link(arguments[0], arguments[8])

    def alter_mirror(self, name: str, on_source_truncated: str) -> dict[str, Any]:
        self.altered.append((name, on_source_truncated))
        return self._link(name, on_source_truncated)


def _parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["mirror", *argv])


# Goal: `--on-source-truncated` reaches the client (absent: not sent, the sink's default), a
# value outside stop|resync is refused by the parser before any call, `mirror alter` changes it,
# and the link's table shows it.
def test_the_cli_flags(capsys: pytest.CaptureFixture[str]) -> None:
    client = _Client()
    create = ("create", "dr", "--source", "s1:8080", "--topics", "o*")
    assert mirror_commands.mirror_create(client, _parse(*create, "--on-source-truncated", "resync")) == 0  # type: ignore[arg-type]
    assert mirror_commands.mirror_create(client, _parse(*create)) == 0  # type: ignore[arg-type]
    assert [c[8] for c in client.created] == ["resync", None]
    lines = capsys.readouterr().out.splitlines()
    assert "ON TRUNCATED" in lines[0] and lines[1].split()[-3:] == ["resync", "-", "0"] and "stop" in lines[3]
    assert mirror_commands.mirror_alter(client, _parse("alter", "dr", "--on-source-truncated", "stop")) == 0  # type: ignore[arg-type]
    assert client.altered == [("dr", "stop")]
    for argv in ((*create, "--on-source-truncated", "earliest"), ("alter", "dr"),
                 ("alter", "dr", "--on-source-truncated", "RESYNC")):
        with pytest.raises(SystemExit) as refused:
            _parse(*argv)
        assert refused.value.code == 2
    assert "invalid choice: 'earliest'" in capsys.readouterr().err


# What `source_client` (multiraft/node/mirror_source.py) reads of a link, which `reads_like`
# compares, and what it does not: every field of `MirrorLink` is in one of the two, so a field
# added fails here until it is classified (and `reads_like` follows the client's inputs).
READ_BY_SOURCE_CLIENT = frozenset({"sources", "token", "source_tls", "source_ca"})
NOT_READ_BY_SOURCE_CLIENT = frozenset({"name", "pattern", "priority", "state", "verify_interval_s",
                                       "on_source_truncated", "record_filter"})
_OTHER_VALUES: dict[str, Any] = {"name": "dr2", "sources": ("h:2",), "pattern": "u*", "priority": Priority.LOW,
                                 "state": LinkState.PAUSED, "token": "t2", "verify_interval_s": 60,
                                 "source_tls": False, "source_ca": None,
                                 "on_source_truncated": OnSourceTruncated.STOP,
                                 "record_filter": (("key_prefix", "x"),)}


class _Recording:
    """A link whose attribute reads are recorded."""

    def __init__(self, link: MirrorLink, read: set[str]) -> None:
        self._link, self._read = link, read

    def __getattr__(self, name: str) -> Any:
        self._read.add(name)
        return getattr(self._link, name)


# Goal: `reads_like` (whether a pull's source client serves a changed link) compares exactly the
# link fields `source_client` reads, on every path (plain HTTP, HTTPS with the system's store,
# with a CA, with a CA OpenSSL refuses); every MirrorLink field is classified.
def test_reads_like_follows_what_the_source_client_reads() -> None:
    names = {f.name for f in dataclasses.fields(MirrorLink)}
    assert names == READ_BY_SOURCE_CLIENT | NOT_READ_BY_SOURCE_CLIENT, "classify every MirrorLink field"
    assert not READ_BY_SOURCE_CLIENT & NOT_READ_BY_SOURCE_CLIENT
    base = _link(token="t0k", source_tls=True, source_ca=CA, verify_interval_s=3600,
                 on_source_truncated="resync").link()
    read: set[str] = set()
    for link in (base, dataclasses.replace(base, source_ca=None), _link().link()):
        source_client(_Recording(link, read))  # type: ignore[arg-type]
    assert read == READ_BY_SOURCE_CLIENT
    for name in sorted(names):
        changed = dataclasses.replace(base, **{name: _OTHER_VALUES[name]})
        assert getattr(changed, name) != getattr(base, name)
        assert base.reads_like(changed) is (name not in READ_BY_SOURCE_CLIENT), name
