"""File descriptors: every hosted replica holds at least one, and running out is a crash.

Each replica keeps its segment files open (one per segment; at least the active
one), each peer link and HTTP client holds a socket, and the state database holds
its own. A node that runs out fails to open a segment or accept a connection in
the middle of its work. So a node raises its soft limit to the hard one at start
(Redpanda and Kafka's packages do the same: both ask for a high `nofile`), reports
the limit, and a topic creation that would put more replicas on a node than its
descriptors can hold is refused up front with the limit in the message, instead
of the node failing later. Nodes of one cluster are assumed to share a limit:
the controller checks its own.
"""

from __future__ import annotations

import os
import resource
from collections import Counter
from collections.abc import Iterable

from multiraft.errors import InvalidPartitions

# Sockets and files that are not replicas' segments: the HTTP connection cap (1,024),
# the raft port's inbound cap (256), peer links, the state database, logs.
RESERVED_FDS = 1024 + 256 + 256
# A new replica opens its active segment (each segment it closes later keeps one more,
# which the reserve and the operator's headroom absorb: this check refuses what cannot
# work at all, it does not promise what will fit in a month).
FDS_PER_NEW_REPLICA = 1
_SOFT_CEILING = 1 << 20  # never ask for more than this even when the hard limit is unlimited


def raise_soft_limit() -> int:
    """Raise the open-files limit as far as this process may; returns the soft limit in force.

    The soft limit goes up to the hard one; a process allowed to (root, CAP_SYS_RESOURCE)
    raises the hard one too, up to the kernel's `fs.nr_open`, as systemd's LimitNOFILE would.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    ceiling = min(_SOFT_CEILING, _kernel_ceiling())
    for new_soft, new_hard in ((ceiling, ceiling), (hard, hard)):
        if new_hard == resource.RLIM_INFINITY:
            new_soft = new_hard = ceiling
        if soft != resource.RLIM_INFINITY and soft >= new_soft:
            break
        if hard != resource.RLIM_INFINITY and new_hard < hard:
            new_hard = hard  # never lower the hard limit
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (new_soft, new_hard))
            break
        except (ValueError, OSError):
            continue
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def _kernel_ceiling() -> int:
    try:
        with open("/proc/sys/fs/nr_open") as limit:
            return int(limit.read())
    except (OSError, ValueError):
        return _SOFT_CEILING


def open_now() -> int:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:  # no /proc: count nothing, the limit check still bounds the new replicas
        return 0


def check_room(new_replicas_per_node: dict[int, int], soft_limit: int, in_use: int) -> None:
    """Refuse a creation that would put more new replicas on a node than its descriptors hold."""
    if not new_replicas_per_node:
        return
    node, most = max(new_replicas_per_node.items(), key=lambda item: item[1])
    room = (soft_limit - RESERVED_FDS - in_use) // FDS_PER_NEW_REPLICA
    if most > room:
        raise InvalidPartitions(
            f"this topic would put {most} new replicas on node {node}, but a node has room for {max(room, 0)} more "
            f"(open-files limit {soft_limit}, {in_use} open, {RESERVED_FDS} kept for connections); "
            "raise the limit (ulimit -n, systemd LimitNOFILE) or create fewer partitions")


def check_new_replicas(assignments: Iterable[Iterable[int]], soft_limit: int) -> None:
    """Refuse new partitions (their replica lists) that would put more new replicas on a
    host than this node's descriptors hold (`check_room`, against what is open here now):
    every placement the controller makes, a topic's or its new partitions', by hand or a
    mirror's (made or grown by discovery)."""
    per_node = Counter(host for replicas in assignments for host in replicas)
    check_room(dict(per_node), soft_limit, open_now())
