"""The command line (`python -m multiraft.cli`, the console script `raftlog`) and the local launcher."""
