"""Fixed-port test clusters check their ports first, so a clash says what it is."""

from __future__ import annotations

import socket
from collections.abc import Iterable

import pytest


def require_free_ports(hosts: Iterable[str], ports: Iterable[int], who: str) -> None:
    """Fail the test (not error deep in a server's log) when a port it needs is taken."""
    wanted = list(ports)
    for host in hosts:
        for port in wanted:
            with socket.socket() as probe:
                # as the servers bind (asyncio sets SO_REUSEADDR): TIME_WAIT from a previous run is no clash
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    probe.bind((host, port))
                except OSError as error:
                    pytest.fail(f"{host}:{port} is taken ({error}); {who} need it")
