"""A mirror link's record filter (issue 24, docs/mirror.md "Record filters"): which records it copies.

Pure. Up to `CLAUSES_MAX` clauses; a record is copied if ANY clause matches it:
- `{"key_prefix": P}`: its key starts with the UTF-8 bytes of P (a null key never matches);
- `{"header": N}`: it carries a header named N;
- `{"header": N, "value": V}`: it carries a header named N whose value is the UTF-8 bytes of V.

Two forms. The API's (a list of those objects, `parse_record_filter`, `describe_record_filter`)
and the command's, the one the catalog keeps and group 0's log and snapshots hold: a tuple of
tuples, `("key_prefix", P)`, `("header", N)` or `("header", N, V)` (JSON lists once written),
checked by `check_record_filter` on every replica as the other fields of a link are. A link
without a filter (None) copies everything, as before filters existed.

The filter is fixed when the link is made: it decides what the mirror's log holds (the
records left out are gaps there), so changing it would make one mirror hold two selections.
"""

from __future__ import annotations

from dataclasses import dataclass

from multiraft.errors import InvalidRequest

CLAUSES_MAX = 16
TEXT_BYTES_MAX = 256  # a prefix, a header name or a header value, in UTF-8 bytes

Clause = tuple[str, ...]
RecordFilterSpec = tuple[Clause, ...]

_FILTER_SHAPE = ('record_filter is a list of 1..16 clauses: {"key_prefix": TEXT}, {"header": NAME} or '
                 '{"header": NAME, "value": TEXT} (each text 1..256 UTF-8 bytes, a value 0..256)')


def _text_bytes(text: object, what: str, least: int) -> bytes:
    if not isinstance(text, str):
        raise InvalidRequest(f"record_filter: {what} is a string")
    try:
        data = text.encode()
    except UnicodeEncodeError:
        raise InvalidRequest(f"record_filter: {what} is not valid UTF-8 text") from None
    if not least <= len(data) <= TEXT_BYTES_MAX:
        raise InvalidRequest(f"record_filter: {what} is {least}..{TEXT_BYTES_MAX} UTF-8 bytes")
    return data


def check_record_filter(spec: object) -> None:
    """The command's form: None, or 1..16 clauses of the shapes above (InvalidRequest if not)."""
    if spec is None:
        return
    if not isinstance(spec, tuple) or not 1 <= len(spec) <= CLAUSES_MAX:
        raise InvalidRequest(_FILTER_SHAPE)
    for clause in spec:
        if not isinstance(clause, tuple) or not clause:
            raise InvalidRequest(_FILTER_SHAPE)
        kind = clause[0]
        if kind == "key_prefix" and len(clause) == 2:
            _text_bytes(clause[1], "a key prefix", 1)
        elif kind == "header" and len(clause) in (2, 3):
            _text_bytes(clause[1], "a header name", 1)
            if len(clause) == 3:
                _text_bytes(clause[2], "a header value", 0)
        else:
            raise InvalidRequest(_FILTER_SHAPE)
    if len(set(spec)) != len(spec):
        raise InvalidRequest("record_filter: a clause is listed twice")


def parse_record_filter(document: object) -> RecordFilterSpec:
    """The API's form (a list of clause objects) as the command's."""
    if not isinstance(document, list):
        raise InvalidRequest(_FILTER_SHAPE)
    clauses: list[Clause] = []
    for item in document:
        if isinstance(item, dict) and set(item) == {"key_prefix"}:
            clauses.append(("key_prefix", item["key_prefix"]))
        elif isinstance(item, dict) and set(item) in ({"header"}, {"header", "value"}):
            clauses.append(("header", item["header"], *((item["value"],) if "value" in item else ())))
        else:
            raise InvalidRequest(_FILTER_SHAPE)
    spec = tuple(clauses)
    check_record_filter(spec)
    return spec


def describe_record_filter(spec: RecordFilterSpec | None) -> list[dict[str, str]] | None:
    """The API's form of a checked spec (None: no filter)."""
    if spec is None:
        return None
    described: list[dict[str, str]] = []
    for clause in spec:
        if clause[0] == "key_prefix":
            described.append({"key_prefix": clause[1]})
        else:
            described.append({"header": clause[1], **({"value": clause[2]} if len(clause) == 3 else {})})
    return described


def spec_from_json(value: object) -> object:
    """JSON lists (a command or snapshot as written) back into the command's tuples; anything
    else is returned as it is, for `check_record_filter` to refuse."""
    if isinstance(value, list):
        return tuple(tuple(c) if isinstance(c, list) else c for c in value)
    return value


@dataclass(frozen=True, slots=True)
class RecordMatcher:
    """A checked spec, ready to test records: any clause matching copies the record."""

    key_prefixes: tuple[bytes, ...]
    header_names: frozenset[str]
    header_values: frozenset[tuple[str, bytes]]

    @classmethod
    def of(cls, spec: RecordFilterSpec) -> RecordMatcher:
        assert spec, "a filter has at least one clause"
        return cls(tuple(c[1].encode() for c in spec if c[0] == "key_prefix"),
                   frozenset(c[1] for c in spec if c[0] == "header" and len(c) == 2),
                   frozenset((c[1], c[2].encode()) for c in spec if c[0] == "header" and len(c) == 3))

    def matches(self, key: bytes | None, headers: tuple[tuple[str, bytes], ...]) -> bool:
        if key is not None and self.key_prefixes and key.startswith(self.key_prefixes):
            return True
        for name, value in headers:
            if name in self.header_names or (name, value) in self.header_values:
                return True
        return False
