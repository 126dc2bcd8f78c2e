"""Partitions and packet loss between loopback addresses, by firewall rules in the chaos namespace.

Nodes live on 127.0.0.1..N and bind their outgoing sockets there too; the
workload client binds 127.0.0.100. Every rule matches source and target
addresses inside 127.0.0.0/8, so node<->node and client<->node paths are cut
independently.

Rules sit on the INPUT hook only. On `lo` every packet crosses OUTPUT and then
INPUT exactly once, so one hook sees it all; dropping in INPUT is silent, like a
lost packet (a drop in OUTPUT fails the sender's `connect` at once with EPERM,
which no real network does), and a `statistic` loss rule is drawn once per
packet, not twice.

Each fault gets its own chain, so `undo` removes exactly that fault's rules and
`heal` removes all of them:

    iptables:  INPUT -> CHAOS -> CHAOS-1 (fault 1's rules)
                              -> CHAOS-2 ...
    nft:       table ip raftlog_chaos { chain fault_1 (input hook) ... }

Both go through one batch per change (`iptables-restore --noflush`, `nft -f`),
so a partition appears and disappears atomically. TCP connections survive a
partition: they stall and retransmit, as over a real network.
"""

from __future__ import annotations

import ipaddress
import itertools
import shutil
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from chaos.namespace import FaultError, require_namespace, run_command

CLIENT_IP = "127.0.0.100"
LOOPBACK = ipaddress.IPv4Network("127.0.0.0/8")
IPTABLES_CHAIN = "CHAOS"
NFT_TABLE = "raftlog_chaos"
# nft's numgen draws an integer below this; probability p drops when the draw < p * this.
NFT_DRAW_RANGE = 1_000_000

Backend = Literal["iptables", "nft"]
Action = Literal["drop", "return"]


@dataclass(frozen=True, slots=True)
class Rule:
    """One firewall rule of a fault; `None` matches any address. Rules apply in order:
    `return` exempts matching packets from the rest of this fault (not from other faults)."""

    action: Action
    source: str | None
    target: str | None
    probability: float = 1.0  # of dropping a matching packet

    def __post_init__(self) -> None:
        for address in (self.source, self.target):
            if address is not None:
                check_loopback(address)
        if not 0.0 <= self.probability <= 1.0:
            raise ValueError(f"probability {self.probability} is not within [0, 1]")
        if self.action == "return" and self.probability != 1.0:
            raise ValueError("a return rule has no probability")


@dataclass(frozen=True, slots=True)
class NetFault:
    """One injected network fault: what `active()` reports and what `undo` removes."""

    number: int
    kind: str  # isolate, split, one-way, isolate-client, loss, block
    description: str
    rules: tuple[Rule, ...]


def check_loopback(address: str) -> str:
    """The address itself if it is a single IPv4 address inside 127.0.0.0/8; else ValueError."""
    parsed = ipaddress.IPv4Address(address)
    if parsed not in LOOPBACK:
        raise ValueError(f"{address} is outside 127.0.0.0/8: chaos rules never touch other networks")
    return str(parsed)


def default_backend() -> Backend | None:
    if shutil.which("iptables-restore") is not None:
        return "iptables"
    if shutil.which("nft") is not None:
        return "nft"
    return None


class Network:
    """Firewall faults inside the chaos namespace. Not thread-safe: one owner calls it."""

    def __init__(self, backend: Backend | None = None, *, client_ip: str = CLIENT_IP) -> None:
        require_namespace()
        chosen = backend or default_backend()
        if chosen is None:
            raise FaultError("neither iptables-restore nor nft is installed (make chaos-deps)")
        self.backend: Backend = chosen
        self.client_ip = check_loopback(client_ip)
        self._faults: dict[int, NetFault] = {}
        self._numbers = itertools.count(1)
        self._apply(self._setup_batch())

    # -- faults -----------------------------------------------------------------

    def isolate(self, node_ip: str, *, include_client: bool = False) -> NetFault:
        """Cut `node_ip` from every other address both ways; the client still reaches it
        unless `include_client`. Its traffic to itself is untouched."""
        node = check_loopback(node_ip)
        rules = [Rule("return", node, node)]
        if not include_client:
            rules += [Rule("return", self.client_ip, node), Rule("return", node, self.client_ip)]
        rules += [Rule("drop", node, None), Rule("drop", None, node)]
        scope = "everyone" if include_client else "the other nodes"
        return self._add("isolate", f"isolate {node} from {scope}", rules)

    def split(self, group_a: Sequence[str], group_b: Sequence[str]) -> NetFault:
        """Drop everything between the two groups, both ways (e.g. minority | majority)."""
        side_a = [check_loopback(address) for address in group_a]
        side_b = [check_loopback(address) for address in group_b]
        if not side_a or not side_b:
            raise ValueError("split needs two non-empty groups")
        if set(side_a) & set(side_b):
            raise ValueError(f"groups overlap: {sorted(set(side_a) & set(side_b))}")
        rules = [Rule("drop", a, b) for a in side_a for b in side_b]
        rules += [Rule("drop", b, a) for a in side_a for b in side_b]
        return self._add("split", f"split {','.join(side_a)} | {','.join(side_b)}", rules)

    def one_way(self, source_ip: str, target_ip: str) -> NetFault:
        """Drop only packets from `source_ip` to `target_ip` (replies included, so over TCP
        neither side can open a connection, and open ones stall one way)."""
        source, target = check_loopback(source_ip), check_loopback(target_ip)
        if source == target:
            raise ValueError("one_way needs two different addresses")
        return self._add("one-way", f"one-way {source} -> {target} dropped", [Rule("drop", source, target)])

    def isolate_client(self, node_ip: str) -> NetFault:
        """Cut the workload client from `node_ip`, both ways; the nodes still talk."""
        node = check_loopback(node_ip)
        rules = [Rule("drop", self.client_ip, node), Rule("drop", node, self.client_ip)]
        return self._add("isolate-client", f"client {self.client_ip} x {node}", rules)

    def loss(self, ips: Iterable[str], probability: float) -> NetFault:
        """Drop each packet sent to any of `ips` (from anyone) with `probability`."""
        targets = [check_loopback(address) for address in ips]
        if not targets:
            raise ValueError("loss needs at least one address")
        rules = [Rule("drop", None, target, probability) for target in targets]
        return self._add("loss", f"loss {probability:.0%} to {','.join(targets)}", rules)

    def block(self, pairs: Iterable[tuple[str, str]], description: str) -> NetFault:
        """Drop each (source, target) pair, one way each: any topology (bridges, rings)."""
        rules = [Rule("drop", check_loopback(s), check_loopback(t)) for s, t in pairs]
        if not rules:
            raise ValueError("block needs at least one pair")
        return self._add("block", description, rules)

    # -- removal and reporting --------------------------------------------------

    def undo(self, fault: NetFault) -> None:
        """Remove one fault's rules; the others stay."""
        if fault.number not in self._faults:
            return
        require_namespace()
        self._apply(self._remove_batch([fault.number]))
        del self._faults[fault.number]

    def heal(self) -> None:
        """Remove every rule this object added (and nothing else)."""
        if not self._faults:
            return
        require_namespace()
        self._apply(self._remove_batch(sorted(self._faults)))
        self._faults.clear()

    def active(self) -> list[str]:
        return [self._faults[number].description for number in sorted(self._faults)]

    def close(self) -> None:
        """Heal, then remove the CHAOS chain or table itself."""
        self.heal()
        require_namespace()
        self._apply(self._teardown_batch())

    def listing(self) -> str:
        """The backend's own view of our rules (`iptables -S` / `nft list table`)."""
        require_namespace()
        if self.backend == "iptables":
            return run_command(["iptables", "-S"])
        return run_command(["nft", "list", "table", "ip", NFT_TABLE])

    def _add(self, kind: str, description: str, rules: Sequence[Rule]) -> NetFault:
        require_namespace()
        fault = NetFault(next(self._numbers), kind, description, tuple(rules))
        self._apply(self._add_batch(fault))
        self._faults[fault.number] = fault
        return fault

    # -- backends ---------------------------------------------------------------

    def _apply(self, batch: str) -> None:
        if self.backend == "iptables":
            run_command(["iptables-restore", "--noflush"], batch)
        else:
            run_command(["nft", "-f", "-"], batch)

    def _setup_batch(self) -> str:
        if self.backend == "iptables":
            existing = run_command(["iptables", "-S"])
            if f"-N {IPTABLES_CHAIN}\n" in existing:
                raise FaultError(f"chain {IPTABLES_CHAIN} already exists: one Network per namespace")
            return f"*filter\n:{IPTABLES_CHAIN} - [0:0]\n-I INPUT 1 -j {IPTABLES_CHAIN}\nCOMMIT\n"
        return f"create table ip {NFT_TABLE}\n"

    def _teardown_batch(self) -> str:
        if self.backend == "iptables":
            chain = IPTABLES_CHAIN
            return f"*filter\n-D INPUT -j {chain}\n-F {chain}\n-X {chain}\nCOMMIT\n"
        return f"delete table ip {NFT_TABLE}\n"

    def _add_batch(self, fault: NetFault) -> str:
        if self.backend == "iptables":
            chain = f"{IPTABLES_CHAIN}-{fault.number}"
            lines = [f":{chain} - [0:0]"]
            lines += [f"-A {chain} {_iptables_rule(rule)}" for rule in fault.rules]
            lines.append(f"-A {IPTABLES_CHAIN} -j {chain}")
            return "*filter\n" + "\n".join(lines) + "\nCOMMIT\n"
        chain = f"fault_{fault.number}"
        lines = [f"add chain ip {NFT_TABLE} {chain} {{ type filter hook input priority 0; policy accept; }}"]
        lines += [f"add rule ip {NFT_TABLE} {chain} {_nft_rule(rule)}" for rule in fault.rules]
        return "\n".join(lines) + "\n"

    def _remove_batch(self, numbers: Sequence[int]) -> str:
        lines: list[str] = []
        for number in numbers:
            if self.backend == "iptables":
                chain = f"{IPTABLES_CHAIN}-{number}"
                lines += [f"-D {IPTABLES_CHAIN} -j {chain}", f"-F {chain}", f"-X {chain}"]
            else:
                lines += [f"flush chain ip {NFT_TABLE} fault_{number}", f"delete chain ip {NFT_TABLE} fault_{number}"]
        if self.backend == "iptables":
            return "*filter\n" + "\n".join(lines) + "\nCOMMIT\n"
        return "\n".join(lines) + "\n"


def _iptables_rule(rule: Rule) -> str:
    parts = []
    if rule.source is not None:
        parts.append(f"-s {rule.source}/32")
    if rule.target is not None:
        parts.append(f"-d {rule.target}/32")
    if rule.action == "return":
        return " ".join([*parts, "-j RETURN"])
    if rule.probability < 1.0:
        parts.append(f"-m statistic --mode random --probability {rule.probability:.6f}")
    return " ".join([*parts, "-j DROP"])


def _nft_rule(rule: Rule) -> str:
    parts = []
    if rule.source is not None:
        parts.append(f"ip saddr {rule.source}")
    if rule.target is not None:
        parts.append(f"ip daddr {rule.target}")
    if rule.action == "return":
        return " ".join([*parts, "return"])
    threshold = round(rule.probability * NFT_DRAW_RANGE)
    if threshold < NFT_DRAW_RANGE:
        parts.append(f"numgen random mod {NFT_DRAW_RANGE} < {threshold}")
    return " ".join([*parts, "drop"])
