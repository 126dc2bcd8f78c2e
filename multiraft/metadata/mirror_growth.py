"""A mirror topic follows its source topic's partition increase (`GrowMirrorTopic`).

The catalog (catalog.py) checks and applies the command through the two pure functions
here, so every replica of group 0 decides the same from the same topic record:

- `check_mirror_growth`: the topic is `link`'s mirror and not promoted, the count grows
  strictly, one replica list per new partition, each of the topic's replication factor.
  The nodes being registered and the group ids left are the catalog's own checks, shared
  with the other commands that add partitions.
- `grown_mirror`: the topic with the new partitions appended, each on the next group id
  and starting at its source partition's log start offset, recording its source
  partition's identity when the command carries it (`source_group`, as a mirror made by
  `CreateMirrorTopic` does: a truncated resync needs it), and `mirror_partitions` raised
  to the new count. A mirror not promoted holds only partitions it was made or grown with,
  so its mirror partitions stay a prefix of its partitions: `mirror_start`
  (multiraft/node/mirror_bootstrap.py) tells a mirror partition by `partition <
  mirror_partitions`, and a replica of a grown partition created late on a node starts
  from the same start point as its peers did.
"""

from __future__ import annotations

from dataclasses import replace

from multiraft.errors import (
    InvalidPartitions,
    InvalidReplicaAssignment,
    MirrorPartitionsFixed,
    NotAMirror,
)
from multiraft.metadata.catalog_records import PartitionInfo, TopicInfo
from multiraft.metadata.mirror_commands import GrowMirrorTopic
from raftlog.types import GroupId


def check_growable(topic: TopicInfo) -> None:
    """Refuse partitions added by hand (`CreatePartitions`) to a mirror topic not promoted: it
    follows its source's count (`GrowMirrorTopic`), and a partition added here would pull a
    source partition that does not exist."""
    if topic.is_mirror:
        raise MirrorPartitionsFixed(f"topic {topic.name!r} is a mirror of link {topic.mirror_link!r}: it follows its "
                                    "source's partition count; promote it before adding partitions")


def check_mirror_growth(topic: TopicInfo, command: GrowMirrorTopic) -> None:
    """Raise the typed error `command` meets against `topic` (the record of `command.name`)."""
    if topic.mirror_link != command.link or not topic.is_mirror:
        raise NotAMirror(f"topic {topic.name!r} is not a mirror of link {command.link!r} (or was promoted): "
                         "it does not follow its source's partitions")
    current = len(topic.partitions)
    assert topic.mirror_partitions == current, "a mirror not promoted has only mirror partitions"
    if command.count <= current:
        raise InvalidPartitions(f"mirror {topic.name!r} has {current} partitions; it grows only, so the new count "
                                f"must be above {current}, got {command.count}")
    if len(command.assignments) != command.count - current:
        raise InvalidReplicaAssignment(f"growing mirror {topic.name!r} from {current} to {command.count} partitions "
                                       f"takes {command.count - current} replica lists, got {len(command.assignments)}")
    if len(command.assignments[0]) != topic.replication_factor:
        raise InvalidReplicaAssignment(f"mirror {topic.name!r} has replication factor {topic.replication_factor}")


def grown_mirror(topic: TopicInfo, command: GrowMirrorTopic, first_group_id: GroupId) -> TopicInfo:
    """`topic` grown by `command` (checked), its new partitions on the group ids from
    `first_group_id` on (the caller moves its counter past them)."""
    current = len(topic.partitions)
    sources = command.source_groups or (None,) * len(command.assignments)
    added = tuple(PartitionInfo(current + i, GroupId(first_group_id + i), replicas, start_offset=start,
                                source_group=source)
                  for i, (replicas, start, source) in enumerate(zip(command.assignments, command.start_offsets,
                                                                    sources, strict=True)))
    grown = replace(topic, partitions=topic.partitions + added, mirror_partitions=command.count)
    assert len(grown.partitions) == grown.mirror_partitions == command.count
    return grown
