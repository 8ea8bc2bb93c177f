"""Cycles of scheduled jobs on the session's worker: conditional revisits, only changes analysed.

Cycles are started here by calling ``tasks.start_cycle`` the way beat does (a firing id per
call); ``test_beat.py`` runs the same through real beat processes.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import pytest

import tasks
from storage import page_location
from tests.site import NOT_PAGES, TestSite
from vcrawl.errors import InvalidTask

pytestmark = pytest.mark.usefixtures("worker")

ALWAYS_DUE = {"initial_s": 0, "min_s": 0, "max_s": 0}


def page(*links: str, title: str = "") -> str:
    anchors = "".join(f'<a href="{href}">{href}</a> ' for href in links)
    return f"<html><head><title>{title}</title></head><body><h1>{title}</h1>{anchors}</body></html>"


def job(site: TestSite, name: str, **extra: Any) -> dict[str, Any]:
    rules = [{"pattern": "", "analyzer": "fields", "fields": {"title": "h1"}}]
    return {"seeds": [site.url("/")], "politeness": {"min_interval_s": 0.0}, "rules": rules, **extra, "id": name}


def fire(spec: dict[str, Any], overlap: str = "skip") -> dict[str, Any]:
    """One firing, as beat sends it (a fresh task id), run in this process like a worker would."""
    result = tasks.start_cycle.apply(args=(spec["id"], spec), kwargs={"overlap": overlap}, task_id=str(uuid.uuid4()))
    return result.get(disable_sync_subtasks=False)  # eager: nothing to wait for


def run_cycle(spec: dict[str, Any], timeout_s: float = 30.0) -> dict[str, Any]:
    started = fire(spec)
    assert started["status"] == "started", started
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = tasks.job_status(spec["id"])
        assert status is not None
        if status["state"] != "running":
            assert status["cycle"] == started["cycle"]
            return status
        time.sleep(0.05)
    raise AssertionError(f"cycle still running after {timeout_s}s: {tasks.job_status(spec['id'])}")


def requests_in(site: TestSite, since: int) -> list[tuple[str, dict[str, str]]]:
    return [(seen.path, seen.headers) for seen in site.seen[since:] if seen.path not in NOT_PAGES]


def test_second_cycle_revisits_conditionally_and_analyses_only_what_changed(site: TestSite) -> None:
    home = site.add_versioned("/", page("/a", "/b", "/c", title="home"))
    site.add_versioned("/a", page(title="a"), validators="etag")
    site.add_versioned("/b", page(title="b"), validators="last-modified")
    c = site.add_versioned("/c", page(title="c"), validators="none")
    spec = job(site, "cycles-basic", revisit=ALWAYS_DUE)

    first = run_cycle(spec)
    assert (first["new"], first["changed"], first["unchanged"], first["analysed"]) == (4, 0, 0, 4)
    assert first["records"] == 4

    c.change(page("/d", title="c, second edition"))
    site.add_versioned("/d", page(title="d"))
    mark = len(site.seen)
    second = run_cycle(spec)

    assert second["fetched"] == 5
    assert second["not_modified"] == 3  # /, /a (ETag), /b (Last-Modified)
    assert second["unchanged"] == 3 and second["changed"] == 1 and second["new"] == 1
    assert second["analysed"] == 2 and second["records"] == 2  # /c and the page it now links to
    sent = dict(requests_in(site, mark))
    assert sent["/a"]["If-None-Match"] == '"v1"' and "If-Modified-Since" not in sent["/a"]
    assert sent["/b"]["If-Modified-Since"] == "Tue, 14 Nov 2023 22:13:20 GMT" and "If-None-Match" not in sent["/b"]
    assert "If-None-Match" not in sent["/c"] and "If-Modified-Since" not in sent["/c"]
    assert sent["/"]["If-None-Match"] == '"v1"'

    # Every cycle's counters stay readable; the earlier version of /c is kept.
    cycles = second["cycles"]
    assert [(c["cycle"], c["new"], c["changed"], c["analysed"]) for c in cycles] == [(1, 4, 0, 4), (2, 1, 1, 2)]
    assert cycles[1]["not_modified"] == 3 and cycles[0]["finished"] <= cycles[1]["started"]
    store = tasks.deps.storage()
    for path, cycles_stored in (("/c", ("cycle-1", "cycle-2")), ("/a", ("cycle-1",))):
        location = page_location(site.url(path))
        kept = [n for n in ("cycle-1", "cycle-2") if store.exists(f"jobs/cycles-basic/{n}/{location}")]
        assert tuple(kept) == cycles_stored

    # A 200 whose body did not change counts as unchanged and is not stored again.
    home.change(page("/a", "/b", "/c", title="home"))  # new ETag, same bytes
    third = run_cycle(spec)
    assert third["unchanged"] == 5 and third["not_modified"] == 3 and third["stored"] == 0  # / and /c: 200, same bytes
    assert third["analysed"] == 0


def test_known_urls_wait_for_their_interval_and_new_links_are_crawled_at_once(site: TestSite) -> None:
    home = site.add_versioned("/", page("/a", title="home"))
    site.add_versioned("/a", page(title="a"))
    spec = job(site, "cycles-due", revisit={"initial_s": 3600, "min_s": 60, "max_s": 86400})

    run_cycle(spec)
    mark = len(site.seen)
    second = run_cycle(spec)  # only the seed is fetched: /a is not due for an hour
    assert [path for path, _ in requests_in(site, mark)] == ["/"]
    assert second["unchanged"] == 1 and second["analysed"] == 0

    home.change(page("/a", "/e", title="home, new link"))
    site.add_versioned("/e", page(title="e"))
    mark = len(site.seen)
    third = run_cycle(spec)
    assert sorted(path for path, _ in requests_in(site, mark)) == ["/", "/e"]
    assert third["changed"] == 1 and third["new"] == 1 and third["not_due"] == 1  # /a: linked, not due


def test_intervals_adapt_to_how_often_a_page_changes(site: TestSite) -> None:
    home = site.add_versioned("/", page("/still", title="home"))
    site.add_versioned("/still", page(title="still"))
    spec = job(site, "cycles-adapt", revisit={"initial_s": 100, "min_s": 50, "max_s": 1000, "grow": 0.5, "shrink": 0.5})
    run_cycle(spec)
    history = tasks.deps.history()
    home_url, still_url = site.url("/"), site.url("/still")
    assert {u: r.interval_s for u, r in history.load("cycles-adapt", [home_url, still_url]).items()} == {
        home_url: 100.0,
        still_url: 100.0,
    }
    home.change(page("/still", title="home, changed"))
    run_cycle(spec)  # the seed is always revisited; /still is not due yet
    records = history.load("cycles-adapt", [home_url, still_url])
    assert records[home_url].interval_s == 50.0 and records[still_url].interval_s == 100.0
    run_cycle(spec)  # home unchanged this time: its interval grows
    assert history.load("cycles-adapt", [home_url])[home_url].interval_s == 75.0


def test_a_firing_while_the_cycle_runs_is_skipped_or_cancels_it(site: TestSite) -> None:
    from tests.site import Response

    site.add_versioned("/", page("/slow1", "/slow2", title="home"))
    for path in ("/slow1", "/slow2"):
        site.add_response(path, Response(page(title="slow").encode(), delay_s=1.5))
    spec = job(site, "cycles-overlap", revisit=ALWAYS_DUE)

    assert fire(spec)["status"] == "started"
    time.sleep(0.3)
    assert fire(spec)["status"] == "skipped"
    status = tasks.job_status("cycles-overlap")
    assert status["state"] == "running" and status["cycle"] == 1 and status["skipped_firings"] == 1

    replaced = fire(spec, overlap="cancel")
    assert replaced["status"] == "started" and replaced["cycle"] == 2
    status = tasks.job_status("cycles-overlap")
    assert status["cycles"][0]["state"] == "cancelled" and status["cycles"][1]["state"] == "running"
    deadline = time.monotonic() + 30
    while tasks.job_status("cycles-overlap")["state"] == "running" and time.monotonic() < deadline:
        time.sleep(0.05)
    finished = tasks.job_status("cycles-overlap")
    # What the cancelled cycle had not finished is fetched by the next one.
    assert finished["state"] == "completed" and finished["fetched"] >= 2


def test_urls_over_the_page_limit_are_kept_for_the_next_cycle(site: TestSite) -> None:
    site.add_versioned("/", page("/p1", "/p2", "/p3", title="home"))
    for n in (1, 2, 3):
        site.add_versioned(f"/p{n}", page(title=f"p{n}"))
    spec = job(site, "cycles-limit", max_pages=2, revisit=ALWAYS_DUE)

    first = run_cycle(spec)
    assert first["fetched"] == 2 and first["filtered"] == {"max_pages": 2}
    second = run_cycle(spec)  # the seed again (304), and one URL left over last time
    assert second["fetched"] == 2 and second["not_modified"] == 1 and second["new"] == 1
    assert tasks.deps.history().size("cycles-limit") == 4


def test_a_redelivered_firing_resumes_its_cycle_instead_of_starting_another(site: TestSite) -> None:
    site.add_versioned("/", page(title="home"))
    spec = job(site, "cycles-redelivered", revisit=ALWAYS_DUE)
    firing = str(uuid.uuid4())
    first = tasks.start_cycle.apply(args=("cycles-redelivered", spec), task_id=firing).get(disable_sync_subtasks=False)
    again = tasks.start_cycle.apply(args=("cycles-redelivered", spec), task_id=firing).get(disable_sync_subtasks=False)
    assert (first["status"], again["status"]) == ("started", "resumed")
    assert first["cycle"] == again["cycle"] == 1


def test_an_invalid_scheduled_job_is_refused_with_its_field() -> None:
    with pytest.raises(InvalidTask) as refused:
        tasks.start_cycle.apply(
            args=("cycles-bad", {"seeds": ["http://x.test/"], "rules": [{"pattern": "("}]}), throw=True
        )
    assert refused.value.field == "rules[0].pattern"


def test_a_page_whose_analysis_failed_is_fetched_in_full_and_analysed_again(site: TestSite) -> None:
    site.add_versioned("/", page("/broken", title="home"))
    site.add_versioned("/broken", page(title="broken"))
    spec = job(site, "cycles-failed-analysis", revisit=ALWAYS_DUE)
    spec["rules"] = [{"pattern": "/broken$", "analyzer": "always_fails"}, *spec["rules"]]

    first = run_cycle(spec)
    assert first["analysis_failed"] == {"error": 1}
    mark = len(site.seen)
    second = run_cycle(spec)
    sent = dict(requests_in(site, mark))
    assert "If-None-Match" not in sent["/broken"] and sent["/"]["If-None-Match"] == '"v1"'
    assert second["analysed"] == 1 and second["new"] == 1 and second["analysis_failed"] == {"error": 1}


def test_a_late_admission_from_an_earlier_cycle_changes_nothing(site: TestSite) -> None:
    from frontier import AdmitRequest, Candidate, Entry, UrlHistory

    site.add_versioned("/", page(title="home"))
    spec = job(site, "cycles-late", revisit=ALWAYS_DUE)
    run_cycle(spec)
    second = run_cycle(spec)
    runtime = tasks.deps.runtimes().get("cycles-late", 2)
    late = tasks.deps.frontier().queue.admit(
        "cycles-late",
        AdmitRequest(
            [Candidate("x", Entry(site.url("/late")))],
            bloom=runtime.bloom,
            max_pages=100,
            per_host=1,
            done=1,
            token="a:from-cycle-1",
            cycle=1,
            history={site.url("/new-in-1"): UrlHistory(2, 1.0, 0.0, '"v1"', 0, "00ff")},
        ),
    )
    assert late.repeated and late.admitted == 0
    after = tasks.job_status("cycles-late")
    assert after["pending"] == second["pending"] == 0 and after["admitted"] == second["admitted"]
    # The late page is not lost: it is due (at once) in a later cycle, with nothing known of it yet.
    assert tasks.deps.history().load("cycles-late", [site.url("/new-in-1")]) == {site.url("/new-in-1"): UrlHistory(2)}


def test_a_start_that_died_half_way_is_finished_by_the_next_firing(site: TestSite) -> None:
    site.add_versioned("/", page("/a", title="home"))
    site.add_versioned("/a", page(title="a"))
    spec = job(site, "cycles-half-started", revisit=ALWAYS_DUE)
    run_cycle(spec)
    # A start that got as far as the cycle script, then died: the hold keeps the cycle open.
    frontier = tasks.deps.frontier()
    bloom_keys = tasks.deps.runtimes().get("cycles-half-started", 1).bloom.keys
    spec_json = json.dumps({**spec, "id": "cycles-half-started"})
    dead = frontier.jobs.new_cycle("cycles-half-started", spec_json, firing="dead", bloom_keys=bloom_keys)
    assert dead.status == "started" and tasks.job_status("cycles-half-started")["pending"] == 1
    resumed = fire(spec)
    assert resumed["status"] == "resumed" and resumed["cycle"] == 2
    deadline = time.monotonic() + 30
    while tasks.job_status("cycles-half-started")["state"] == "running" and time.monotonic() < deadline:
        time.sleep(0.05)
    finished = tasks.job_status("cycles-half-started")
    assert (finished["state"], finished["cycle"], finished["not_modified"]) == ("completed", 2, 2)


def test_a_one_off_jobs_id_cannot_be_a_schedules_name(site: TestSite) -> None:
    site.add_page("/", page(title="home"))
    tasks.start_job({"id": "cycles-one-off", "seeds": [site.url("/")], "politeness": {"min_interval_s": 0.0}})
    with pytest.raises(InvalidTask) as refused:
        fire(job(site, "cycles-one-off"))
    assert refused.value.field == "id"
