"""One analysis batch of a crawl job: the pages a fetch batch stored, analysed, and their links admitted.

Each page goes through the one analysis step (``engine.analysis_step.analyze_one``): links to
follow, and the analyzer its rule names, whose result becomes a record. An analyzer that fails
is retried like a single task's analysis: up to the analysis retry budget (3), with backoff, only
for the pages that failed (what the others found is carried along), then counted, alerted once
and given up; the page's links are still followed. The links of the whole batch are admitted in
one admission call at the end, which also finishes the batch's URLs in the frontier.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from engine.alerts import Alert
from engine.analysis_step import Analysis, analyze_one
from engine.batch import CrawlEnv
from engine.jobs import JobRuntime, admit_links
from frontier import UrlHistory
from vcrawl import names
from vcrawl.errors import InvalidTask, MissingPage, PermanentError
from vcrawl.payloads import FetchedBatch, FetchedPage
from vcrawl.policies import RetryPolicy

__all__ = ["AnalysisRetry", "CarriedAnalysis", "abandon_analysis", "run_analyze_batch"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class CarriedAnalysis:
    """What earlier attempts of an analysis batch found, carried into its retry (JSON on the wire)."""

    attempt: int = 1
    finished: tuple[str, ...] = ()  # pages analysed, or given up for good
    not_analysed: tuple[str, ...] = ()  # of those, pages whose analysis failed (their history keeps no hash)
    links: tuple[tuple[str, int, int], ...] = ()  # (url, depth, redirects_left) found so far
    counters: Mapping[str, int] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> CarriedAnalysis:
        """Decode; None is a first attempt.

        Raises:
            InvalidTask: a malformed carried state.
        """
        if data is None:
            return cls()
        try:
            return cls(
                attempt=int(data["attempt"]),
                finished=tuple(str(url) for url in data["finished"]),
                not_analysed=tuple(str(url) for url in data["not_analysed"]),
                links=tuple((str(url), int(depth), int(left)) for url, depth, left in data["links"]),
                counters={str(name): int(count) for name, count in data["counters"].items()},
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise InvalidTask("carried", f"malformed carried analysis state: {exc!r}") from None

    def to_dict(self) -> dict[str, Any]:
        """The JSON form."""
        return {
            "attempt": self.attempt,
            "finished": list(self.finished),
            "not_analysed": list(self.not_analysed),
            "links": [list(link) for link in self.links],
            "counters": dict(self.counters),
        }


@dataclass(frozen=True)
class AnalysisRetry:
    """Some pages' analyzers failed and may succeed again: retry in ``delay_s`` with ``carried``."""

    carried: CarriedAnalysis
    delay_s: float
    failing: Mapping[str, str]  # url -> error


def run_analyze_batch(
    env: CrawlEnv, fetched: Mapping[str, Any], carried: Mapping[str, Any] | None = None,
    retry: RetryPolicy | None = None,
) -> dict[str, Any] | AnalysisRetry:  # fmt: skip
    """Analyse a fetch batch's pages and admit their links in one call, or ask for a retry.

    Returns the admission's summary, or an ``AnalysisRetry`` when analyzers failed and the
    ``retry`` budget (None: no retries) is not spent yet.
    """
    batch = FetchedBatch.from_dict(fetched)
    runtime = env.runtimes.get(batch.job, batch.cycle)
    state = CarriedAnalysis.from_dict(carried)
    counters: Counter[str] = Counter(state.counters)
    links = list(state.links)
    finished, not_analysed = list(state.finished), list(state.not_analysed)
    failing: dict[str, tuple[FetchedPage, str]] = {}
    for page in batch.pages:
        if page.url in state.finished:
            continue
        error = _analyze_page(env, runtime, page, counters, links)
        if error is None:
            finished.append(page.url)
        elif error == "":  # failed for good at once (a missing page, a permanent error)
            finished.append(page.url)
            not_analysed.append(page.url)
        else:
            failing[page.url] = (page, error)
    if failing:
        delay_s = retry.delay_for(state.attempt) if retry is not None else None
        if delay_s is not None:
            carried_on = CarriedAnalysis(state.attempt + 1, tuple(finished), tuple(not_analysed), tuple(links),
                                         dict(counters))  # fmt: skip
            logger.warning("job %s: analysis of %d page(s) of batch %s failed (attempt %d), retrying in %.1fs",
                           batch.job, len(failing), batch.batch, state.attempt, delay_s)  # fmt: skip
            return AnalysisRetry(carried_on, delay_s, {url: error for url, (_, error) in failing.items()})
        for page, error in failing.values():  # retries spent: count, alert once, still follow the links
            counters[names.COUNTER_ANALYSED] += 1
            counters[f"{names.PREFIX_ANALYSIS_FAILED}error"] += 1
            _alert_analysis(env, runtime, page, error, state.attempt)
            _follow_links_only(env, runtime, page, counters, links)
            not_analysed.append(page.url)
    for redirect in batch.redirects:
        links.append((redirect.target, redirect.depth, redirect.redirects_left))
    admission = admit_links(
        runtime,
        env.frontier,
        links,
        done=batch.done,
        token=f"a:{batch.batch}",
        counters=counters,
        history=_page_history(batch.pages, set(not_analysed)),
        analysed_batch=batch.batch,
    )
    return {"job": batch.job, "batch": batch.batch, "admitted": admission.admitted,
            "completed": admission.completed}  # fmt: skip


def _analyze_page(
    env: CrawlEnv, runtime: JobRuntime, page: FetchedPage, counters: Counter[str], links: list[tuple[str, int, int]]
) -> str | None:
    """Analyse one page: None when it went well, "" when it failed for good, else the error to retry."""
    rule = runtime.spec.rule_for(page.url)
    try:
        analysis = analyze_one(env.storage, page, rule.analyzer, rule.fields, follow_links=True)
    except MissingPage:
        counters[f"{names.PREFIX_ANALYSIS_FAILED}missing_page"] += 1
        return ""
    except PermanentError as exc:  # retrying cannot help (a bad rule, an unknown analyzer)
        counters[names.COUNTER_ANALYSED] += 1
        counters[f"{names.PREFIX_ANALYSIS_FAILED}{exc.reason}"] += 1
        _alert_analysis(env, runtime, page, f"{type(exc).__name__}: {exc}", 1)
        _follow_links_only(env, runtime, page, counters, links)
        return ""
    except Exception as exc:  # an analyzer plugin's bug: retried, then counted; it must not stop the crawl
        return f"{type(exc).__name__}: {exc}"
    counters[names.COUNTER_ANALYSED] += 1
    _count_links(analysis, page, runtime, counters, links)
    if analysis.result is not None:
        assert env.records is not None, "a crawl environment that runs analyzers has record writers"
        env.records(runtime.job_id).append(
            {
                "url": page.url,
                "final_url": page.final_url,
                "fetched_at": page.fetched_at,
                "job": runtime.job_id,
                "analyzer": rule.analyzer,
                "data": analysis.result,
            }
        )
        counters[names.COUNTER_RECORDS] += 1
    return None


def _follow_links_only(
    env: CrawlEnv, runtime: JobRuntime, page: FetchedPage, counters: Counter[str], links: list[tuple[str, int, int]]
) -> None:
    """A page whose analyzer failed for good: its links are still followed."""
    try:
        analysis = analyze_one(env.storage, page, None, follow_links=True)
    except MissingPage:
        return
    _count_links(analysis, page, runtime, counters, links)


def _count_links(
    analysis: Analysis, page: FetchedPage, runtime: JobRuntime, counters: Counter[str],
    links: list[tuple[str, int, int]],
) -> None:  # fmt: skip
    if not analysis.html:
        counters[names.COUNTER_NOT_HTML] += 1
    for reason, count in analysis.skipped.items():  # javascript:, mailto:, empty ... : counted as filtered
        counters[f"{names.PREFIX_FILTERED}{reason}"] += count
    max_redirects = runtime.limits.max_redirects
    links.extend((url, page.depth + 1, max_redirects) for url in analysis.links)


def _alert_analysis(env: CrawlEnv, runtime: JobRuntime, page: FetchedPage, error: str, attempts: int) -> None:
    analyzer = runtime.spec.rule_for(page.url).analyzer
    logger.warning("analysis of %s with %s failed for good after %d attempt(s): %s", page.url, analyzer, attempts,
                   error)  # fmt: skip
    env.alert(
        f"{runtime.job_id}:{analyzer}",
        Alert(
            subject=f"analyzer {analyzer} failing in job {runtime.job_id}",
            text=f"Analyzer {analyzer} failed on {page.url} after {attempts} attempt(s): {error}. "
            "Later failures of this analyzer in this job are counted; alerted again after the alert window.",
            details={
                "job": runtime.job_id,
                "url": page.url,
                "analyzer": analyzer,
                "error": error,
                "attempts": attempts,
            },
        ),
    )


def abandon_analysis(env: CrawlEnv, fetched: Mapping[str, Any], error: str) -> None:
    """Finish a batch whose analysis failed for good: count it and release its pages' pending.

    An errback must not fail in turn: a hand-over with malformed pages still finishes as many URLs
    as it names.
    """
    job_id, batch_id = str(fetched["job"]), str(fetched["batch"])
    pages, redirects = list(fetched.get("pages") or ()), list(fetched.get("redirects") or ())
    runtime = env.runtimes.get(job_id, int(fetched.get("cycle") or 0))
    counters: Counter[str] = Counter({f"{names.PREFIX_ANALYSIS_FAILED}batch": len(pages)})
    logger.error("analysis of batch %s of job %s failed for good: %s", batch_id, job_id, error)
    readable = tuple(page for page in map(_page_or_none, pages) if page is not None)
    # The same token as the analysis: if it did admit before failing, this changes nothing.
    history = _page_history(readable, {page.url for page in readable})
    admit_links(runtime, env.frontier, [], done=len(pages) + len(redirects), token=f"a:{batch_id}",
                counters=counters, history=history, analysed_batch=batch_id)  # fmt: skip


def _page_or_none(data: Any) -> FetchedPage | None:
    try:
        return FetchedPage.from_dict(data)
    except InvalidTask:
        return None


def _page_history(pages: tuple[FetchedPage, ...], not_analysed: set[str]) -> dict[str, UrlHistory]:
    """Scheduled jobs: the pages' new history records. A page that was not analysed keeps no
    content hash or validators, so the next cycle fetches it in full and analyses it."""
    records = {page.url: UrlHistory.decode(page.history) for page in pages if page.history}
    return {
        url: replace(record, etag="", last_modified_s=0, content_hash="") if url in not_analysed else record
        for url, record in records.items()
    }
