"""Parse and run data-driven interaction scripts (etcd-io/raft's `datadriven` format).

A script is a sequence of blocks, separated by blank lines:

    # comment lines say what the next steps are meant to show
    command arg key=value
    ----
    expected output (never blank: a command that prints nothing prints `ok`)

Why scripts rather than Python assertions? The expected output *is* the
specification: every message, Ready and state change of a scenario is written
out, so a reviewer reads what the protocol did, and any change in the core's
behaviour shows up as a diff to be read and judged. `REWRITE=1` regenerates the
outputs in place (comments and commands are kept verbatim); commit a rewrite
only after reading its diff.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

SEPARATOR = "----"
EMPTY_OUTPUT = "ok"


class ScriptError(Exception):
    """A malformed script or command (distinct from an output mismatch)."""


@dataclass(frozen=True, slots=True)
class Command:
    """One parsed command line: `name pos1 pos2 key=value ...`."""

    name: str
    positional: tuple[str, ...]
    options: dict[str, str]
    line: int

    @classmethod
    def parse(cls, text: str, line: int) -> Command:
        tokens = shlex.split(text)
        positional: list[str] = []
        options: dict[str, str] = {}
        for token in tokens[1:]:
            key, eq, value = token.partition("=")
            if eq:
                options[key] = value
            else:
                positional.append(token)
        return cls(tokens[0], tuple(positional), options, line)

    def int_at(self, position: int) -> int:
        try:
            return int(self.positional[position])
        except (IndexError, ValueError) as error:
            raise ScriptError(
                f"line {self.line}: {self.name} wants an integer argument {position + 1}"
            ) from error

    def option(self, key: str, default: str) -> str:
        return self.options.get(key, default)

    def int_option(self, key: str, default: int) -> int:
        return int(self.options.get(key, default))

    def bool_option(self, key: str, default: bool) -> bool:
        value = self.options.get(key)
        if value is None:
            return default
        if value not in ("true", "false"):
            raise ScriptError(f"line {self.line}: {key} must be true or false, not {value!r}")
        return value == "true"

    def ids_option(self, key: str) -> list[int] | None:
        """`key=1,2,3` as a list of ints (`key=` is the empty list); None when absent."""
        value = self.options.get(key)
        if value is None:
            return None
        return [int(part) for part in value.split(",") if part]

    def check_known(self, *keys: str) -> None:
        """Reject misspelled options: a silently ignored option makes a script lie."""
        unknown = set(self.options) - set(keys)
        if unknown:
            raise ScriptError(
                f"line {self.line}: {self.name} has unknown options {sorted(unknown)}"
            )


@dataclass(slots=True)
class Block:
    command_text: str
    line: int
    expected: list[str]
    actual: list[str] = field(default_factory=list)


# A script is kept as items in file order: verbatim text lines (comments, blanks) or blocks.
Item = str | Block


def parse_script(text: str) -> list[Item]:
    lines = text.splitlines()
    items: list[Item] = []
    position = 0
    while position < len(lines):
        line = lines[position]
        if not line.strip() or line.startswith("#"):
            items.append(line)
            position += 1
            continue
        if position + 1 >= len(lines) or lines[position + 1] != SEPARATOR:
            raise ScriptError(
                f"line {position + 1}: command {line!r} is not followed by {SEPARATOR!r}"
            )
        block = Block(line, position + 1, [])
        position += 2
        while position < len(lines) and lines[position].strip():
            block.expected.append(lines[position])
            position += 1
        items.append(block)
    return items


def render_script(items: list[Item]) -> str:
    """The script with each block's *actual* output (what REWRITE writes back)."""
    out: list[str] = []
    for item in items:
        if isinstance(item, Block):
            out.extend([item.command_text, SEPARATOR, *item.actual])
        else:
            out.append(item)
    return "\n".join(out) + "\n"


def normalize_output(raw: list[str]) -> list[str]:
    lines = [line.rstrip() for line in raw]
    assert all(lines), "handlers never print blank lines (they would end the block)"
    return lines or [EMPTY_OUTPUT]


def run_script(path: Path, execute: Callable[[Command], list[str]]) -> None:
    """Run every block of `path` through `execute`; raise AssertionError on mismatches.

    All blocks run even after a mismatch, so one report lists every difference.
    With `REWRITE=1` in the environment the file is rewritten instead.
    """
    items = parse_script(path.read_text())
    rewrite = bool(os.environ.get("REWRITE"))
    for item in items:
        if isinstance(item, Block):
            item.actual = list(item.expected)  # blocks that never run keep their text
    mismatches: list[str] = []
    try:
        for item in items:
            if not isinstance(item, Block):
                continue
            command = Command.parse(item.command_text, item.line)
            item.actual = normalize_output(execute(command))
            if item.actual != item.expected:
                mismatches.append(_describe_mismatch(path, item))
    finally:
        # A failing `check` or a broken command still rewrites what ran, to help debugging.
        if rewrite:
            path.write_text(render_script(items))
    if rewrite:
        return
    if mismatches:
        raise AssertionError("\n\n".join(mismatches))


def _describe_mismatch(path: Path, block: Block) -> str:
    expected = "\n".join("  " + line for line in block.expected)
    actual = "\n".join("  " + line for line in block.actual)
    return (
        f"{path.name}:{block.line}: {block.command_text}\nexpected:\n{expected}\nactual:\n{actual}"
    )
