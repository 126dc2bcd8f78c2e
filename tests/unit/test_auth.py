"""Bearer tokens and rights (multiraft/metadata/auth.py), and the catalog's tokens."""

from __future__ import annotations

import pytest

from multiraft.errors import InvalidRequest, UnknownToken
from multiraft.metadata import Catalog, DeleteToken, PutToken
from multiraft.metadata.auth import ADMIN, Principal, authenticate, check_rights, token_digest
from raftlog.types import Index


def test_rights_are_per_topic_with_a_wildcard_and_admin_covers_all():
    reader = Principal("r", frozenset({"read:t1", "write:*"}))
    assert reader.may("read", "t1") and not reader.may("read", "t2")
    assert reader.may("write", "anything") and reader.may("write") and reader.may("read")
    assert not reader.may("admin")
    assert ADMIN.may("admin") and ADMIN.may("read", "x") and ADMIN.may("write")
    assert not Principal("n", frozenset({"read:t1"})).may("write")


@pytest.mark.parametrize("rights", [[], ["root"], ["read:"], ["read:a b"], "admin", [1], ["admin"] * 101])
def test_bad_rights_are_refused(rights):
    with pytest.raises(InvalidRequest):
        check_rights(rights)


def test_headers_authenticate_the_admin_or_a_catalog_token_only():
    tokens = {token_digest("tok-1"): ("reader", ("read:t1",))}
    admin = b"admin-secret-0123456789"
    assert authenticate("Bearer admin-secret-0123456789", admin, tokens.get) is ADMIN
    assert authenticate("Bearer tok-1", admin, tokens.get) == Principal("reader", frozenset({"read:t1"}))
    for header in (None, "", "Bearer ", "Basic dG9rLTE=", "Bearer tok-2", "bearer tok-1"):
        assert authenticate(header, admin, tokens.get) is None, header


def test_the_catalog_keeps_digests_replaces_by_name_and_restores_them():
    catalog = Catalog()
    first = PutToken(name="reader", digest=token_digest("one"), rights=("read:t1",))
    assert catalog.apply(Index(1), first).ok
    assert catalog.token_by_digest(token_digest("one")) == ("reader", ("read:t1",))
    assert catalog.apply(Index(2), PutToken(name="reader", digest=token_digest("two"), rights=("read:*",))).ok
    assert catalog.token_by_digest(token_digest("one")) is None, "a replaced token stops working"
    restored = Catalog.restore(catalog.snapshot())
    assert restored.token_by_digest(token_digest("two")) == ("reader", ("read:*",))
    assert b"two" not in catalog.snapshot(), "no token in clear"
    clash = PutToken(name="other", digest=token_digest("two"), rights=("read:*",))
    assert isinstance(catalog.apply(Index(3), clash).error, InvalidRequest)
    assert isinstance(catalog.apply(Index(4), DeleteToken(name="nobody")).error, UnknownToken)
    assert catalog.apply(Index(5), DeleteToken(name="reader")).ok and not catalog.tokens
    with pytest.raises(InvalidRequest):
        PutToken(name="x", digest="not-hex", rights=("admin",))
