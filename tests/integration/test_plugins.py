"""Plug-in filters and fetchers from the test package (tests/plugin_site) in real crawls on the session's worker."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import redis
import vcrawl_test_plugin

import tasks
from cli.local_redis import LocalRedis
from frontier import canonical_url
from tests.cluster import worker_start_with_plugins
from tests.integration.conftest import run_job, wait_for_end
from tests.proxy import ForwardProxy
from tests.site import TestSite
from vcrawl import redis_keys
from vcrawl.errors import InvalidTask

pytestmark = pytest.mark.usefixtures("worker")

FAST = {"min_interval_s": 0.0}


def page(*links: str) -> str:
    return "<html><body>" + "".join(f'<a href="{href}">{href}</a> ' for href in links) + "</body></html>"


def test_a_plugin_filter_drops_links_and_its_reason_is_counted(site: TestSite) -> None:
    site.add_page("/", page("/one.html?a=1", "/two.html?a=1&b=2", "/three.html?a=1&b=2&c=3", "/plain.html"))
    for path in ("/one.html?a=1", "/two.html?a=1&b=2", "/three.html?a=1&b=2&c=3", "/plain.html"):
        site.add_page(path, page())

    status = run_job({"seeds": [site.url("/")], "politeness": FAST, "sitemaps": False,
                      "filters": [{"name": "max-query-params", "params": {"max": 1}}]})  # fmt: skip

    assert status["state"] == "completed"
    assert sorted(seen.path for seen in site.seen if seen.path != "/robots.txt") == [
        "/",
        "/one.html?a=1",
        "/plain.html",
    ]
    assert status["filtered"].get("too_many_params") == 2
    assert status["pages_stored"] == 3
    dropped = canonical_url(site.url("/two.html?a=1&b=2"))
    seen = vcrawl_test_plugin.FILTER_CONTEXTS
    contexts = [ctx for url, ctx in seen if url == dropped and ctx.job_id == status["job"]]
    assert contexts and contexts[0].source_url == site.url("/") and contexts[0].depth == 1


def test_a_plugin_fetcher_serves_the_pages_of_its_page_type(site: TestSite) -> None:
    site.add_page("/", page("/tagged/a.html", "/plain.html"))
    site.add_page("/tagged/a.html", page("/tagged/b.html"))
    site.add_page("/tagged/b.html", page())
    site.add_page("/plain.html", page())

    status = run_job({"seeds": [site.url("/")], "politeness": FAST, "sitemaps": False,
                      "rules": [{"pattern": "/tagged/", "page_type": "tagged"}]})  # fmt: skip

    assert status["state"] == "completed" and status["pages_stored"] == 4
    fetched_by = {seen.path: seen.headers.get("X-Fetched-By") for seen in site.seen if seen.path != "/robots.txt"}
    assert fetched_by == {"/": None, "/plain.html": None, "/tagged/a.html": "tagged", "/tagged/b.html": "tagged"}


# page type, the paths the site sees: "follows" is a plug-in that follows redirects although told not to.
REDIRECTING = [("tagged", ["/", "/tagged/a.html"]), ("follows", ["/", "/tagged/a.html", "/denied/x.html"])]


@pytest.mark.parametrize(("page_type", "requested"), REDIRECTING, ids=[case[0] for case in REDIRECTING])
def test_a_redirect_of_a_plugin_page_type_goes_back_through_admission(
    site: TestSite, page_type: str, requested: list[str]
) -> None:
    site.add_page("/", page("/tagged/a.html"))
    site.add_redirect("/tagged/a.html", "/denied/x.html")
    site.add_page("/denied/x.html", page())

    status = run_job({"seeds": [site.url("/")], "politeness": FAST, "sitemaps": False, "scope": {"deny": ["/denied/"]},
                      "rules": [{"pattern": "/tagged/", "page_type": page_type}]})  # fmt: skip

    assert status["state"] == "completed" and status["pages_stored"] == 1, status  # the target is not stored
    assert status["filtered"] == {"deny": 1} and status["redirects"] == 1
    assert [seen.path for seen in site.seen if seen.path != "/robots.txt"] == requested


@pytest.mark.parametrize("page_type", ["broken", "unbuildable"])  # its fetch raises; its factory raises
def test_a_plugin_fetcher_that_raises_fails_its_page_and_the_job_goes_on(site: TestSite, page_type: str) -> None:
    site.add_page("/", page("/broken/a.html", "/plain.html"))
    site.add_page("/broken/a.html", page())
    site.add_page("/plain.html", page())

    status = run_job({"seeds": [site.url("/")], "politeness": FAST, "sitemaps": False,
                      "rules": [{"pattern": "/broken/", "page_type": page_type}]})  # fmt: skip

    assert status["state"] == "completed" and status["pages_stored"] == 2, status
    assert status["failed"] == {f"{page_type}_failed": 1}


def test_a_plugin_page_type_through_a_failing_proxy_benches_it(site: TestSite, redis_server: LocalRedis) -> None:
    site.add_page("/", page(*(f"/tagged/{n}.html" for n in range(6))))
    for n in range(6):
        site.add_page(f"/tagged/{n}.html", page())
    bench = redis.Redis.from_url(redis_server.url, decode_responses=True)
    try:
        with ForwardProxy() as good, ForwardProxy(mode="fail") as broken:
            bench.delete(redis_keys.proxy_health())
            status = run_job({"seeds": [site.url("/")], "politeness": FAST, "sitemaps": False,
                              "proxies": [good.url, broken.url],
                              "rules": [{"pattern": "", "page_type": "tagged"}]})  # fmt: skip
            assert bench.hexists(redis_keys.proxy_health(), broken.url)
    finally:
        bench.delete(redis_keys.proxy_health())
        bench.close()

    assert status["state"] == "completed" and status["pages_stored"] == 7, status
    assert status["proxies"][broken.url] == {"ok": 0, "failed": 1, "errors": 0, "reasons": {"proxy_5xx": 1}}
    assert status["proxies"][good.url]["ok"] == 7
    assert len(broken.seen) == 1  # benched after its first answer


def test_a_single_task_of_a_plugin_page_type_is_fetched_by_its_fetcher(site: TestSite) -> None:
    url = site.add_page("/single.html", page("/next.html"))

    record = wait_for_end(tasks.crawl.delay({"url": url, "page_type": "tagged"}).id)

    assert record["state"] == "analyzed"
    assert [seen.headers.get("X-Fetched-By") for seen in site.seen if seen.path == "/single.html"] == ["tagged"]


REFUSED: list[tuple[str, dict[str, Any], str, str]] = [
    ("unknown filter", {"filters": [{"name": "no-such-filter"}]}, "filters[0].name", "max-query-params"),
    ("a built-in named", {"filters": [{"name": "scope"}]}, "filters[0].name", "always runs"),
    ("import path", {"filters": [{"name": "os:system"}]}, "filters[0].name", "filter name"),
    ("bad param", {"filters": [{"name": "max-query-params", "params": {"max": -1}}]}, "filters[0].params.max", ">= 0"),
    ("unknown param", {"filters": [{"name": "max-query-params", "params": {"mx": 1}}]}, "filters[0].params.mx", ""),
    ("unknown page type", {"rules": [{"pattern": "", "page_type": "no-such"}]}, "rules[0].page_type", "tagged"),
]


@pytest.mark.parametrize(("extra", "field", "words"), [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED])
def test_unknown_plugin_names_are_refused_at_submit(extra: dict[str, Any], field: str, words: str) -> None:
    job_id = f"plugin-refused-{field.replace('[', '').replace(']', '').replace('.', '-')}"
    with pytest.raises(InvalidTask) as refused:
        tasks.start_job({"id": job_id, "seeds": ["http://127.0.0.1:9/"], **extra})

    assert refused.value.field == field
    assert words in refused.value.problem
    assert tasks.job_status(job_id, with_outputs=False) is None  # nothing recorded


def test_a_single_task_of_an_unknown_page_type_is_refused_at_delay() -> None:
    with pytest.raises(InvalidTask) as refused:
        tasks.crawl.delay({"url": "http://127.0.0.1:9/", "page_type": "no-such"})
    assert refused.value.field == "page_type" and "tagged" in refused.value.problem


@pytest.mark.parametrize(
    ("group", "name", "words"),
    [
        ("vcrawl.filters", "scope", "built-in filter 'scope'"),
        ("vcrawl.fetchers", "static", "built-in fetcher 'static'"),
    ],
)
def test_a_worker_with_a_plugin_taking_a_builtin_name_refuses_to_start(
    tmp_path: Path, group: str, name: str, words: str
) -> None:
    site = tmp_path / "site"  # a package installed by its .dist-info on PYTHONPATH, as tests/plugin_site_clash
    (site / "shadow-0.1.dist-info").mkdir(parents=True)
    (site / "shadow-0.1.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: shadow\nVersion: 0.1\n")
    (site / "shadow-0.1.dist-info" / "entry_points.txt").write_text(f"[{group}]\n{name} = shadow:factory\n")
    (site / "shadow.py").write_text("def factory(arg):\n    raise AssertionError('never loaded')\n")
    done = worker_start_with_plugins(tmp_path, site)
    assert done.returncode != 0
    assert words in done.stderr and "shadow" in done.stderr
