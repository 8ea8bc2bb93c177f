"""A single ``crawl.delay`` task's steps as plain functions: validate, fetch, analyse.

The fetch and the analysis are the crawl's one fetch step and one analysis step, the same a crawl
job's batches use; this module adds what only a single task has: its payload's validation and
storage paths (confined to the single-task areas, ``pages/`` and ``results/`` of the data root:
``storage.naming.single_task_area_problem``), its host's pause (the host gate in ``tasks.fetch``), its result file.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from engine.analysis_step import analyze_one
from engine.api_pages import read_api_page, single_result
from engine.fetch_step import FetchContext, FetchItem, fetch_one, read_robots_rules
from engine.outcomes import Failed, FetchOutcome, RobotsBlocked
from engine.trail import StatusTrail
from engine.validation import check_rule
from fetchers import FetcherRegistry
from frontier import Entry, HostGate, RobotsRules, host_key, origin
from storage import Storage, page_location, result_location, single_task_area_problem
from vcrawl.errors import (
    AttemptsExhausted,
    DownloadFailed,
    FetchFailed,
    InvalidTask,
    RobotsDisallowed,
    StorageRefused,
    VcrawlError,
)
from vcrawl.payloads import AnalysisJob, DownloadTask, FetchedPage
from vcrawl.policies import PolitenessPolicy

__all__ = [
    "AnalysisOutcome",
    "ComeBack",
    "SingleEnv",
    "analyze_page",
    "cached_robots",
    "check_area",
    "fetch_single",
    "host_pause_s",
    "outcome_error",
    "run_single_fetch",
    "stored_at",
    "validate",
]


def validate(data: Any, fetchers: FetcherRegistry, store: Storage) -> DownloadTask:
    """Check a payload against the schema and this process's registries; fill in paths.

    Both paths must lie in the single-task areas (``pages/``, ``results/``), given or derived, so
    a task can never write into a job's folder or vcrawl's own state.

    Raises:
        InvalidTask: naming the first wrong field.
    """
    task = DownloadTask.from_dict(data)
    check_rule(task.rule, fetchers)
    save_path = _location("save_path", store, task.save_path, page_location(task.url))
    result_path = _location("result_path", store, task.result_path, result_location(task.url, task.analyzer))
    if save_path == result_path:
        raise InvalidTask("result_path", "must differ from save_path")
    return task.with_paths(save_path, result_path)


@dataclass(frozen=True)
class SingleEnv:
    """What a single task's fetch uses: the fetch step's context (no job hooks), the host gate, the trail, the pause."""

    ctx: FetchContext
    gate: HostGate
    trail: StatusTrail
    politeness: PolitenessPolicy


@dataclass(frozen=True)
class ComeBack:
    """The host is not free yet, or robots.txt just took its slot: run again then (not an attempt).

    ``slot_ms`` is the reserved time (epoch ms) to pass back as ``reserved_ms``; None: at once.
    """

    slot_ms: int | None = None


def run_single_fetch(
    env: SingleEnv, task: DownloadTask, trail_id: str, reserved_ms: int | None
) -> ComeBack | FetchOutcome:
    """One run of a single task's fetch: robots.txt first when unknown, the host's slot, the fetch step.

    Its host is paced cluster-wide by the host gate with a job's pause: the interval with jitter, or
    the host's Crawl-delay when longer; robots.txt is a request of its own in the host's slot.

    Raises:
        AttemptsExhausted: redelivered after killing its worker again and again.
    """
    ctx, gate, host = env.ctx, env.gate, host_key(task.url)
    token = ctx.policy.robots_token
    rules = cached_robots(ctx, task.url)
    if rules is None:  # robots.txt first: a request of its own, in the host's slot; not an attempt
        if (slot_ms := gate.reserve(host, reserved_ms)) > 0:
            return ComeBack(slot_ms)
        try:
            rules = read_robots_rules(ctx, task.url)
        finally:
            gate.release(host, host_pause_s(env.politeness, rules, token))
        if rules is not None:  # else the network policy refuses the host: the fetch step says so
            return ComeBack(None)
    pause_s = host_pause_s(env.politeness, rules, token)
    # No request leaves for a disallowed URL, nor for an origin the network policy refuses (rules None).
    paced = rules is not None and rules.can_fetch(task.url, token)
    if paced and (slot_ms := gate.reserve(host, reserved_ms, pause_s)) > 0:
        return ComeBack(slot_ms)  # come back exactly at the reserved slot
    try:
        attempt = env.trail.downloading(trail_id)
        if attempt > ctx.policy.retry.retries + 1:
            raise AttemptsExhausted("download", attempt)
        return fetch_single(ctx, task, attempt)
    finally:
        if paced:
            gate.release(host, pause_s)


def fetch_single(ctx: FetchContext, task: DownloadTask, attempt: int = 1) -> FetchOutcome:
    """Fetch a validated single task's page through the one fetch step (robots.txt included).

    ``attempt`` counts from 1; a single task is a depth-0 URL whose redirects its fetcher follows.
    """
    assert task.save_path is not None, "validate() fills in save_path"
    entry = Entry(task.url, depth=0, attempt=attempt - 1, redirects_left=0)
    return fetch_one(ctx, FetchItem(entry, task.rule, task.save_path))


def cached_robots(ctx: FetchContext, url: str) -> RobotsRules | None:
    """The cached robots.txt rules for ``url``'s origin, or None when robots.txt must be read first."""
    return ctx.services.robots.get(origin(url)) if ctx.policy.obey_robots else RobotsRules.from_response(404, None)


def host_pause_s(policy: PolitenessPolicy, rules: RobotsRules | None, token: str) -> float:
    """The pause before the host's next request: the interval (with jitter), or its Crawl-delay if longer.

    >>> robots = RobotsRules.from_response(200, b"User-agent: *\\nCrawl-delay: 2")
    >>> host_pause_s(PolitenessPolicy(0.0, 0.0), robots, "vcrawl")
    2.0
    """
    pause = policy.pause_s()
    delay = rules.crawl_delay(token) if rules is not None else None
    return max(pause, delay) if delay is not None else pause


def outcome_error(outcome: Failed | RobotsBlocked) -> VcrawlError:
    """The error a single task's fetch ends with, for its status trail and its link_error handler."""
    if isinstance(outcome, RobotsBlocked):
        return RobotsDisallowed(outcome.entry.url)
    if outcome.gave_up:  # retries spent on a transient trouble: the error says what kept failing
        return FetchFailed(outcome.entry.url, outcome.reason, outcome.http_status)
    return DownloadFailed(outcome.entry.url, outcome.reason, outcome.http_status)


@dataclass(frozen=True)
class AnalysisOutcome:
    """Where an analysis result went and how much it holds."""

    result_path: str
    result_bytes: int
    items: int


def analyze_page(fetched: FetchedPage, job: AnalysisJob, store: Storage) -> AnalysisOutcome:
    """Run the named analyzer on the stored page through the one analysis step; write its JSON result.

    Raises:
        InvalidTask: the result path is outside the single-task areas (a message from another producer).
        MissingPage: the stored page is gone.
        UnknownComponent: no analyzer of that name in this process.
    """
    check_area("result_path", store, job.result_path)
    if job.api is not None:
        result = single_result(read_api_page(store, fetched, job.api))
    else:
        result = dict(analyze_one(store, fetched, job.analyzer, job.fields).result or {})
    data = json.dumps(result, ensure_ascii=False, separators=(",", ":")).encode()
    store.write_bytes(job.result_path, data)
    return AnalysisOutcome(stored_at(store, job.result_path), len(data), _count_items(result))


def _count_items(result: dict[str, Any]) -> int:
    """Links found, fields that matched, or an api page's records, for the status trail."""
    if isinstance(result.get("records"), list):
        return len(result["records"])
    if isinstance(result.get("links"), list):
        return len(result["links"])
    fields = result.get("fields")
    if isinstance(fields, dict):
        return sum(1 for value in fields.values() if value not in (None, []))
    return 0


def stored_at(store: Storage, location: str) -> str:
    """Where ``location`` is in this process's storage (an absolute path or a URL)."""
    return store.resolve(location, location)


def _location(name: str, store: Storage, given: str | None, default: str) -> str:
    """Check a storage location; keep it relative to the data root when it was given so.

    Relative locations travel in messages as they are, so each worker resolves them
    against its own ``VCRAWL_DATA``; absolute paths and URLs are checked and kept whole.
    """
    location = default if given is None else given
    try:
        resolved = store.resolve(location, default)
    except StorageRefused as exc:
        raise InvalidTask(name, str(exc)) from None
    check_area(name, store, resolved, shown=location)
    if os.path.isabs(location) or "://" in location:
        return resolved
    return os.path.normpath(location)


def check_area(name: str, store: Storage, location: str, shown: str | None = None) -> None:
    """Refuse a single task's ``location`` unless it is a file in ``pages/`` or ``results/`` of the data root.

    The check reads where the location really is under the root (``Storage.relative``: ``..``
    folded, local symlinked directories followed), however it was spelled. ``shown`` is how the
    message names the location (default: ``location`` itself).

    Raises:
        InvalidTask: naming ``name`` and where single tasks may write.
    """
    try:
        problem = single_task_area_problem(store.relative(location))
    except StorageRefused as exc:
        raise InvalidTask(name, str(exc)) from None
    if problem is not None:
        shown = location if shown is None else shown
        raise InvalidTask(name, f"{shown!r} {problem}")
