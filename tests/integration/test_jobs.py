"""Crawl jobs on the session's worker: links followed through scope, robots.txt and dedup."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from warcio.archiveiterator import ArchiveIterator

import tasks
from storage import lookup, read_response
from storage.records import read_records
from tests.integration.conftest import run_job, wait_for_batches_released
from tests.site import NOT_PAGES, Response, TestSite
from vcrawl.errors import InvalidTask
from vcrawl.jobs import load_job_file
from vcrawl.settings import Settings

pytestmark = pytest.mark.usefixtures("worker")

FAST = {"min_interval_s": 0.0}


def page(*links: str, title: str = "") -> str:
    anchors = "".join(f'<a href="{href}">{href}</a> ' for href in links)
    return f"<html><head><title>{title}</title></head><body><h1>{title}</h1>{anchors}</body></html>"


def fetches(site: TestSite) -> Counter[str]:
    return Counter(seen.path for seen in site.seen if seen.path not in NOT_PAGES)


def test_job_follows_links_within_scope_and_depth_and_completes(site: TestSite) -> None:
    with TestSite("127.0.0.2") as elsewhere:
        away = elsewhere.add_page("/x.html", page())
        # A small graph with cycles, fragments, tracking parameters and an off-site link.
        site.add_page("/", page("/a.html", "/b.html#top", "/a.html?utm_source=x", away, "ftp://x.test/f"))
        site.add_page("/a.html", page("/b.html", "/c.html", "/", "/img/logo.png"))
        site.add_page("/b.html", page("/a.html", "/c.html"))
        site.add_page("/c.html", page("/d.html"))
        site.add_page("/d.html", page("/e.html"))  # depth 3 links to depth 4: not followed
        site.add_page("/e.html", page())

        status = run_job({"seeds": [site.url("/")], "max_depth": 3, "politeness": FAST})

    assert status["state"] == "completed"
    assert fetches(site) == {"/": 1, "/a.html": 1, "/b.html": 1, "/c.html": 1, "/d.html": 1}
    assert elsewhere.seen == []
    assert status["pages_stored"] == 5 and status["pending"] == 0 and status["queued"] == 0
    assert status["filtered"]["host"] == 1 and status["filtered"]["depth"] == 1
    assert status["filtered"]["suffix"] == 1 and status["filtered"]["scheme"] == 1
    assert status["duplicates"] >= 4
    stored = list(Path(tasks.deps.settings().data, "jobs", status["job"], "pages").rglob("*.html"))
    assert len(stored) == 5


ROBOTS = """
User-agent: BadBot
Disallow: /

User-agent: *
Disallow: /private/
Allow: /private/public-
Disallow: /*?sort=
Disallow: /*.cgi$
"""


def test_robots_txt_rules_are_obeyed(site: TestSite) -> None:
    site.add_page("/robots.txt", ROBOTS, Content_Type="text/plain")
    paths = ["/private/secret.html", "/private/public-info.html", "/list.html?sort=asc", "/q.cgi", "/q.cgi?id=7",
             "/open.html"]  # fmt: skip
    site.add_page("/", page(*paths))
    for path in paths:
        site.add_page(path.split("?")[0], page())

    status = run_job({"seeds": [site.url("/")], "politeness": FAST})

    assert status["state"] == "completed"
    seen = {s.path for s in site.seen}
    assert seen == {"/robots.txt", "/", "/private/public-info.html", "/q.cgi?id=7", "/open.html"}
    assert status["robots_blocked"] == 3 and status["robots_fetched"] == 1


@pytest.mark.parametrize(("status_code", "fetched"), [(404, True), (403, True), (503, False), (500, False)])
def test_robots_txt_errors(site: TestSite, status_code: int, fetched: bool) -> None:
    site.add_page("/robots.txt", "nope", status=status_code)
    site.add_page("/", page("/a.html"))
    site.add_page("/a.html", page())

    status = run_job({"seeds": [site.url("/")], "politeness": FAST})

    assert status["state"] == "completed"
    # 4xx: no robots.txt, all allowed. 5xx: assume all disallowed until it can be read.
    assert (fetches(site) == {"/": 1, "/a.html": 1}) is fetched
    assert (status["robots_blocked"] == 1) is not fetched


@pytest.mark.parametrize("interval_s", [0.0, 0.1], ids=["politeness-off", "shorter-interval"])
def test_crawl_delay_raises_the_host_interval(site: TestSite, interval_s: float) -> None:
    site.add_page("/robots.txt", "User-agent: *\nCrawl-delay: 1\n", Content_Type="text/plain")
    site.add_page("/", page("/1.html", "/2.html"))
    site.add_page("/1.html", page())
    site.add_page("/2.html", page())

    status = run_job({"seeds": [site.url("/")], "politeness": {"min_interval_s": interval_s, "jitter": 0}})

    assert status["state"] == "completed" and status["pages_stored"] == 3
    arrivals = sorted(seen.at for seen in site.seen)  # robots.txt counts as a request to the host
    assert min(b - a for a, b in itertools.pairwise(arrivals)) >= 0.99


def test_max_pages_caps_what_is_admitted(site: TestSite) -> None:
    site.add_page("/", page(*[f"/p{n}.html" for n in range(20)]))
    for n in range(20):
        site.add_page(f"/p{n}.html", page())

    status = run_job({"seeds": [site.url("/")], "max_pages": 6, "politeness": FAST})

    assert status["state"] == "completed"
    assert status["admitted"] == 6 and status["pages_stored"] == 6
    assert status["filtered"]["max_pages"] == 15
    assert sum(fetches(site).values()) == 6


@pytest.mark.parametrize(("cap", "truncated"), [(4, 27), (12, 19), (40, 0)])
def test_a_page_over_its_jobs_link_cap_admits_only_its_first_links(site: TestSite, cap: int, truncated: int) -> None:
    # 31 links on the seed page (the last repeats the first); the job reads the first `cap` and counts
    # the rest, which never reach admission: they are neither filtered there nor duplicates.
    site.add_page("/", page(*[f"/p{n}.html" for n in range(30)], "/p0.html"))
    for n in range(30):
        site.add_page(f"/p{n}.html", page())

    status = run_job({"seeds": [site.url("/")], "max_links_per_page": cap, "politeness": FAST})

    kept = min(cap, 30)
    assert status["state"] == "completed"
    assert status["links_truncated"] == truncated
    assert fetches(site) == {"/": 1, **{f"/p{n}.html": 1 for n in range(kept)}}
    assert status["pages_stored"] == 1 + kept and status["filtered"] == {} and status["duplicates"] == 0


def test_retries_go_back_through_the_frontier(site: TestSite) -> None:
    busy = Response(b"busy", 503)
    site.add_page("/", page("/flaky.html", "/gone.html", "/down.html"))
    site.add_sequence("/flaky.html", [busy, busy, Response(page().encode())])
    site.add_response("/down.html", busy)

    status = run_job({"seeds": [site.url("/")], "politeness": FAST, "limits": {"retries": 2}})

    assert status["state"] == "completed"
    assert fetches(site) == {"/": 1, "/flaky.html": 3, "/gone.html": 1, "/down.html": 3}
    assert status["failed"] == {"http_404": 1, "http_503": 1}
    assert status["retries"] == 4 and status["pages_stored"] == 2


@pytest.mark.parametrize("scope", ["host", "url", "auto"])
def test_retry_after_pauses_the_host_or_only_its_url(site: TestSite, scope: str) -> None:
    others = [f"/p{n}.html" for n in range(4)]
    site.add_page("/", page("/throttled.html", *others))
    site.add_sequence("/throttled.html", [Response(b"", 429, {"Retry-After": "1"}), Response(page().encode())])
    for path in others:
        site.add_page(path, page())

    status = run_job({"seeds": [site.url("/")], "politeness": {**FAST, "retry_after": scope}})

    assert status["state"] == "completed" and status["pages_stored"] == 6
    first, second = site.requests_to("/throttled.html")
    assert second.at - first.at >= 1.0  # the URL waits as asked, either way
    during_the_wait = [seen.path for seen in site.seen if first.at < seen.at < first.at + 1.0]
    if scope in ("host", "auto"):  # the whole host waited (auto: what Retry-After asks holds the origin)
        assert during_the_wait == []
    else:  # only that URL waited: the host's other pages went on
        assert sorted(during_the_wait) == others


def test_a_host_answering_429_without_retry_after_in_a_row_pauses_as_a_whole_by_default(site: TestSite) -> None:
    throttled = [f"/t{n}.html" for n in range(6)]
    site.add_page("/", page(*throttled))
    for path in throttled:
        site.add_sequence(path, [Response(b"", 429), Response(page().encode())])

    status = run_job({"seeds": [site.url("/")], "politeness": FAST})

    assert status["state"] == "completed" and status["pages_stored"] == 7 and status["retries"] == 6
    paths = [seen.path for seen in site.seen if seen.path in throttled]
    # Two 429s make only their URLs wait, behind the host's other URLs; the third in a row is the host
    # throttling us: it pauses as a whole, and that URL goes first again when the pause ends.
    assert paths[:4] == [*throttled[:3], throttled[2]], paths


def test_polite_gaps_never_fall_below_the_interval(site: TestSite) -> None:
    paths = [f"/p{n}.html" for n in range(12)]
    site.add_page("/", page(*paths))
    for path in paths:
        site.add_page(path, page())

    status = run_job({"seeds": [site.url("/")], "politeness": {"min_interval_s": 0.1, "jitter": 0}})

    assert status["state"] == "completed" and status["pages_stored"] == 13
    # Server side, between request arrivals (robots.txt included): the interval counts from the
    # end of the last response, so no gap is shorter, however the next request is dispatched.
    arrivals = [seen.at for seen in site.seen]
    gaps = [later - earlier for earlier, later in itertools.pairwise(arrivals)]
    assert len(gaps) == 13 and min(gaps) >= 0.1


def test_redirects_are_admitted_as_new_urls(site: TestSite) -> None:
    site.add_page("/robots.txt", "User-agent: *\nDisallow: /private/\n", Content_Type="text/plain")
    site.add_page("/", page("/old.html", "/loop-a", "/sneaky", "/new.html"))
    site.add_redirect("/old.html", "/new.html", 301)
    site.add_redirect("/loop-a", "/loop-b")
    site.add_redirect("/loop-b", "/loop-a")
    site.add_redirect("/sneaky", "/private/x.html")
    site.add_page("/new.html", page())
    site.add_page("/private/x.html", page())

    status = run_job({"seeds": [site.url("/")], "politeness": FAST})

    assert status["state"] == "completed"
    # Every hop goes through dedup and robots: /new.html once, the loop ends, /private/ untouched.
    assert fetches(site) == {"/": 1, "/old.html": 1, "/new.html": 1, "/loop-a": 1, "/loop-b": 1, "/sneaky": 1}
    assert status["redirects"] == 4 and status["robots_blocked"] == 1


def test_rules_pick_the_analyzer_and_write_records(site: TestSite, vcrawl_settings: Settings) -> None:
    site.add_page("/", page("/products/1.html", "/products/2.html", "/about.html"))
    site.add_page("/products/1.html", page(title="Hammer"))
    site.add_page("/products/2.html", page(title="Saw"))
    site.add_page("/about.html", page(title="About"))
    rules = [{"pattern": r"/products/\d+\.html$", "analyzer": "fields", "fields": {"name": "h1"}}]

    status = run_job({"seeds": [site.url("/")], "politeness": FAST, "rules": rules})

    assert status["records"] == 2 and status["analysed"] == 4
    tasks.deps.flush_records()
    records = list(read_records(tasks.deps.storage(), f"jobs/{status['job']}/records"))
    assert sorted(r["data"]["fields"]["name"] for r in records) == ["Hammer", "Saw"]
    for record in records:
        assert record["job"] == status["job"] and record["analyzer"] == "fields"
        assert record["url"].startswith(site.url("/products/")) and record["fetched_at"].startswith("20")


def test_cancel_stops_dispatch_at_once(site: TestSite) -> None:
    site.add_page("/", page(*[f"/p{n}.html" for n in range(30)]))
    for n in range(30):
        site.add_page(f"/p{n}.html", page())
    job_id = tasks.start_job({"seeds": [site.url("/")], "politeness": {"min_interval_s": 0.2, "jitter": 0}})
    deadline = time.monotonic() + 10
    while sum(fetches(site).values()) < 3 and time.monotonic() < deadline:
        time.sleep(0.02)

    assert tasks.cancel_job(job_id)
    requests_at_cancel = sum(fetches(site).values())
    time.sleep(1.0)  # five more intervals: a running job would have fetched about five more pages
    # The fetch in flight at the cancel is counted when its batch is released, which a loaded machine
    # may delay past the second above: wait for that, not a fixed time.
    wait_for_batches_released(job_id)

    status = tasks.job_status(job_id)
    assert status["state"] == "cancelled"
    assert sum(fetches(site).values()) <= requests_at_cancel + 1  # at most the one in flight
    assert status["pages_fetched"] == sum(fetches(site).values())  # in-flight fetches are counted
    assert not tasks.cancel_job(job_id)
    assert wait_for_no_filter(job_id)  # a cancelled job's Bloom filter is dropped too


def filter_keys(job_id: str) -> list[str]:
    return list(tasks.deps.frontier_client().scan_iter(match=f"vcrawl:job:{{{job_id}}}:bloom:*", count=1000))


def wait_for_no_filter(job_id: str, timeout_s: float = 5.0) -> bool:
    """The pumps drop a finished job's Bloom filter on their next round."""
    deadline = time.monotonic() + timeout_s
    while filter_keys(job_id) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not filter_keys(job_id)


def test_a_finished_job_leaves_no_bloom_filter_and_a_paused_one_keeps_it(site: TestSite) -> None:
    site.add_page("/", page(*[f"/p{n}.html" for n in range(20)]))
    for n in range(20):
        site.add_page(f"/p{n}.html", page())
    job_id = tasks.start_job({"seeds": [site.url("/")], "politeness": {"min_interval_s": 0.1, "jitter": 0}})
    deadline = time.monotonic() + 10
    while sum(fetches(site).values()) < 4 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert tasks.pause_job(job_id)
    time.sleep(1.0)  # several pump rounds see it stopped
    assert filter_keys(job_id)  # still needed: resuming must not admit the same URLs again
    assert tasks.resume_job(job_id) == "running"
    deadline = time.monotonic() + 30
    while tasks.job_status(job_id)["state"] == "running" and time.monotonic() < deadline:
        time.sleep(0.05)
    status = tasks.job_status(job_id)
    assert status["state"] == "completed" and status["pages_stored"] == 21
    assert sum(fetches(site).values()) == 21  # nothing fetched twice across the pause
    assert wait_for_no_filter(job_id)


@pytest.mark.parametrize(
    ("job", "field"),
    [
        ({"seeds": []}, "seeds"),
        ({"seeds": ["ftp://x.test/"]}, "seeds[0]"),
        ({"seeds": ["http://x.test/"], "depth": 2}, "depth"),
        ({"seeds": ["http://x.test/"], "scope": {"allow": ["(unclosed"]}}, "scope.allow[0]"),
        ({"seeds": ["http://x.test/"], "politeness": {"per_host": 0}}, "politeness.per_host"),
        ({"seeds": ["http://x.test/"], "politeness": {"min_interval_s": "fast"}}, "politeness.min_interval_s"),
        ({"seeds": ["http://x.test/"], "rules": [{"pattern": "x", "analyzer": "nope"}]}, "rules[0].analyzer"),
        ({"seeds": ["http://x.test/"], "rules": [{"pattern": "x", "page_type": "ajax"}]}, "rules[0].page_type"),
        (
            {"seeds": ["http://x.test/"], "rules": [{"pattern": "x", "page_type": "dynamic", "wait_for": "div[["}]},
            "rules[0].wait_for",
        ),
        ({"seeds": ["http://x.test/"], "rules": [{"analyzer": "links"}]}, "rules[0].pattern"),
        (
            {"seeds": ["http://x.test/"], "rules": [{"pattern": "x", "page_type": "dynamic",
                                                     "actions": [{"scroll": "end"}, {"click": "a[["}]}]},
            "rules[0].actions[1].click",
        ),
        (
            {"seeds": ["http://x.test/"], "rules": [{"pattern": "x", "page_type": "dynamic",
                                                     "actions": [{"script": "not-installed"}]}]},
            "rules[0].actions[0].script",
        ),
        ({"seeds": ["http://x.test/"], "rules": [{"pattern": "x", "fields": {"a": "h1[["}}]}, "rules[0].fields.a.css"),
        ({"seeds": ["http://x.test/"], "allowed_networks": ["10.0.0.0/33"]}, "allowed_networks[0]"),
        ({"seeds": ["http://x.test/"], "proxies": ["socks://p:1"]}, "proxies[0]"),
        ({"seeds": ["http://x.test/"], "user_agents": ["ok/1", "bad/2\r\nX-Injected: 1"]}, "user_agents[1]"),
        ({"seeds": ["http://x.test/"], "referers": ["https://r.test/\nX: 1"]}, "referers[0]"),
        ({"seeds": ["http://x.test/"], "proxies": ["http://127.0.0.1:3128/\r\nX: 1"]}, "proxies[0]"),
    ],
)
def test_invalid_jobs_are_refused_with_the_path_of_the_bad_key(job: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidTask) as refused:
        tasks.start_job(job)
    assert refused.value.field == field


def test_a_live_change_refuses_control_characters_in_header_values(site: TestSite) -> None:
    site.add_page("/", page(*[f"/h{n}.html" for n in range(10)]))
    job_id = tasks.start_job({"seeds": [site.url("/")], "politeness": {"min_interval_s": 5.0, "jitter": 0}})
    try:
        with pytest.raises(InvalidTask) as refused:
            tasks.reconfigure_job(job_id, {"user_agents": ["ok/1", "bad/2\r\nX-Injected: 1"]})
        assert refused.value.field == "user_agents[1]"
        assert refused.value.problem.startswith("must not hold CR, LF or other control characters")
        assert tasks.job_spec(job_id).user_agents is None  # nothing was changed
        assert tasks.reconfigure_job(job_id, {"referers": ["https://r.test/"]}).referers == ("https://r.test/",)
    finally:
        tasks.cancel_job(job_id)


def test_a_job_id_cannot_be_reused(site: TestSite) -> None:
    site.add_page("/", page())
    status = run_job({"id": "reuse-test", "seeds": [site.url("/")], "politeness": FAST})
    assert status["state"] == "completed"
    with pytest.raises(InvalidTask) as refused:
        tasks.start_job({"id": "reuse-test", "seeds": [site.url("/")]})
    assert refused.value.field == "id"


def test_job_files_in_yaml_and_json(tmp_path: Path) -> None:
    (tmp_path / "job.yaml").write_text(
        "seeds: [http://shop.test/]\nmax_depth: 2\nscope:\n  domains: [shop.test]\n"
        "rules:\n  - pattern: /item/\n    analyzer: fields\n    fields: {name: h1, price: 'xpath://span/text()'}\n"
    )
    (tmp_path / "job.json").write_text(json.dumps({"seeds": ["http://shop.test/"], "max_depth": 2}))
    (tmp_path / "bad.yaml").write_text("seeds: [http://shop.test/]\npoliteness:\n  per_hots: 2\n")
    (tmp_path / "broken.yaml").write_text("seeds: [\n")
    (tmp_path / "twice.yaml").write_text("seeds: [http://shop.test/]\nmax_depth: 2\nmax_depth: 5\n")

    spec = load_job_file(tmp_path / "job.yaml")
    assert spec.scope.domains == ("shop.test",) and spec.rules[0].fields["name"].css == "h1"
    assert load_job_file(tmp_path / "job.json").max_depth == 2
    with pytest.raises(InvalidTask) as refused:
        load_job_file(tmp_path / "bad.yaml")
    assert refused.value.field == "politeness.per_hots"
    with pytest.raises(InvalidTask) as refused:
        load_job_file(tmp_path / "broken.yaml")
    assert refused.value.field == "file"
    with pytest.raises(InvalidTask) as refused:  # PyYAML alone would keep 5 without a word
        load_job_file(tmp_path / "twice.yaml")
    assert refused.value.field == "max_depth" and "given twice" in refused.value.problem


def test_cancel_with_a_backlog_on_many_hosts_stops_queued_batches_too() -> None:
    sites = [TestSite() for _ in range(6)]
    for site in sites:
        site.__enter__()
        site.add_page("/", page(*[f"/p{n}.html" for n in range(40)]))
        for n in range(40):
            site.add_response(f"/p{n}.html", Response(page().encode(), delay_s=0.05))
    try:
        job_id = tasks.start_job({"seeds": [s.url("/") for s in sites], "politeness": {"min_interval_s": 0,
                                  "per_host": 4}})  # fmt: skip
        deadline = time.monotonic() + 10
        while sum(len(s.seen) for s in sites) < 40 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert tasks.cancel_job(job_id)
        # Let what is in flight finish: up to 8 threads fetch on until their batch next checks the
        # job's state (every 0.2 s, plus the fetch under way), and queued batches must hand back.
        wait_for_batches_released(job_id)
        time.sleep(0.1)  # the last responses on their way back
        settled = sum(len(s.seen) for s in sites)
        time.sleep(1.5)
        after = sum(len(s.seen) for s in sites)
        status = tasks.job_status(job_id)
    finally:
        for site in sites:
            site.__exit__()
    assert status["state"] == "cancelled"
    assert after == settled  # nothing more went out, though batches were queued
    assert after < 6 * 41 / 2  # far from the whole crawl


def test_allowed_networks_hold_before_robots_txt(site: TestSite) -> None:
    site.add_page("/", page("/a.html"))

    status = run_job({"seeds": [site.url("/")], "politeness": FAST, "allowed_networks": ["10.0.0.0/8"]})

    assert status["state"] == "completed"
    assert site.seen == []  # not even robots.txt
    assert status["failed"] == {"blocked_address": 1}


def test_seeds_are_not_held_to_the_allow_patterns(site: TestSite) -> None:
    site.add_page("/", page("/catalogue/1.html", "/about.html"))
    site.add_page("/catalogue/1.html", page())
    site.add_page("/about.html", page())

    status = run_job({"seeds": [site.url("/")], "politeness": FAST, "scope": {"allow": ["/catalogue/"]}})

    assert fetches(site) == {"/": 1, "/catalogue/1.html": 1}
    assert status["filtered"] == {"allow": 1}


def test_robots_txt_that_fails_for_a_while_is_waited_for(site: TestSite) -> None:
    site.add_sequence(
        "/robots.txt",
        [Response(b"", 503), Response(b"User-agent: *\nDisallow: /private/\n", headers={"Content-Type": "text/plain"})],
    )
    site.add_page("/", page("/a.html", "/private/b.html"))
    site.add_page("/a.html", page())

    status = run_job({"seeds": [site.url("/")], "politeness": FAST})

    # Disallowed while robots.txt answered 503; read again after the error's cache time; then crawled.
    assert status["state"] == "completed"
    assert fetches(site) == {"/": 1, "/a.html": 1}
    assert status["robots_blocked"] == 1 and status["robots_fetched"] == 2


def test_a_warc_job_archives_every_response(site: TestSite) -> None:
    site.add_page("/", page("/a.html", "/gone.html"))
    site.add_page("/a.html", page(title="A"))

    status = run_job({"seeds": [site.url("/")], "politeness": FAST, "warc": True})
    tasks.deps.close_warc()

    assert status["state"] == "completed"
    store = tasks.deps.storage()
    prefix = f"jobs/{status['job']}/warc"
    files = store.list_files(prefix)
    warcs = [f for f in files if f.endswith(".warc.gz")]
    indexes = [f for f in files if f.endswith(".cdxj")]
    assert warcs and len(indexes) == len(warcs)
    checked = subprocess.run([str(Path(sys.executable).parent / "warcio"), "check", *warcs], capture_output=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    entries = [entry for index in indexes for entry in lookup(store, index, site.url("/a.html"))]
    [entry] = entries
    http_status, headers, body = read_response(store, entry)
    content_type = {k.lower(): v for k, v in headers.items()}["content-type"]
    assert http_status == 200 and b"<h1>A</h1>" in body and content_type.startswith("text/html")
    statuses = sorted(e.status for index in indexes for e in lookup(store, index, site.url("/gone.html")))
    assert statuses == [404]  # every response, not only the stored pages


def test_pages_carry_the_address_they_came_from_into_warc_and_records(site: TestSite) -> None:
    by_name = site.url("/").replace("127.0.0.1", "localhost")  # a name, resolved through the worker's DNS cache
    site.add_page("/", page("/products/1.html", "/gone.html"))
    site.add_page("/products/1.html", page(title="Hammer"))
    rules = [{"pattern": r"/products/\d+\.html$", "analyzer": "fields", "fields": {"name": "h1"}}]
    before = tasks.deps.dns_cache().stats()

    status = run_job({"seeds": [by_name], "politeness": FAST, "warc": True, "rules": rules})
    tasks.deps.close_warc()
    tasks.deps.flush_records()

    assert status["state"] == "completed" and status["records"] == 1
    after = tasks.deps.dns_cache().stats()
    assert after.lookups + after.hits > before.lookups + before.hits  # the guard resolved through the cache
    warcs = [f for f in tasks.deps.storage().list_files(f"jobs/{status['job']}/warc") if f.endswith(".warc.gz")]
    addresses = {}
    for path in warcs:
        with open(path, "rb") as stream:
            for record in ArchiveIterator(stream):
                if record.rec_type == "response":
                    target = record.rec_headers.get_header("WARC-Target-URI")
                    addresses[target] = record.rec_headers.get_header("WARC-IP-Address")
    assert addresses == {  # every response, the 404 too, from the address its connection was pinned to
        by_name: "127.0.0.1",
        by_name + "products/1.html": "127.0.0.1",
        by_name + "gone.html": "127.0.0.1",
    }
    [record] = read_records(tasks.deps.storage(), f"jobs/{status['job']}/records")
    assert (record["url"], record["ip"]) == (by_name + "products/1.html", "127.0.0.1")
