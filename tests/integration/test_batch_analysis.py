"""Batch analysis and replay on the session's real worker: chords over a crawled job, chunk retries, replay.

A small two-host site is crawled for real; the site report is then checked against a direct
computation from the files the crawl stored and the requests the servers saw.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urljoin, urlsplit

import lxml.html
import pytest

import tasks
from analyzers import batch_registry
from analyzers.batch import CrawledUrl, MapContext
from analyzers.site_report import SiteReport
from batch_analysis import steps as batch_analysis
from engine.fetch_log import latest_by_url, read_fetch_log
from tasks import batch_analysis as batch_tasks
from tests.cluster import REPO, cluster_env
from tests.integration.conftest import AlertSinks, run_job
from tests.site import NOT_PAGES, TestSite
from vcrawl import redis_keys
from vcrawl.errors import AnalysisFailed, InvalidTask
from vcrawl.settings import Settings

pytestmark = pytest.mark.usefixtures("worker")

DUPLICATE = "<html><body><h1>Same</h1><p>one body served under two URLs, word for word</p></body></html>"


def page(title: str, *links: str, text: str = "") -> str:
    anchors = "".join(f'<a href="{href}">{href}</a>' for href in links)
    return f"<html><head><title>{title}</title></head><body><h2>{title} aside</h2><p>{text}</p>{anchors}</body></html>"


@pytest.fixture
def other_site() -> Iterator[TestSite]:
    with TestSite() as running:
        yield running


def build_sites(site: TestSite, other: TestSite) -> None:
    """Two hosts: broken links (404, 410) from several pages, a byte-identical alias, a link out of scope."""
    links = ["/a.html", "/b.html", "/missing.html", "/item?id=1", "/item?id=2", other.url("/"), "http://127.0.0.9:9/o"]
    site.add_page("/", page("Home", *links, text="home of the test site"))
    site.add_page("/a.html", page("A", "/missing.html", "/gone.html", "/b.html", text="page a"))
    site.add_page("/b.html", page("B", "/a.html", other.url("/x.html"), text="page b"))
    site.add_page("/gone.html", "gone", status=410)
    site.add_page("/item?id=1", DUPLICATE)
    site.add_page("/item?id=2", DUPLICATE)
    other.add_page("/", page("Other", "/x.html", "/nowhere.html", site.url("/"), text="the other host"))
    other.add_page("/x.html", page("X", "/nowhere.html", text="page x"))


def crawl(site: TestSite, other: TestSite, **extra: Any) -> dict[str, Any]:
    job = {
        "seeds": [site.url("/")],
        "scope": {"hosts": ["127.0.0.1"]},
        "politeness": {"min_interval_s": 0.0},
        "limits": {"retries": 0},
        **extra,
    }
    status = run_job(job, timeout_s=60)
    assert status["state"] == "completed", status
    return status


def stored_pages(settings: Settings, job_id: str) -> dict[str, Path]:
    """Stored file per URL, found by the URL hash in the file name (storage.naming)."""
    files = {}
    for root, _dirs, names in os.walk(Path(settings.data) / "jobs" / job_id / "pages"):
        for name in names:
            files[name.rsplit("__", 1)[1].split(".")[0]] = Path(root) / name
    return files


def direct_report(settings: Settings, job_id: str, sites: list[TestSite]) -> dict[str, Any]:
    """Per host: pages, bytes, 404/410s with referrers, computed from the stored files and the servers' logs."""
    by_hash = stored_pages(settings, job_id)
    hosts: dict[str, dict[str, Any]] = {}
    bodies: dict[str, bytes] = {}
    for site in sites:
        netloc = urlsplit(site.base).netloc
        for seen in site.seen:
            if seen.path in NOT_PAGES:
                continue
            url = site.url(seen.path)
            digest = hashlib.sha256(url.encode()).hexdigest()[:10]
            entry = hosts.setdefault(netloc, {"pages": 0, "bytes": 0, "broken": {}})
            if digest in by_hash:
                body = by_hash[digest].read_bytes()
                bodies[url] = body
                entry["pages"] += 1
                entry["bytes"] += len(body)
            else:
                entry["broken"][url] = []
    for url, body in bodies.items():
        if b"<a" not in body:
            continue
        for href in lxml.html.fromstring(body).xpath("//a/@href"):
            target = urljoin(url, href)
            broken = hosts.get(urlsplit(target).netloc, {}).get("broken", {})
            if target in broken and url not in broken[target]:
                broken[target].append(url)
    return hosts


def test_a_chord_gives_the_site_report_a_direct_computation_gives(
    site: TestSite, other_site: TestSite, vcrawl_settings: Settings
) -> None:
    build_sites(site, other_site)
    status = crawl(site, other_site)

    location = tasks.analyze_job(status["job"], "site-report", chunk=2, timeout_s=60)

    # In the job's own folder, like everything a job writes: never in the single tasks' results/.
    assert location == str(Path(vcrawl_settings.data) / "jobs" / status["job"] / "results" / "site-report.json")
    assert not (Path(vcrawl_settings.data) / "results" / status["job"]).exists()
    report = json.loads(Path(location).read_text())
    truth = direct_report(vcrawl_settings, status["job"], [site, other_site])
    assert set(report["hosts"]) == set(truth)
    for host, want in truth.items():
        got = report["hosts"][host]
        assert (got["pages"], got["bytes"]) == (want["pages"], want["bytes"]), host
        broken = {url: sorted(entry["referrers"]) for url, entry in got["broken_links"].items()}
        assert broken == {url: sorted(refs) for url, refs in want["broken"].items()}, host
    ours = report["hosts"][urlsplit(site.base).netloc]
    assert ours["status_codes"] == {"200": 5, "404": 1, "410": 1}
    assert ours["broken_links"][site.url("/gone.html")]["status"] == 410
    assert ours["content_types"] == {"text/html": 5} and ours["depth"] == {"0": 1, "1": 4}
    assert ours["top_outgoing_domains"] == [{"domain": "127.0.0.9", "pages": 1}]
    assert report["totals"]["pages"] == status["pages_stored"] == 7
    runs = tasks.analysis_runs(status["job"])
    assert runs[0]["state"] == "done" and runs[0]["chunks"] == runs[0]["chunks_done"] == 5  # 10 URLs


def test_near_duplicates_cluster_the_identical_alias_and_nothing_else(
    site: TestSite, other_site: TestSite, vcrawl_settings: Settings
) -> None:
    build_sites(site, other_site)
    status = crawl(site, other_site)

    result = json.loads(Path(tasks.analyze_job(status["job"], "near-duplicates", chunk=3, timeout_s=60)).read_text())

    assert [cluster["urls"] for cluster in result["clusters"]] == [[site.url("/item?id=1"), site.url("/item?id=2")]]
    assert result["clusters"][0]["identical"] and result["pages"] == 7


def test_any_chunk_size_gives_the_same_report(site: TestSite, other_site: TestSite) -> None:
    build_sites(site, other_site)
    status = crawl(site, other_site)

    one = json.loads(Path(tasks.analyze_job(status["job"], "site-report", chunk=1, timeout_s=60)).read_text())
    all_in_one = json.loads(Path(tasks.analyze_job(status["job"], "site-report", chunk=1000, timeout_s=60)).read_text())

    for result in (one, all_in_one):
        for volatile in ("run", "generated_at"):
            result.pop(volatile)
    assert one == all_in_one


class FlakyTitles:
    """A test batch analyzer whose map fails twice for the chunk holding ``/b.html``."""

    calls: Counter[str] = Counter()
    lock = threading.Lock()

    def map(self, urls: list[CrawledUrl], context: MapContext) -> dict[str, Any]:
        first = urls[0].url
        with self.lock:
            self.calls[first] += 1
            calls = self.calls[first]
        if any(url.url.endswith("/b.html") for url in urls) and calls <= 2:
            raise RuntimeError(f"flaky chunk, call {calls}")
        return {"titles": sorted(url.url for url in urls if url.page is not None)}

    def reduce(self, partials: Any) -> dict[str, Any]:
        return {"titles": sorted(url for partial in partials for url in partial["titles"])}


class Broken(FlakyTitles):
    def map(self, urls: list[CrawledUrl], context: MapContext) -> dict[str, Any]:
        raise RuntimeError("this analyzer always fails")


@pytest.fixture
def test_analyzers(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """FlakyTitles and Broken in the process's batch registry (the session's worker is a thread here)."""
    batch_registry.batch_analyzer_names()  # loaded, then extended
    loaded = batch_registry._default._loaded
    assert loaded is not None
    monkeypatch.setitem(loaded, "flaky-titles", FlakyTitles)
    monkeypatch.setitem(loaded, "broken", Broken)
    FlakyTitles.calls.clear()
    yield


@pytest.mark.usefixtures("test_analyzers")
def test_a_chunk_that_fails_twice_is_retried_alone(site: TestSite, other_site: TestSite) -> None:
    build_sites(site, other_site)
    status = crawl(site, other_site)

    result = json.loads(Path(tasks.analyze_job(status["job"], "flaky-titles", chunk=2, timeout_s=60)).read_text())

    assert len(result["titles"]) == 7
    flaky = [first for first, n in FlakyTitles.calls.items() if n > 1]
    assert len(flaky) == 1 and FlakyTitles.calls[flaky[0]] == 3  # two failures, then the third try
    assert sorted(FlakyTitles.calls.values()) == [1, 1, 1, 1, 3]  # 10 URLs in 5 chunks


@pytest.mark.usefixtures("test_analyzers")
def test_a_chunk_that_keeps_failing_fails_the_run_and_alerts(
    site: TestSite, other_site: TestSite, alert_sinks: AlertSinks
) -> None:
    build_sites(site, other_site)
    status = crawl(site, other_site)

    with pytest.raises(AnalysisFailed, match="always fails"):
        tasks.analyze_job(status["job"], "broken", chunk=100, timeout_s=60)

    run = tasks.analysis_runs(status["job"])[0]
    assert run["state"] == "failed" and "always fails" in run["error"]
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not any(run["run"] in json.dumps(hook) for hook in alert_sinks.webhooks):
        time.sleep(0.1)
    assert any(run["run"] in json.dumps(hook) for hook in alert_sinks.webhooks)


def test_replay_with_a_fixed_rule_writes_new_records_and_keeps_the_old(
    site: TestSite, other_site: TestSite, vcrawl_settings: Settings
) -> None:
    build_sites(site, other_site)
    wrong = [{"pattern": "", "analyzer": "fields", "fields": {"title": "h2"}}]
    status = crawl(site, other_site, rules=wrong)
    tasks.deps.flush_records()
    records = Path(vcrawl_settings.data) / "jobs" / status["job"] / "records"
    before = {path: path.read_bytes() for path in records.glob("*.jsonl")}
    requests_before = len(site.seen) + len(other_site.seen)

    run = tasks.reanalyze_job(status["job"], "fields", fields={"title": "title", "links": {"css": "a", "all": True}},
                              chunk=3, timeout_s=60)  # fmt: skip

    assert len(site.seen) + len(other_site.seen) == requests_before  # nothing fetched
    assert {path: path.read_bytes() for path in records.glob("*.jsonl")} == before
    replayed = [
        json.loads(line)
        for part in (Path(vcrawl_settings.data) / "jobs" / status["job"] / "replays" / run["run"] / "records").glob("*")
        for line in part.read_text().splitlines()
    ]
    titles = {record["url"]: record["data"]["fields"]["title"] for record in replayed}
    assert len(replayed) == status["pages_stored"] == len(titles)
    assert titles[site.url("/a.html")] == "A" and titles[other_site.url("/x.html")] == "X"
    old = [json.loads(line) for body in before.values() for line in body.decode().splitlines()]
    assert {record["data"]["fields"]["title"] for record in old if record["url"] == site.url("/a.html")} == {"A aside"}
    summary = json.loads(Path(run["result"]).read_text())
    assert summary["records"] == status["pages_stored"] and summary["failed"] == {}


def test_a_job_runs_its_batch_analyzers_when_it_completes(
    site: TestSite, other_site: TestSite, vcrawl_settings: Settings
) -> None:
    build_sites(site, other_site)
    status = crawl(site, other_site, batch_analyzers=["site-report"])
    result = Path(vcrawl_settings.data) / "jobs" / status["job"] / "results" / "site-report.json"

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not result.exists():
        time.sleep(0.1)

    assert json.loads(result.read_text())["totals"]["pages"] == 7


def test_analysis_is_refused_for_unknown_jobs_and_analyzers(site: TestSite, other_site: TestSite) -> None:
    with pytest.raises(InvalidTask, match="no job"):
        tasks.start_analysis("no-such-job", "site-report")
    build_sites(site, other_site)
    status = crawl(site, other_site)
    with pytest.raises(InvalidTask, match=r"no batch analyzer 'nope'; known: .*site-report"):
        tasks.start_analysis(status["job"], "nope")
    with pytest.raises(InvalidTask, match="chunk"):
        tasks.start_analysis(status["job"], "site-report", chunk=0)
    with pytest.raises(InvalidTask, match="batch_analyzers"):
        tasks.start_job({"seeds": [site.url("/")], "batch_analyzers": ["nope"]})


def test_the_fetch_log_holds_every_url_the_job_ended(site: TestSite, other_site: TestSite) -> None:
    build_sites(site, other_site)
    status = crawl(site, other_site)
    tasks.deps.flush_records()

    lines = latest_by_url(read_fetch_log(tasks.deps.storage(), status["job"]))

    outcomes = Counter(line.outcome for line in lines)
    assert outcomes == {"stored": status["pages_stored"], "failed": sum(status["failed"].values())}
    assert {line.url: line.status for line in lines if line.outcome == "failed"} == {
        site.url("/missing.html"): 404, site.url("/gone.html"): 410, other_site.url("/nowhere.html"): 404,
    }  # fmt: skip
    assert all(line.depth >= 0 and line.at > 0 for line in lines)


def test_site_report_map_and_reduce_without_celery() -> None:
    """The analyzer alone: partials folded in any order give one answer."""

    class Context:
        def canonical(self, url: str) -> str:
            return url

        def final_status(self, url: str) -> int | None:
            return {"http://h/404": 404}.get(url)

    from analyzers import Page

    def stored(url: str, body: str, depth: int) -> CrawledUrl:
        return CrawledUrl(url, "h", "stored", 200, depth, len(body), "text/html", page=Page(url, body.encode()))

    chunks = [
        [stored("http://h/", '<a href="/404">x</a><a href="http://o/">o</a>', 0)],
        [stored("http://h/a", '<a href="/404">x</a>', 1), CrawledUrl("http://h/404", "h", "failed", 404, 1)],
    ]
    report = SiteReport()
    partials = [report.map(chunk, Context()) for chunk in chunks]
    assert report.reduce(partials) == report.reduce(reversed(partials))
    host = report.reduce(partials)["hosts"]["h"]
    assert host["broken_links"] == {"http://h/404": {"status": 404, "referrers": ["http://h/", "http://h/a"]}}
    assert host["status_codes"] == {"200": 2, "404": 1}
    assert host["top_outgoing_domains"] == [{"domain": "o", "pages": 1}]


def test_a_run_that_lost_a_map_message_is_sent_again(site: TestSite, other_site: TestSite) -> None:
    """A killed worker can lose a message between kombu's BRPOP and its unacked note: simulated by
    planning a run whose chord is never sent, and mapping all chunks but one here. The look comes
    10 s after the last progress, whatever the visibility timeout; the resent map sends the reduce."""
    build_sites(site, other_site)
    status = crawl(site, other_site)
    expected = json.loads(Path(tasks.analyze_job(status["job"], "site-report", chunk=3, timeout_s=60)).read_text())
    store, runs = tasks.deps.storage(), batch_tasks.runs()
    plan = batch_analysis.plan_run(store, runs, status["job"], "site-report", chunk_size=3)
    runs.sent(status["job"], plan.run, time.time())
    for index in range(plan.chunks):
        if index != 1:
            batch_analysis.map_chunk(store, runs, status["job"], plan.run, index)

    client = tasks.deps.redis_client()
    client.delete(redis_keys.analyses_watch())  # the session worker's watchdog may have just looked
    soon = time.time() + batch_tasks.LOOKS.first_look_s - 2
    assert batch_tasks.watch_runs(now=soon) == 0  # a chunk was mapped a moment ago: not looked at yet
    client.delete(redis_keys.analyses_watch())
    later = time.time() + batch_tasks.LOOKS.first_look_s + 1
    assert batch_tasks.watch_runs(now=later) == 1  # chunk 1: neither queued nor unacked, sent again
    sent_at = time.monotonic()
    run = tasks.analysis_facade.wait_for_run(status["job"], plan.run, timeout_s=60)
    # The resent map ran outside the chord, so the chord's reduce never comes: the map sent it, at once.
    assert time.monotonic() - sent_at < batch_tasks.REDUCE_DUE_S
    assert run["state"] == "done" and run.get("reduce_sent_at") is not None

    result = json.loads(Path(run["result"]).read_text())
    assert {key: result[key] for key in ("hosts", "totals")} == {key: expected[key] for key in ("hosts", "totals")}


def test_a_run_whose_maps_all_wait_their_turn_is_not_sent_again(site: TestSite, other_site: TestSite) -> None:
    """A look finds the messages where they wait: one pass over the queue, nothing sent twice."""
    build_sites(site, other_site)
    status = crawl(site, other_site)
    store, runs = tasks.deps.storage(), batch_tasks.runs()
    plan = batch_analysis.plan_run(store, runs, status["job"], "site-report", chunk_size=3)
    runs.sent(status["job"], plan.run, time.time())
    client = tasks.deps.redis_client()
    waiting = {batch_tasks.map_task_id(plan.run, index) for index in range(plan.chunks)}
    later = time.time() + batch_tasks.LOOKS.first_look_s + 1

    assert batch_tasks.recover_run(status["job"], plan.run, now=later, present=lambda: waiting) == 0
    looked = runs.get(status["job"], plan.run)
    assert looked is not None and looked["looked_at"] == later and not looked.get("resent_at")
    assert looked["look_every"] == batch_tasks.LOOKS.first_look_s  # the session's queue is short: no back-off
    assert not batch_tasks.LOOKS.is_due(looked, later + 1)
    assert batch_tasks.maps_present(client).isdisjoint(waiting)  # nothing was sent
    runs.fail(status["job"], plan.run, "test: never sent", time.time())  # the session's watchdog leaves it


def test_the_command_line_analyzes_replays_and_lists(
    site: TestSite, other_site: TestSite, vcrawl_settings: Settings, tmp_path: Path
) -> None:
    env = cluster_env(vcrawl_settings)
    build_sites(site, other_site)
    status = crawl(site, other_site)

    done = vcrawl(env, "analyze", status["job"], "--analyzer", "site-report", "--chunk", "4", "--json")
    assert done.returncode == 0, done.stderr
    run = json.loads(done.stdout.splitlines()[-1])
    assert (run["state"], run["chunks"], run["urls"], run["pages"]) == ("done", 3, 10, 7)
    assert json.loads(Path(run["result"]).read_text())["totals"]["pages"] == 7
    assert "site-report: 3/3 chunks mapped (100%), done" in done.stderr
    rules = tmp_path / "rules.yaml"
    rules.write_text("title: title\n")
    replayed = vcrawl(env, "reanalyze", status["job"], "--analyzer", "fields", "--fields", str(rules))
    assert replayed.returncode == 0 and replayed.stdout.startswith("result: "), replayed.stderr
    listing = json.loads(vcrawl(env, "analyzers", "--json").stdout)
    assert {"site-report", "near-duplicates"} <= set(listing["batch"]) and "fields" in listing["page"]
    for args, message in (
        (("analyze", "no-such-job", "--analyzer", "site-report"), "no job 'no-such-job'"),
        (("analyze", status["job"], "--analyzer", "fields"), "no batch analyzer 'fields'"),
        (("reanalyze", status["job"], "--analyzer", "site-report"), "no analyzer 'site-report'"),
    ):
        refused = vcrawl(env, *args)
        assert refused.returncode == 2 and message in refused.stderr, refused.stderr


def vcrawl(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cli", *args], env=env, cwd=REPO, capture_output=True, text=True,
                          timeout=120)  # fmt: skip


def test_replay_without_fields_uses_the_jobs_own_rules(
    site: TestSite, other_site: TestSite, vcrawl_settings: Settings
) -> None:
    build_sites(site, other_site)
    rules = [{"pattern": "/a\\.html$", "analyzer": "fields", "fields": {"heading": "h2"}}]
    status = crawl(site, other_site, rules=rules)

    run = tasks.reanalyze_job(status["job"], "fields", timeout_s=60)

    summary = json.loads(Path(run["result"]).read_text())
    folder = Path(vcrawl_settings.data) / summary["records_in"]
    records = [json.loads(line) for part in folder.glob("*.jsonl") for line in part.read_text().splitlines()]
    assert summary["pages"] == status["pages_stored"]
    # Only /a.html has a rule with fields; the fields analyzer refuses the other pages, each counted.
    assert summary["records"] == 1 and summary["failed"] == {"invalid_task": status["pages_stored"] - 1}
    assert [record["data"]["fields"] for record in records] == [{"heading": "A aside"}]


def test_each_cycle_of_a_scheduled_job_gets_its_own_report(site: TestSite, vcrawl_settings: Settings) -> None:
    from tests.integration.test_cycles import ALWAYS_DUE, run_cycle
    from tests.integration.test_cycles import job as scheduled_job
    from tests.integration.test_cycles import page as cycle_page

    site.add_versioned("/", cycle_page("/a", "/b", title="home"))
    site.add_versioned("/a", cycle_page(title="a"))
    b = site.add_versioned("/b", cycle_page(title="b"))
    spec = scheduled_job(site, "cycles-analysed", revisit=ALWAYS_DUE, batch_analyzers=["site-report"])
    folder = Path(vcrawl_settings.data) / "jobs" / "cycles-analysed"

    first = run_cycle(spec)
    b.change(cycle_page(title="b, second edition"))
    second = run_cycle(spec)

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and len(list(folder.glob("cycle-*/results/site-report.json"))) < 2:
        time.sleep(0.1)
    one = json.loads((folder / "cycle-1" / "results" / "site-report.json").read_text())
    two = json.loads((folder / "cycle-2" / "results" / "site-report.json").read_text())
    assert one["totals"]["pages"] == first["stored"] == 3
    assert two["totals"]["pages"] == second["stored"] == 1  # only /b changed; the others were not stored again
    assert two["hosts"][urlsplit(site.base).netloc]["failed"] == {"unchanged": 2}
    location = tasks.analyze_job("cycles-analysed", "site-report", timeout_s=60)
    assert location == str(folder / "results" / "site-report.json")
    latest = json.loads(Path(location).read_text())
    assert latest["totals"]["pages"] == 3 and latest["cycle"] is None  # every page as it is now
    assert latest["hosts"][urlsplit(site.base).netloc]["failed"] == {}


def test_pages_whose_files_are_gone_are_read_from_the_jobs_warc_files(
    site: TestSite, other_site: TestSite, vcrawl_settings: Settings
) -> None:
    build_sites(site, other_site)
    status = crawl(site, other_site, warc=True)
    expected = json.loads(Path(tasks.analyze_job(status["job"], "site-report", timeout_s=60)).read_text())
    tasks.deps.close_warc()  # ships this process's WARC files and their indexes (a worker does it on its own)
    pages = Path(vcrawl_settings.data) / "jobs" / status["job"] / "pages"
    removed = [path for path in pages.rglob("*") if path.is_file()]
    for path in removed:
        path.unlink()

    report = json.loads(Path(tasks.analyze_job(status["job"], "site-report", timeout_s=60)).read_text())
    replay = json.loads(
        Path(tasks.reanalyze_job(status["job"], "fields", fields={"title": "title"})["result"]).read_text()
    )

    assert len(removed) == status["pages_stored"] == 7
    assert {key: report[key] for key in ("hosts", "totals")} == {key: expected[key] for key in ("hosts", "totals")}
    assert replay["records"] == 7 and replay["failed"] == {}
