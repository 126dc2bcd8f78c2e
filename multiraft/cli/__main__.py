"""`python -m multiraft.cli`: what the console script `raftlog` runs."""

from multiraft.cli.main import main

raise SystemExit(main())
