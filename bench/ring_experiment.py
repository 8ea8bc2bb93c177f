"""The host ring experiment of the design slides (issue 17): nodes A150 B80 C200 D40, C dies, E300 joins.

Run: ``.venv/bin/python bench/ring_experiment.py [--quick]`` (``make ring-experiment``; about 4
minutes, ``--quick``: 60 hosts, about 1.5 minutes). It starts one Redis, the kit's universe
(``universe.py serve``, 200 hosts x about 15 pages, every host but two with ``Crawl-delay: 6``,
150 +- 30 ms latency) and four ring nodes, each ``VCRAWL_NODE_WEIGHT=W celery -A tasks worker
... -P threads -c 8 -n X@%h`` in a process group of its own, then submits one job over the
universe with ``vcrawl submit`` and:

1. about ``--kill-at`` s into the crawl, reads ``vcrawl nodes --json`` (hosts each node owns) and
   SIGKILLs C's process group;
2. follows the listing (every 0.5 s) until C is out and its hosts have owners again, then waits
   ``--settle`` s and starts E (weight 300);
3. follows the listing until E is in; waits for the job to complete; scores the crawl from the
   universe's access log (the kit's ``universe.py evaluate``).

Printed: one JSON line per stage (nodes, weight share, host share, URL share), one per change
(hosts moved, against the ideal, and between which nodes), a summary line (recall, robots
violations, per-host gaps below the job's delay and below Crawl-delay, pages fetched twice,
wall time), then a markdown table. The URL share of a node in a stage is its share of the
``pages`` deltas of ``vcrawl nodes --json`` over the stage (URLs the node fetched); the
transitions (C silent but not yet out; E started but not yet in) are left out of the stages.

Settings that differ from the shipped defaults, and why (the acceptance check 12-scale-out's):
``VCRAWL_NODE_TIMEOUT_S=10`` (default 30: the experiment must see C go within the crawl; the
Crawl-delay of 6 s stays below it, so a handed-over host keeps its gap);
``VCRAWL_VISIBILITY_TIMEOUT_S=60`` (default 3600: analysis messages C had taken come back only
after it, so the job would wait an hour to complete); ``VCRAWL_MAX_RETRY_AFTER_S=10`` and
``VCRAWL_TOTAL_TIMEOUT_S=20`` (the universe's Retry-After traps and slow pages bound the tail).
The job: politeness ``min_interval_s`` 0.1, ``per_host`` 1, jitter 0, robots obeyed.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import node_cluster as nc

WEIGHTS = {"A": 150, "B": 80, "C": 200, "D": 40, "E": 300}
FAST_HOSTS: set[str] = set()  # hosts without a Crawl-delay (the kit gives them 20x the pages)


def main() -> int:
    """Run the experiment; print its JSON lines and table."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hosts", type=int, default=200)
    parser.add_argument("--pages", type=int, default=3000)
    parser.add_argument("--latency-ms", type=float, default=150.0)
    parser.add_argument("--jitter-ms", type=float, default=30.0)
    parser.add_argument("--crawl-delay", type=float, default=6.0, help="Crawl-delay of (almost) every host")
    parser.add_argument("--port", type=int, default=18831, help="the universe's port (one of our own)")
    parser.add_argument("--threads", type=int, default=8, help="threads per node")
    parser.add_argument("--delay", type=float, default=0.1, help="the job's min_interval_s")
    parser.add_argument("--node-timeout", type=float, default=10.0, help="VCRAWL_NODE_TIMEOUT_S")
    parser.add_argument("--kill-at", type=float, default=20.0, help="seconds after submit to kill C")
    parser.add_argument("--settle", type=float, default=5.0, help="seconds after C's hosts are re-owned to start E")
    parser.add_argument("--timeout", type=float, default=600.0, help="hard stop of the crawl, seconds")
    parser.add_argument("--stall", type=float, default=60.0, help="give up on a job with nothing queued, "
                        "nothing in flight and no counter moving for this long (s)")  # fmt: skip
    parser.add_argument("--quick", action="store_true", help="smoke run: 60 hosts, 900 pages, Crawl-delay 3")
    parser.add_argument("--out", default="/tmp/vcrawl-ring-experiment.jsonl", help="JSON lines")
    args = parser.parse_args()
    if args.quick:
        args.hosts, args.pages, args.crawl_delay, args.kill_at = 60, 900, 3.0, 15.0
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so the `finally`s stop what was started
    rows = run(args)
    with open(args.out, "w") as out:
        for row in rows:
            out.write(json.dumps(row) + "\n")
    print_table(rows)
    return 0 if rows and rows[-1].get("kind") == "summary" and rows[-1]["state"] == "completed" else 1


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Start everything, run the experiment, stop everything (also on failure)."""
    from cli.local_redis import LocalRedis

    work = Path(tempfile.mkdtemp(prefix="vcrawl-ring-"))
    state = work / "state.json"
    uni = argparse.Namespace(hosts=args.hosts, pages=args.pages, latency_ms=args.latency_ms, jitter_ms=args.jitter_ms)
    extra = ["--port", str(args.port), "--crawl-delay-frac", "1", "--crawl-delay", str(args.crawl_delay)]
    server = nc.crawl_universe.start_universe(uni, state, work, extra)
    redis_server = None
    nodes: dict[str, nc.Node] = {}
    rows: list[dict[str, Any]] = []
    try:
        redis_server = LocalRedis(work / "redis").start()
        env = nc.base_env(
            redis_server.url, work / "data",
            VCRAWL_NODE_TIMEOUT_S=f"{args.node_timeout:g}", VCRAWL_VISIBILITY_TIMEOUT_S="60",
            VCRAWL_MAX_RETRY_AFTER_S="10", VCRAWL_TOTAL_TIMEOUT_S="20",
        )  # fmt: skip
        tasks = nc.use_cluster(env)
        manifest = json.loads(Path(json.loads(state.read_text())["manifest"]).read_text())
        FAST_HOSTS.update(h for h, robots in manifest["robots"].items() if not robots["crawl_delay"])
        pages_per_host: dict[str, int] = {}
        for url in manifest["reachable_pages"]:
            host = url.split("/")[2].split(":")[0]
            pages_per_host[host] = pages_per_host.get(host, 0) + 1
        slow = sorted(n for h, n in pages_per_host.items() if h not in FAST_HOSTS) or [0]
        uni_row = {"kind": "universe", "hosts": len(manifest["hosts"]),
                   "reachable_pages": len(manifest["reachable_pages"]),
                   "fast_hosts": {h: pages_per_host.get(h, 0) for h in sorted(FAST_HOSTS)},
                   "pages_per_slow_host_median": slow[len(slow) // 2]}  # fmt: skip
        print(json.dumps(uni_row), flush=True)
        rows.append(uni_row)
        job_file = work / "job.json"
        job_file.write_text(json.dumps(nc.job_for(manifest, args.delay, 1), indent=1))
        rows += experiment(args, tasks, env, nodes, work, state, job_file)
    finally:
        nc.stop_all(list(nodes.values()))
        if redis_server is not None:
            redis_server.stop()
        nc.crawl_universe.stop_universe(server)
        print(f">>> logs in {work}", file=sys.stderr)
    return rows


def experiment(
    args: argparse.Namespace, tasks: Any, env: dict[str, str], nodes: dict[str, nc.Node], work: Path,
    state: Path, job_file: Path,
) -> list[dict[str, Any]]:  # fmt: skip
    """The timeline: four nodes, the job, C killed, E added, the job's end; the rows to print."""
    rows: list[dict[str, Any]] = []
    for letter in "ABCD":
        nodes[letter] = nc.Node(letter, WEIGHTS[letter], args.threads, env, work).start()
    wait_listing(tasks, nodes, lambda v: all(v.get(x, {}).get("alive") for x in "ABCD"), 90, "A B C D alive")
    time.sleep(5)  # every node's view of the ring settles before the job starts (as the check does)

    offset = nc.log_offset(state)
    t0 = time.time()
    job_id = nc.vcrawl(env, "submit", str(job_file)).strip().splitlines()[-1]
    print(f">>> job {job_id} submitted", file=sys.stderr, flush=True)
    pages_t0 = pages_of(listing(tasks))

    # Stage 1 until C dies
    time.sleep(max(0.0, t0 + args.kill_at - time.time()))
    before_kill = cli_listing(env)
    tk = time.time()
    nodes["C"].kill_group()
    print(f">>> C killed {tk - t0:.1f} s after submit", file=sys.stderr, flush=True)
    rows.append(stage_row("s1 A B C D", before_kill, pages_t0, pages_of(before_kill), "ABCD", t0, tk))

    # C silent, then out: its hosts re-owned
    c_out = wait_listing(tasks, nodes, lambda v: not v.get("C", {}).get("alive", True), args.node_timeout + 60,
                         "C out after its kill")  # fmt: skip
    t_out = time.time()
    after_kill = cli_listing(env)
    rows.append(change_row("C removed", before_kill, after_kill, "C", None, tk, t_out))
    time.sleep(args.settle)

    # Stage 2 until E joins
    before_e = cli_listing(env)
    te = time.time()
    rows.append(stage_row("s2 A B D", before_e, pages_of(c_out), pages_of(before_e), "ABD", t_out, te))
    nodes["E"] = nc.Node("E", WEIGHTS["E"], args.threads, env, work).start()
    e_in = wait_listing(tasks, nodes, lambda v: v.get("E", {}).get("alive", False), 90, "E alive")
    t_in = time.time()
    after_e = cli_listing(env)
    rows.append(change_row("E added", before_e, after_e, None, "E", te, t_in))
    state_when_e = tasks.job_state(job_id)

    # Stage 3 until the job ends
    deadline = t0 + args.timeout
    last = after_e
    stuck: dict[str, Any] | None = None
    seen, since = None, time.monotonic()
    while time.time() < deadline and tasks.job_state(job_id) not in ("completed", "failed", "cancelled"):
        for letter, node in nodes.items():
            if letter != "C" and not node.running():
                raise SystemExit(f"node {letter} exited; see {node.log}")
        last_try = listing(tasks)
        if last_try["hosts"]:
            last = last_try
        status = tasks.job_status(job_id) or {}
        now_seen = tuple(status.get(k) for k in ("pending", "queued", "in_flight_batches", "analysed", "pages_fetched"))
        if now_seen != seen:
            seen, since = now_seen, time.monotonic()
        elif (
            status.get("queued") == 0 and status.get("in_flight_batches") == 0 and time.monotonic() - since > args.stall
        ):
            # nothing queued, nothing in flight, no counter moving: the job will not end by itself
            stuck = {k: status.get(k) for k in ("pending", "queued", "in_flight_batches", "pages_stored", "analysed",
                                                "handed_over", "pages_fetched", "state")}  # fmt: skip
            print(f">>> job stuck for {args.stall:g} s: {stuck}", file=sys.stderr, flush=True)
            break
        time.sleep(1)
    t1 = time.time()
    final = listing(tasks)
    rows.append(stage_row("s3 A B D E", last, pages_of(e_in), pages_of(final), "ABDE", t_in, t1))
    time.sleep(1.5)  # the server flushes its access log every second
    score = nc.evaluate(state, offset, args.delay)
    status = json.loads(nc.vcrawl(env, "status", job_id, "--json").strip().splitlines()[-1])
    reown = wire_reown(state, offset, before_kill, tk)
    rows.append({
        "kind": "summary", "job": job_id, "state": status.get("state"), "state_when_e_joined": state_when_e,
        "wall_s": round(t1 - t0, 1), "kill_at_s": round(tk - t0, 1), "c_out_after_s": round(t_out - tk, 1),
        "e_in_after_s": round(t_in - te, 1), **reown,
        "recall": score["recall"], "reachable_fetched": score["reachable_fetched"],
        "reachable_pages": score["reachable_pages"], "robots_violations": score["robots_violations"],
        "gaps_below_delay": score.get("gaps_below_delay"), "gaps_total": score.get("gaps_total"),
        "delay_checked_s": args.delay, "host_gap_min_s": score.get("host_gap_min_s"),
        "crawl_delay_violated_hosts": score["crawl_delay_violated_hosts"],
        "crawl_delay_hosts": score.get("crawl_delay_hosts"), "duplicate_page_fetches": score["duplicate_page_fetches"],
        "requests": score["requests"], "pages_by_node": pages_of(final),
        "c_hosts_at_kill": len(hosts_of(before_kill).get("C", [])), "stuck": stuck,
    })  # fmt: skip
    for row in rows:
        print(json.dumps(row), flush=True)
    return rows


def listing(tasks: Any) -> dict[str, Any]:
    """``vcrawl nodes --json``, read in-process through the same façade function (cheap to poll)."""
    return dict(tasks.ring_nodes(with_hosts=True))


def cli_listing(env: dict[str, str]) -> dict[str, Any]:
    """``vcrawl nodes --json`` itself, for the readings the tables are made of."""
    return dict(json.loads(nc.vcrawl(env, "nodes", "--json").strip().splitlines()[-1]))


def by_letter(view: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {node["name"].split("@")[0]: node for node in view["nodes"]}


def pages_of(view: dict[str, Any]) -> dict[str, int]:
    return {letter: int(node["pages"]) for letter, node in by_letter(view).items()}


def hosts_of(view: dict[str, Any]) -> dict[str, list[str]]:
    return {letter: list(node.get("hosts", [])) for letter, node in by_letter(view).items()}


def wait_listing(tasks: Any, nodes: dict[str, nc.Node], cond: Any, timeout_s: float, what: str) -> dict[str, Any]:
    """Poll the listing every 0.5 s until ``cond(nodes by letter)`` holds; the listing that did."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        view = listing(tasks)
        if cond(by_letter(view)):
            return view
        for letter, node in nodes.items():
            if letter != "C" and not node.running():
                raise SystemExit(f"node {letter} exited; see {node.log}")
        time.sleep(0.5)
    raise SystemExit(f"timed out after {timeout_s:g} s waiting for: {what}")


def stage_row(
    name: str, view: dict[str, Any], pages_from: dict[str, int], pages_to: dict[str, int], letters: str,
    t_from: float, t_to: float,
) -> dict[str, Any]:  # fmt: skip
    """Weight share, host share and URL share of each node of a stage."""
    hosts = hosts_of(view)
    total_w = sum(WEIGHTS[x] for x in letters)
    total_h = sum(len(hosts.get(x, [])) for x in letters) or 1
    deltas = {x: pages_to.get(x, 0) - pages_from.get(x, 0) for x in WEIGHTS if x in pages_to}
    total_p = sum(deltas.values()) or 1
    per = {
        x: {"weight": WEIGHTS[x], "weight_share": round(WEIGHTS[x] / total_w, 3),
            "hosts": len(hosts.get(x, [])), "host_share": round(len(hosts.get(x, [])) / total_h, 3),
            "urls": deltas.get(x, 0), "url_share": round(deltas.get(x, 0) / total_p, 3)}
        for x in letters
    }  # fmt: skip
    others = {x: d for x, d in deltas.items() if x not in letters and d}
    for x in letters:  # the few hosts without Crawl-delay hold ~20x the pages of the others
        per[x]["fast_hosts"] = sorted(h for h in hosts.get(x, []) if h.split(":")[0] in FAST_HOSTS)
    return {"kind": "stage", "stage": name, "seconds": round(t_to - t_from, 1), "hosts": total_h,
            "urls": sum(deltas.values()), "nodes": per, "urls_by_absent_nodes": others}  # fmt: skip


def change_row(
    name: str, before: dict[str, Any], after: dict[str, Any], gone: str | None, added: str | None,
    t_change: float, t_done: float,
) -> dict[str, Any]:  # fmt: skip
    """Hosts that changed owner between two listings, against the consistent-hashing ideal."""
    owner_before = {h: x for x, hs in hosts_of(before).items() for h in hs}
    owner_after = {h: x for x, hs in hosts_of(after).items() for h in hs}
    common = sorted(set(owner_before) & set(owner_after))
    moved = [h for h in common if owner_before[h] != owner_after[h]]
    n = len(common) or 1
    if gone is not None:
        ideal = sum(1 for h in common if owner_before[h] == gone) / n
        wrong = [h for h in moved if owner_before[h] != gone]
        to = {}
        for h in moved:
            to[owner_after[h]] = to.get(owner_after[h], 0) + 1
        what = {"ideal_note": f"{gone}'s hosts only", "moved_to": to}
    else:
        assert added is not None
        alive = [x for x, node in by_letter(after).items() if node["alive"]]
        ideal = WEIGHTS[added] / sum(WEIGHTS[x] for x in alive)
        wrong = [h for h in moved if owner_after[h] != added]
        what = {
            "ideal_note": f"{added}'s weight share",
            "moved_to_" + added: len(moved) - len(wrong),
            "host_share_" + added: round(len(hosts_of(after).get(added, [])) / n, 3),
        }
    return {
        "kind": "change", "change": name, "hosts_compared": len(common), "moved": len(moved),
        "moved_frac": round(len(moved) / n, 3), "ideal_frac": round(ideal, 3),
        "moved_between_other_nodes": len(wrong), "examples_between_others": wrong[:5],
        "listing_after_s": round(t_done - t_change, 1), **what,
    }  # fmt: skip


def wire_reown(state: Path, offset: int, before_kill: dict[str, Any], tk: float) -> dict[str, Any]:
    """From the access log: how long after the kill each of C's hosts (with pages left) was fetched again."""
    sys.path.insert(0, str(nc.SHARED))
    import universe  # the kit's log reader

    c_hosts = {h.split(":")[0] for h in hosts_of(before_kill).get("C", [])}
    first_after: dict[str, float] = {}
    last_before: dict[str, float] = {}
    last_any: dict[str, float] = {}
    for ts, ip, _status, _size, _uri in universe.read_log(json.loads(state.read_text())["log"], offset):
        last_any[ip] = max(ts, last_any.get(ip, 0.0))
        if ip not in c_hosts:
            continue
        if ts < tk:
            last_before[ip] = max(ts, last_before.get(ip, 0.0))
        elif ip not in first_after or ts < first_after[ip]:
            first_after[ip] = ts
    waits = sorted(first_after[h] - tk for h in first_after)
    idle = sorted(first_after[h] - last_before[h] for h in first_after if h in last_before)
    return {
        "c_hosts_fetched_after_kill": len(first_after),
        "c_hosts_refetch_first_s": round(waits[0], 1) if waits else None,
        "c_hosts_refetch_median_s": round(waits[len(waits) // 2], 1) if waits else None,
        "c_hosts_refetch_max_s": round(waits[-1], 1) if waits else None,
        "c_hosts_idle_gap_max_s": round(idle[-1], 1) if idle else None,
    }


def print_table(rows: list[dict[str, Any]]) -> None:
    """The markdown table of the docs: one block per stage, one line per change, the summary."""
    stages = [r for r in rows if r.get("kind") == "stage"]
    changes = {r["change"]: r for r in rows if r.get("kind") == "change"}
    if stages:
        print("\n| stage | node | weight | weight share | hosts | host share | URLs | URL share |")
        print("|---|---|---|---|---|---|---|---|")
    for stage in stages:
        for letter, n in stage["nodes"].items():
            print(
                f"| {stage['stage']} ({stage['seconds']:g} s) | {letter} | {n['weight']} | {n['weight_share']:.3f} "
                f"| {n['hosts']} | {n['host_share']:.3f} | {n['urls']} | {n['url_share']:.3f} |"
            )
    if changes:
        print("\n| change | hosts moved | moved fraction | ideal | moved between other nodes | listing after |")
        print("|---|---|---|---|---|---|")
    for name, c in changes.items():
        print(
            f"| {name} | {c['moved']} of {c['hosts_compared']} | {c['moved_frac']:.3f} | {c['ideal_frac']:.3f} "
            f"({c['ideal_note']}) | {c['moved_between_other_nodes']} | {c['listing_after_s']:g} s |"
        )
    for s in (r for r in rows if r.get("kind") == "summary"):
        if s.get("stuck"):
            print(f"\nThe job did not complete: nothing queued or in flight, no counter moving: {s['stuck']}")
        print(
            f"\nJob {s['state']} after {s['wall_s']} s; C killed at {s['kill_at_s']} s, out of the listing "
            f"{s['c_out_after_s']} s later; C's hosts fetched again {s['c_hosts_refetch_first_s']}-"
            f"{s['c_hosts_refetch_max_s']} s after the kill (median {s['c_hosts_refetch_median_s']}); E in "
            f"{s['e_in_after_s']} s after its start. Recall {s['recall']} ({s['reachable_fetched']}/"
            f"{s['reachable_pages']}), robots violations {s['robots_violations']}, gaps below "
            f"{s['delay_checked_s']} s {s['gaps_below_delay']} of {s['gaps_total']}, Crawl-delay violated hosts "
            f"{s['crawl_delay_violated_hosts']}"
            f"/{s['crawl_delay_hosts']}, pages fetched twice {s['duplicate_page_fetches']}."
        )


if __name__ == "__main__":
    sys.exit(main())
