"""raftlog's consensus layer: the sans-I/O Raft core (`raftlog.core`), its typed
messages and errors, the storage protocol it reads through, and the simulator."""
