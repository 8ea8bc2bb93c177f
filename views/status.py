"""A job's status: its state and counters, read from the frontier into one record.

``JobStatus.to_dict`` is what ``vcrawl status JOB --json``, the job API and ``tasks.job_status``
give; ``JobStatus.from_dict`` reads it back (the CLI's summary, the dashboard's clients).
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Protocol

from fetchers import proxy_stats
from frontier import Frontier
from storage import Storage, job_fetch_log_location, job_records_location, job_warc_location
from vcrawl import names
from vcrawl.errors import VcrawlError
from vcrawl.job_filters import effective_filters, parse_filter_chain, parse_filters

logger = logging.getLogger(__name__)


class PendingOutputs(Protocol):
    """Who still holds a job's output not shipped (``cluster.outputs.OutputLedger``)."""

    def pending(self, job_id: str) -> list[str]:
        """The writers (worker processes) that hold output of ``job_id`` not shipped yet."""
        ...


__all__ = ["CYCLE_COUNTERS", "CycleSummary", "JobStatus", "PendingOutputs", "job_outputs", "job_status", "load_status"]

CYCLE_COUNTERS = (
    names.COUNTER_FETCHED,
    names.COUNTER_NOT_MODIFIED,
    names.COUNTER_UNCHANGED,
    names.COUNTER_UNCHANGED_BY_SITEMAP,
    names.COUNTER_CHANGED,
    names.COUNTER_NEW,
    names.COUNTER_ANALYSED,
    names.COUNTER_NOT_DUE,
    names.COUNTER_STORED,
    names.COUNTER_BYTES,
)
"""What every cycle summary of a scheduled job reports."""


@dataclass(frozen=True)
class CycleSummary:
    """One cycle of a scheduled job: its state, times and the cycle counters."""

    cycle: int
    state: str | None
    started: float | None
    finished: float | None
    counters: Mapping[str, int] = field(default_factory=dict)  # CYCLE_COUNTERS

    def to_dict(self) -> dict[str, Any]:
        """The JSON form: the counters beside the other keys."""
        return {"cycle": self.cycle, "state": self.state, "started": self.started, "finished": self.finished,
                **{name: int(self.counters.get(name, 0)) for name in CYCLE_COUNTERS}}  # fmt: skip

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CycleSummary:
        """Read the JSON form back."""
        counters = {name: int(data.get(name, 0)) for name in CYCLE_COUNTERS}
        return cls(int(data["cycle"]), data.get("state"), data.get("started"), data.get("finished"), counters)


@dataclass(frozen=True)
class JobStatus:
    """State and counters of a job, as one record (``to_dict`` is the documented JSON)."""

    job: str
    state: str | None
    seeds: tuple[str, ...]
    created_at: float
    finished_at: float | None
    elapsed_s: float
    admitted: int = 0
    queued: int = 0
    pending: int = 0
    in_flight_batches: int = 0
    hosts: int = 0
    pages_fetched: int = 0
    pages_stored: int = 0
    failed: Mapping[str, int] = field(default_factory=dict)
    robots_blocked: int = 0
    filtered: Mapping[str, int] = field(default_factory=dict)
    duplicates: int = 0
    links_truncated: int = 0
    bytes: int = 0
    analysed: int = 0
    records: int = 0
    analysis_failed: Mapping[str, int] = field(default_factory=dict)
    redirects: int = 0
    retries: int = 0
    robots_fetched: int = 0
    lease_expired: int = 0
    sitemaps_read: int = 0
    sitemap_urls: int = 0
    sitemap_problems: Mapping[str, int] = field(default_factory=dict)
    statuses: Mapping[str, int] = field(default_factory=dict)
    proxies: Mapping[str, Any] = field(default_factory=dict)
    spec_rev: int = 0
    error: str | None = None  # a failed job: why
    # A scheduled job's current cycle (None for a one-off job) and its summaries, newest last.
    cycle: int | None = None
    started_at: float | None = None
    skipped_firings: int = 0
    cycle_counters: Mapping[str, int] = field(default_factory=dict)
    cycles: tuple[CycleSummary, ...] = ()
    # The job's output files in storage (WARC files and their .cdxj, record and fetch log parts),
    # and how many worker processes still hold output of it not shipped (0 soon after completion).
    outputs: tuple[str, ...] = ()
    outputs_pending: int = 0
    strategy: str = "breadth-first"  # the order its URLs go in (docs/strategies.md)
    # The admission filters it runs, in order, scope first: [{name, params}] (docs/jobs.md#the-filter-chain)
    filter_chain: tuple[Mapping[str, Any], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """The JSON form: a failed job adds ``error``, a scheduled job its cycle keys and counters."""
        data = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in _OPTIONAL}
        data["seeds"] = list(self.seeds)
        data["outputs"] = list(self.outputs)
        data["filter_chain"] = [{"name": f["name"], "params": dict(f["params"])} for f in self.filter_chain]
        for name in ("failed", "filtered", "analysis_failed", "sitemap_problems", "statuses", "proxies"):
            data[name] = dict(data[name])
        if self.error is not None:
            data["error"] = self.error
        if self.cycle is not None:
            data.update(cycle=self.cycle, started_at=self.started_at, skipped_firings=self.skipped_firings)
            data.update({name: int(self.cycle_counters.get(name, 0)) for name in CYCLE_COUNTERS})
            data["cycles"] = [summary.to_dict() for summary in self.cycles]
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> JobStatus:
        """Read the JSON form back."""
        values = {f.name: data[f.name] for f in fields(cls) if f.name in data and f.name not in _OPTIONAL}
        values["seeds"] = tuple(values.get("seeds", ()))
        values["outputs"] = tuple(values.get("outputs", ()))
        values["filter_chain"] = tuple(values.get("filter_chain", ()))
        if data.get("cycle") is not None:
            values.update(cycle=int(data["cycle"]), started_at=data.get("started_at"),
                          skipped_firings=int(data.get("skipped_firings") or 0),
                          cycle_counters={name: int(data.get(name, 0)) for name in CYCLE_COUNTERS},
                          cycles=tuple(CycleSummary.from_dict(c) for c in data.get("cycles", ())))  # fmt: skip
        return cls(**values, error=data.get("error"))


_OPTIONAL = frozenset({"error", "cycle", "started_at", "skipped_firings", "cycle_counters", "cycles"})


def job_outputs(store: Storage, job_id: str) -> tuple[str, ...]:
    """The job's output files in storage: WARC files with their indexes, record parts, fetch log parts."""
    prefixes = (job_warc_location(job_id), job_records_location(job_id), job_fetch_log_location(job_id))
    try:
        return tuple(location for prefix in prefixes for location in store.list_files(prefix))
    except (OSError, VcrawlError) as exc:  # a store out of reach must not hide the job's state
        logger.warning("job %s: could not list its outputs: %s", job_id, exc)
        return ()


def load_status(
    frontier: Frontier,
    job_id: str,
    now: float | None = None,
    store: Storage | None = None,
    ledger: PendingOutputs | None = None,
) -> JobStatus | None:
    """Read a job's status from the frontier, or None if unknown; with ``store`` and ``ledger``, its
    output files and the worker processes still holding output of it."""
    raw = frontier.jobs.raw_state(job_id)
    if not raw:
        return None
    counters = Counter({name: int(value) for name, value in raw.items() if _is_counter(name, value)})
    created = float(raw.get(names.META_CREATED_AT, "0"))
    finished = float(raw[names.META_FINISHED_AT]) if raw.get(names.META_FINISHED_AT) else None
    started = float(raw.get(names.META_STARTED_AT) or created)
    spec = json.loads(raw.get(names.META_SPEC, "{}"))
    cycle = int(raw[names.META_CYCLE]) if raw.get(names.META_CYCLE) else None
    state = raw.get(names.META_STATE)
    cycle_counters = {name: counters[name] for name in CYCLE_COUNTERS}
    cycles: tuple[CycleSummary, ...] = ()
    if cycle is not None:
        current = CycleSummary(cycle, state, float(raw.get(names.META_STARTED_AT) or 0), finished, cycle_counters)
        cycles = (*(_past_cycle(past) for past in frontier.jobs.cycles(job_id)), current)
    return JobStatus(
        job=job_id,
        state=state,
        seeds=tuple(spec.get("seeds", ())),
        created_at=created,
        finished_at=finished,
        elapsed_s=round((finished or (time.time() if now is None else now)) - started, 3),
        admitted=counters[names.META_ADMITTED],
        queued=max(0, counters[names.META_QUEUED_NOW]),
        pending=max(0, counters[names.META_PENDING]),
        in_flight_batches=frontier.queue.in_flight(job_id),
        hosts=frontier.stats.hosts_seen(job_id),
        pages_fetched=counters[names.COUNTER_FETCHED],
        pages_stored=counters[names.COUNTER_STORED],
        failed=_family(counters, names.PREFIX_FAILED),
        robots_blocked=counters[names.COUNTER_ROBOTS_BLOCKED],
        filtered=_family(counters, names.PREFIX_FILTERED),
        duplicates=counters[names.COUNTER_DUPLICATES],
        links_truncated=counters[names.COUNTER_LINKS_TRUNCATED],
        bytes=counters[names.COUNTER_BYTES],
        analysed=counters[names.COUNTER_ANALYSED],
        records=counters[names.COUNTER_RECORDS],
        analysis_failed=_family(counters, names.PREFIX_ANALYSIS_FAILED),
        redirects=counters[names.COUNTER_REDIRECTS],
        retries=counters[names.COUNTER_RETRIES],
        robots_fetched=counters[names.COUNTER_ROBOTS_FETCHED],
        lease_expired=counters[names.COUNTER_LEASE_EXPIRED],
        sitemaps_read=counters[names.COUNTER_SITEMAPS_READ],
        sitemap_urls=counters[names.COUNTER_SITEMAP_URLS],
        sitemap_problems=_family(counters, names.PREFIX_SITEMAP_PROBLEM),
        statuses=_family(counters, names.PREFIX_STATUS),
        proxies=proxy_stats(counters),  # per proxy (password masked): ok, failed (its fault), errors
        spec_rev=counters[names.META_SPEC_REV],
        error=raw.get(names.META_ERROR) or None,
        cycle=cycle,
        started_at=float(raw.get(names.META_STARTED_AT) or 0) if cycle is not None else None,
        skipped_firings=int(raw.get(names.META_SKIPPED_FIRINGS) or 0),
        cycle_counters=cycle_counters if cycle is not None else {},
        cycles=cycles,
        outputs=job_outputs(store, job_id) if store is not None else (),
        outputs_pending=len(ledger.pending(job_id)) if ledger is not None else 0,
        strategy=spec.get("strategy", "breadth-first"),
        filter_chain=_filter_chain(spec),
    )


def _filter_chain(spec: Mapping[str, Any]) -> tuple[Mapping[str, Any], ...]:
    """The filters a stored spec (valid when stored) runs, as ``{name, params}``."""
    chain = effective_filters(parse_filters(spec.get("filters")), parse_filter_chain(spec.get("filter_chain")))
    return tuple({"name": f.name, "params": dict(f.params)} for f in chain)


def job_status(
    frontier: Frontier, job_id: str, store: Storage | None = None, ledger: PendingOutputs | None = None
) -> dict[str, Any] | None:
    """State and counters of a job as JSON-ready dict, or None if unknown."""
    status = load_status(frontier, job_id, store=store, ledger=ledger)
    return None if status is None else status.to_dict()


def _family(counters: Mapping[str, int], prefix: str) -> dict[str, int]:
    return {name.removeprefix(prefix): count for name, count in counters.items() if name.startswith(prefix)}


def _past_cycle(past: Mapping[str, Any]) -> CycleSummary:
    counters = past.get("counters") or {}
    return CycleSummary(int(past["cycle"]), past["state"], past.get("started_at"), past.get("finished_at"),
                        {name: int(counters.get(name, 0)) for name in CYCLE_COUNTERS})  # fmt: skip


def _is_counter(name: str, value: str) -> bool:
    return name not in names.TEXT_FIELDS and value.lstrip("-").isdigit()
