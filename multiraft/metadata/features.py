"""The cluster's feature level: what group 0 may hold that an older node cannot read.

Kafka's finalized features (KIP-584) and KRaft's `metadata.version`, made simple: one
integer. A build supports the levels up to `SUPPORTED_LEVEL`; the catalog holds the
level the cluster is *finalized* at (`Catalog.feature_level`, 0 by default), raised by
`FinalizeFeatureLevel` once every registered node says it supports the new level
(multiraft/node/features.py asks them, at propose time: an apply cannot know the nodes'
builds). Whatever an older node cannot decode (a catalog command or field, docs/node.md
"Upgrading") belongs to a level, and its proposer asks `supports` first: below the level
it proposes the older form, or refuses (`require_level`, 409 FEATURE_LEVEL_UNSUPPORTED).

The gate is checked where commands are proposed, never where they apply: a committed
command applies alike on every node whatever the catalog's level (a node of a build from
before the gate may have proposed it during a rolling upgrade; refusing it on apply here
and not there would fork the catalogs). The one rule `apply` adds is that the finalized
level only goes up (`check_finalize`).

Adding a level: a new member below with its docstring, its gated commands in
`required_level`, and each proposer asking `supports` (docs/node.md, "Upgrading").
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol

from multiraft.errors import FeatureLevelUnsupported, InvalidRequest
from multiraft.metadata.checks import is_int
from multiraft.metadata.mirror_commands import (
    CreateMirrorLink,
    CreateMirrorTopic,
    GrowMirrorTopic,
    OnSourceTruncated,
    ResyncMirrorPartition,
    SetMirrorLinkPolicy,
)

# A bound for the command's shape only: levels a later build may name are decoded and
# applied here too (a node below the level learns it and says so, multiraft/node/features.py).
FEATURE_LEVEL_MAX = 10_000


class FeatureLevel(enum.IntEnum):
    """The levels this build knows; each includes everything below it."""

    def __new__(cls, value: int, doc: str) -> FeatureLevel:
        member = int.__new__(cls, value)
        member._value_ = value
        member.__doc__ = doc
        return member

    NONE = 0, (
        "A cluster from before the gate (0 is the catalog's default): nothing gated may be "
        "proposed, since some node may run a build that cannot read it.")
    BASELINE = 1, (
        "Everything up to the gate: a mirror resync that keeps its identical prefix "
        "(ResyncMirrorPartition's prefix_* fields; below it a verify's repair resyncs whole) and a "
        "mirror link to an HTTPS source (CreateMirrorLink's source_tls and source_ca; refused "
        "below it). Partition-state v2/v3 entries and consumer group commands belong here too, but "
        "are not gated: they were written before the gate (docs/node.md, \"Upgrading\").")
    MIRROR_FOLLOW = 2, (
        "A mirror follows its source: discovery grows a mirror topic when its source's partition "
        "count rises (GrowMirrorTopic; below it the growth is named in the discovery's refused) and "
        "records the source partitions' identities in the mirror topics it makes or grows "
        "(CreateMirrorTopic's and GrowMirrorTopic's source_groups; below it they are made exactly "
        "as before, without), and a link may resync after the source's retention truncated past a "
        "mirror (a link created with on_source_truncated other than stop, SetMirrorLinkPolicy; "
        "refused below it).")
    MIRROR_FILTER = 3, (
        "A mirror link may filter records (CreateMirrorLink's record_filter; refused below it): "
        "its pulls write gap batches (storage/batch.py FLAG_GAP) where records were left out, "
        "which a node of an earlier build refuses as unknown flags when it replicates them.")

    @property
    def description(self) -> str:
        return self.__doc__ or ""


SUPPORTED_LEVEL = max(FeatureLevel)  # what this build reads and may propose


class HasFeatureLevel(Protocol):
    feature_level: int


def supports(catalog: HasFeatureLevel, level: FeatureLevel) -> bool:
    """Whether the cluster is finalized at `level` or above: whether a proposer may write
    what `level` brings."""
    return catalog.feature_level >= level


def require_level(catalog: HasFeatureLevel, level: FeatureLevel, what: str) -> None:
    """Refuse `what` (FEATURE_LEVEL_UNSUPPORTED) unless the cluster is finalized at `level`."""
    if not supports(catalog, level):
        raise FeatureLevelUnsupported(
            f"{what} needs feature level {int(level)} ({level.name.lower()}); this cluster is finalized at "
            f"{catalog.feature_level}: once every node runs a build that supports it, raise it with "
            "`raftlog cluster features finalize` (docs/node.md, \"Upgrading\")")


def required_level(command: object) -> tuple[FeatureLevel, str]:
    """The level a command needs to be proposed, and what it is for a person (the highest
    of what it holds)."""
    needs = [(FeatureLevel.NONE, "")]
    if isinstance(command, ResyncMirrorPartition) and command.prefix_index:
        needs.append((FeatureLevel.BASELINE, "a mirror resync keeping its identical prefix"))
    if isinstance(command, CreateMirrorLink) and command.source_tls:
        needs.append((FeatureLevel.BASELINE, "a mirror link to an HTTPS source (source_tls)"))
    if isinstance(command, CreateMirrorLink) and command.on_source_truncated != OnSourceTruncated.STOP:
        needs.append((FeatureLevel.MIRROR_FOLLOW, f"a mirror link with on_source_truncated "
                                                  f"{command.on_source_truncated!r}"))
    if isinstance(command, CreateMirrorLink) and command.record_filter is not None:
        needs.append((FeatureLevel.MIRROR_FILTER, "a mirror link with a record filter (record_filter)"))
    if isinstance(command, SetMirrorLinkPolicy):
        needs.append((FeatureLevel.MIRROR_FOLLOW, "a mirror link's on_source_truncated changed"))
    if isinstance(command, GrowMirrorTopic):
        needs.append((FeatureLevel.MIRROR_FOLLOW, "a mirror topic following its source's partition increase"))
    if isinstance(command, CreateMirrorTopic) and command.source_groups is not None:
        needs.append((FeatureLevel.MIRROR_FOLLOW, "a mirror topic recording its source partitions' identities"))
    return max(needs, key=lambda need: need[0])


def require_command_level(catalog: HasFeatureLevel, command: object) -> None:
    """The metadata leader's check before it proposes `command` (multiraft/node/metadata_ops.py)."""
    level, what = required_level(command)
    if level:
        require_level(catalog, level, what)


@dataclass(frozen=True, slots=True, kw_only=True)
class FinalizeFeatureLevel:
    """Raise the cluster's finalized feature level to `level` (the same level again changes
    nothing). Proposed only once every registered node said it supports `level`
    (multiraft/node/features.py), or by a new cluster's first metadata leader."""

    level: int

    def __post_init__(self) -> None:
        if not is_int(self.level) or not 1 <= self.level <= FEATURE_LEVEL_MAX:
            raise InvalidRequest(f"a feature level is 1..{FEATURE_LEVEL_MAX}")


def check_finalize(current: int, command: FinalizeFeatureLevel) -> None:
    """On apply (and before proposing): the finalized level is only ever raised."""
    if command.level < current:
        raise InvalidRequest(f"the cluster is finalized at feature level {current}; a level is only ever raised "
                             f"(asked {command.level}): a node that supports less must be upgraded instead")
