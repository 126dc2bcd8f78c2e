"""The node: `node.Node` is the composition root; controller, replicas, reads, balancing.

See docs/architecture.md and docs/node.md.
"""
