"""`raftlog cluster features [finalize [--level N]]`: the cluster's feature level
(multiraft/node/features.py, docs/node.md "Upgrading").

    raftlog cluster features                    each registered node's supported level, who did
                                                not answer, and the level the cluster is finalized at
    raftlog cluster features finalize [--level N]
                                                raise it (default: the highest level every node
                                                supports); refused, naming the nodes, when one did
                                                not answer or supports less

A new cluster starts at its build's level; finalizing is the last step of a rolling
upgrade, once every node runs the new build, and cannot be undone.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from multiraft.cli.commands import EXIT_OK, _table

if TYPE_CHECKING:
    from multiraft.client import Client

class ClientCommand(Protocol):
    def __call__(self, parser: argparse.ArgumentParser, func: Callable[..., int], *, inherited: bool = False) -> None:
        ...


def add_features_parser(cluster_commands: argparse._SubParsersAction,  # type: ignore[type-arg]
                        client_command: ClientCommand) -> None:
    features = cluster_commands.add_parser(
        "features", help="the cluster's feature level and the level each node supports; 'finalize' raises it "
                         "once every node runs a build that supports it (admin)",
        description="Show the level the cluster is finalized at and ask every registered node which level it "
                    "supports. Finalize after a rolling upgrade, once every node runs the new build: gated "
                    "features (a mirror resync keeping its prefix, HTTPS mirror links) are used only from the "
                    "level on, and a finalized level is never lowered (the old build could no longer read "
                    "the metadata log). A new cluster starts at its build's level.")
    client_command(features, features_show)
    actions = features.add_subparsers(dest="features_command", required=False, metavar="{finalize}")
    finalize = actions.add_parser("finalize", help="raise the finalized level (default: the highest every node "
                                                   "supports); refused, naming the nodes, when one did not "
                                                   "answer or supports less")
    finalize.add_argument("--level", type=int, default=None, metavar="N",
                          help="the level to finalize (default: the highest level every registered node supports)")
    client_command(finalize, features_finalize, inherited=True)  # before `finalize` or after it


def features_show(client: Client, args: argparse.Namespace) -> int:
    _print(client.features())
    return EXIT_OK


def features_finalize(client: Client, args: argparse.Namespace) -> int:
    if args.level is not None and args.level < 1:
        raise ValueError("--level: a feature level, 1 or more")
    report = client.finalize_features(args.level)
    if report["finalized"] == report["previous"]:
        print(f"the cluster is finalized at feature level {report['finalized']} already")
    else:
        print(f"the cluster is finalized at feature level {report['finalized']} (was {report['previous']})")
    _print(report)
    return EXIT_OK


def _print(report: dict[str, Any]) -> None:
    rows = []
    for node in report["nodes"]:
        note = "not asked" if node["decommissioned"] else node["error"] or (
            "supports less than the finalized level: upgrade it" if (node["supported"] or 0) < report["finalized"]
            else "")
        supports = "decommissioned" if node["decommissioned"] else node["supported"] if node["answered"] \
            else "no answer"
        rows.append([node["node_id"], node["status"], supports, node["finalized"], note])
    print(_table(rows, ["NODE", "STATUS", "SUPPORTS", "SEES", "NOTE"]))
    common = report["highest_common"]
    silent = report["not_answered"]
    print(f"finalized feature level: {report['finalized']}; highest level every node supports: "
          f"{'unknown' if common is None else common}; did not answer: {', '.join(map(str, silent)) or 'none'}")
    for level in report["levels"]:
        print(f"  level {level['level']} ({level['name']}): {level['description']}")
