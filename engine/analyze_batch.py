"""One analysis batch of a crawl job: the pages a fetch batch stored, analysed, and their links admitted.

Each page goes through the one analysis step (``engine.analysis_step.analyze_one``): links to
follow, and the analyzer its rule names, whose result becomes a record. An analyzer that fails
is retried like a single task's analysis: up to the analysis retry budget (3), with backoff, only
for the pages that failed (what the others found is carried along), then counted, alerted once
and given up; the page's links are still followed. The links of the whole batch are admitted in
one admission call at the end, which also finishes the batch's URLs in the frontier. Batches a
bundle gathers (``run_analyze_batches``) are analysed in one task and admitted together.
"""

from __future__ import annotations

import hashlib
import logging
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from engine.analysis_step import Analysis, analyze_one
from engine.api_pages import api_links, api_records, read_api_page
from engine.crawl_env import CrawlEnv
from engine.jobs import JobRuntime, Link, admit_links
from frontier import Admission, UrlHistory
from frontier.url_ids import url_id
from telemetry.alerts import Alert
from telemetry.log_context import log_context
from vcrawl import names
from vcrawl.errors import InvalidTask, MissingPage, PermanentError, RetryableError
from vcrawl.payloads import FetchedBatch, FetchedPage, Rule
from vcrawl.policies import RetryPolicy

__all__ = ["ANALYSIS_ID_PREFIX", "AnalysisRetry", "CarriedAnalysis", "GatheredOutcome", "abandon_analysis",
           "analysis_task_id", "run_analyze_batch", "run_analyze_batches"]  # fmt: skip

logger = logging.getLogger(__name__)

ANALYSIS_ID_PREFIX = "vcrawl-analysis:"


def analysis_task_id(job_id: str, batch_id: str) -> str:
    """The task id of a fetch batch's analysis (also of its retries and of a resend): known without
    asking the broker, so a lost message can be told (``tasks.broker.lost_analyses``)."""
    return f"{ANALYSIS_ID_PREFIX}{job_id}:{batch_id}"


@dataclass(frozen=True)
class CarriedAnalysis:
    """What earlier attempts of an analysis batch found, carried into its retry (JSON on the wire).

    Links are kept per page, so the batch admits them in the order of its pages whatever attempt
    found them: a replayed admission must see the same chunks (see ``engine.jobs.admit_links``).
    """

    attempt: int = 1
    page_links: Mapping[str, tuple[Link, ...]] = field(default_factory=dict)  # finished page -> its links
    not_analysed: tuple[str, ...] = ()  # finished pages whose analysis failed (their history keeps no hash)
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
                page_links={
                    str(page): tuple(Link(str(u), int(d), int(r)) for u, d, r in links)
                    for page, links in data["page_links"].items()
                },
                not_analysed=tuple(str(url) for url in data["not_analysed"]),
                counters={str(name): int(count) for name, count in data["counters"].items()},
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise InvalidTask("carried", f"malformed carried analysis state: {exc!r}") from None

    def to_dict(self) -> dict[str, Any]:
        """The JSON form."""
        return {
            "attempt": self.attempt,
            "page_links": {  # [url, depth, redirects_left]: a page's links, as the first attempt sent them
                page: [[link.url, link.depth, link.redirects_left] for link in links]
                for page, links in self.page_links.items()
            },
            "not_analysed": list(self.not_analysed),
            "counters": dict(self.counters),
        }


@dataclass(frozen=True)
class AnalysisRetry:
    """Some pages' analyzers failed and may succeed again: retry in ``delay_s`` with ``carried``."""

    carried: CarriedAnalysis
    delay_s: float
    failing: Mapping[str, str]  # url -> error


@dataclass(frozen=True)
class _PageResult:
    """One page's analysis: finished (analysed, or given up for good) or failing (worth a retry)."""

    finished: bool
    analysed: bool = True
    links: tuple[Link, ...] = ()
    error: str = ""
    records: tuple[dict[str, Any], ...] = ()  # written with the rest of its batch's (_write_records)


def run_analyze_batch(
    env: CrawlEnv, fetched: Mapping[str, Any], carried: Mapping[str, Any] | None = None,
    retry: RetryPolicy | None = None,
) -> dict[str, Any] | AnalysisRetry:  # fmt: skip
    """Analyse a fetch batch's pages and admit their links in one call, or ask for a retry.

    Returns the admission's summary, or an ``AnalysisRetry`` when analyzers failed and the
    ``retry`` budget (None: no retries) is not spent yet.

    Raises:
        RetryableError, OSError: storage or Redis trouble, for the task edge to retry the whole batch.
    """
    batch = FetchedBatch.from_dict(fetched)
    if batch.done == 0:
        # A fetch that handed nothing on (its lease gone, or nothing stored): nothing to analyse or
        # finish. Admitting nothing would still spend the batch's admission token, and a real
        # hand-over of the same batch (its release's retry, a resend) would then finish nothing.
        return {"job": batch.job, "batch": batch.batch, "admitted": 0, "completed": False}
    runtime = env.runtimes.get(batch.job, batch.cycle)
    analysed = _analyse_pages(env, runtime, batch, CarriedAnalysis.from_dict(carried), retry)
    if isinstance(analysed, AnalysisRetry):
        return analysed
    admission = _admit(env, runtime, _links_in_order(batch, analysed.page_links), f"a:{batch.batch}",
                       analysed.counters, _page_history(batch.pages, set(analysed.not_analysed)),
                       {batch.batch: batch.done})  # fmt: skip
    return {"job": batch.job, "batch": batch.batch, "admitted": admission.admitted,
            "completed": admission.completed}  # fmt: skip


def _admit(env: CrawlEnv, runtime: JobRuntime, links: list[Link], token: str, counters: Counter[str],
           history: Mapping[str, UrlHistory], finishes: Mapping[str, int]) -> Admission:  # fmt: skip
    """Admit the analysed batches' links and finish their URLs (``finishes``: batch id -> its URLs
    done) in one admission; tell the environment if that completed the job."""
    admission = admit_links(runtime, env.frontier, links, done=sum(finishes.values()), token=token,
                            counters=counters, history=history, analysed_batch=finishes)  # fmt: skip
    if admission.completed and env.on_completed is not None:
        env.on_completed(runtime.job_id, runtime.cycle)
    return admission


@dataclass(frozen=True)
class GatheredOutcome:
    """What the analysis of gathered batches did: the summary of their one admission, and the
    batches whose analyzers failed and are retried on their own (fetched, retry)."""

    summary: dict[str, Any]
    retries: tuple[tuple[Mapping[str, Any], AnalysisRetry], ...] = ()


def run_analyze_batches(
    env: CrawlEnv, gathered: Sequence[Mapping[str, Any]], retry: RetryPolicy | None = None
) -> GatheredOutcome:
    """Analyse several fetch batches of one job and partition (gathered by a bundle:
    ``engine.fetch_bundle``), and admit all their links in one admission, which finishes them all:
    one call per partition their links reach, not one per batch and partition.

    A batch whose analyzers failed, with retries left, is left out: it is retried alone, as
    ``run_analyze_batch`` would (``GatheredOutcome.retries``).

    Raises:
        InvalidTask: no batches, or batches of several jobs or cycles.
        RetryableError, OSError: storage or Redis trouble, for the task edge to retry them all.
    """
    batches = [FetchedBatch.from_dict(fetched) for fetched in gathered]
    if not batches or len({(batch.job, batch.cycle) for batch in batches}) > 1:
        raise InvalidTask("batches", "gathered batches must be one or more of one job and cycle")
    job, cycle = batches[0].job, batches[0].cycle
    runtime = env.runtimes.get(job, cycle)
    links: list[Link] = []
    counters: Counter[str] = Counter()
    history: dict[str, UrlHistory] = {}
    finishes: dict[str, int] = {}
    retries = []
    for fetched, batch in zip(gathered, batches, strict=True):
        if batch.done == 0:  # nothing to finish: see run_analyze_batch
            continue
        analysed = _analyse_pages(env, runtime, batch, CarriedAnalysis(), retry)
        if isinstance(analysed, AnalysisRetry):
            retries.append((fetched, analysed))
            continue
        links.extend(_links_in_order(batch, analysed.page_links))
        counters.update(analysed.counters)
        history.update(_page_history(batch.pages, set(analysed.not_analysed)))
        finishes[batch.batch] = batch.done
    summary: dict[str, Any] = {"job": job, "batches": list(finishes), "admitted": 0, "completed": False}
    if finishes:
        # Named by every batch gathered, whatever each one's analyzers did this time: a retried task admits once.
        token = "a:" + hashlib.blake2b(" ".join(b.batch for b in batches).encode(), digest_size=10).hexdigest()
        admission = _admit(env, runtime, links, token, counters, history, finishes)
        summary.update(admitted=admission.admitted, completed=admission.completed)
    return GatheredOutcome(summary, tuple(retries))


@dataclass(frozen=True)
class _Analysed:
    """A batch's pages, each analysed or given up for good: their links, what they counted, and
    which were not analysed (their history keeps no hash)."""

    page_links: Mapping[str, tuple[Link, ...]]
    not_analysed: tuple[str, ...]
    counters: Counter[str]


def _analyse_pages(
    env: CrawlEnv, runtime: JobRuntime, batch: FetchedBatch, state: CarriedAnalysis, retry: RetryPolicy | None
) -> _Analysed | AnalysisRetry:
    """Analyse the pages ``state`` has not finished; an ``AnalysisRetry`` while failing pages have
    retries left, else each failing page counted, alerted and its links still followed."""
    counters: Counter[str] = Counter(state.counters)
    page_links, not_analysed = dict(state.page_links), list(state.not_analysed)
    failing: dict[str, tuple[FetchedPage, str]] = {}
    records: list[dict[str, Any]] = []
    for page in batch.pages:
        if page.url in state.page_links:
            continue
        with log_context(job=batch.job, url=page.url):
            result = _analyze_page(env, runtime, page, counters)
        if not result.finished:
            failing[page.url] = (page, result.error)
            continue
        records.extend(result.records)
        page_links[page.url] = result.links
        if not result.analysed:
            not_analysed.append(page.url)
    # Before the retry or the admission: the batch's records are stored when its task returns.
    _write_records(env, runtime, records)
    if failing:
        delay_s = retry.delay_for(state.attempt) if retry is not None else None
        if delay_s is not None:
            carried_on = CarriedAnalysis(state.attempt + 1, page_links, tuple(not_analysed), dict(counters))
            logger.warning("job %s: analysis of %d page(s) of batch %s failed (attempt %d), retrying in %.1fs",
                           batch.job, len(failing), batch.batch, state.attempt, delay_s)  # fmt: skip
            return AnalysisRetry(carried_on, delay_s, {url: error for url, (_, error) in failing.items()})
        for page, error in failing.values():  # retries spent: count, alert once, still follow the links
            counters[names.COUNTER_ANALYSED] += 1
            counters[f"{names.PREFIX_ANALYSIS_FAILED}error"] += 1
            _alert_analysis(env, runtime, page, error, state.attempt)
            page_links[page.url] = _follow_links_only(env, runtime, page, counters)
            not_analysed.append(page.url)
    return _Analysed(page_links, tuple(not_analysed), counters)


def _links_in_order(batch: FetchedBatch, page_links: Mapping[str, tuple[Link, ...]]) -> list[Link]:
    """The batch's links in the order of its pages, then its redirect targets, each with where it was found."""
    links = [link._replace(source=page.url) for page in batch.pages for link in page_links.get(page.url, ())]
    links.extend(Link(hop.target, hop.depth, hop.redirects_left, source=hop.url) for hop in batch.redirects)
    return links


def _analyze_page(env: CrawlEnv, runtime: JobRuntime, page: FetchedPage, counters: Counter[str]) -> _PageResult:
    """Analyse one page: its links, and the record of its rule's analyzer."""
    rule = runtime.spec.rule_for(page.url)
    if rule.page_type == "api":
        return _analyze_api_page(env, runtime, rule, page, counters)
    try:
        analysis = analyze_one(env.storage, page, rule.analyzer, rule.fields, follow_links=True,
                               max_links=runtime.spec.max_links_per_page)  # fmt: skip
    except MissingPage:
        counters[f"{names.PREFIX_ANALYSIS_FAILED}missing_page"] += 1
        return _PageResult(finished=True, analysed=False)
    except (RetryableError, OSError):
        raise  # storage trouble, not the analyzer's: the task edge retries the batch
    except PermanentError as exc:  # retrying cannot help (a bad rule, an unknown analyzer)
        counters[names.COUNTER_ANALYSED] += 1
        counters[f"{names.PREFIX_ANALYSIS_FAILED}{exc.reason}"] += 1
        _alert_analysis(env, runtime, page, f"{type(exc).__name__}: {exc}", 1)
        return _PageResult(finished=True, analysed=False, links=_follow_links_only(env, runtime, page, counters))
    except Exception as exc:  # an analyzer plugin's bug (any exception): retried, then counted, never stops the crawl
        return _PageResult(finished=False, error=f"{type(exc).__name__}: {exc}")
    counters[names.COUNTER_ANALYSED] += 1
    links = _count_links(analysis, page, runtime, counters)
    if analysis.result is None:
        return _PageResult(finished=True, links=links)
    record = {
        "url": page.url,
        "url_id": url_id(page.url),
        "final_url": page.final_url,
        "fetched_at": page.fetched_at,
        "ip": page.ip,
        "job": runtime.job_id,
        "analyzer": rule.analyzer,
        "data": analysis.result,
    }
    counters[names.COUNTER_RECORDS] += 1
    return _PageResult(finished=True, links=links, records=(record,))


def _analyze_api_page(
    env: CrawlEnv, runtime: JobRuntime, rule: Rule, page: FetchedPage, counters: Counter[str]
) -> _PageResult:
    """An api page: every record of its answer is a record; its next page and follow-ups are its links."""
    try:
        assert rule.api is not None, "an api rule has its api spec (Rule checks it)"
        answer = read_api_page(env.storage, page, rule.api)
    except MissingPage:
        counters[f"{names.PREFIX_ANALYSIS_FAILED}missing_page"] += 1
        return _PageResult(finished=True, analysed=False)
    except PermanentError as exc:  # not JSON: retrying cannot help
        counters[names.COUNTER_ANALYSED] += 1
        counters[f"{names.PREFIX_ANALYSIS_FAILED}{exc.reason}"] += 1
        _alert_analysis(env, runtime, page, f"{type(exc).__name__}: {exc}", 1)
        return _PageResult(finished=True, analysed=False)
    counters[names.COUNTER_ANALYSED] += 1
    counters[names.COUNTER_RECORDS] += len(answer.records)
    return _PageResult(finished=True, links=api_links(answer, page, runtime.limits.max_redirects),
                       records=tuple(api_records(answer, page, runtime.job_id)))  # fmt: skip


def _write_records(env: CrawlEnv, runtime: JobRuntime, records: list[dict[str, Any]]) -> None:
    """Hand the batch's records to the job's record sink in one call (one transaction in PostgreSQL).

    Raises:
        RetryableError, OSError: the sink failed; the task edge retries the batch, which writes them again.
    """
    if not records:
        return
    assert env.records is not None, "a crawl environment that runs analyzers has record sinks"
    env.records(runtime.job_id).write(records)


def _follow_links_only(
    env: CrawlEnv, runtime: JobRuntime, page: FetchedPage, counters: Counter[str]
) -> tuple[Link, ...]:
    """A page whose analyzer failed for good: its links are still followed, if its stored copy can be read."""
    try:
        analysis = analyze_one(env.storage, page, None, follow_links=True, max_links=runtime.spec.max_links_per_page)
    except PermanentError as exc:  # gone, or refused by the storage (already counted): one page, not the batch
        logger.debug("no links from %s: %s", page.url, exc)
        return ()
    return _count_links(analysis, page, runtime, counters)


def _count_links(
    analysis: Analysis, page: FetchedPage, runtime: JobRuntime, counters: Counter[str]
) -> tuple[Link, ...]:
    """Count what the page's links came to; return those to follow, one level deeper."""
    if not analysis.html:
        counters[names.COUNTER_NOT_HTML] += 1
    for reason, count in analysis.skipped.items():  # javascript:, mailto:, empty ... : counted as filtered
        counters[f"{names.PREFIX_FILTERED}{reason}"] += count
    if analysis.links_truncated:  # past the job's max_links_per_page: never canonicalised nor sent to admission
        counters[names.COUNTER_LINKS_TRUNCATED] += analysis.links_truncated
    max_redirects = runtime.limits.max_redirects
    return tuple(Link(url, page.depth + 1, max_redirects) for url in analysis.links)


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


def abandon_analysis(
    env: CrawlEnv, fetched: Mapping[str, Any], error: str, carried: Mapping[str, Any] | None = None
) -> None:
    """Finish a batch whose analysis failed for good: count it and release its pages' pending; the
    links its earlier attempts found (``carried``) and its redirect targets are still admitted.

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
    links, done = _salvaged_links(fetched, carried), len(pages) + len(redirects)
    admission = admit_links(runtime, env.frontier, links, done=done, token=f"a:{batch_id}", counters=counters,
                            history=history, analysed_batch=batch_id)  # fmt: skip
    if admission.completed and env.on_completed is not None:
        env.on_completed(job_id, runtime.cycle)


def _salvaged_links(fetched: Mapping[str, Any], carried: Mapping[str, Any] | None) -> list[Link]:
    """What a failed analysis found before it failed, in the order the analysis would admit it."""
    try:
        return _links_in_order(FetchedBatch.from_dict(fetched), CarriedAnalysis.from_dict(carried).page_links)
    except InvalidTask:
        return []


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
