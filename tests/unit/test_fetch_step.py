"""The one fetch step (``fetch_one``) with in-process services: canned responses, robots rules kept in a
dict, pages stored by the real ``Storage`` in a temporary directory. No sockets, no sleeps."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest

from engine.fetch_step import Cycle, FetchContext, FetchItem, FetchPolicy, FetchServices, JobHooks, fetch_one
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
from fetchers import FetcherRegistry, FetchRequest, FetchResult, IdentityPool
from frontier import Entry, RobotsRules, UrlHistory, content_hash
from storage import Storage
from storage.warc import WarcStage
from telemetry.alerts import Alert
from vcrawl.errors import DownloadFailed, FetchFailed
from vcrawl.payloads import Rule
from vcrawl.policies import RetryPolicy

ORIGIN = "http://a.test"
URL = f"{ORIGIN}/page.html"
NOW = 1000.0
BODY = b"<html><body><a href='/next'>next</a></body></html>"


class Canned:
    """A fetcher that answers from a list, in order: a response, or an error to raise."""

    def __init__(self, *answers: FetchResult | Exception) -> None:
        self._answers = list(answers)
        self.requests: list[FetchRequest] = []

    def fetch(self, request: FetchRequest) -> FetchResult:
        self.requests.append(request)
        answer = self._answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


class Broken:
    """A plug-in page type's fetcher with a bug."""

    def fetch(self, request: FetchRequest) -> FetchResult:
        raise RuntimeError("plug-in bug")


class RulesHere:
    """robots.txt rules by origin, in this process (what ``RobotsCache`` keeps in Redis)."""

    def __init__(self, rules: Mapping[str, RobotsRules] | None = None) -> None:
        self.rules = dict(rules or {})

    def get(self, origin: str) -> RobotsRules | None:
        return self.rules.get(origin)

    def put(self, origin: str, rules: RobotsRules) -> None:
        self.rules[origin] = rules


class NoSitemaps:
    """A job's sitemap reader that lists nothing (``SitemapSink`` admits into Redis)."""

    def discover(self, entry: Entry, rules: RobotsRules | None, requested: bool, counts: Counter[str]) -> SitemapRead:
        return SitemapRead(entry, Visit(requested=requested, counts=counts))

    def read(
        self, entry: Entry, result: FetchResult, counts: Counter[str], crawl_delay_s: float | None
    ) -> SitemapRead | None:
        return SitemapRead(entry, Visit(requested=True, crawl_delay_s=crawl_delay_s, counts=counts))


def answer(status: int = 200, body: bytes = BODY, headers: Mapping[str, str] | None = None) -> FetchResult:
    return FetchResult(URL, URL, status, dict(headers or {"content-type": "text/html"}), body)


def allow_all() -> RulesHere:
    return RulesHere({ORIGIN: RobotsRules.from_response(404, None)})


def context(
    tmp_path: Path,
    fetcher: Canned,
    *,
    robots: RulesHere | None = None,
    robots_fetcher: Canned | None = None,
    policy: FetchPolicy | None = None,
    job: JobHooks | None = None,
    alerts: list[tuple[str, Alert]] | None = None,
    registry: FetcherRegistry | None = None,
) -> FetchContext:
    """A single task's context (``job`` None) or a job's, its pages stored under ``tmp_path``."""

    def alert(cause: str, message: Alert) -> bool:
        if alerts is not None:
            alerts.append((cause, message))
        return True

    services = FetchServices(
        fetcher=fetcher,
        robots_fetcher=robots_fetcher or Canned(),
        identities=IdentityPool(("test-bot",)),
        robots=robots or allow_all(),
        store=Storage(str(tmp_path)),
        fetchers=registry,
        alert=alert,
        clock=lambda: NOW,
    )
    return FetchContext(services, policy or FetchPolicy(), job)


def job_hooks(
    throttled: int = 0,
    slow: tuple[int, int] = (0, 0),
    cycle: Cycle | None = None,
    warc: Callable[[], WarcStage] | None = None,
) -> JobHooks:
    """A job batch's hooks: its host's 429/503 streak and (slow, answered) so far, its cycle, its stage."""
    return JobHooks("j1", lambda host: throttled, lambda host: slow, NoSitemaps(), cycle, warc)


JOB_POLICY = FetchPolicy(follow_redirects=False)


def item(
    path: str = "/page.html", *, attempt: int = 0, redirects_left: int = 5, sitemap: int = 0,
    known: UrlHistory | None = None,
) -> FetchItem:  # fmt: skip
    entry = Entry(f"{ORIGIN}{path}", depth=1, attempt=attempt, redirects_left=redirects_left, sitemap=sitemap)
    return FetchItem(entry, Rule(), "pages/a.html", known)


def stored_files(tmp_path: Path) -> list[Path]:
    return [path for path in tmp_path.rglob("*") if path.is_file()]


def test_a_200_is_stored_and_its_page_handed_to_the_analysis(tmp_path: Path) -> None:
    fetcher = Canned(answer(headers={"content-type": "text/html", "etag": '"v1"', "set-cookie": "id=1"}))
    outcome = fetch_one(context(tmp_path, fetcher), item())

    assert isinstance(outcome, Stored)
    assert (tmp_path / "pages" / "a.html").read_bytes() == BODY
    page = outcome.page
    assert (page.url, page.http_status, page.bytes, page.depth) == (URL, 200, len(BODY), 1)
    assert dict(page.headers) == {"content-type": "text/html", "etag": '"v1"'}  # only those worth keeping
    assert dict(outcome.visit.counts) == {"fetched": 1, "status:200": 1, "stored": 1, "bytes": len(BODY)}
    [request] = fetcher.requests
    assert request.user_agent == "test-bot" and request.follow_redirects  # a single task's fetcher follows


def test_a_jobs_redirect_comes_back_as_a_link_of_its_own(tmp_path: Path) -> None:
    fetcher = Canned(answer(301, b"", {"location": " /moved.html "}))
    outcome = fetch_one(context(tmp_path, fetcher, policy=JOB_POLICY, job=job_hooks()), item())

    assert isinstance(outcome, Redirected)
    assert (outcome.target, outcome.http_status) == (f"{ORIGIN}/moved.html", 301)
    assert outcome.visit.counts["redirects"] == 1
    assert not fetcher.requests[0].follow_redirects and stored_files(tmp_path) == []


def test_a_redirect_past_the_urls_budget_fails(tmp_path: Path) -> None:
    fetcher = Canned(answer(302, b"", {"location": "/again.html"}))
    outcome = fetch_one(context(tmp_path, fetcher, policy=JOB_POLICY, job=job_hooks()), item(redirects_left=0))

    assert isinstance(outcome, Failed) and (outcome.reason, outcome.http_status) == ("too_many_redirects", 302)


def test_a_503_makes_only_its_url_wait_with_backoff(tmp_path: Path) -> None:
    policy = FetchPolicy(retry=RetryPolicy(retries=3, backoff_s=2.0))
    outcome = fetch_one(context(tmp_path, Canned(answer(503, b"busy")), policy=policy), item())

    assert isinstance(outcome, Retry)
    assert (outcome.reason, outcome.scope, outcome.http_status) == ("http_503", "url", 503)
    assert 1.0 <= outcome.delay_s <= 3.0  # backoff_s * 2**0, with +/-50 % jitter
    assert outcome.entry.attempt == 1 and outcome.entry.not_before_s == NOW + outcome.delay_s
    assert outcome.visit.counts["retries"] == 1 and outcome.visit.counts["status:503"] == 1


def test_a_503_that_makes_a_throttling_streak_pauses_the_jobs_host(tmp_path: Path) -> None:
    ctx = context(tmp_path, Canned(answer(503, b"busy")), policy=JOB_POLICY, job=job_hooks(throttled=2))
    outcome = fetch_one(ctx, item())

    assert isinstance(outcome, Retry) and outcome.scope == "host" and outcome.entry.not_before_s == 0.0


@pytest.mark.parametrize(("retry_after", "host_wait_s"), [("auto", 30.0), ("url", 0.0), ("host", 30.0)])
def test_a_url_out_of_retries_fails_and_its_host_keeps_the_wait_it_asked_for_when_the_job_says_so(
    tmp_path: Path, retry_after: str, host_wait_s: float
) -> None:
    busy = answer(503, b"busy", {"retry-after": "30"})
    policy = FetchPolicy(follow_redirects=False, retry_after=retry_after)
    outcome = fetch_one(context(tmp_path, Canned(busy), policy=policy, job=job_hooks()), item(attempt=3))

    assert isinstance(outcome, Failed) and outcome.gave_up
    assert (outcome.reason, outcome.host_wait_s) == ("http_503", host_wait_s)
    assert outcome.visit.host_wait_s == host_wait_s  # the origin's hold, announced to every worker
    assert outcome.visit.counts["failed:http_503"] == 1


@pytest.mark.parametrize("status", [429, 503])
@pytest.mark.parametrize(("retry_after", "scope", "hold_s"), [("auto", "host", 3.0), ("host", "host", 3.0),
                                                               ("url", "url", 0.0)])  # fmt: skip
def test_a_retry_after_holds_the_whole_origin_unless_the_job_says_url(
    tmp_path: Path, status: int, retry_after: str, scope: str, hold_s: float
) -> None:
    throttled = answer(status, b"slow down", {"retry-after": "3"})
    policy = FetchPolicy(follow_redirects=False, retry_after=retry_after)
    outcome = fetch_one(context(tmp_path, Canned(throttled), policy=policy, job=job_hooks()), item())

    assert isinstance(outcome, Retry) and (outcome.scope, outcome.delay_s) == (scope, 3.0)
    assert outcome.visit.host_wait_s == hold_s  # what the batch holds every worker's requests to the host for
    assert outcome.entry.not_before_s == (NOW + 3.0 if scope == "url" else 0.0)  # the URL itself goes after it


def test_a_retry_after_past_the_cap_fails_the_url_and_holds_its_origin_for_the_cap(tmp_path: Path) -> None:
    busy = answer(429, b"come back tomorrow", {"retry-after": "86400"})
    policy = FetchPolicy(follow_redirects=False, retry=RetryPolicy(max_retry_after_s=600.0))
    outcome = fetch_one(context(tmp_path, Canned(busy), policy=policy, job=job_hooks()), item())

    assert isinstance(outcome, Failed) and outcome.gave_up and outcome.visit.host_wait_s == 600.0


def test_a_host_over_its_timeout_budget_pauses_and_an_operator_is_told(tmp_path: Path) -> None:
    alerts: list[tuple[str, Alert]] = []
    ctx = context(tmp_path, Canned(FetchFailed(URL, "timeout")), job=job_hooks(slow=(4, 1)), alerts=alerts)
    outcome = fetch_one(ctx, item())

    assert isinstance(outcome, Retry) and (outcome.reason, outcome.scope) == ("timeout", "host")
    assert outcome.visit.counts["slow"] == 1
    assert [cause for cause, _ in alerts] == ["j1:slow:a.test"]


@pytest.mark.parametrize(("reason", "retried"), [("slow_head", False), ("too_slow", True), ("timeout", True)])
def test_a_trickled_head_fails_at_its_first_attempt_and_counts_against_its_host(
    tmp_path: Path, reason: str, retried: bool
) -> None:
    # A server trickling its head does so on purpose: a retry would be held as long again.
    ctx = context(tmp_path, Canned(FetchFailed(URL, reason)), policy=JOB_POLICY, job=job_hooks())
    outcome = fetch_one(ctx, item())

    assert isinstance(outcome, Retry if retried else Failed), outcome
    assert outcome.visit.counts["slow"] == 1  # the host's failure budget counts it either way
    if not retried:
        assert isinstance(outcome, Failed) and outcome.gave_up and outcome.visit.counts[f"failed:{reason}"] == 1


def test_robots_txt_read_now_takes_the_hosts_slot_then_refuses_a_disallowed_url(tmp_path: Path) -> None:
    robots_txt = FetchResult(
        f"{ORIGIN}/robots.txt", f"{ORIGIN}/robots.txt", 200, {}, b"User-agent: *\nDisallow: /private"
    )
    pages, robots = Canned(), RulesHere()
    ctx = context(tmp_path, pages, robots=robots, robots_fetcher=Canned(robots_txt))

    first = fetch_one(ctx, item("/private/x.html"))
    again = fetch_one(ctx, item("/private/x.html"))

    assert isinstance(first, RobotsFetched) and first.visit.counts["robots_fetched"] == 1
    assert isinstance(again, RobotsBlocked) and dict(again.visit.counts) == {"robots_blocked": 1}
    assert not again.visit.requested and pages.requests == [] and ORIGIN in robots.rules


def test_an_unreachable_robots_txt_holds_the_hosts_urls_and_alerts(tmp_path: Path) -> None:
    alerts: list[tuple[str, Alert]] = []
    unreachable = Canned(FetchFailed(f"{ORIGIN}/robots.txt", "connection_error"))
    policy = FetchPolicy(robots_retry_s=120.0)
    ctx = context(tmp_path, Canned(), robots=RulesHere(), robots_fetcher=unreachable, policy=policy, alerts=alerts)
    outcome = fetch_one(ctx, item())

    assert isinstance(outcome, Retry)
    assert (outcome.reason, outcome.delay_s, outcome.scope) == ("robots_unavailable", 120.0, "host")
    assert [cause for cause, _ in alerts] == [f"single:robots:{ORIGIN}"]


def test_a_host_whose_name_does_not_resolve_is_retried_then_fails_as_dns_error_not_held_for_robots(
    tmp_path: Path,
) -> None:
    alerts: list[tuple[str, Alert]] = []
    no_such_name = Canned(*[FetchFailed(f"{ORIGIN}/robots.txt", "dns_error")] * 2)  # one per attempt
    robots, pages = RulesHere(), Canned()
    ctx = context(tmp_path, pages, robots=robots, robots_fetcher=no_such_name, alerts=alerts)
    first = fetch_one(ctx, item())
    last = fetch_one(ctx, item(attempt=ctx.policy.retry.retries))

    assert isinstance(first, Retry) and (first.reason, first.scope) == ("dns_error", "host")
    assert first.delay_s <= 2 * ctx.policy.retry.backoff_s  # the fetch's backoff, not robots_retry_s (600 s)
    assert isinstance(last, Failed) and last.reason == "dns_error" and last.visit.counts["failed:dns_error"] == 1
    assert robots.rules == {} and pages.requests == [] and alerts == []  # nothing cached, no robots alert


def test_a_body_over_the_cap_fails_for_good_and_nothing_is_stored(tmp_path: Path) -> None:
    outcome = fetch_one(context(tmp_path, Canned(DownloadFailed(URL, "too_large", 200))), item())

    assert isinstance(outcome, Failed) and not outcome.gave_up
    assert (outcome.reason, outcome.http_status) == ("too_large", 200)
    assert dict(outcome.visit.counts) == {"failed:too_large": 1} and stored_files(tmp_path) == []


def test_a_plug_in_page_types_bug_fails_only_its_page(tmp_path: Path) -> None:
    registry = FetcherRegistry({"static": Canned, "flaky": Broken})
    ctx = context(tmp_path, Canned(), registry=registry)
    flaky = FetchItem(Entry(URL), Rule(page_type="flaky"), "pages/a.html")

    outcome = fetch_one(ctx, flaky)

    assert isinstance(outcome, Failed) and outcome.reason == "flaky_failed"


def test_a_scheduled_jobs_page_with_the_body_it_had_is_unchanged_and_a_new_body_is_stored(tmp_path: Path) -> None:
    known = UrlHistory(1, fetched_cycle_s=400.0, content_hash=content_hash(BODY))
    job = job_hooks(cycle=Cycle(2, 500.0))

    same = fetch_one(context(tmp_path, Canned(answer()), job=job), item(known=known))
    changed = fetch_one(context(tmp_path, Canned(answer(body=b"<p>new</p>")), job=job), item(known=known))

    assert isinstance(same, Unchanged) and same.visit.counts["unchanged"] == 1
    assert same.visit.revisit is not None and same.visit.revisit.fetched_cycle_s == 500.0
    assert isinstance(changed, Stored) and changed.visit.counts["changed"] == 1
    history = UrlHistory.decode(changed.page.history or "")
    assert history.content_hash == content_hash(b"<p>new</p>")


def test_a_jobs_capture_goes_to_its_warc_stage(tmp_path: Path) -> None:
    stage = WarcStage()
    try:
        outcome = fetch_one(context(tmp_path, Canned(answer()), job=job_hooks(warc=lambda: stage)), item())
        assert isinstance(outcome, Stored) and outcome.visit.counts["warc_records"] == 1
        assert len(stage) == 1
    finally:
        stage.discard()


def test_a_sitemap_that_cannot_be_fetched_is_a_sitemap_problem_not_a_failed_url(tmp_path: Path) -> None:
    ctx = context(tmp_path, Canned(DownloadFailed(f"{ORIGIN}/sitemap.xml", "too_large", 200)), job=job_hooks())
    outcome: FetchOutcome = fetch_one(ctx, item("/sitemap.xml", sitemap=1))

    assert isinstance(outcome, SitemapRead) and dict(outcome.visit.counts) == {"sitemap_problem:too_large": 1}
