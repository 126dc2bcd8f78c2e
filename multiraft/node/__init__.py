"""The node: `node.Node` is the composition root; `api.NodeApi` is what the edge sees.

See docs/architecture.md and docs/node.md.
"""
