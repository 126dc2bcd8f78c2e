"""Helpers shared by handlers: node-id arguments and client errors as output."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from raftlog.errors import ClientError
from tests.datadriven.env import InteractionEnv
from tests.datadriven.runner import Command, ScriptError

T = TypeVar("T")


def node_ids(command: Command) -> list[int]:
    """All positional arguments as node ids."""
    try:
        return [int(arg) for arg in command.positional]
    except ValueError as error:
        raise ScriptError(f"line {command.line}: {command.name} wants node ids") from error


def client_call(env: InteractionEnv, call: Callable[[], T]) -> T | None:
    """Run a client-facing call; a refusal is part of the scenario, so print it.

    Only `ClientError`s are caught: an assertion inside the core is a bug and
    fails the script.
    """
    try:
        return call()
    except ClientError as error:
        env.print(f"error: {error.code}: {error.message}")
        return None
