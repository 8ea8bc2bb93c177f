"""Proxy harvesting with real local proxies, source pages and a check server on loopback.

Each proxy listens on its own 127.0.0.x address and reaches origins from it, so the check server
(and a crawled site) see the proxy's address, not the crawler's 127.0.0.1, unless the proxy passes
the client's address on (X-Forwarded-For: a transparent proxy).
"""

from __future__ import annotations

import json
import logging
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import redis

import fetchers.proxy_harvest
from cli.local_redis import LocalRedis
from cli.main import main
from fetchers.base import FetchRequest, FetchResult
from fetchers.proxies import ProxyHealth
from fetchers.proxy_check import ProxyCheck
from fetchers.proxy_harvest import HarvestConfig, harvest, harvest_with_settings
from fetchers.proxy_pool import HarvestedProxy, read_pool, write_pool
from frontier import Frontier
from tests.cluster import REPO, cluster_env, start_worker, stop_worker
from tests.integration.conftest import run_job
from tests.proxy import ForwardProxy
from tests.site import Response, Seen, TestSite
from vcrawl import redis_keys
from vcrawl.errors import FetchFailed
from vcrawl.proxy_sources import ProxySource
from vcrawl.settings import Settings
from views.status import job_status

MAX_LATENCY_S = 0.8  # short to stay fast; the twin at the shipped 5 s: test_at_the_shipped_latency_bound_...


def echo(seen: Seen) -> Response:
    """The check URL: what it saw of the request, httpbin-style."""
    return Response(json.dumps({"origin": seen.client_host, "headers": seen.headers}).encode())


def closed_port(host: str) -> int:
    """A port on ``host`` nobody listens on (a dead proxy)."""
    with socket.socket() as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


@dataclass
class Lists:
    """The source site, the check site, and the proxies the sources list."""

    sources: tuple[ProxySource, ...]
    check_url: str
    good: list[ForwardProxy]  # fast, then fast, then a little slower (still under the bound)
    slow: ForwardProxy
    transparent: ForwardProxy
    dead: str
    site: TestSite


@pytest.fixture
def lists() -> Iterator[Lists]:
    with ExitStack() as stack:
        site = stack.enter_context(TestSite())
        good = [stack.enter_context(ForwardProxy(host=f"127.0.0.{11 + n}", delay_s=0.3 * (n == 2))) for n in range(3)]
        slow = stack.enter_context(ForwardProxy(host="127.0.0.14", delay_s=MAX_LATENCY_S + 0.4))
        transparent = stack.enter_context(ForwardProxy(host="127.0.0.15", forwarded_for=True))
        dead = f"http://127.0.0.16:{closed_port('127.0.0.16')}"
        hostport = [proxy.url.removeprefix("http://") for proxy in (*good, slow, transparent)]
        hostport.append(dead.removeprefix("http://"))
        site.add_page("/list.txt", "# today's proxies\n" + "\n".join(hostport[:2]) + "\nnonsense line\n")
        rows = "".join(f"<tr><td>{hp.split(':')[0]}</td><td>{hp.split(':')[1]}</td></tr>" for hp in hostport[2:5])
        site.add_page("/table.html", f"<table><tr><th>IP</th><th>Port</th></tr>{rows}</table>")
        site.add_page("/regex.js", "".join(f"proxy('{hp}');" for hp in hostport[4:]))
        sources = (
            ProxySource(site.url("/list.txt")),
            ProxySource(site.url("/table.html"), "table", host_column="IP", port_column="Port"),
            ProxySource(site.url("/regex.js"), "regex", pattern=r"proxy\('(?P<host>[\d.]+):(?P<port>\d+)'\)"),
            ProxySource(site.url("/gone.txt")),  # 404: skipped, the others still read
        )
        check_url = site.add_answer("/check", echo)
        yield Lists(sources, check_url, good, slow, transparent, dead, site)


@pytest.fixture
def pool(redis_server: LocalRedis) -> Iterator[redis.Redis]:
    """The session Redis, with no harvested proxy before or after the test (other jobs draw from it)."""
    client = redis.Redis.from_url(redis_server.url, decode_responses=True)
    keys = (redis_keys.proxy_pool(), redis_keys.proxy_pool_info(), redis_keys.proxy_harvest_lock())
    client.delete(*keys, redis_keys.proxy_health())
    yield client
    client.delete(*keys, redis_keys.proxy_health())
    client.close()


def harvest_settings(base: Settings, lists: Lists, pool_max: int) -> Settings:
    return replace(
        base,
        proxy_sources=lists.sources,
        proxy_check_url=lists.check_url,
        proxy_max_latency_s=MAX_LATENCY_S,
        proxy_pool_max=pool_max,
        proxy_check_concurrency=4,
    )


def harvest_here(settings: Settings, client: redis.Redis) -> dict[str, Any]:
    """One harvest in this process (the task's body without the worker's settings)."""
    return harvest_with_settings(settings, client).to_dict()


def test_only_good_proxies_join_the_pool_and_the_bound_keeps_the_fastest(
    lists: Lists, pool: redis.Redis, vcrawl_settings: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    started = time.monotonic()
    report = harvest_here(harvest_settings(vcrawl_settings, lists, pool_max=2), pool)
    took_s = time.monotonic() - started
    fast, fast_too, slower = (proxy.url for proxy in lists.good)
    assert report["status"] == "done", report
    assert report["sources"] == {
        source.url: count for source, count in zip(lists.sources, (2, 3, 2, "http_404"), strict=True)
    }
    assert report["checked"] == 6
    assert report["rejected"] == {
        "too_slow": 1,
        "transparent": 1,
        "proxy_error": 1,
    }  # `slower` passed: the bound left it out
    assert set(report["pool"]) == {fast, fast_too} and set(report["joined"]) == {fast, fast_too}
    harvested = read_pool(pool)
    assert [entry.proxy for entry in harvested] == report["pool"]  # fastest first
    assert all(entry.latency_s < 0.3 and entry.anonymity == "elite" for entry in harvested)
    assert {entry.source for entry in harvested} == {lists.sources[0].url}
    assert took_s < 5, "checks run in parallel, each cut at the latency bound"
    checks = lists.site.requests_to("/check")
    seen_from = {seen.client_host: seen.headers for seen in checks}
    assert seen_from["127.0.0.15"].get("X-Forwarded-For") == "127.0.0.1"  # the transparent one told on us
    assert "127.0.0.14" not in seen_from  # the slow one was given up before it forwarded
    # Re-checked on the next run: a pool member that died is dropped, the next fastest takes its place.
    lists.good[0].stop()
    ProxyHealth(pool).record(fast, "proxy_error")  # a fetch through it failed before the run
    again = harvest_here(harvest_settings(vcrawl_settings, lists, pool_max=2), pool)
    assert set(again["pool"]) == {fast_too, slower} and again["dropped"] == [fast] and again["joined"] == [slower]
    assert pool.hkeys(redis_keys.proxy_health()) == []  # dropped with it: the bench holds no stale record
    assert main(["proxies", "--json"]) == 0  # `vcrawl proxies`, on the session's Redis
    listing = json.loads(capsys.readouterr().out)
    # This test's proxies only: the process's bench may still hold its own marks of other tests' proxies.
    mine = {*(proxy.url for proxy in lists.good), lists.slow.url, lists.transparent.url, lists.dead}
    assert [entry["proxy"] for entry in listing["harvested"]] == again["pool"] and not set(listing["cooling"]) & mine
    # `vcrawl proxies --harvest` runs the task's body here, with this process's settings: no sources.
    assert main(["proxies", "--harvest", "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["status"] == "no_sources"


def test_the_pool_keeps_every_good_proxy_under_a_larger_bound_and_a_failing_check_url_changes_nothing(
    lists: Lists, pool: redis.Redis, vcrawl_settings: Settings
) -> None:
    settings = harvest_settings(vcrawl_settings, lists, pool_max=10)
    report = harvest_here(settings, pool)
    assert set(report["pool"]) == {proxy.url for proxy in lists.good}
    assert lists.dead not in report["pool"] and lists.slow.url not in report["pool"]
    broken = harvest_here(replace(settings, proxy_check_url=lists.site.url("/no-check")), pool)
    assert broken["status"] == "check_unusable" and "http_404" in broken["problem"]
    assert {entry.proxy for entry in read_pool(pool)} == set(report["pool"])  # left as it was
    # Harvested proxies are not the operator's trusted VCRAWL_PROXIES: on a private network they need it allowed.
    narrow = harvest_here(replace(settings, allowed_networks=("127.0.0.1/32",)), pool)
    assert narrow["pool"] == [] and narrow["rejected"] == {"blocked_address": 6}, narrow


def test_at_the_shipped_latency_bound_every_live_proxy_that_hides_the_crawler_joins(
    lists: Lists, pool: redis.Redis, vcrawl_settings: Settings
) -> None:
    """The tests above bound the latency at 0.8 s to stay fast; this twin keeps the shipped harvest
    settings (VCRAWL_PROXY_MAX_LATENCY_S, pool size, concurrency), so the 1.2 s proxy is under the bound."""
    settings = replace(vcrawl_settings, proxy_sources=lists.sources, proxy_check_url=lists.check_url)
    shipped = Settings()
    assert (settings.proxy_max_latency_s, settings.proxy_pool_max, settings.proxy_check_concurrency) == (
        shipped.proxy_max_latency_s, shipped.proxy_pool_max, shipped.proxy_check_concurrency)  # fmt: skip
    report = harvest_here(settings, pool)
    assert report["status"] == "done" and report["rejected"] == {"transparent": 1, "proxy_error": 1}, report
    assert set(report["pool"]) == {proxy.url for proxy in (*lists.good, lists.slow)}
    assert report["pool"][-1] == lists.slow.url  # fastest first
    harvested = read_pool(pool)
    assert all(entry.latency_s < shipped.proxy_max_latency_s and entry.anonymity == "elite" for entry in harvested)


CHECK_URL = "http://127.0.0.1:9/check"  # never asked: the fetchers below answer for it
SOURCE = ProxySource("http://127.0.0.1:9/list.txt")


class Listing:
    """A source fetcher without sockets: the source lists ``proxies``."""

    def __init__(self, proxies: Sequence[str]) -> None:
        self.body = "\n".join(proxy.removeprefix("http://") for proxy in proxies).encode()

    def fetch(self, request: FetchRequest) -> FetchResult:
        return FetchResult(request.url, request.url, 200, body=self.body)


class Checks:
    """A check fetcher without sockets: the check sees each proxy's host, or the proxy raises ``failing[proxy]``."""

    def __init__(self, failing: Mapping[str, Exception]) -> None:
        self.failing = failing

    def fetch(self, request: FetchRequest) -> FetchResult:
        if request.proxy in self.failing:
            raise self.failing[request.proxy]
        origin = "127.0.0.1" if request.proxy is None else urlsplit(request.proxy).hostname
        return FetchResult(request.url, request.url, 200, body=json.dumps({"origin": origin}).encode(), elapsed_s=0.01)


def test_a_check_that_fails_unexpectedly_rejects_its_candidate_not_the_run(
    pool: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    proxies = [f"http://203.0.113.{n}:8080" for n in range(1, 6)]
    checks = Checks({proxies[1]: RuntimeError("a bug in a check"), proxies[3]: UnicodeError("an odd answer")})
    config = HarvestConfig((SOURCE,), ProxyCheck(CHECK_URL, 1.0), concurrency=2)
    with caplog.at_level(logging.WARNING, logger="fetchers.proxy_harvest"):
        report = harvest(config, Listing(proxies), checks, pool)
    assert report.status == "done" and report.checked == 5 and report.rejected == {"check_error": 2}, report
    assert set(report.pool) == {proxies[0], proxies[2], proxies[4]} == {entry.proxy for entry in read_pool(pool)}
    unexpected = [record for record in caplog.records if "unexpectedly" in record.getMessage()]
    assert len(unexpected) == 1 and "2 checks" in unexpected[0].getMessage()  # once per run, with the count


class SlowChecks(Checks):
    """Checks through a proxy take ``delay_s`` each (asking the check URL directly does not)."""

    def __init__(self, delay_s: float) -> None:
        super().__init__({})
        self.delay_s = delay_s

    def fetch(self, request: FetchRequest) -> FetchResult:
        if request.proxy is not None:
            time.sleep(self.delay_s)
        return super().fetch(request)


def test_checks_not_started_within_the_budget_are_left_and_running_ones_keep_their_verdict(pool: redis.Redis) -> None:
    proxies = [f"http://203.0.113.{n}:8080" for n in range(1, 7)]
    config = HarvestConfig((SOURCE,), ProxyCheck(CHECK_URL, 2.0), concurrency=2, budget_s=0.75)
    started = time.monotonic()
    # Two checks end at 0.5 s, two more run across the deadline (0.75 s) and end at 1 s; the last
    # two never start.
    report = harvest(config, Listing(proxies), SlowChecks(0.5), pool)
    took_s = time.monotonic() - started
    assert report.status == "done" and report.checked == 4, report
    assert set(report.pool) == set(proxies[:4]), report
    assert took_s < config.budget_s + 0.5 + 1.0  # the budget, one check's time, and slack


class Pages:
    """A source fetcher without sockets: each source URL answers its page of ``bodies``."""

    def __init__(self, bodies: Mapping[str, str]) -> None:
        self.bodies = bodies

    def fetch(self, request: FetchRequest) -> FetchResult:
        return FetchResult(request.url, request.url, 200, body=self.bodies[request.url].encode())


def test_an_odd_port_or_an_unparsable_page_fails_its_entry_or_source_not_the_harvest(
    pool: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = ProxySource("http://127.0.0.1:9/table.html", "table", host_column=0, port_column=1)
    regex = ProxySource("http://127.0.0.1:9/list.js", "regex", pattern=r"(?P<host>[\d.]+):(?P<port>\w+)")
    broken = ProxySource("http://127.0.0.1:9/broken.txt")
    pages = Pages({
        table.url: "<table><tr><td>203.0.113.8</td><td>80\N{SUPERSCRIPT TWO}</td></tr>"
                   "<tr><td>203.0.113.1</td><td>8080</td></tr></table>",
        regex.url: "203.0.113.9:\u0668\u0660 203.0.113.2:8080",  # Arabic-Indic 80: not a port
        broken.url: "203.0.113.3:8080",
    })  # fmt: skip
    read_source = fetchers.proxy_harvest.read_source

    def trips_on_broken(source: ProxySource, body: bytes) -> list[str]:
        if source is broken:
            raise RuntimeError("a page the reader trips on")
        return read_source(source, body)

    monkeypatch.setattr(fetchers.proxy_harvest, "read_source", trips_on_broken)
    config = HarvestConfig((table, regex, broken), ProxyCheck(CHECK_URL, 1.0))
    report = harvest(config, pages, Checks({}), pool)
    assert report.status == "done", report
    assert report.sources == {table.url: 1, regex.url: 1, broken.url: "unreadable"}
    assert set(report.pool) == {"http://203.0.113.1:8080", "http://203.0.113.2:8080"}, report


class ZrangeCount:
    """A redis client that counts the ZRANGEs its pipelines send (the harvested pool's reads)."""

    def __init__(self, client: redis.Redis) -> None:
        self.client, self.zranges = client, 0

    def register_script(self, script: str) -> Any:
        return self.client.register_script(script)

    def pipeline(self, transaction: bool = True) -> Any:
        pipe = self.client.pipeline(transaction=transaction)
        zrange = pipe.zrange

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.zranges += 1
            return zrange(*args, **kwargs)

        pipe.zrange = counted  # type: ignore[method-assign]
        return pipe


def test_the_bench_reads_the_harvested_pool_only_when_harvesting_and_merges_it_once_per_refresh(
    pool: redis.Redis,
) -> None:
    own, first, second = "http://203.0.113.1:8080", "http://203.0.113.2:8080", "http://203.0.113.3:8080"
    write_pool(pool, [HarvestedProxy(first, 0.1), HarvestedProxy(own, 0.2)])
    now = [0.0]
    plain = ZrangeCount(pool)
    health = ProxyHealth(plain, refresh_s=1.0, clock=lambda: now[0])  # no proxy sources configured
    for step in range(3):
        now[0] = step * 2.0  # a refresh each time
        assert health.draw((own,), harvested=True) == own and health.has_healthy((own,), harvested=True)
    assert plain.zranges == 0

    counted = ZrangeCount(pool)
    health = ProxyHealth(counted, refresh_s=1.0, clock=lambda: now[0], read_harvested=True)
    cluster = (own,)
    merged = health.pool(cluster, harvested=True)
    assert merged == (own, first) and health.pool(cluster, harvested=True) is merged  # built once
    assert {health.draw(cluster, harvested=True) for _ in range(50)} == {own, first}
    assert health.has_healthy(cluster, harvested=True) and counted.zranges == 1  # one read per refresh
    assert health.pool(cluster) == cluster  # a job's own list: no harvested proxy
    write_pool(pool, [HarvestedProxy(second, 0.1)])
    assert health.pool(cluster, harvested=True) is merged  # trusted until the next refresh
    now[0] += 2.0
    assert health.pool(cluster, harvested=True) == (own, second) and counted.zranges == 2


def test_a_harvest_forgets_the_bench_records_of_the_proxies_it_drops_except_configured_ones(
    pool: redis.Redis,
) -> None:
    kept, dropped, configured = "http://203.0.113.1:8080", "http://u:pw@203.0.113.2:8080", "http://203.0.113.3:8080"
    elsewhere = "http://203.0.113.4:8080"  # a job's own proxy, never in the pool
    write_pool(pool, [HarvestedProxy(proxy, 0.1) for proxy in (kept, dropped, configured)])
    health = ProxyHealth(pool)
    for proxy in (kept, dropped, configured, elsewhere):
        health.record(proxy, "proxy_error")
    assert len(pool.hkeys(redis_keys.proxy_health())) == 4
    dead = FetchFailed(CHECK_URL, "proxy_error")
    config = HarvestConfig((SOURCE,), ProxyCheck(CHECK_URL, 1.0), configured=(configured,))
    report = harvest(config, Listing([]), Checks({dropped: dead, configured: dead}), pool)
    assert report.pool == (kept,) and set(report.dropped) == {dropped, configured}, report
    # The dropped one's record went with it (by its masked name); a configured proxy is drawn all the
    # same, and a proxy the harvest never had is not its business: their records stay.
    assert set(pool.hkeys(redis_keys.proxy_health())) == {kept, configured, elsewhere}
    assert set(ProxyHealth(pool).cooling()) == {kept, configured, elsewhere}


@pytest.mark.slow
def test_beat_harvests_on_a_worker_and_a_job_fetches_through_the_harvested_proxy(lists: Lists, tmp_path: Path) -> None:
    """End to end on a private Redis: a real beat fires the harvest, a real worker runs it, a job
    without proxies of its own is fetched through the proxy that joined, as the site sees."""
    proxy = lists.good[1]
    lists.site.add_page("/one.txt", f"{proxy.url.removeprefix('http://')}\n{lists.dead.removeprefix('http://')}\n")
    paths = [f"/p{n}" for n in range(5)]
    lists.site.add_page("/", "".join(f'<a href="{path}">{path}</a>' for path in paths))
    for path in paths:
        lists.site.add_page(path, f"<html><body>{path}</body></html>")
    processes: list[subprocess.Popen[bytes]] = []
    with LocalRedis(tmp_path / "redis") as server:
        settings = Settings(
            redis_url=server.url,
            data=str(tmp_path / "data"),
            proxy_sources=(ProxySource(lists.site.url("/one.txt")),),
            proxy_check_url=lists.check_url,
            proxy_max_latency_s=MAX_LATENCY_S,
            proxy_harvest_every_s=1.0,
            min_interval_s=0.0,
        )
        env = cluster_env(settings)
        client = redis.Redis.from_url(server.url, decode_responses=True)
        try:
            log = tmp_path / "beat.log"
            with open(log, "ab") as out:  # beat starts while the worker does
                command = [sys.executable, "-m", "celery", "-A", "tasks", "beat", "-l", "INFO", "-s", str(log) + ".db"]
                processes.append(subprocess.Popen(command, env=env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT))
            processes.append(start_worker(env, "harvest-worker", tmp_path / "worker.log", concurrency=4))
            deadline = time.monotonic() + 30
            while not client.zrange(redis_keys.proxy_pool(), 0, -1) and time.monotonic() < deadline:
                time.sleep(0.1)
            assert client.zrange(redis_keys.proxy_pool(), 0, -1) == [proxy.url], log.read_text()[-2000:]
            job = tmp_path / "job.json"
            job.write_text(json.dumps({"id": "via-harvest", "seeds": [lists.site.url("/")], "max_depth": 1}))
            subprocess.run([sys.executable, "-m", "cli", "submit", str(job)], env=env, cwd=REPO, timeout=60,
                           capture_output=True, check=True)  # fmt: skip
            frontier = Frontier(client)
            deadline = time.monotonic() + 30
            while (status := job_status(frontier, "via-harvest")) is None or status["state"] == "running":
                assert time.monotonic() < deadline, status
                time.sleep(0.1)
        finally:
            for process in processes:
                stop_worker(process)
            client.close()
    assert status["state"] == "completed" and status["pages_stored"] == 6, status
    assert status["proxies"] == {proxy.url: {"ok": 6, "failed": 0, "errors": 0, "reasons": {}}}
    pages = [seen for seen in lists.site.seen if seen.path == "/" or seen.path in paths]
    assert len(pages) == 6 and {seen.client_host for seen in pages} == {"127.0.0.12"}  # the site saw the proxy


@pytest.mark.usefixtures("worker")
def test_a_job_with_its_own_proxy_list_or_none_and_a_worker_that_does_not_harvest_leave_the_pool_alone(
    lists: Lists, pool: redis.Redis, vcrawl_settings: Settings, site: TestSite
) -> None:
    harvest_here(harvest_settings(vcrawl_settings, lists, 10), pool)
    assert pool.zcard(redis_keys.proxy_pool()) == 3
    site.add_page("/", "<html><body>home</body></html>")
    status = run_job({"seeds": [site.url("/")], "max_depth": 0}, 30.0)  # the session's worker has no sources
    assert status["state"] == "completed" and status["proxies"] == {}, status
    status = run_job({"seeds": [site.url("/")], "max_depth": 0, "proxies": [lists.transparent.url]}, 30.0)
    assert list(status["proxies"]) == [lists.transparent.url]  # a job's own list is all it uses
    assert all(seen.target.endswith("/check") for proxy in lists.good for seen in proxy.seen)
