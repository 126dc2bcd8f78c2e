"""What names and rights look like: topic names, token names, token rights.

Shared by the commands (multiraft/metadata/commands.py), which check them when a
command is built, and the bearer tokens (multiraft/metadata/auth.py), which check
them at the edge; both import this module, neither imports the other.
"""

from __future__ import annotations

import re

from multiraft.errors import InvalidRequest

# Kafka's legal topic characters and maximum length; "." and ".." are refused too.
TOPIC_NAME_PATTERN = re.compile(r"[a-zA-Z0-9._-]{1,249}")
TOKEN_NAME_PATTERN = re.compile(r"[a-zA-Z0-9._-]{1,64}")
RIGHT_PATTERN = re.compile(rf"admin|(read|write):(\*|{TOPIC_NAME_PATTERN.pattern})")
RIGHTS_MAX = 100


def check_rights(rights: object) -> tuple[str, ...]:
    if not isinstance(rights, list | tuple) or not 1 <= len(rights) <= RIGHTS_MAX:
        raise InvalidRequest(f"rights are a list of 1..{RIGHTS_MAX} of admin, read:TOPIC, write:TOPIC (TOPIC or *)")
    for right in rights:
        if not isinstance(right, str) or not RIGHT_PATTERN.fullmatch(right):
            raise InvalidRequest(f"right {right!r} is not admin, read:TOPIC or write:TOPIC (TOPIC or *)")
    return tuple(sorted(set(rights)))


def check_token_name(name: object) -> None:
    if not isinstance(name, str) or not TOKEN_NAME_PATTERN.fullmatch(name):
        raise InvalidRequest(f"token name must match {TOKEN_NAME_PATTERN.pattern}")
