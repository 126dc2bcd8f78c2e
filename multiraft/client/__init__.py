"""The Python client of raftlog: sync and async, producer and consumer.

What the CLI, the Spark connector and the chaos runner use to talk to a cluster,
exactly as a user's program would (DESIGN.md section 2).

    from multiraft.client import Client
    with Client("127.0.0.1:8080,127.0.0.2:8080") as client:
        client.create_topic("events", partitions=3)
        with client.producer("events", idempotent=True) as producer:
            producer.send(b"hello", key=b"user-1")
        consumer = client.consumer("events", group="readers")
        records = consumer.poll()
        consumer.commit()
        # or as a member of the group: the cluster splits the partitions among its members
        with client.group_consumer("readers", topics=["events"]) as member:
            records = member.poll()   # commits positions when partitions move, and at close

Async: `AsyncClient`, `AsyncProducer(client, topic)`, `AsyncConsumer(client, topic)`,
`AsyncGroupConsumer(client, group, topics=[...])`.

This module is the client's face: the Spark connector and the chaos runner import
only from it (tests/unit/test_layers.py), never its inner modules.
"""

from multiraft.client.consumer import AsyncConsumer, ConsumedRecord
from multiraft.client.credentials import CredentialsError, read_token_file
from multiraft.client.http import (
    BATCH_CONTENT_TYPE,
    DEFAULT_SERVER,
    AsyncClient,
    BatchRead,
    OutcomeUnknownError,
    RaftlogError,
    UnavailableError,
    normalize,
    parse_frames,
)
from multiraft.client.member import AsyncGroupConsumer
from multiraft.client.producer import AsyncProducer
from multiraft.client.sync import Client, Consumer, GroupConsumer, Producer

__all__ = [
    "BATCH_CONTENT_TYPE", "DEFAULT_SERVER", "AsyncClient", "AsyncConsumer", "AsyncGroupConsumer", "AsyncProducer",
    "BatchRead", "Client", "ConsumedRecord", "Consumer", "CredentialsError", "GroupConsumer",
    "OutcomeUnknownError", "Producer",
    "RaftlogError", "UnavailableError", "normalize", "parse_frames", "read_token_file",
]
