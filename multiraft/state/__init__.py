"""Partition state machines: records, producers, consumer offsets, the partitioner.

Pure: no asyncio, nothing of node/, http/, runtime/ or cli/ (tests/unit/test_layers.py).
"""
