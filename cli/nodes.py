"""``vcrawl nodes``: the host ring's nodes, alive or down, and the hosts each owns."""

from __future__ import annotations

import argparse
import json
from typing import Any

from cli.tables import aligned

__all__ = ["add_nodes_command", "format_nodes"]


def add_nodes_command(commands: Any) -> None:
    """Register ``vcrawl nodes`` on the ``vcrawl`` parser's subparsers."""
    nodes = commands.add_parser(
        "nodes",
        help="list the workers ($VCRAWL_REDIS_URL): weight, alive, hosts owned, pages/s, last heartbeat, "
        "messages held, what was taken over from the dead",
        description="Every worker is a member: it beats and says which broker messages it holds. Ring nodes "
        "(workers started with VCRAWL_NODE_WEIGHT or VCRAWL_RING=on) also own the hosts that the consistent-hash "
        "ring maps to them; hosts are those of the running jobs. Plain workers have weight 0.",
    )
    nodes.add_argument("--json", action="store_true", help="one JSON object, with the list of hosts each node owns")
    nodes.add_argument("--forget", metavar="NAME", help="drop a node that is down from the listing")
    nodes.set_defaults(run=_cmd_nodes)


def _cmd_nodes(args: argparse.Namespace) -> int:
    import tasks

    if args.forget:
        if not tasks.forget_node(args.forget):
            print(f"vcrawl: no node {args.forget!r} that is down")
            return 1
        print(f"forgot {args.forget}")
        return 0
    listing = tasks.ring_nodes(with_hosts=args.json)
    print(json.dumps(listing) if args.json else format_nodes(listing))
    return 0


def format_nodes(listing: dict[str, Any]) -> str:
    """The listing as a table: ring nodes (weight > 0) and plain workers (weight 0) alike.

    >>> print(format_nodes({"nodes": [{"name": "a@box", "weight": 150, "state": "up", "share": 0.65,
    ...     "hosts_owned": 130, "pages_per_s": 12.5, "heartbeat_age_s": 0.4, "held_messages": 3},
    ...     {"name": "w@box", "weight": 0, "state": "down", "share": 0.0, "hosts_owned": 0, "pages_per_s": 0.0,
    ...     "heartbeat_age_s": 41.0, "held_messages": 0, "taken_over": {"batches": 2, "restored": 5}}],
    ...     "alive": 1, "down": 1, "hosts": 200, "unowned_hosts": 0, "node_timeout_s": 30.0, "at": 0}))
    NODE   WEIGHT  STATE  SHARE  HOSTS  PAGES/S  HEARTBEAT  HELD  TAKEN OVER
    a@box     150  up     65.0%    130     12.5  0.4 s ago     3  -
    w@box       0  down    0.0%      0      0.0  41 s ago      0  2 batches, 5 messages
    1 of 2 members alive, 1 down; 200 hosts in running jobs; node timeout 30 s
    """
    rows = [("NODE", "WEIGHT", "STATE", "SHARE", "HOSTS", "PAGES/S", "HEARTBEAT", "HELD", "TAKEN OVER")]
    for node in listing["nodes"]:
        age = node.get("heartbeat_age_s")
        taken = node.get("taken_over")
        rows.append((
            node["name"], str(node["weight"]), node["state"], f"{node['share'] * 100:.1f}%",
            str(node["hosts_owned"]), f"{node['pages_per_s']:.1f}", "-" if age is None else f"{age:g} s ago",
            str(node.get("held_messages", 0)),
            f"{taken.get('batches', 0)} batches, {taken.get('restored', 0)} messages" if taken else "-",
        ))  # fmt: skip
    lines = aligned(rows, right={1, 3, 4, 5, 7})
    if len(rows) == 1:
        lines = ["no workers: none has beaten since the last restart of Redis, or none runs"]
    total = len(listing["nodes"])
    ring = [node for node in listing["nodes"] if node["weight"] > 0 and node["state"] == "up"]
    down = listing.get("down", 0)
    summary = f"{listing['alive']} of {total} members alive" + (f", {down} down" if down else "")
    lines.append(summary + f"; {listing['hosts']} hosts in running jobs"
                 + (f" ({listing['unowned_hosts']} without an owner)" if listing["unowned_hosts"] and ring else "")
                 + f"; node timeout {listing['node_timeout_s']:g} s")  # fmt: skip
    if total and not ring:
        lines.append("no ring node alive: batches go to the shared download queue (VCRAWL_NODE_WEIGHT makes one)")
    return "\n".join(lines)
