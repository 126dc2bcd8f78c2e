"""Certificates the TLS tests make themselves: the cluster's CA with a certificate per
loopback host, and a rogue CA with a certificate of its own for the same hosts (what
a node of another cluster, or an impostor, would present). Made with `openssl`
through multiraft/cli/tls_certs.py, the code `raftlog cluster up --tls` uses."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from multiraft.cli.tls_certs import KeyPair, make_ca, make_certificate

HOSTS = ("127.0.0.1", "127.0.0.2", "127.0.0.3", "127.0.0.4")


@dataclass(frozen=True)
class Pki:
    ca: KeyPair
    nodes: dict[str, KeyPair]  # by host: a certificate naming that host (and localhost)
    rogue_ca: KeyPair
    rogue: KeyPair  # signed by rogue_ca, naming every host of HOSTS


def make_pki(directory: Path) -> Pki:
    ca = make_ca(directory / "ca", "raftlog test CA", days=2)
    nodes = {host: make_certificate(ca, directory / host, "node", [host, "localhost"], days=2) for host in HOSTS}
    rogue_ca = make_ca(directory / "rogue-ca", "rogue CA", days=2)
    rogue = make_certificate(rogue_ca, directory / "rogue", "node", [*HOSTS, "localhost"], days=2)
    return Pki(ca=ca, nodes=nodes, rogue_ca=rogue_ca, rogue=rogue)
