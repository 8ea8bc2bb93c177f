"""A fetch batch's outcomes folded into the release of its lease: pure code, no Redis."""

from __future__ import annotations

import pytest

from engine.fetch_batch import fold_release
from engine.fetch_step import stops_batch
from engine.outcomes import (
    Failed,
    FetchOutcome,
    Redirected,
    Retry,
    RobotsBlocked,
    RobotsFetched,
    SitemapRead,
    Stored,
    Unchanged,
    Visit,
)
from frontier import Entry
from vcrawl.payloads import FetchedPage
from vcrawl.policies import PolitenessPolicy

NOW = 1000.0
POLITE = PolitenessPolicy(1.0, 0.0)
EAGER = PolitenessPolicy(0.0, 0.0)


def _entry(path: str, attempt: int = 0, not_before_s: float = 0.0) -> Entry:
    return Entry(f"http://a.test/{path}", 1, attempt, 5, not_before_s)


def _page(entry: Entry) -> FetchedPage:
    return FetchedPage(entry.url, entry.url, "jobs/j/p.html", 200, 10, depth=entry.depth)


def _fold(outcomes: list, handed_back: tuple = (), waiting: tuple = (), policy: PolitenessPolicy = POLITE,
          obey_robots: bool = True):  # fmt: skip
    return fold_release(outcomes, handed_back, waiting, policy, obey_robots, clock=lambda: NOW)


def test_stored_pages_and_redirects_are_left_to_the_analysis_and_the_host_pauses() -> None:
    one, two = _entry("one"), _entry("two")
    release = _fold([
        Stored(one, _page(one), Visit(requested=True, counts={"fetched": 1, "stored": 1})),
        Redirected(two, "http://a.test/three", 301, Visit(requested=True, counts={"fetched": 1, "redirects": 1})),
    ])  # fmt: skip
    assert release.done == 0 and release.requeue == () and release.requeue_back == ()
    assert dict(release.counters) == {"fetched": 2, "stored": 1, "redirects": 1}
    assert release.fetched and release.pause_ms == 1000.0 and release.host_delay_ms == 1000.0


def test_final_outcomes_are_done_and_a_host_that_asked_for_a_wait_gets_it() -> None:
    release = _fold([
        Failed(_entry("gone"), "http_404", 404, visit=Visit(requested=True, counts={"failed:http_404": 1})),
        RobotsBlocked(_entry("private"), Visit(counts={"robots_blocked": 1})),
        Unchanged(_entry("same"), Visit(requested=True, counts={"unchanged": 1})),
        Failed(_entry("busy"), "http_503", 503, host_wait_s=30.0, visit=Visit(requested=True), gave_up=True),
    ])  # fmt: skip
    assert release.done == 4
    assert release.counters["failed:http_404"] == 1 and release.counters["robots_blocked"] == 1
    assert release.host_delay_ms == 30_000.0


def test_a_struggling_host_goes_first_again_after_its_wait_and_a_urls_own_error_goes_behind() -> None:
    host_trouble, own_error, throttled = _entry("a", 1), _entry("b", 1), _entry("c", 1, not_before_s=NOW + 5)
    release = _fold([
        Retry(host_trouble, "timeout", 4.0, "host", visit=Visit(requested=True, counts={"retries": 1})),
        Retry(own_error, "http_500", 0.5, "queue", 500, Visit(requested=True, counts={"retries": 1})),
        Retry(throttled, "http_429", 5.0, "url", 429, Visit(requested=True, counts={"retries": 1})),
    ], handed_back=(_entry("rest"),))  # fmt: skip
    assert release.requeue == (host_trouble, _entry("rest"))
    assert release.requeue_back == (own_error, throttled)
    assert release.host_delay_ms == 4000.0 and release.done == 0 and release.counters["retries"] == 3


def test_the_crawl_delay_holds_when_robots_txt_is_obeyed_and_a_robots_read_requeues_its_url() -> None:
    url = _entry("x")
    outcomes = [RobotsFetched(url, Visit(requested=True, crawl_delay_s=2.5, counts={"robots_fetched": 1}))]
    obeyed, ignored = _fold(outcomes, policy=EAGER), _fold(outcomes, policy=EAGER, obey_robots=False)
    assert obeyed.requeue == (url,) and obeyed.crawl_delay_s == 2.5 and obeyed.pause_ms == 2500.0
    assert ignored.crawl_delay_s is None and ignored.pause_ms == 0.0


def test_only_waiting_retries_leave_the_host_idle_until_the_first_is_due() -> None:
    later, sooner = _entry("later", 1, NOW + 9), _entry("sooner", 1, NOW + 3)
    release = _fold([], waiting=(later, sooner))
    assert not release.fetched and release.requeue_back == (later, sooner)
    assert release.host_delay_ms == 3000.0 and release.pause_ms == 1000.0


def test_an_outcomes_counts_cannot_change_after_it_was_made() -> None:
    counts = {"fetched": 1}
    visit = Visit(requested=True, counts=counts)
    counts["fetched"] = 5
    assert visit.counts == {"fetched": 1}


def _throttled(path: str, attempt: int) -> Retry:
    """A 429 to attempt ``attempt`` of ``path`` (a Retry carries the next attempt)."""
    return Retry(
        _entry(path, attempt + 1), "http_429", 1.0, "url", 429, Visit(requested=True, counts={"status:429": 1})
    )


def _answered(path: str) -> Stored:
    entry = _entry(path)
    return Stored(entry, _page(entry), Visit(requested=True, counts={"fetched": 1, "status:200": 1}))


def test_the_host_throttle_streak_counts_first_requests_answered_429_or_503_in_a_row() -> None:
    assert _fold([_throttled("a", 0), _throttled("b", 0)]).throttle == "+2"  # added to the host's streak
    assert _fold([_throttled("a", 0), _answered("b"), _throttled("c", 0)]).throttle == "=1"  # reset, then one
    assert _fold([_throttled("a", 1), _throttled("b", 2)]).throttle == ""  # retries say nothing new
    assert _fold([_throttled("a", 1), _answered("b")]).throttle == "=0"
    assert _fold([]).throttle == ""


def test_a_handed_back_retry_still_in_its_retry_after_goes_behind_the_hosts_other_urls() -> None:
    waiting, rest = _entry("waiting", 1, not_before_s=NOW + 5), _entry("rest")
    release = _fold([_answered("a")], handed_back=(waiting, rest))
    assert release.requeue == (rest,) and release.requeue_back == (waiting,)


_REQUESTED = Visit(requested=True)
_STOPS = [
    ("a page stored", Stored(_entry("a"), _page(_entry("a")), _REQUESTED), False),
    ("a host-wide retry", Retry(_entry("a", 1), "connection_error", 2.0, "host", visit=_REQUESTED), True),
    ("a URL's own retry", Retry(_entry("a", 1), "http_500", 2.0, "queue", 500, _REQUESTED), False),
    ("robots.txt read in the slot", RobotsFetched(_entry("a"), _REQUESTED), True),
    ("a sitemap that listed URLs", SitemapRead(_entry("a"), _REQUESTED, found=3), True),
    ("a sitemap that listed none", SitemapRead(_entry("a"), _REQUESTED), False),
    ("a failure whose host asked for a wait", Failed(_entry("a"), "http_503", 503, host_wait_s=30.0), True),
    ("a plain failure", Failed(_entry("a"), "http_404", 404, visit=_REQUESTED), False),
    ("a request to a host with a Crawl-delay", Unchanged(_entry("a"), Visit(requested=True, crawl_delay_s=2.0)), True),
    ("no request, Crawl-delay known", RobotsBlocked(_entry("a"), Visit(crawl_delay_s=2.0)), False),
]


@pytest.mark.parametrize(("outcome", "stops"), [case[1:] for case in _STOPS], ids=[case[0] for case in _STOPS])
def test_the_batch_stops_before_its_next_url_when_the_host_needs_its_pause(outcome: FetchOutcome, stops: bool) -> None:
    assert stops_batch(outcome) is stops


def test_a_crawl_delay_does_not_stop_the_batch_when_robots_txt_is_not_obeyed() -> None:
    assert not stops_batch(Unchanged(_entry("a"), Visit(requested=True, crawl_delay_s=2.0)), obey_robots=False)
