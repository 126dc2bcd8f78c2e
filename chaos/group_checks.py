"""The consumer-group checks: what members were told, fetched and committed (issue 23).

Pure functions over the history's group ops (`chaos/history.py`), called by
`chaos/checker.py`. Classes (a single one fails a run):

- `group-undelivered`: an acknowledged value of a topic a group subscribes to
  that no member of the group ever fetched, though the group's final drain
  (a member joining after the heal and fetching until it passed every
  acknowledged offset) read past it. At least once: a commit that moves past
  records nobody fetched, or a new owner starting past the committed offset,
  shows here.
- `group-drain-incomplete`: the drain did not pass a partition's highest
  acknowledged offset (a check that could not finish, as `final-read-incomplete`;
  values above where it got are not judged).
- `group-offset-backwards`: a group's committed offset for a partition went down,
  as seen by successful commit answers and offset fetches in real-time order (b
  invoked after a completed, b's offset below a's), unless an admin reset may
  have fallen between them.
- `group-two-owners-epoch`: two members were told the same partition is theirs
  (`assignment`) at the same member epoch.
- `group-two-owners`: a member was told a partition is its own while another
  member certainly still held it. A member holds a partition from the answer that
  told it so until, at the earliest, the invocation of its first later call that
  may give it back (a heartbeat whose `owned` leaves it out, a leave, a join
  again), or its removal: never before its last successful call's invocation,
  nor before a silence of a session timeout could have begun, nor before the
  revocation's invocation plus the rebalance timeout (`_removed_by`). `revoking` is ownership too (the member may still
  commit), so the epoch check alone cannot see a partition given to its new owner
  before the old one gave it back; this one does.
- `group-fetch-unowned`: a fetch answer returned records of a partition that
  answer's own view did not assign to the member.

Group commits also join the committed-offset registers (`register_commits`), so
`committed-offset-nonlinearizable` covers them and the groups' offset fetches.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from itertools import pairwise

from chaos.anomalies import Anomaly, anomaly, listing
from chaos.history import (
    GroupCommit,
    GroupFetch,
    MemberAction,
    Membership,
    MemberView,
    OffsetCommit,
    OffsetFetch,
    Outcome,
    PartitionKey,
    Value,
)
from chaos.version_order import VersionOrder

SESSION_TIMEOUT_MS_DEFAULT = 45_000  # the server's, for a group whose joins did not say
REBALANCE_TIMEOUT_MS_DEFAULT = 300_000
# The runner and the nodes read one CLOCK_MONOTONIC; this only absorbs float rounding.
CLOCK_SLACK_S = 0.05
PAIRS_LISTED = 3


def add_group_reads(orders: dict[PartitionKey, VersionOrder], fetches: Iterable[GroupFetch]) -> None:
    """Every record a member fetched into the version order, as a poll's: a group fetch
    reading another value at an offset is `inconsistent-offsets`, a value nobody sent
    `unexpected`, and a read value resolves an ambiguous send."""
    for op in fetches:
        if op.outcome is not Outcome.OK:
            continue
        for key, offset, value in op.records:
            order = orders[key]
            order.claim(offset, value, op.index)
            order.read_by.setdefault(value, op.index)


def register_commits(commits: Iterable[GroupCommit]) -> list[OffsetCommit]:
    """Group commits as the register writes `chaos/offset_register.py` checks, one per partition."""
    return [OffsetCommit(index=op.index, process=op.process, invoke_s=op.invoke_s, complete_s=op.complete_s,
                         outcome=op.outcome, error=op.error, group=op.group, key=key, offset=offset)
            for op in commits for key, offset in op.offsets]


def group_anomalies(members: list[Membership], fetches: list[GroupFetch], commits: list[GroupCommit],
                    offset_fetches: list[OffsetFetch], orders: Mapping[PartitionKey, VersionOrder],
                    acknowledged: Mapping[PartitionKey, Mapping[Value, int]]) -> list[Anomaly]:
    return [
        *undelivered(members, fetches, orders, acknowledged),
        *offsets_backwards(members, commits, offset_fetches),
        *two_owners_in_epoch(members, fetches),
        *two_owners(members, fetches),
        *fetch_unowned(fetches),
    ]


def _subscriptions(members: Iterable[Membership]) -> dict[str, set[str]]:
    topics: dict[str, set[str]] = defaultdict(set)
    for op in members:
        if op.action is MemberAction.JOIN:
            topics[op.group].update(op.topics)
    return topics


# -- (a) every acknowledged record delivered -------------------------------------------


def undelivered(members: list[Membership], fetches: list[GroupFetch], orders: Mapping[PartitionKey, VersionOrder],
                acknowledged: Mapping[PartitionKey, Mapping[Value, int]]) -> list[Anomaly]:
    delivered: dict[tuple[str, PartitionKey], set[Value]] = defaultdict(set)
    reach: dict[tuple[str, PartitionKey], int] = {}
    for op in fetches:
        if op.outcome is not Outcome.OK:
            continue
        for key, _, value in op.records:
            delivered[op.group, key].add(value)
        if op.final:
            for read in op.reads:
                reach[op.group, read.key] = max(reach.get((op.group, read.key), 0), read.next_offset)
    anomalies = []
    for group, topics in sorted(_subscriptions(members).items()):
        for key in sorted(k for k in acknowledged if k.topic in topics):
            order = orders.get(key)
            offsets = {} if order is None else order.offset_of
            acked = sorted((offsets[v], v, writer) for v, writer in acknowledged[key].items() if v in offsets)
            if not acked:
                continue
            reached = reach.get((group, key), 0)
            if reached <= acked[-1][0]:
                explanation = (f"group {group}: the final drain reached offset {reached}, "
                               f"acknowledged up to {acked[-1][0]}")
                anomalies.append(anomaly("group-drain-incomplete", key, explanation, ()))
            seen = delivered.get((group, key), set())
            missing = [(offset, value, writer) for offset, value, writer in acked
                       if offset < reached and value not in seen]
            if missing:
                explanation = (f"group {group}: {len(missing)} acknowledged values no member fetched, at "
                               f"offsets {listing([offset for offset, _, _ in missing])}")
                anomalies.append(anomaly("group-undelivered", key, explanation,
                                         (writer for _, _, writer in missing[:8])))
    return anomalies


# -- (b) committed offsets never go backwards ------------------------------------------


@dataclass(frozen=True, slots=True)
class _Seen:
    invoke_s: float
    complete_s: float
    offset: int
    op: int


def offsets_backwards(members: list[Membership], commits: list[GroupCommit],
                      offset_fetches: list[OffsetFetch]) -> list[Anomaly]:
    groups = {op.group for op in members}
    seen: dict[tuple[str, PartitionKey], list[_Seen]] = defaultdict(list)
    resets: dict[tuple[str, PartitionKey], list[GroupCommit]] = defaultdict(list)
    for commit in commits:
        for key, offset in commit.offsets:
            if commit.admin_reset and commit.outcome is not Outcome.FAIL:
                resets[commit.group, key].append(commit)
            elif commit.outcome is Outcome.OK and not commit.admin_reset:
                seen[commit.group, key].append(_Seen(commit.invoke_s, commit.complete_s, offset, commit.index))
    for fetch in offset_fetches:
        if fetch.group in groups and fetch.outcome is Outcome.OK and fetch.offset is not None:
            seen[fetch.group, fetch.key].append(_Seen(fetch.invoke_s, fetch.complete_s, fetch.offset, fetch.index))
    anomalies = []
    for (group, key), observed in sorted(seen.items()):
        pairs = _backwards_pairs(observed, resets.get((group, key), []))
        if pairs:
            shown = "; ".join(f"op {a.op} saw {a.offset}, then op {b.op} saw {b.offset}"
                              for a, b in pairs[:PAIRS_LISTED])
            more = f" (+{len(pairs) - PAIRS_LISTED} more)" if len(pairs) > PAIRS_LISTED else ""
            anomalies.append(anomaly("group-offset-backwards", key,
                                     f"group {group}: committed offset went back: {shown}{more}",
                                     (x for a, b in pairs[:PAIRS_LISTED] for x in (a.op, b.op))))
    return anomalies


def _backwards_pairs(observed: list[_Seen], resets: list[GroupCommit]) -> list[tuple[_Seen, _Seen]]:
    """Pairs (a, b): a completed before b was invoked and b saw less. With no reset one
    sweep in invocation order keeps the highest offset seen by what completed before."""
    by_completion = sorted(observed, key=lambda s: s.complete_s)
    pairs = []
    done = 0
    highest: _Seen | None = None
    for b in sorted(observed, key=lambda s: s.invoke_s):
        while done < len(by_completion) and by_completion[done].complete_s < b.invoke_s:
            a = by_completion[done]
            if highest is None or a.offset > highest.offset:
                highest = a
            done += 1
        if highest is None or b.offset >= highest.offset:
            continue
        if not resets:
            pairs.append((highest, b))
            continue
        # A reset may move the offset anywhere: only pairs it cannot fall between count.
        for a in by_completion[:done]:
            if a.offset > b.offset and not any(r.invoke_s < b.complete_s and r.complete_s > a.invoke_s
                                               for r in resets):
                pairs.append((a, b))
                break
    return pairs


# -- (c) never two owners --------------------------------------------------------------


def _views(members: Iterable[Membership], fetches: Iterable[GroupFetch]
           ) -> list[tuple[str, MemberView, Membership | GroupFetch]]:
    views = []
    for op in (*members, *fetches):
        if op.outcome is Outcome.OK and op.view is not None:
            views.append((op.group, op.view, op))
    return views


def two_owners_in_epoch(members: list[Membership], fetches: list[GroupFetch]) -> list[Anomaly]:
    """An empty group is removed and starts again at epoch 1 when someone joins, so views
    compare only within one *incarnation* of the group: members that certainly existed at
    one moment together, chained (`_incarnations`)."""
    incarnation = _incarnations(members, fetches)
    owners: dict[tuple[str, int, int, PartitionKey], dict[str, int]] = defaultdict(dict)
    for group, view, op in _views(members, fetches):
        for key in view.assigned:
            owners[group, incarnation[op.index], view.epoch, key].setdefault(view.member_id, op.index)
    anomalies = []
    for (group, _, epoch, key), told in sorted(owners.items()):
        if len(told) > 1:
            listed = ", ".join(f"{member} (op {op})" for member, op in sorted(told.items()))
            anomalies.append(anomaly("group-two-owners-epoch", key,
                                     f"group {group}: epoch {epoch} assigned to {listed}", told.values()))
    return anomalies


def _incarnations(members: list[Membership], fetches: list[GroupFetch]) -> dict[int, int]:
    """op index -> incarnation number, for every ok op with a view.

    A member's *lifetime* is its ops from one join to the next join naming it (a join
    under a known id may create it again after it was removed). It certainly existed
    from its first ok op's completion to its last ok op's invocation. Members alive at one
    moment together belong to one incarnation, and so does the chain of such overlaps:
    the merged union of the lifetimes. A lifetime with no such span (one ok op) is an
    incarnation of its own, compared with nothing."""
    lifetimes: list[list[Membership | GroupFetch]] = []
    current: dict[tuple[str, str], list[Membership | GroupFetch]] = {}
    for op in sorted((*members, *fetches), key=lambda o: o.invoke_s):
        member_id = op.member_id if op.member_id is not None else (op.view.member_id if op.view else None)
        if member_id is None:
            continue
        if (isinstance(op, Membership) and op.action is MemberAction.JOIN) or (op.group, member_id) not in current:
            current[op.group, member_id] = []
            lifetimes.append(current[op.group, member_id])
        current[op.group, member_id].append(op)
    spans: dict[str, list[tuple[float, float, int]]] = defaultdict(list)
    for number, ops in enumerate(lifetimes):
        ok = [op for op in ops if op.outcome is Outcome.OK]
        if ok:
            spans[ops[0].group].append((min(op.complete_s for op in ok), max(op.invoke_s for op in ok), number))
    incarnation_of_lifetime: dict[int, int] = {}
    count = 0
    for of_group in spans.values():
        current, end = -1, -math.inf
        for start, span_end, number in sorted(of_group):
            if start >= span_end:  # no moment it certainly existed: compared with nothing
                incarnation_of_lifetime[number] = count
                count += 1
                continue
            if current < 0 or start >= end:
                current, end = count, span_end
                count += 1
            end = max(end, span_end)
            incarnation_of_lifetime[number] = current
    return {op.index: incarnation_of_lifetime[number] for number, ops in enumerate(lifetimes)
            for op in ops if number in incarnation_of_lifetime}


def _timeouts(members: Iterable[Membership]) -> dict[str, tuple[float, float]]:
    """Per group, (session, rebalance) timeouts in seconds: the longest any join asked
    (a longer one only moves a removal later, so the bound stays a lower bound)."""
    timeouts: dict[str, tuple[float, float]] = {}
    for op in members:
        if op.action is MemberAction.JOIN:
            session = (op.session_timeout_ms or SESSION_TIMEOUT_MS_DEFAULT) / 1000
            rebalance = (op.rebalance_timeout_ms or REBALANCE_TIMEOUT_MS_DEFAULT) / 1000
            old = timeouts.get(op.group, (0.0, 0.0))
            timeouts[op.group] = (max(old[0], session), max(old[1], rebalance))
    return timeouts


def _holds(ops: list[Membership | GroupFetch], key: PartitionKey, session_s: float,
           rebalance_s: float) -> list[tuple[float, float, int]]:
    """One member's ops (in invocation order): the times it certainly held `key`, as
    merged, sorted (start, end, op that told it) intervals (module docstring)."""
    removed_by = _removed_by(ops, session_s)
    # given_back_by[i]: the earliest the member can have let go of `key` after op i: its
    # next call that may give it back, or a rebalance timeout running out before that.
    given_back_by = [math.inf] * len(ops)
    release = revoked = math.inf
    for number in range(len(ops) - 1, -1, -1):
        given_back_by[number] = min(release, revoked)
        op = ops[number]
        if _may_release(op, key):
            release, revoked = op.invoke_s, math.inf
        elif op.outcome is Outcome.OK and op.view is not None and key in op.view.revoking:
            revoked = min(revoked, op.invoke_s + rebalance_s - CLOCK_SLACK_S)
    intervals: list[tuple[float, float, int]] = []
    for number, op in enumerate(ops):
        if op.outcome is not Outcome.OK or op.view is None or key not in op.view.assigned:
            continue
        end = min(removed_by, given_back_by[number])
        if end <= op.complete_s:
            continue
        if intervals and op.complete_s <= intervals[-1][1]:
            start, old_end, told = intervals[-1]
            intervals[-1] = (start, max(old_end, end), told)
        else:
            intervals.append((op.complete_s, end, op.index))
    return intervals


def _removed_by(ops: list[Membership | GroupFetch], session_s: float) -> float:
    """The earliest the coordinator can have removed the member for silence.

    It decides to expire a member at a moment D when it has not seen it for the
    session timeout, and the removal applies at some R >= D; calls it answers between
    D and R still succeed (the member is in the state until R), and they do not undo
    the decision. Every ok call was seen at a moment inside its span, so D is at
    least `invoke + session` of some ok call j, with j's successor able to come after
    D (it completes later than that), or j the last; and R is after every ok call's
    invocation, since the member was there for each."""
    ok = [op for op in ops if op.outcome is Outcome.OK]
    if not ok:
        return -math.inf
    decided = min([ok[-1].invoke_s + session_s] + [
        op.invoke_s + session_s for op, after in pairwise(ok)
        if after.complete_s > op.invoke_s + session_s])
    return max(ok[-1].invoke_s, decided - CLOCK_SLACK_S)


def _may_release(op: Membership | GroupFetch, key: PartitionKey) -> bool:
    if not isinstance(op, Membership) or op.outcome is Outcome.FAIL:
        return False
    if op.action is MemberAction.HEARTBEAT:
        return op.owned is None or key not in op.owned
    return True  # a leave, or a join again under the same id


def two_owners(members: list[Membership], fetches: list[GroupFetch]) -> list[Anomaly]:
    timeouts = _timeouts(members)
    by_member: dict[str, dict[str, list[Membership | GroupFetch]]] = defaultdict(lambda: defaultdict(list))
    for op in (*members, *fetches):
        member_id = op.member_id if op.member_id is not None else (op.view.member_id if op.view else None)
        if member_id is not None:
            by_member[op.group][member_id].append(op)
    holds: dict[tuple[str, str, PartitionKey], list[tuple[float, float, int]]] = {}
    anomalies = []
    for group, view, op in _views(members, fetches):
        session_s, rebalance_s = timeouts.get(group, (SESSION_TIMEOUT_MS_DEFAULT / 1000,
                                                      REBALANCE_TIMEOUT_MS_DEFAULT / 1000))
        for key in view.assigned:
            for other, ops in sorted(by_member[group].items()):
                if other == view.member_id:
                    continue
                held = holds.get((group, other, key))
                if held is None:
                    ops.sort(key=lambda o: o.invoke_s)
                    held = holds[group, other, key] = _holds(ops, key, session_s, rebalance_s)
                holder = _held_across(held, op.invoke_s, op.complete_s)
                if holder is not None:
                    explanation = (f"group {group}: op {op.index} told {view.member_id} (epoch {view.epoch}) it "
                                   f"owns {key} while {other} held it since op {holder}")
                    anomalies.append(anomaly("group-two-owners", key, explanation, (holder, op.index)))
    return anomalies


def _held_across(intervals: list[tuple[float, float, int]], begin: float, end: float) -> int | None:
    """The op that began a hold covering all of [begin, end], if one does (starts are sorted)."""
    position = bisect_right(intervals, begin, key=lambda interval: interval[0])
    if position and intervals[position - 1][0] < begin and intervals[position - 1][1] > end:
        return intervals[position - 1][2]
    return None


def fetch_unowned(fetches: list[GroupFetch]) -> list[Anomaly]:
    anomalies = []
    for op in fetches:
        if op.outcome is not Outcome.OK or op.view is None:
            continue
        assigned = set(op.view.assigned)
        outside = sorted({key for key, _, _ in op.records if key not in assigned})
        for key in outside:
            anomalies.append(anomaly("group-fetch-unowned", key,
                                     f"group {op.group}: op {op.index} fetched {key} for {op.view.member_id}, "
                                     f"which its answer did not assign", (op.index,)))
    return anomalies
