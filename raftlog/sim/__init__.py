"""The deterministic simulator of Raft clusters (see docs/consensus.md)."""
