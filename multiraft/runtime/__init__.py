"""The group runtime: one asyncio task per Raft group, the sans-I/O Ready processor it
runs (as the simulator does), persistence strategies, the flusher, quiescence, liveness.

Never imports node/, http/ or cli/ (tests/unit/test_layers.py).
"""
