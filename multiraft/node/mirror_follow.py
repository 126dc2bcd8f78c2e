"""A mirror topic follows its source topic's partition increase: discovery's side (the
catalog's is multiraft/metadata/mirror_growth.py; the round itself, `MirrorLinks._discover`
in multiraft/node/mirror_links.py, creates and grows mirrors with these).

- `listed_growth`: which of a link's mirror topics not promoted the source's listing asks
  to grow, and which counts it gives are refused (fewer partitions than the mirror's, above
  `PARTITIONS_MAX`, none; a growth while the cluster is finalized below feature level 2,
  `MIRROR_FOLLOW`), before any read.
- `ReadBudget`: the log-start reads one link's round may still make, its creations and
  growths together (`READS_PER_ROUND_MAX`); a mirror with more new partitions than are left
  is made or grown by those read, and grown further in the next rounds.
- `mirror_size`: a mirror's partition count while it follows its source (not promoted).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from multiraft.metadata.commands import PARTITIONS_MAX
from multiraft.metadata.features import FeatureLevel, supports

if TYPE_CHECKING:
    from multiraft.metadata.catalog import Catalog
    from multiraft.node.mirror_source import SourceClient

# Log-start reads of one link's round, its creations and growths together (one per new
# partition, each up to the source client's call bound): links are discovered one after
# another, so this bounds how long one slow source holds up the others. A mirror with more
# new partitions than are left is made or grown by those read, and grown further next round.
READS_PER_ROUND_MAX = 64


@dataclass(slots=True)
class ReadBudget:
    """The log-start reads one link's round may still make (`READS_PER_ROUND_MAX`)."""

    left: int = READS_PER_ROUND_MAX

    async def log_starts(self, client: SourceClient, topic: str, partitions: range) -> list[int]:
        """The source's log start offset of each of `partitions` of `topic`, one read each,
        every read taken from the budget (a failed one too)."""
        assert len(partitions) <= self.left
        starts = []
        for partition in partitions:
            self.left -= 1
            starts.append((await client.read_log(topic, partition, 0, 1, 0)).log_start_offset)
        return starts


def mirror_size(catalog: Catalog, name: str, link: str) -> int | None:
    """The partition count of `name` if it is `link`'s mirror not promoted, else None."""
    topic = catalog.topics.get(name)
    return len(topic.partitions) if topic is not None and topic.mirror_link == link and topic.is_mirror else None


def listed_growth(catalog: Catalog, link: str, counts: dict[str, object]) -> tuple[dict[str, int], dict[str, str]]:
    """Which of `link`'s mirror topics not promoted the source's listing (`counts`: topic ->
    partition count as the source says it, untrusted) asks to grow, and to what count; and
    which counts are refused, with why (never applied: the mirror keeps pulling what it has)."""
    growing: dict[str, int] = {}
    refused: dict[str, str] = {}
    for name, said in counts.items():
        current = mirror_size(catalog, name, link)
        if current is None:
            continue
        if not isinstance(said, int) or isinstance(said, bool):
            refused[name] = "the source's listing gives no partition count"
        elif said < current:
            refused[name] = (f"the source says {said} partitions, fewer than the mirror's {current}: a partition "
                             f"count never shrinks (was the source topic made again?); the mirror keeps its {current}")
        elif said > PARTITIONS_MAX:
            refused[name] = f"the source says {said} partitions; a topic has 1..{PARTITIONS_MAX}"
        elif said > current and not supports(catalog, FeatureLevel.MIRROR_FOLLOW):
            refused[name] = (f"the source says {said} partitions; the mirror keeps its {current}: following a source's "
                             f"growth needs feature level {int(FeatureLevel.MIRROR_FOLLOW)} (mirror_follow), this "
                             f"cluster is finalized at {catalog.feature_level}: once every node runs a build that "
                             "supports it, raise it with `raftlog cluster features finalize` (docs/node.md, "
                             "\"Upgrading\")")
        elif said > current:
            growing[name] = said
    return growing, refused
