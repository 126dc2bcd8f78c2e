"""Goal (issue 21, family 6): a creation that would put more replicas on a node than
its file descriptors hold is refused up front, naming the limit; the node raises
its soft limit to the hard one at start."""

from __future__ import annotations

import resource
import subprocess
import sys

import pytest

from multiraft.errors import InvalidPartitions
from multiraft.node import open_files


def test_a_creation_beyond_the_descriptors_is_refused_with_the_limit() -> None:
    limit = open_files.RESERVED_FDS + 100 + open_files.FDS_PER_NEW_REPLICA * 50
    open_files.check_room({1: 50, 2: 49}, limit, in_use=100)
    with pytest.raises(InvalidPartitions, match=rf"51 new replicas on node 2.*limit {limit}"):
        open_files.check_room({1: 50, 2: 51}, limit, in_use=100)


def test_new_partitions_are_counted_by_host(monkeypatch: pytest.MonkeyPatch) -> None:
    # The check every placement runs (metadata_ops.check_files): replicas summed per host
    # across the new partitions' lists, against what is open now.
    monkeypatch.setattr(open_files, "open_now", lambda: 100)
    limit = open_files.RESERVED_FDS + 100 + open_files.FDS_PER_NEW_REPLICA * 2
    open_files.check_new_replicas([[1, 2], [2, 3]], limit)
    with pytest.raises(InvalidPartitions, match="3 new replicas on node 2"):
        open_files.check_new_replicas([[1, 2], [2, 3], [2, 1]], limit)


def test_the_soft_limit_is_raised_as_far_as_the_process_may() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    script = ("import resource; from multiraft.node import open_files; "
              "resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1])); "
              "print(open_files.raise_soft_limit(), resource.getrlimit(resource.RLIMIT_NOFILE)[0])")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60)
    raised, in_force = map(int, out.stdout.split())
    assert raised == in_force
    assert in_force >= (hard if hard != resource.RLIM_INFINITY else 1 << 20)  # root may go above the hard one
