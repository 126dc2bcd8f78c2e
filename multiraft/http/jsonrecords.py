"""A produce body parsed one record at a time, so a worker thread gives the GIL back.

`json.loads` is one C call: it holds the GIL from the first byte to the last, so
parsing a 15 MiB body of legitimate records in a worker thread still stalls the
event loop for its whole duration (tens of milliseconds; bench/json_bodies.py). This
parser walks the body's top-level object and its `records` array in Python and
hands each key and each record to the stdlib's C scanner (`scan_once`), so the
interpreter may switch threads between two records: the longest call is one
record, not the body. The text is decoded in slices for the same reason.

It accepts exactly what `json.loads` accepts and returns the same document
(duplicate keys: the last wins; the same number and constant hooks as
`jsontext.loads`), which a test checks against the stdlib on every shape.
What still runs as one call is a single record, whose values the caller bounds
(`jsontext.check_values`).
"""

from __future__ import annotations

import codecs
import json
import json.decoder
import json.scanner
import re
from typing import Any

from multiraft.errors import InvalidRequest
from multiraft.http import jsontext

_DECODE_SLICE_BYTES = 1 << 20
_WHITESPACE = re.compile(r"[ \t\n\r]*")
_SPACE = frozenset(" \t\n\r")  # a set: the empty string (the text's end) is not in it
_scan_once = json.scanner.make_scanner(json.JSONDecoder(  # the C scanner when built (always in CPython)
    parse_constant=jsontext.refuse_constant, parse_float=jsontext.finite_float))
_scan_string = json.decoder.scanstring
RECORDS_FIELD = "records"


def _text(body: bytes) -> str:
    """`body` decoded as `json.loads` would (its detected encoding), one slice per call."""
    decoder = codecs.getincrementaldecoder(json.detect_encoding(body))("surrogatepass")
    parts = [decoder.decode(body[start:start + _DECODE_SLICE_BYTES])
             for start in range(0, len(body), _DECODE_SLICE_BYTES)]
    parts.append(decoder.decode(b"", final=True))
    return "".join(parts)


def _skip(text: str, index: int) -> int:
    match = _WHITESPACE.match(text, index)
    assert match is not None  # the pattern matches the empty string
    return match.end()


def _value(text: str, index: int) -> tuple[Any, int]:
    try:
        return _scan_once(text, index)
    except StopIteration as stop:
        raise json.JSONDecodeError("Expecting value", text, stop.value) from None


def _expect(text: str, index: int, closing: str, what: str) -> tuple[bool, int]:
    """After a member: (whether `closing` ended the container, the index after the delimiter)."""
    index = _skip(text, index)
    char = text[index:index + 1]
    if char == closing:
        return True, index + 1
    if char != ",":
        raise json.JSONDecodeError(f"Expecting ',' delimiter{what}", text, index)
    return False, _skip(text, index + 1)


def _array(text: str, index: int) -> tuple[list[Any], int]:
    """The array opening at `index`, one scanner call per element.

    The loop is the one per record: whitespace is skipped only where there is some
    (a compact body has none), so it costs about a microsecond per record.
    """
    items: list[Any] = []
    append = items.append
    index = _skip(text, index + 1)
    if text[index:index + 1] == "]":
        return items, index + 1
    while True:
        try:
            item, index = _scan_once(text, index)
        except StopIteration as stop:
            raise json.JSONDecodeError("Expecting value", text, stop.value) from None
        append(item)
        char = text[index:index + 1]
        if char in _SPACE:
            index = _skip(text, index)
            char = text[index:index + 1]
        if char == "]":
            return items, index + 1
        if char != ",":
            raise json.JSONDecodeError("Expecting ',' delimiter", text, index)
        index += 1
        if text[index:index + 1] in _SPACE:
            index = _skip(text, index)


def _object(text: str, index: int) -> tuple[dict[str, Any], int]:
    """The object opening at `index`; its `records` array parsed by `_array`."""
    document: dict[str, Any] = {}
    index = _skip(text, index + 1)
    if text[index:index + 1] == "}":
        return document, index + 1
    while True:
        if text[index:index + 1] != '"':
            raise json.JSONDecodeError("Expecting property name enclosed in double quotes", text, index)
        key, index = _scan_string(text, index + 1, True)
        index = _skip(text, index)
        if text[index:index + 1] != ":":
            raise json.JSONDecodeError("Expecting ':' delimiter", text, index)
        index = _skip(text, index + 1)
        if key == RECORDS_FIELD and text[index:index + 1] == "[":
            document[key], index = _array(text, index)
        else:
            document[key], index = _value(text, index)
        closed, index = _expect(text, index, "}", "")
        if closed:
            return document, index


def _document(text: str) -> Any:
    index = _skip(text, 0)
    if text[index:index + 1] == "{":
        document, index = _object(text, index)
    else:
        document, index = _value(text, index)
    index = _skip(text, index)
    if index != len(text):
        raise json.JSONDecodeError("Extra data", text, index)
    return document


def loads(body: bytes, *, values_max: int) -> Any:
    """`jsontext.loads(body, check_depth=False, values_max=values_max)`, record by record."""
    jsontext.check_values(body, values_max)
    try:
        text = _text(body)
        with jsontext.collector_paused():
            return _document(text)
    except RecursionError:
        raise InvalidRequest(f"body nests deeper than {jsontext.JSON_DEPTH_MAX} levels") from None
    except (ValueError, UnicodeDecodeError) as error:
        raise InvalidRequest(f"body is not valid JSON: {error}") from None
