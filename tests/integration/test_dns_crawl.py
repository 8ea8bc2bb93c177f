"""The DNS cache (fetchers/dns_cache.py) on a crawl of named hosts, through the system resolver.

A worker runs in a network namespace (tests/netns.py) whose resolv.conf names a test DNS server
(tests/dns_server.py) on the root end of the link: its ``getaddrinfo`` asks that server, as it
would ask the operator's resolver, and no query can leave the machine. The shop sites serve every
response with ``Connection: close``, so each request opens a connection and resolves its host's
name: without the cache that is one query per page. Shipped settings (TTL 60 s, negative TTL 5 s).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, replace
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
import redis

from cli.local_redis import LocalRedis
from frontier import Frontier
from tests.celery_setup import REPO, LocalWorkerProcess
from tests.cluster import cluster_env, ring_listing
from tests.conftest import TEST_ALLOWED_NETWORKS
from tests.dns_server import TestDns
from tests.netns import Lab, lab_or_skip
from tests.site import TestSite, link_page
from vcrawl.settings import Settings
from views.status import job_status

pytestmark = pytest.mark.slow

SHOPS = ("shop-a.test", "shop-b.test", "shop-c.test")
GONE = "gone.test"  # the DNS server answers NXDOMAIN
PAGES = 8  # per shop, besides its home page and robots.txt


@pytest.fixture
def lab() -> Iterator[Lab]:
    with lab_or_skip() as made:
        yield made


def wait_for(check: Callable[[], Any], timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if value := check():
            return value
        time.sleep(0.2)
    raise AssertionError(f"not within {timeout_s}s: {what}")


def start_job_in(lab: Lab, env: dict[str, str], job: dict[str, Any]) -> str:
    """Submit ``job`` from inside the namespace: whatever the submitter resolved would reach the test DNS."""
    code = "import json, sys, tasks; print(tasks.start_job(json.loads(sys.argv[1])))"
    done = subprocess.run(lab.command([sys.executable, "-c", code, json.dumps(job)]), env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    return done.stdout.split()[-1]


def shop_site(stack: ExitStack, address: str) -> TestSite:
    """A shop: a home page linking to PAGES products; every response closes its connection."""
    site = stack.enter_context(TestSite(address))
    products = [f"/p{i}.html" for i in range(PAGES)]
    site.add_page("/robots.txt", "User-agent: *\nAllow: /\n", Content_Type="text/plain", Connection="close")
    site.add_page("/", link_page(*products), Connection="close")
    for path in products:
        site.add_page(path, link_page("/"), Connection="close")
    return site


@dataclass(frozen=True)
class NamedCrawl:
    """What a crawl of the shops (and GONE) came to, seen from the DNS server, the sites and the node."""

    settings: Settings
    status: dict[str, Any]
    dns: TestDns
    crawl_s: float
    requests: int  # HTTP requests the shops got, each on its own connection
    node: dict[str, Any]  # the worker's row in `vcrawl nodes --json`, once its counters caught up


def crawl_named_hosts(tmp_path: Path, lab: Lab, politeness: dict[str, Any], **settings_given: Any) -> NamedCrawl:
    """Crawl the shops and GONE with a worker in ``lab`` that resolves through the test DNS server."""
    with ExitStack() as stack:
        sites = {name: shop_site(stack, lab.root_address) for name in SHOPS}
        dns = stack.enter_context(TestDns(lab.root_address, {name: lab.root_address for name in SHOPS}))
        lab.use_nameserver(lab.root_address)
        server = stack.enter_context(LocalRedis(tmp_path / "redis", bind=("127.0.0.1", lab.root_address)))
        settings = Settings(redis_url=server.url, data=str(tmp_path / "data"),
                            allowed_networks=(*TEST_ALLOWED_NETWORKS, str(lab.network)), **settings_given)  # fmt: skip
        env = cluster_env(settings)
        lab_env = cluster_env(replace(settings, redis_url=f"redis://{lab.root_address}:{server.port}/0"))
        worker = LocalWorkerProcess(lab_env, tmp_path / "worker.log", "dns", run_in=lab.command([]))
        stack.callback(worker.teardown)
        worker.start()
        gone_port = sites[SHOPS[0]].address[1]  # never reached: the name does not resolve
        seeds = [f"http://{name}:{site.address[1]}/" for name, site in sites.items()] + [f"http://{GONE}:{gone_port}/"]
        started = time.monotonic()
        job_id = start_job_in(lab, lab_env, {"seeds": seeds, "politeness": politeness})
        frontier = Frontier(redis.Redis.from_url(server.url))

        def finished() -> Any:
            status = job_status(frontier, job_id)
            return status if status is not None and status["state"] != "running" else None

        status = wait_for(finished, 240, f"job {job_id} finished")
        crawl_s = time.monotonic() - started
        requests = sum(len(site.seen) for site in sites.values())
        a_queries = sum(1 for query in dns.queries if query.qtype == "A")  # the crawl is over: no more come

        def node_counters() -> dict[str, Any] | None:  # sent with the worker's heartbeat (every 2 s)
            row = next((row for row in ring_listing(env)["nodes"] if row["name"] == worker.name), None)
            caught_up = row is not None and row["dns_lookups"] >= a_queries and row["connections_opened"] >= requests
            return row if caught_up else None

        node = wait_for(node_counters, 20, f"{worker.name}'s counters in `vcrawl nodes --json`")
    return NamedCrawl(settings, status, dns, crawl_s, requests, node)


def test_a_crawl_of_named_hosts_asks_dns_once_per_name_and_names_unresolvable_hosts(tmp_path: Path, lab: Lab) -> None:
    crawl = crawl_named_hosts(tmp_path, lab, {"min_interval_s": 0.0})
    status, dns, node, requests = crawl.status, crawl.dns, crawl.node, crawl.requests
    gone_asked = dns.asked(GONE)

    assert crawl.crawl_s < crawl.settings.dns_ttl_s, "the crawl outlived the shipped TTL: a second query would be right"
    assert status["state"] == "completed"
    assert status["pages_stored"] == len(SHOPS) * (1 + PAGES)
    # Every request came on its own connection (Connection: close), resolved by name: one query per name.
    assert requests == len(SHOPS) * (2 + PAGES)  # robots.txt, home, products
    assert {name: len(dns.asked(name)) for name in SHOPS} == dict.fromkeys(SHOPS, 1)
    # The name that does not resolve: its URL fails for good saying why, after its retries.
    assert status["failed"] == {"dns_error": 1}
    attempts = status["retries"] + 1
    assert 1 <= len(gone_asked) < attempts, "failed lookups are kept (negative TTL), not asked per attempt"
    gaps = [later.at - earlier.at for earlier, later in pairwise(gone_asked)]
    assert all(gap >= crawl.settings.dns_negative_ttl_s - 0.5 for gap in gaps), gaps
    # What the node reports: a lookup per query the server answered, a hit for every other resolution.
    a_queries = sum(1 for query in dns.queries if query.qtype == "A")
    assert node["dns_lookups"] == a_queries == len(SHOPS) + len(gone_asked)
    assert node["connections_opened"] == requests
    assert node["dns_hits"] >= requests - len(SHOPS), node


@pytest.mark.parametrize(
    ("interval_s", "ttls", "fewest_asks"),
    [
        (0.5, {"dns_ttl_s": 1.0, "dns_negative_ttl_s": 1.0}, 3),
        # The twin at the shipped 60 s TTL: a request per host every 8 s spans more than a minute.
        pytest.param(8.0, {}, 2, marks=pytest.mark.long, id="shipped"),
    ],
)
def test_a_name_is_asked_again_once_its_answer_is_older_than_the_ttl(
    tmp_path: Path, lab: Lab, interval_s: float, ttls: dict[str, float], fewest_asks: int
) -> None:
    """The same crawl, paced (a request per host every ``interval_s``) past its TTL: each name is asked
    again once its answer is older than the TTL, never sooner."""
    crawl = crawl_named_hosts(tmp_path, lab, {"min_interval_s": interval_s, "jitter": 0}, **ttls)
    status, dns = crawl.status, crawl.dns

    assert status["state"] == "completed" and status["pages_stored"] == len(SHOPS) * (1 + PAGES)
    for name in SHOPS:
        asked = dns.asked(name)
        span_s = asked[-1].at - asked[0].at
        assert fewest_asks <= len(asked) <= span_s / crawl.settings.dns_ttl_s + 1, (name, len(asked), span_s)
        assert all(later.at - earlier.at >= crawl.settings.dns_ttl_s - 0.1 for earlier, later in pairwise(asked))
    assert crawl.node["dns_lookups"] == sum(1 for query in dns.queries if query.qtype == "A")
    assert crawl.node["dns_hits"] > 0  # most requests find a fresh answer
