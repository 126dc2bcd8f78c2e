"""Sockets and secrets shared by the two servers: TLS contexts, the TLS listener that
admits a connection before its handshake, and private-file reading.

Both the raft transport (`transport/`) and the HTTP server (`http/`) accept
connections through these, so they live below both, in a room that imports
nothing else of multiraft.
"""
