"""A mirror link's record filter spec (multiraft/metadata/record_filter.py, docs/mirror.md "Record filters").

Goal: the API's form parses into the command's and back; malformed specs (shapes, sizes,
counts, duplicates, bad UTF-8) are refused with InvalidRequest; matching follows the
clauses (any clause; a null key never matches a prefix); the link carries the filter
through its command's encoding, the catalog's snapshot and its description; a link with a
filter needs feature level 3 and one without is written byte for byte as before.
"""

from __future__ import annotations

import pytest

from multiraft.errors import InvalidRequest
from multiraft.metadata.catalog import Catalog
from multiraft.metadata.commands import decode_command, encode_command
from multiraft.metadata.features import FeatureLevel, required_level
from multiraft.metadata.mirror_commands import CreateMirrorLink
from multiraft.metadata.record_filter import (
    CLAUSES_MAX,
    RecordMatcher,
    check_record_filter,
    describe_record_filter,
    parse_record_filter,
)
from raftlog.types import Index

API = [{"key_prefix": "eu-"}, {"header": "tenant"}, {"header": "kind", "value": "order"}]
SPEC = (("key_prefix", "eu-"), ("header", "tenant"), ("header", "kind", "order"))


def test_the_api_form_parses_into_the_command_form_and_back() -> None:
    assert parse_record_filter(API) == SPEC
    assert describe_record_filter(SPEC) == API
    assert describe_record_filter(None) is None


@pytest.mark.parametrize("document", [
    None, [], {}, "eu-", [{"key_prefix": ""}], [{"key_prefix": 1}], [{"key_prefix": "x" * 257}],
    [{"key_prefix": "é" * 129}],  # 258 bytes
    [{"header": ""}], [{"header": "a", "value": 3}], [{"header": "a", "value": "v" * 257}],
    [{"key_prefix": "a", "header": "b"}], [{"value": "v"}], [{"other": "x"}], ["eu-"], [None],
    [{"key_prefix": "a"}] * 2, [{"key_prefix": f"p{i}"} for i in range(CLAUSES_MAX + 1)],
    [{"key_prefix": "\ud800"}],  # no UTF-8 encoding
])
def test_malformed_specs_are_refused(document: object) -> None:
    with pytest.raises(InvalidRequest):
        parse_record_filter(document)


@pytest.mark.parametrize("spec", [(), ("key_prefix", "a"), (("key_prefix",),), (("key_prefix", "a", "b"),),
                                  (("header", "a", "b", "c"),), (("other", "a"),), [("key_prefix", "a")]])
def test_malformed_command_forms_are_refused(spec: object) -> None:
    with pytest.raises(InvalidRequest):
        check_record_filter(spec)


def test_bounds_are_accepted_at_their_edges() -> None:
    assert parse_record_filter([{"key_prefix": f"p{i}"} for i in range(CLAUSES_MAX)]) is not None
    assert parse_record_filter([{"key_prefix": "x" * 256}, {"header": "h", "value": ""}]) is not None


@pytest.mark.parametrize(("key", "headers", "copied"), [
    (b"eu-1", (), True), (b"us-1", (), False), (None, (), False), (b"eu", (), False),
    (None, (("tenant", b"x"),), True), (b"us", (("kind", b"order"),), True),
    (b"us", (("kind", b"orders"),), False), (b"us", (("Tenant", b""),), False),
])
def test_a_record_is_copied_if_any_clause_matches(key: bytes | None, headers: tuple[tuple[str, bytes], ...],
                                                   copied: bool) -> None:
    assert RecordMatcher.of(SPEC).matches(key, headers) is copied


def _link(**fields: object) -> CreateMirrorLink:
    return CreateMirrorLink(name="dr", sources=("127.0.0.1:8080",), pattern="orders*", **fields)  # type: ignore[arg-type]


def test_the_link_carries_its_filter_through_the_log_and_the_snapshot() -> None:
    command = _link(record_filter=SPEC)
    assert decode_command(encode_command(command)) == command
    assert b"record_filter" not in encode_command(_link())  # as before filters existed
    catalog = Catalog()
    assert catalog.apply(Index(1), command).ok
    assert catalog.mirror_links["dr"].record_filter == SPEC
    assert catalog.mirror_links["dr"].describe()["record_filter"] == API
    restored = Catalog.restore(catalog.snapshot())
    assert restored.mirror_links["dr"].record_filter == SPEC and restored.snapshot() == catalog.snapshot()
    plain = Catalog()
    assert plain.apply(Index(1), _link()).ok
    assert b"record_filter" not in plain.snapshot() and plain.mirror_links["dr"].describe()["record_filter"] is None


def test_a_link_with_a_filter_needs_level_3() -> None:
    assert required_level(_link(record_filter=SPEC))[0] is FeatureLevel.MIRROR_FILTER
    assert required_level(_link())[0] is FeatureLevel.NONE


def test_a_malformed_filter_in_a_command_is_refused() -> None:
    with pytest.raises(InvalidRequest):
        decode_command(encode_command(_link(record_filter=SPEC)).replace(b'"eu-"', b'""'))


def test_the_cli_filter_flags_parse_into_the_api_form() -> None:
    from multiraft.cli.mirror_commands import _filter_cell, parse_filters

    flags = ["key-prefix=eu-", "header=tenant", "header=kind=order"]
    assert parse_filters(flags) == API and parse_filters(None) is None
    assert _filter_cell(API) == " ".join(flags) and _filter_cell(None) == "-"
    for bad in ("key_prefix=eu", "header", "prefix=x", "key-prefix"):
        with pytest.raises(ValueError):
            parse_filters([bad])


@pytest.mark.asyncio
async def test_the_metadata_leader_refuses_a_filtered_link_below_level_3_made_there_or_forwarded() -> None:
    from multiraft.metadata.features import FinalizeFeatureLevel
    from raftlog.errors import ClientError
    from tests.unit.test_feature_level import leader_and_follower

    filtered = _link(record_filter=SPEC)
    async with leader_and_follower() as (leader, replica, catalog, follower, _):
        assert catalog.apply(Index(3), FinalizeFeatureLevel(level=2)).ok
        for ops in (leader, follower):
            with pytest.raises(ClientError) as refused:
                await ops.propose(filtered)
            assert refused.value.code == "FEATURE_LEVEL_UNSUPPORTED" and "needs feature level 3" in refused.value.message
        assert replica.proposed == []
        await leader.propose(_link())  # without a filter: as before
        assert catalog.apply(Index(4), FinalizeFeatureLevel(level=3)).ok
        await follower.propose(filtered)
        assert len(replica.proposed) == 2
