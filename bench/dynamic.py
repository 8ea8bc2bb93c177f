"""The dynamic fetcher on the universe's lazy-loading pages; prints one JSON line.

Run: ``.venv/bin/python bench/dynamic.py [--pages 60]`` (``make bench`` runs it). Starts the
shared universe (../shared/bench, 20 hosts x 6000 pages), fetches its dynamic pages with one
browser calling each page's lazy-load function, checks each page's marker, and fetches the
same pages with the static fetcher to show the browser's cost per page.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from crawl_universe import start_universe, stop_universe

from fetchers import (
    BrowserConfig,
    BrowserFetcher,
    FetchLimits,
    FetchRequest,
    NetworkPolicy,
    StaticFetcher,
    make_session,
)
from fetchers.netguard import parse_networks

USER_AGENT = "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/142.0.0.0 Safari/537.36"


def main() -> int:
    """Start the universe, time browser and static fetches of its dynamic pages, print JSON."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pages", type=int, default=60, help="dynamic pages to fetch")
    args = parser.parse_args()
    universe = argparse.Namespace(hosts=20, pages=6000, latency_ms=0.0, jitter_ms=0.0)
    work = Path(tempfile.mkdtemp(prefix="vcrawl-bench-dynamic-"))
    state = work / "state.json"
    server = start_universe(universe, state, work)
    loopback = NetworkPolicy(allowed=parse_networks(["127.0.0.0/8"]))  # the universe; refused by default
    browser = BrowserFetcher(BrowserConfig(), policy=loopback)
    try:
        manifest = json.loads(Path(json.loads(state.read_text())["manifest"]).read_text())
        pages = list(manifest["dynamic"].items())[: args.pages]
        start_s = browser.start()
        browser_times, found, pss, rss = [], 0, [], []
        for url, info in pages:
            began = time.monotonic()
            result = browser.fetch(FetchRequest(url=url, user_agent=USER_AGENT, js_function=info["function"]))
            browser_times.append(time.monotonic() - began)
            found += info["marker"].encode() in result.body
            pss.append(browser.memory_bytes("Pss"))
            rss.append(browser.memory_bytes("Rss"))
        static = StaticFetcher(make_session(), FetchLimits(), policy=loopback)
        static_times = []
        for url, _ in pages:
            began = time.monotonic()
            static.fetch(FetchRequest(url=url, user_agent=USER_AGENT))
            static_times.append(time.monotonic() - began)
    finally:
        browser.close()
        stop_universe(server)
    print(json.dumps({
        "dynamic_pages": len(pages),
        "markers_found": found,
        "browser_start_s": round(start_s, 3),
        "pages_per_s_per_browser": round(len(pages) / sum(browser_times), 2),
        "browser_ms_per_page_median": round(statistics.median(browser_times) * 1000, 1),
        "static_ms_per_page_median": round(statistics.median(static_times) * 1000, 2),
        "overhead_ms_per_page": round((statistics.median(browser_times) - statistics.median(static_times)) * 1000, 1),
        "browser_pss_mb_max": round(max(pss) / 2**20, 1),
        "browser_rss_mb_max": round(max(rss) / 2**20, 1),
    }), flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
