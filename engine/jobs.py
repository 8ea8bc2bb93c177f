"""Crawl jobs: start, admit, status, cancel. Plain functions; the Celery tasks call them."""

from __future__ import annotations

import ipaddress
import json
import logging
import re
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple, Protocol
from urllib.parse import urlsplit

from analyzers.batch_registry import batch_analyzer_names
from engine.validation import check_rule
from fetchers import FetcherRegistry, FetchLimits, IdentityPool, NetworkPolicy, StaticFetcher
from fetchers.limits import cluster_limits, fetch_limits
from frontier import (
    MAX_ROBOTS_BYTES,
    Admission,
    AdmissionContext,
    AdmitRequest,
    Batch,
    BatchRelease,
    BloomFilter,
    Candidate,
    Entry,
    FilterChain,
    Frontier,
    RecentUrls,
    Scope,
    UrlHistory,
    canonical_url,
    dedup_key,
    filter_chain,
    host_key,
    origin,
)
from telemetry.alerts import Alert
from vcrawl import redis_keys
from vcrawl.errors import ConfigError, InvalidTask
from vcrawl.jobs import ROBOTS_SITEMAPS, JobSpec, LimitsSpec
from vcrawl.names import STRATEGY_PRIORITY
from vcrawl.policies import PolitenessPolicy, RetryPolicy
from vcrawl.priorities import PriorityPatterns, compiled_priorities, url_priority
from vcrawl.settings import Settings

logger = logging.getLogger(__name__)

__all__ = [
    "JobRuntime",
    "Runtimes",
    "admit_links",
    "check_job",
    "current_spec",
    "fail_job",
    "reconfigure",
    "scope_of",
    "start",
]


class Link(NamedTuple):
    """A URL to admit: how deep it is, how many redirects it may still follow, the sitemap level it
    comes from (0: a page's link, 1: a sitemap named by a job or robots.txt, ...) and the page or
    redirect it was found on ("" for seeds and sitemaps)."""

    url: str
    depth: int
    redirects_left: int
    sitemap: int = 0
    source: str = ""


_ADMIT_CHUNK = 1000  # URLs per admission script call: each call blocks Redis ~10 us per URL


@dataclass(frozen=True)
class JobRuntime:
    """Everything a worker derives from a job's spec, built once per process and job."""

    spec: JobSpec
    scope: Scope
    fetcher: StaticFetcher
    robots_fetcher: StaticFetcher
    identities: IdentityPool
    politeness: PolitenessPolicy
    retry: RetryPolicy
    bloom: BloomFilter
    networks: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]  # the job's narrowing; () for none
    batch_size: int
    cycle: int = 0  # a scheduled job's cycle; 0 for a one-off job (no URL history kept)
    cycle_started_s: float = 0.0
    spec_rev: int = 0  # changes of the spec while the job runs (live configuration)
    limits: LimitsSpec = field(default_factory=LimitsSpec)  # the job's limits, unset ones from the cluster
    recent: RecentUrls = field(default_factory=RecentUrls)  # URLs this process saw admitted or refused as seen
    api_auth: Mapping[str, str] = field(default_factory=dict, repr=False)  # api pages' secrets (VCRAWL_API_AUTH_*)
    filters: FilterChain | None = None  # the job's chain (frontier.filter_registry); None: the built-ins
    priorities: PriorityPatterns = ()  # a priority job's patterns, compiled once

    @property
    def job_id(self) -> str:
        """The job's id."""
        return self.spec.id

    @property
    def eager(self) -> bool:
        """Politeness off: a host may be handed out again before its batch returns."""
        return self.politeness.min_interval_s <= 0


def check_job(spec: JobSpec, fetchers: FetcherRegistry) -> None:
    """Check what a JobSpec cannot check alone: registries and selectors.

    Raises:
        InvalidTask: naming the rule's key, e.g. ``rules[0].analyzer``, or the filter's
            (``filters[0].name``, ``filter_chain[1].params.suffixes``).
    """
    filter_chain(spec.filters, spec.filter_chain)
    for index, rule in enumerate(spec.rules):
        check_rule(rule, fetchers, f"rules[{index}]")
    known = batch_analyzer_names()
    for index, name in enumerate(spec.batch_analyzers):
        if name not in known:
            raise InvalidTask(f"batch_analyzers[{index}]", f"no batch analyzer {name!r}; known: {', '.join(known)}")


def scope_of(spec: JobSpec) -> Scope:
    """The filter scope of a job; with no hosts and no domains, the seeds' hosts."""
    hosts = frozenset(spec.scope.hosts)
    if not hosts and not spec.scope.domains:
        hosts = frozenset((urlsplit(canonical_url(seed)).hostname or "") for seed in spec.seeds)
    return Scope(
        hosts=hosts,
        domains=tuple(spec.scope.domains),
        allow=tuple(re.compile(p) for p in spec.scope.allow),
        deny=tuple(re.compile(p) for p in spec.scope.deny),
        max_depth=spec.max_depth,
    )


def build_runtime(
    spec: JobSpec, settings: Settings, session: Any, client: Any, cycle: int = 0, cycle_started_s: float = 0.0
) -> JobRuntime:
    """Derive a job's runtime objects from its spec and the cluster settings."""
    limits = spec.limits.resolved(cluster_limits(settings))
    assert limits.total_timeout_s is not None and limits.retries is not None
    # A job follows redirects as links of their own (admission sees every hop).
    page_limits = replace(fetch_limits(limits), max_redirects=0, follow_redirects=False)
    politeness = PolitenessPolicy(spec.politeness.min_interval_s, spec.politeness.jitter)
    # The cluster's policy; the job's allowed_networks narrow it request by request (FetchRequest.networks).
    policy = NetworkPolicy.from_settings(settings)
    return JobRuntime(
        spec=spec,
        scope=scope_of(spec),
        fetcher=StaticFetcher(session, page_limits, policy=policy),
        robots_fetcher=StaticFetcher(session, robots_limits(page_limits), policy=policy),
        identities=IdentityPool(
            spec.user_agents if spec.user_agents is not None else settings.user_agents,
            spec.referers if spec.referers is not None else settings.referers,
            spec.proxies if spec.proxies is not None else settings.proxies,
            # Harvested proxies join the cluster's pool where this worker harvests; a job's own list is all it uses.
            harvested=spec.proxies is None and bool(settings.proxy_sources),
        ),
        politeness=politeness,
        retry=RetryPolicy(
            limits.retries, settings.fetch_backoff_s, settings.fetch_backoff_max_s, settings.max_retry_after_s
        ),
        bloom=job_bloom(spec, client),
        networks=tuple(ipaddress.ip_network(n) for n in spec.allowed_networks),
        batch_size=paced_batch_size(politeness.min_interval_s, settings.frontier_batch),
        cycle=cycle,
        cycle_started_s=cycle_started_s,
        limits=limits,
        api_auth=dict(settings.api_auth),
        filters=_worker_filters(spec),
        priorities=compiled_priorities(spec.priorities),
    )


def _worker_filters(spec: JobSpec) -> FilterChain:
    """The job's filter chain in this worker; a filter the submitter had and this worker lacks is
    the worker's configuration error (the job fails and says which), not the job's.

    Raises:
        ConfigError: naming the job's filter this worker cannot make.
    """
    try:
        return filter_chain(spec.filters, spec.filter_chain)
    except InvalidTask as exc:
        raise ConfigError(f"job {spec.id}: {exc} (install the filter's plug-in on every worker)") from None


def job_bloom(spec: JobSpec, client: Any) -> BloomFilter:
    """The job's Bloom filter; its segments share the job's hash tag (admission is one script)."""
    return BloomFilter(
        client,
        spec.id,
        spec.dedup.expected_urls,
        spec.dedup.error_rate,
        segment_key=lambda index: redis_keys.job_bloom_segment(spec.id, index),
    )


def robots_limits(limits: FetchLimits) -> FetchLimits:
    """A robots.txt request's limits: RFC 9309's 500 KiB parsed (the rest cut), redirects followed hop by hop
    by ``frontier.read_robots``."""
    return replace(limits, max_body_bytes=MAX_ROBOTS_BYTES, truncate_body=True, max_redirects=0, follow_redirects=False)


PACED_SPAN_S = 2.0
"""How long a paced host's batch spans at most: its URLs go one pause apart (``engine.fetch_batch``)."""
PACED_MOST_URLS = 8
"""URLs of a paced batch at most: what a worker killed mid-batch costs in pages fetched again. Past
8, the frontier's work per page (one lease, start and release per batch) hardly shrinks."""


def paced_batch_size(interval_s: float, most: int) -> int:
    """URLs per batch of a host paced at ``interval_s`` (``most`` without politeness).

    >>> paced_batch_size(0.0, 32), paced_batch_size(0.05, 32), paced_batch_size(0.5, 32), paced_batch_size(5.0, 32)
    (32, 8, 4, 1)
    """
    if interval_s <= 0:
        return most
    return max(1, min(most, PACED_MOST_URLS, int(PACED_SPAN_S / interval_s)))


def lease_s(runtime: JobRuntime) -> float:
    """How long a batch may run from its start (or wait unsent, if its pump died) before its URLs
    are handed out again: every fetch's total time, plus a margin for robots.txt and storage of
    twice one fetch's total time, at least 10 s and at most 60 s."""
    total_s = runtime.limits.total_timeout_s
    return total_s * runtime.batch_size + min(60.0, max(10.0, 2 * total_s))


def lease_ms(runtime: JobRuntime) -> float:
    """``lease_s`` in milliseconds."""
    return lease_s(runtime) * 1000


def admit_links(
    runtime: JobRuntime,
    frontier: Frontier,
    links: Iterable[Link | tuple[str, int, int]],
    *,
    done: int,
    token: str,
    counters: Counter[str],
    seeds: bool = False,
    known: bool = False,
    history: Mapping[str, UrlHistory] | None = None,
    analysed_batch: str | Mapping[str, int] | None = None,
    sitemap_priorities: Mapping[str, float] | None = None,
) -> Admission:
    """Canonicalize, filter, dedup and queue links (a plain ``(url, depth, redirects_left)`` is a
    page's link found nowhere in particular); finish ``done`` URLs.

    Filter drops are counted as ``filtered:<reason>`` in ``counters`` (sent with the call), by the job's
    chain: scope, then its ``filter_chain`` or the other built-ins and its ``filters`` (``frontier.filter_registry``).
    Seeds are not held to the ``allow`` patterns (they are where the crawl starts). The call
    that finishes the ``done`` URLs carries the token ``<token>:final``, whatever the number
    of chunks, so ``abandon_analysis`` can tell whether it already happened. In a scheduled
    job, links to URLs the history knows wait for their due time; ``seeds`` and ``known``
    (URLs due in this cycle) are queued whatever the history says. A priority job gives each
    candidate its priority (``vcrawl.priorities.url_priority``, with ``sitemap_priorities``: a
    sitemap's ``priority`` by listed URL); a sitemap to read goes before any page (``admit.lua``).
    ``analysed_batch``: the fetch batch whose ``done`` URLs this finishes, or several of one partition (id -> done).
    """
    analysed = ((analysed_batch, done),) if isinstance(analysed_batch, str) else tuple((analysed_batch or {}).items())
    history_mode = 0 if not runtime.cycle else 1 if (seeds or known) else 2
    scope = replace(runtime.scope, allow=()) if seeds else runtime.scope
    # A sitemap is the way in, not a page: the allow patterns and the file-suffix filter (.gz) are for pages.
    sitemap_scope = replace(runtime.scope, allow=(), skip_suffixes=frozenset())
    # One-off jobs: a URL this process saw in the Bloom filter is a known duplicate (scheduled jobs go by
    # their history). Priority jobs: every link reaches Redis, where a link to a queued URL raises its score.
    by_priority = runtime.spec.strategy == STRATEGY_PRIORITY
    recent = runtime.recent if history_mode == 0 and not by_priority else None
    chain = runtime.filters if runtime.filters is not None else filter_chain(())
    listed_priorities = sitemap_priorities or {}
    candidates: list[Candidate] = []
    local: set[str] = set()
    for url, depth, redirects_left, sitemap, source in (Link(*link) for link in links):
        try:
            canonical = canonical_url(url)
        except ValueError:
            counters["filtered:malformed"] += 1
            continue
        if (key := dedup_key(canonical)) in local or (recent is not None and key in recent):
            counters["duplicates"] += 1  # before the filters: most links are to pages admitted already
            continue
        context = AdmissionContext(runtime.job_id, depth, sitemap_scope if sitemap else scope, source, seeds,
                                   bool(sitemap))  # fmt: skip
        if (reason := chain.reject_reason(canonical, context)) is not None:
            counters[f"filtered:{reason}"] += 1
            continue
        local.add(key)
        entry = Entry(canonical, depth, 0, redirects_left, sitemap=sitemap)
        priority = 0.0
        if by_priority and not sitemap:  # a sitemap's score is the frontier's: ahead of every page
            priority = url_priority(runtime.priorities, canonical, depth, listed_priorities.get(url))
        candidates.append(Candidate(host_key(canonical), entry, priority))
    chunks = [candidates[i : i + _ADMIT_CHUNK] for i in range(0, len(candidates), _ADMIT_CHUNK)] or [[]]
    result = Admission(False, False, 0, 0, 0)
    in_filter: list[Candidate] = []
    for index, chunk in enumerate(chunks):
        last = index == len(chunks) - 1
        chunk_token = f"{token}:final" if last else f"{token}:{index}"
        admission = frontier.queue.admit(
            runtime.job_id,
            AdmitRequest(
                chunk,
                bloom=runtime.bloom,
                max_pages=runtime.spec.max_pages,
                per_host=runtime.spec.politeness.per_host,
                done=done if last else 0,  # finish the pages only after all their links are queued
                token=chunk_token if token else "",
                counters=counters if index == 0 else {},
                history_mode=history_mode,
                cycle=runtime.cycle,
                history=(history or {}) if last else {},  # with the pages it finishes
                analysed=analysed if last else (),
            ),
            wake=runtime.spec.politeness.min_interval_s <= 0,  # paced hosts: the pump's next round is soon enough
        )
        if admission.admitted + admission.duplicates == len(chunk):
            in_filter.extend(chunk)  # each one is in the filter now
        result = _add(result, admission)
    # Only once every chunk went through: a retried call must see the same chunks, or its chunk
    # tokens would name other URLs (a chunk taken for a repeat would admit nothing).
    if recent is not None:
        recent.add_all(dedup_key(candidate.entry.url) for candidate in in_filter)
    return result


class Runtimes(Protocol):
    """(job id, cycle) -> the job's runtime in this process (``engine.runtime_cache.RuntimeCache``)."""

    def get(self, job_id: str, cycle: int = 0) -> JobRuntime:
        """The runtime of ``job_id`` in ``cycle`` (0: a one-off job).

        Raises:
            InvalidTask: no such job.
        """
        ...


def start(spec: JobSpec, frontier: Frontier, runtimes: Runtimes, fetchers: FetcherRegistry) -> str:
    """Validate and record a job, then admit its seeds; return its id.

    Raises:
        InvalidTask: a bad key (``rules[0].analyzer``, ...) or an id already taken (``id``).
    """
    check_job(spec, fetchers)
    now = time.time()
    if not frontier.jobs.create(spec.id, spec.to_json(), now, strategy=spec.strategy, seeds=spec.seeds):
        raise InvalidTask("id", f"a job {spec.id!r} exists already")
    runtime = runtimes.get(spec.id)
    admit_links(runtime, frontier, seed_links(spec, runtime.limits.max_redirects), done=0, token="seeds",
                counters=Counter(), seeds=True)  # fmt: skip
    frontier.partitions.started(spec.id)  # a job split over a cluster may complete from now on
    return spec.id


def seed_links(spec: JobSpec, max_redirects: int) -> list[Link]:
    """What a job (each cycle of a scheduled one) starts with: its seeds, then its sitemaps: a
    discovery entry per seed origin (its robots.txt, read as a sitemap: ``engine.sitemaps``), or
    the sitemaps the job lists."""
    seeds = [Link(seed, 0, max_redirects) for seed in spec.seeds]
    if spec.sitemaps is True or spec.sitemaps == ROBOTS_SITEMAPS:
        origins = dict.fromkeys(origin(seed) for seed in spec.seeds)
        return [*seeds, *(Link(f"{base}/robots.txt", 0, max_redirects, sitemap=1) for base in origins)]
    listed = spec.sitemaps if isinstance(spec.sitemaps, tuple) else ()
    return [*seeds, *(Link(url, 0, max_redirects, sitemap=1) for url in listed)]


LIVE_KEYS = {
    "politeness": ("min_interval_s", "jitter", "per_host"),
    "user_agents": (),
    "referers": (),
    "proxies": (),
}
"""What may change while a job runs: workers pick it up within seconds."""


def reconfigure(frontier: Frontier, job_id: str, changes: Mapping[str, Any]) -> JobSpec:
    """Change a running or paused job's politeness or header and proxy pools; return the new spec.

    Raises:
        InvalidTask: a key that cannot change live, a bad value (naming its path), or no such
            running job (``job``).
    """
    raw = frontier.jobs.raw_state(job_id)
    if not raw.get("spec"):
        raise InvalidTask("job", f"no job {job_id!r}")
    if not isinstance(changes, Mapping) or not changes:
        raise InvalidTask("config", "give at least one of: " + ", ".join(sorted(LIVE_KEYS)))
    data = json.loads(raw["spec"])
    for key, value in changes.items():
        if key not in LIVE_KEYS:
            raise InvalidTask(key, f"cannot change while the job runs; live keys: {', '.join(sorted(LIVE_KEYS))}")
        if LIVE_KEYS[key]:
            if not isinstance(value, Mapping):
                raise InvalidTask(key, "must be a mapping")
            for name in value:
                if name not in LIVE_KEYS[key]:
                    raise InvalidTask(f"{key}.{name}", f"cannot change live; live keys: {', '.join(LIVE_KEYS[key])}")
            data[key] = {**data.get(key, {}), **value}
        else:
            data[key] = value
    spec = JobSpec.from_dict(data)
    if frontier.jobs.update_spec(job_id, spec.to_json()) is None:
        raise InvalidTask("job", f"job {job_id!r} is not running or paused")
    return spec


def current_spec(frontier: Frontier, job_id: str) -> JobSpec | None:
    """A job's spec as its workers read it now (live changes included); None for an unknown job."""
    raw = frontier.jobs.raw_state(job_id)
    return JobSpec.from_dict(json.loads(raw["spec"])) if raw.get("spec") else None


def _add(a: Admission, b: Admission) -> Admission:
    return Admission(
        a.completed or b.completed,
        a.repeated or b.repeated,
        a.admitted + b.admitted,
        a.duplicates + b.duplicates,
        a.over_limit + b.over_limit,
        a.not_due + b.not_due,
    )


def fail_job(
    frontier: Frontier, job_id: str, error: str, alert: Callable[[str, Alert], bool], batch: Batch | None = None
) -> bool:
    """Fail a job that cannot go on (a configuration error inside a task): its state says why, what
    ``batch`` holds goes back to the queue, and one alert goes out. False if it was not running or paused.
    """
    failed = frontier.jobs.fail(job_id, error, time.time())
    if batch is not None:  # hand the lease back at once rather than let it run out
        # After the state changed: requeued while the job still ran, a pump could lease the URLs
        # again in between, and that batch would be in flight while the job already failed.
        frontier.queue.release(job_id, batch, BatchRelease(pause_ms=0, done=0, requeue=batch.entries, fetched=False))
    if failed:
        logger.error("job %s failed: %s", job_id, error)
        alert(
            f"{job_id}:failed",
            Alert(
                subject=f"job {job_id} failed: configuration error",
                text=f"Job {job_id} was stopped: {error}. Fix the workers' configuration and start the job again.",
                details={"job": job_id, "error": error},
            ),
        )
    return failed
