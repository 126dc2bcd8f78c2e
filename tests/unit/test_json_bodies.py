"""Goal (issue 21, family 1): a JSON body's parse is bounded before it starts, and a
large produce body never holds the event loop for the length of its parse.

- `structure_count` is an upper bound on what a parser builds, for any document;
- 15 MiB of `[]` is refused (413) without being parsed: in milliseconds and
  without allocating more than a slice of the body (twice);
- `jsonrecords.loads` (record by record) accepts and returns exactly what
  `json.loads` does;
- a large produce body decoded in the worker leaves the event loop free; on main it
  held it for seconds (2.65 s for 14.6 MiB of `[]`).
"""

from __future__ import annotations

import asyncio
import gc
import json
import time
import tracemalloc
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from multiraft.errors import InvalidRequest, RequestTooLarge
from multiraft.http import jsonrecords, jsontext, produce_body
from multiraft.http.limits import JSON_BULK_VALUES_MAX
from multiraft.http.params import decode_json
from multiraft.http.produce_body import PARTITION_FIELDS, _decode

MiB = 1 << 20
_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text()
documents = st.recursive(_scalars, lambda children: st.lists(children, max_size=5)
                         | st.dictionaries(st.text(max_size=5), children, max_size=5), max_leaves=30)


def _values(document: Any) -> int:
    """Values and keys in `document` (what a parser allocates)."""
    if isinstance(document, list):
        return 1 + sum(_values(item) for item in document)
    if isinstance(document, dict):
        return 1 + len(document) + sum(_values(item) for item in document.values())
    return 1


def _empties(size: int) -> bytes:
    return b"[" + b",".join([b"[]"] * (size // 3)) + b"]"


@given(documents, st.sampled_from([(",", ":"), (", ", ": ")]))
def test_structure_count_bounds_what_a_parser_builds(document: Any, separators: tuple[str, str]) -> None:
    body = json.dumps(document, separators=separators).encode()
    assert _values(document) <= jsontext.structure_count(body) + 1


def _outcome(parse: Any, body: bytes) -> tuple[str, Any]:
    try:
        return "ok", parse(body)
    except InvalidRequest as error:
        return ("constant" if "standard JSON" in str(error) else "invalid"), None
    except (ValueError, RecursionError):
        return "invalid", None


def _stdlib(body: bytes) -> Any:
    return json.loads(body, parse_constant=jsontext.refuse_constant, parse_float=jsontext.finite_float)


def _by_record(body: bytes) -> Any:
    return jsonrecords.loads(body, values_max=1 << 30)


@given(st.lists(documents, max_size=5), st.dictionaries(st.text(max_size=8), documents, max_size=3),
       st.sampled_from(["", " ", "\n\t "]))
def test_record_by_record_parse_equals_the_stdlib(records: list[Any], others: dict[str, Any], space: str) -> None:
    body = json.dumps({**others, "records": records}, indent=space or None).encode()
    assert _outcome(_by_record, body) == _outcome(_stdlib, body)


@given(st.binary(max_size=60) | st.text(alphabet='{}[]",: \t01a\\eNr-', max_size=40).map(str.encode))
def test_record_by_record_parse_fails_where_the_stdlib_fails(noise: bytes) -> None:
    for body in (noise, b'{"records":[' + noise, b'{"records":[1,' + noise + b"]}", b'{"a":' + noise + b"}"):
        ours, theirs = _outcome(_by_record, body), _outcome(_stdlib, body)
        assert ours[0] == theirs[0] and ours[1] == theirs[1], body


@pytest.mark.parametrize("body", [b'{"records":[1,]}', b'{"records":[1] x', b'{"records":"a\x01"}', b"\xef\xbb\xbf{}",
                                  '{"records":[1]}'.encode("utf-16-le"), b'{"records":[1],"records":[2]}',
                                  b'{"records":[' + b"[" * 5000 + b"]" * 5000 + b"]}", b""])
def test_record_by_record_parse_on_the_edges(body: bytes) -> None:
    assert _outcome(_by_record, body) == _outcome(_stdlib, body)


@pytest.mark.parametrize("parse", [lambda b: jsontext.loads(b, values_max=JSON_BULK_VALUES_MAX),
                                   lambda b: jsonrecords.loads(b, values_max=JSON_BULK_VALUES_MAX)])
def test_fifteen_mib_of_empty_arrays_is_refused_unparsed(parse: Any) -> None:
    body = _empties(15 * MiB)
    tracemalloc.start()
    started = time.perf_counter()
    with pytest.raises(RequestTooLarge, match="JSON values"):
        parse(body)
    seconds = time.perf_counter() - started
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 3 * MiB, peak  # a 1 MiB slice and its structural characters; on main 750 MiB of lists
    assert seconds < 1.0, seconds  # on main: 2.65 s to parse; a count is tens of ms on a loaded box


def test_a_body_within_the_bound_is_parsed_and_one_beyond_refused() -> None:
    fits = b'{"records":[' + b",".join([b"[1]"] * 1000) + b"]}"  # { : [, 1,000 [, 999 ,: 2,002
    assert len(jsontext.loads(fits, values_max=2_002)["records"]) == 1000
    with pytest.raises(RequestTooLarge):
        jsontext.loads(fits, values_max=2_001)


@pytest.mark.asyncio
async def test_a_large_produce_body_leaves_the_event_loop_free() -> None:
    """A hostile 15 MiB body and a legitimate 10,000-record one, decoded as a produce
    does above the inline bound, while the loop measures how late it wakes."""
    legit = json.dumps({"records": [{"key": f"k{i}", "value": {"id": i, "tags": ["a", "b"]}}
                                    for i in range(10_000)]}).encode()
    hostile = b'{"records":[' + b",".join([b'{"value":' + _empties(1570) + b"}"] * 10_000) + b"]}"
    loop = asyncio.get_running_loop()
    for body in (hostile, legit):
        work = asyncio.ensure_future(decode_json(body, _decode, PARTITION_FIELDS, "quorum", True))
        worst = 0.0
        async with asyncio.timeout(60):
            while not work.done():
                due = loop.time() + 0.001
                await asyncio.sleep(0.001)
                worst = max(worst, loop.time() - due)
        if body is hostile:
            with pytest.raises(RequestTooLarge):
                work.result()
        else:
            assert len(work.result().records) == 10_000
        # A few switch intervals (5 ms) on a loaded box; on main the hostile body held it 2.65 s.
        assert worst < 0.1, f"the loop was held {worst * 1000:.0f} ms"


def test_each_scanner_call_parses_one_record_at_most(monkeypatch: pytest.MonkeyPatch) -> None:
    """The GIL is held for one C call at a time: none may span two records."""
    scanned: list[int] = []
    scan = jsonrecords._scan_once

    def measured(text: str, index: int) -> tuple[Any, int]:
        value, end = scan(text, index)
        scanned.append(end - index)
        return value, end

    monkeypatch.setattr(jsonrecords, "_scan_once", measured)
    record = {"value": {"n": 1, "tags": ["a", "b"]}}
    body = json.dumps({"acks": "all", "records": [record] * 100}).encode()
    assert len(_decode(body, PARTITION_FIELDS, "quorum", False).records) == 100  # as a produce parses
    assert len(scanned) == 101 and max(scanned) == len(json.dumps(record))


def test_the_collector_is_paused_while_a_body_becomes_records(monkeypatch: pytest.MonkeyPatch) -> None:
    """A collection during the decode would walk every object it made, in one C call."""
    seen = []
    parse_records = produce_body.parse_records
    monkeypatch.setattr(produce_body, "parse_records", lambda *args: seen.append(gc.isenabled()) or parse_records(*args))
    assert gc.isenabled()
    _decode(b'{"records":[{"value":1}]}', PARTITION_FIELDS, "quorum", True)
    assert seen == [False] and gc.isenabled()
