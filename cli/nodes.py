"""``vcrawl nodes``: the host ring's nodes, alive or down, and the hosts each owns."""

from __future__ import annotations

import argparse
import json
from typing import Any

from cli.tables import aligned

__all__ = ["add_nodes_command", "format_node_stats", "format_nodes"]


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
    actions = nodes.add_subparsers(dest="nodes_action", metavar="{resize}")
    resize = actions.add_parser(
        "resize",
        help="set a running worker's pool size (tasks at once: its fetch concurrency)",
        description="Grow or shrink a running worker's pool (threads of -P threads, processes of -P prefork) "
        "to N slots; its prefetch follows. Running tasks finish first on slots that go.",
    )
    resize.add_argument("name", metavar="NODE", help="the worker's node name, as `vcrawl nodes` lists it")
    resize.add_argument("concurrency", metavar="N", type=int, help="the pool size to run, 1 to 1024")
    resize.add_argument("--json", action="store_true", help="the worker's answer as JSON")
    resize.set_defaults(run=_cmd_resize)


def _cmd_resize(args: argparse.Namespace) -> int:
    import tasks

    answer = tasks.resize_node(args.name, args.concurrency)
    if args.json:
        print(json.dumps(answer))
    else:
        print(f"{args.name}: {answer.get('ok') or answer.get('error')}")
    return 0 if "error" not in answer else 1


def _cmd_nodes(args: argparse.Namespace) -> int:
    import tasks

    if args.forget:
        if not tasks.forget_node(args.forget):
            print(f"vcrawl: no node {args.forget!r} that is down")
            return 1
        print(f"forgot {args.forget}")
        return 0
    listing = tasks.ring_nodes(with_hosts=args.json)
    print(json.dumps(listing) if args.json else format_nodes(listing) + "\n\n" + format_node_stats(listing))
    return 0


def format_node_stats(listing: dict[str, Any]) -> str:
    """Each member's fetch statistics: totals since it joined, bandwidth, pages/s for its life and last minutes.

    >>> stats = {"requests": 120, "successes": 100, "failures": 3, "hosts_visited": 7, "bytes": 2_500_000,
    ...     "busy_s": 10.0, "bandwidth_bps": 250_000.0, "pages_per_s": 2.5, "recent": {"minutes": 5,
    ...     "pages_per_s": 1.25, "bytes_per_s": 30_000.0}}
    >>> print(format_node_stats({"nodes": [{"name": "a@box", "concurrency": 8, "stats": stats},
    ...     {"name": "b@box", "concurrency": 2, "stats": None}]}))
    NODE   SLOTS  REQUESTS   OK  FAILED  HOSTS  DOWNLOADED  BANDWIDTH  BUSY    PAGES/S  LAST 5 MIN
    a@box      8       120  100       3      7      2.5 MB   250 kB/s  10.0 s     2.50  1.25 p/s, 30 kB/s
    b@box      2         0    0       0      0         0 B          -  0.0 s      0.00  -
    requests sent (robots.txt and redirects too), pages stored, requests that brought no page, hosts requested,
    body bytes; bandwidth is bytes over the time spent downloading; pages/s since the node joined
    """
    rows = [("NODE", "SLOTS", "REQUESTS", "OK", "FAILED", "HOSTS", "DOWNLOADED", "BANDWIDTH", "BUSY", "PAGES/S",
             "LAST 5 MIN")]  # fmt: skip
    for node in listing["nodes"]:
        stats = node.get("stats") or {}
        recent = stats.get("recent") or {}
        rows.append((
            node["name"], str(node.get("concurrency") or "-"), str(stats.get("requests", 0)),
            str(stats.get("successes", 0)), str(stats.get("failures", 0)), str(stats.get("hosts_visited", 0)),
            _size(stats.get("bytes", 0)),
            f"{_size(stats['bandwidth_bps'])}/s" if stats.get("bandwidth_bps") else "-",
            f"{stats.get('busy_s', 0.0):.1f} s", f"{stats.get('pages_per_s', 0.0):.2f}",
            f"{recent['pages_per_s']:.2f} p/s, {_size(recent['bytes_per_s'])}/s" if recent else "-",
        ))  # fmt: skip
    lines = aligned(rows, right={1, 2, 3, 4, 5, 6, 7, 9})
    lines[0] = lines[0].replace("LAST 5 MIN", f"LAST {_recent_minutes(listing)} MIN")
    lines.append("requests sent (robots.txt and redirects too), pages stored, requests that brought no page, "
                 "hosts requested,\nbody bytes; bandwidth is bytes over the time spent downloading; pages/s "
                 "since the node joined")  # fmt: skip
    return "\n".join(lines)


def _recent_minutes(listing: dict[str, Any]) -> int:
    for node in listing["nodes"]:
        if (node.get("stats") or {}).get("recent"):
            return int(node["stats"]["recent"].get("minutes", 5))
    return 5


def _size(count: float) -> str:
    """Bytes in SI units.

    >>> _size(0), _size(999), _size(250_000), _size(2_500_000), _size(3.2e9)
    ('0 B', '999 B', '250 kB', '2.5 MB', '3.2 GB')
    """
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if count >= scale:
            value = count / scale
            return f"{value:.3g} {unit}" if value < 100 else f"{value:.0f} {unit}"
    return f"{count:.0f} B"


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
