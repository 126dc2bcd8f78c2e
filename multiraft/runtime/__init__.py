"""The group runtime: one asyncio task per Raft group, the flusher, quiescence, liveness.

Never imports node/, http/ or cli/ (tests/unit/test_layers.py).
"""
