"""Transport: frames, the handshake, peer links and inbound connections, RPC, TLS.

Imports nothing of multiraft beyond `multiraft.errors` (tests/unit/test_layers.py).
"""
