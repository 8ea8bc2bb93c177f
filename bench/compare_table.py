"""The side-by-side table and the goals of bench/compare.py (issues 9, 16, 35 and 36), from its JSON rows."""

from __future__ import annotations

from typing import Any

Row = dict[str, Any]


def print_table(rows: list[Row]) -> None:
    """Print the markdown table of every run, then the goals table of each round."""
    print("\n| case | crawler | pages/s (server) | wall s | CPU ms/page | recall | 200s (server) "
          "| robots viol. | dup. fetches | Crawl-delay viol. | gaps < delay | peak RSS MB | Redis req./page "
          "| Redis CPU ms/page |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "note" in r:
            print(f"| {r['case']} | site | {r['note']} |")
        elif "skipped" in r or "error" in r:
            print(f"| {r['case']} | {r['tool']} | {r.get('error') or 'skipped: ' + r['skipped']} |")
        else:
            gaps = f"{r['gaps_below_delay']}/{r['gaps_total']}" if "gaps_below_delay" in r else "-"
            print(f"| {r['case']} | {r['tool']} | {r['fetched_per_s']} | {r['wall_s']} | {r['cpu_ms_per_fetched']} "
                  f"| {r['recall']} | {r['status_counts'].get('200', 0)} | {r['robots_violations']} "
                  f"| {r['duplicate_page_fetches']} | {r['crawl_delay_violated_hosts']} | {gaps} | {r['peak_rss_mb']} "
                  f"| {r.get('redis_requests_per_page', '-')} | {r.get('redis_cpu_ms_per_page', '-')} |")  # fmt: skip
    print(
        "\nCPU ms/page: CPU of the crawler's process tree (and, for `vcrawl` cluster rows, its Redis and "
        "workers) over the reachable pages the server answered with 200."
    )
    rounds = sorted({int(r.get("round", 1)) for r in rows if "fetched_per_s" in r})
    for round_no in rounds:  # each round's verdict on its own: a goal holds when every round says so
        if len(rounds) > 1:
            print(f"\nRound {round_no}:")
        print_goals({(r["case"], r["tool"]): r for r in rows if "fetched_per_s" in r and r.get("round", 1) == round_no})


def _goal(name: str, value: float | None, target: float, at_least: bool = True, unit: str = "x") -> None:
    if value is None:
        return
    met = value >= target if at_least else value <= target
    print(f"| {name} {'>=' if at_least else '<='} {target:g}{unit} | {value:.2f}{unit} | {'yes' if met else 'no'} |")


def _reference(name: str, value: float | None) -> None:
    if value is not None:
        print(f"| {name} (reference) | {value:.2f}x | - |")


def _speed(by: dict[tuple[str, str], Row], case: str, tool: str, other: str) -> float | None:
    """pages/s of ``tool`` over that of ``other`` in ``case`` (None unless both ran)."""
    one, two = by.get((case, tool)), by.get((case, other))
    return one["fetched_per_s"] / two["fetched_per_s"] if one and two and two["fetched_per_s"] else None


def print_goals(by: dict[tuple[str, str], Row]) -> None:
    """The goals table: goal, measured, met; reference ratios have no goal."""
    print("\n| goal | measured | met |\n|---|---|---|")
    print_fetch_engine_goals(by)
    scrapy = by.get(("a", "scrapy"))
    for tool, name in (("vcrawl-defaults", "defaults, `vcrawl crawl --job`"), ("vcrawl", "tuned, running cluster")):
        a = by.get(("a", tool))
        if a and scrapy:
            _goal(f"(a) {name}: pages/s vs Scrapy", _speed(by, "a", tool, "scrapy"), 3.0)
            _goal(f"(a) {name}: CPU/page vs Scrapy", a["cpu_ms_per_fetched"] / scrapy["cpu_ms_per_fetched"], 0.4, False)
        if a:
            _goal(f"(a) {name}: recall", a["recall"], 1.0, unit="")
            _goal(f"(a) {name}: robots violations", a["robots_violations"], 0, at_least=False, unit="")
            _goal(f"(a) {name}: duplicate page fetches", a["duplicate_page_fetches"], 0, at_least=False, unit="")
    _reference(
        "(a) defaults, `retry_after: auto` vs the same with `url`: pages/s auto / url",
        _speed(by, "a", "vcrawl-defaults", "vcrawl-defaults-url"),
    )
    _reference(
        "(a) price of `retry_after: host`, tuned cluster: pages/s host / url", _speed(by, "a", "vcrawl-host", "vcrawl")
    )
    _reference("(a) Crawlee pages/s vs Scrapy", _speed(by, "a", "crawlee", "scrapy"))
    _reference("(a) vcrawl defaults pages/s vs Crawlee", _speed(by, "a", "vcrawl-defaults", "crawlee"))
    _reference("(a) vcrawl tuned cluster pages/s vs Crawlee", _speed(by, "a", "vcrawl", "crawlee"))
    b, ceiling = by.get(("b", "vcrawl")), by.get(("b", "ceiling"))
    if b and ceiling:
        _goal("(b) pages/s vs the ceiling client", b["fetched_per_s"] / ceiling["fetched_per_s"], 0.8)
    c = by.get(("c", "vcrawl"))
    if c and c.get("per_host_bound"):
        _goal("(c) pages/s vs the per-host bound", c["fetched_per_s"] / c["per_host_bound"], 0.95)
        _goal("(c) gaps below the delay", c.get("gaps_below_delay", 0), 0, at_least=False, unit="")
        sc = by.get(("c", "scrapy"))
        if sc and sc.get("per_host_bound"):
            _reference("(c) Scrapy vs its per-host bound", sc["fetched_per_s"] / sc["per_host_bound"])
    for tool, name in (("vcrawl-defaults", "defaults"), ("vcrawl", "tuned cluster")):
        if by.get(("p", tool)) and by.get(("p", "scrapy")):  # issue 35's goals
            p, sp = by[("p", tool)], by[("p", "scrapy")]
            _goal(f"(p) polite at scale, {name}: pages/s vs Scrapy", _speed(by, "p", tool, "scrapy"), 2.5)
            cpu_ratio = p["cpu_ms_per_fetched"] / sp["cpu_ms_per_fetched"]
            _goal(f"(p) polite at scale, {name}: CPU/page vs Scrapy", cpu_ratio, 0.5, False)
            _goal(f"(p) polite at scale, {name}: gaps below the delay", p.get("gaps_below_delay", 0), 0,
                  at_least=False, unit="")  # fmt: skip
    one, two = by.get(("d", "vcrawl-1proc")), by.get(("a", "vcrawl")) or by.get(("d", "vcrawl"))
    if one and two:
        _goal("(d) 2 worker processes vs 1", two["fetched_per_s"] / one["fetched_per_s"], 1.8)
    e = by.get(("e", "vcrawl-defaults"))
    if e:
        _goal("(e) doc site, defaults: recall", e["recall"], 1.0, unit="")
        _goal("(e) doc site, defaults: pages/s vs Scrapy", _speed(by, "e", "vcrawl-defaults", "scrapy"), 2.0)
    if ("e", "scrapy") in by:
        print(f"| (e) doc site, Scrapy recall (reference) | {by[('e', 'scrapy')]['recall']:.2f} | - |")
    _reference("(e) doc site, tuned cluster pages/s vs Scrapy", _speed(by, "e", "vcrawl", "scrapy"))


def _cpu(by: dict[tuple[str, str], Row], case: str, tool: str, other: str) -> float | None:
    """CPU per page of ``tool`` over ``other``'s in ``case`` (None when either did not run)."""
    if (case, tool) not in by or (case, other) not in by:
        return None
    return by[(case, tool)]["cpu_ms_per_fetched"] / by[(case, other)]["cpu_ms_per_fetched"]


def print_fetch_engine_goals(by: dict[tuple[str, str], Row]) -> None:
    """Issue 36's goals: U20 clean against Crawlee, 100 ms against the ceiling client; the trap case as reference."""
    if ("u", "vcrawl-defaults") in by:
        _goal("(u) U20 clean, defaults: pages/s vs Crawlee", _speed(by, "u", "vcrawl-defaults", "crawlee"), 1.5)
        _goal("(u) U20 clean, defaults: CPU/page vs Crawlee", _cpu(by, "u", "vcrawl-defaults", "crawlee"), 0.8, False)
        u = by[("u", "vcrawl-defaults")]
        _goal("(u) U20 clean, defaults: recall", u["recall"], 1.0, unit="")
        _goal("(u) U20 clean, defaults: duplicate fetches", u["duplicate_page_fetches"], 0, at_least=False, unit="")
    _reference("(u) U20 clean, defaults pages/s vs the ceiling client", _speed(by, "u", "vcrawl-defaults", "ceiling"))
    _reference("(u) U20 clean, defaults pages/s vs Scrapy", _speed(by, "u", "vcrawl-defaults", "scrapy"))
    _reference("(t) U20 with traps, defaults pages/s vs Crawlee", _speed(by, "t", "vcrawl-defaults", "crawlee"))
    _reference("(t) U20 with traps, defaults CPU/page vs Crawlee", _cpu(by, "t", "vcrawl-defaults", "crawlee"))
    _reference("(t) U20 with traps, defaults pages/s vs the ceiling", _speed(by, "t", "vcrawl-defaults", "ceiling"))
    if ("l", "vcrawl-cluster") in by:
        _goal("(l) 100 ms, running cluster: pages/s vs the ceiling", _speed(by, "l", "vcrawl-cluster", "ceiling"), 0.8)
    _reference("(l) 100 ms, `vcrawl crawl --job` (start-up included) vs the ceiling client",
               _speed(by, "l", "vcrawl-defaults", "ceiling"))  # fmt: skip
    _reference("(l) 100 ms, running cluster pages/s vs Crawlee", _speed(by, "l", "vcrawl-cluster", "crawlee"))
