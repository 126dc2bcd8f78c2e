"""The `raftlog` command line. Only a placeholder until the node exists."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    """Entry point of the console script `raftlog`."""
    args = sys.argv[1:] if argv is None else argv
    if sys.flags.optimize:
        print("raftlog: refusing to run under python -O (assertions guard invariants)", file=sys.stderr)
        return 2
    print(
        "raftlog: the node is not built yet (commands requested: %s). "
        "This version holds the Raft core and its simulator." % (" ".join(args) or "none"),
        file=sys.stderr,
    )
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
