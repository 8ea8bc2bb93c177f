"""The one fetch step: robots.txt, one request, the response sorted into an outcome.

``fetch_one`` is what both a crawl job's fetch batch and a single ``crawl.delay`` task call for
each URL. It reads robots.txt when the origin's rules are not cached (RFC 9309), refuses what
they disallow, fetches with an identity (User-Agent, Referer, proxy) drawn from the pool, stores
a 200 body, and returns one frozen outcome (``engine.outcomes``). It never waits: politeness
(when the host may be asked next) belongs to the caller, the frontier for jobs and the host gate
for single tasks, both counted from what the outcome says.

Its phases, one module each:

- ``context``: what a fetch uses, by lifetime: ``FetchServices`` (per process, behind small
  protocols), ``FetchPolicy`` (values), ``JobHooks`` (a job's batch only), and ``FetchItem``.
- ``robots``: robots.txt read and obeyed; ``request``: the one request, its identity and proxy.
- ``archive``: a job's WARC capture; ``response``: the response sorted, retries and their reach;
  ``host_trouble``: the host judged (down, throttling, too slow); ``store``: a 200 body stored;
  ``visits``: the ``Visit`` and URL history an outcome carries.
- ``step``: ``fetch_one`` itself, the phases in order, and ``stops_batch``.
"""

from __future__ import annotations

from engine.fetch_step.context import (
    AlertSink,
    Cycle,
    FetchContext,
    FetchItem,
    FetchPolicy,
    FetchServices,
    JobHooks,
    PageStore,
    PageTypeFetchers,
    ProxyBench,
    RobotsRulesCache,
    SitemapReader,
)
from engine.fetch_step.robots import read_robots_rules
from engine.fetch_step.step import fetch_one, stops_batch

__all__ = [
    "AlertSink",
    "Cycle",
    "FetchContext",
    "FetchItem",
    "FetchPolicy",
    "FetchServices",
    "JobHooks",
    "PageStore",
    "PageTypeFetchers",
    "ProxyBench",
    "RobotsRulesCache",
    "SitemapReader",
    "fetch_one",
    "read_robots_rules",
    "stops_batch",
]
