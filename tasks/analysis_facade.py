"""The façade of batch analysis and replay for the command line and the API (``tasks`` re-exports it).

``analyze_job`` and ``reanalyze_job`` plan a run in the calling process, send its chord, and wait
for the result; ``start_analysis`` only starts one.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from analyzers import analyzer_names, check_rules, get_analyzer
from analyzers.batch_registry import batch_analyzer_names
from batch_analysis.steps import DEFAULT_CHUNK
from frontier import Frontier
from tasks import batch_analysis, deps
from vcrawl import names
from vcrawl.errors import AnalysisFailed, InvalidTask, UnknownComponent
from vcrawl.payloads import field_rules

__all__ = ["analysis_run", "analysis_runs", "analyze_job", "analyzers", "reanalyze_job", "start_analysis"]

_FINISHED = names.FINAL_STATES
_POLL_S = 0.25

Progress = Callable[[dict[str, Any]], None]


def analyzers() -> dict[str, list[str]]:
    """The analyzers this process knows: ``page`` (per page, for rules and replay) and ``batch`` (map/reduce)."""
    return {"page": analyzer_names(), "batch": batch_analyzer_names()}


def start_analysis(
    job_id: str,
    analyzer: str,
    *,
    replay: bool = False,
    cycle: int | None = None,
    chunk: int = DEFAULT_CHUNK,
    fields: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Start a run of a batch analyzer (or, ``replay``, of a per-page analyzer) over a finished job.

    Waits (at most the records flush age) for fetch log parts workers have not shipped yet.

    Raises:
        InvalidTask: ``job`` unknown or still running, ``analyzer`` unknown, ``fields`` malformed,
            ``chunk`` out of range, or nothing stored.
    """
    _check_finished(deps.frontier(), job_id)
    if replay:
        _check_name(analyzer, analyzer_names(), "analyzer")
        get_analyzer(analyzer)
        if fields is not None:
            check_rules(field_rules(fields))
    else:
        _check_name(analyzer, batch_analyzer_names(), "batch analyzer")
    deadline = time.monotonic() + batch_analysis._log_wait_s()
    while batch_analysis.unshipped_log_parts(job_id) and time.monotonic() < deadline:
        time.sleep(_POLL_S)
    kind = "replay" if replay else "batch"
    return batch_analysis.launch(job_id, analyzer, kind=kind, cycle=cycle, chunk=chunk, fields=fields)


def analyze_job(
    job_id: str,
    analyzer: str,
    *,
    cycle: int | None = None,
    chunk: int = DEFAULT_CHUNK,
    timeout_s: float = 3600.0,
    progress: Progress | None = None,
) -> str:
    """Run a batch analyzer over every stored page of a finished job (or one cycle) and wait for it.

    Returns the location of the result (``jobs/<job>/results/<analyzer>.json`` under the data root).

    Raises:
        InvalidTask: see ``start_analysis``.
        AnalysisFailed: the run failed (a chunk failed for good, ...).
        TimeoutError: no result within ``timeout_s`` (the run goes on).
    """
    run = start_analysis(job_id, analyzer, cycle=cycle, chunk=chunk)
    return str(wait_for_run(job_id, run["run"], timeout_s, progress)["result"])


def reanalyze_job(
    job_id: str,
    analyzer: str,
    *,
    fields: Mapping[str, Any] | None = None,
    cycle: int | None = None,
    chunk: int = DEFAULT_CHUNK,
    timeout_s: float = 3600.0,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Run a per-page analyzer again over a job's stored pages, fetching nothing; wait for it.

    Records go to ``jobs/<job>/replays/<run>/records/``, beside the crawl's own. ``fields``
    replaces the job's field rules. Returns the finished run (``result``: its summary's location).

    Raises:
        InvalidTask, AnalysisFailed, TimeoutError: as ``analyze_job``.
    """
    run = start_analysis(job_id, analyzer, replay=True, cycle=cycle, chunk=chunk, fields=fields)
    return wait_for_run(job_id, run["run"], timeout_s, progress)


def wait_for_run(job_id: str, run_id: str, timeout_s: float, progress: Progress | None = None) -> dict[str, Any]:
    """Poll a run until it is done; return its state.

    Raises:
        AnalysisFailed: the run failed.
        TimeoutError: still running after ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        run = batch_analysis.runs().get(job_id, run_id) or {"run": run_id, "state": names.RUN_RUNNING}
        if progress is not None:
            progress(run)
        if run.get("state") == "done":
            return run
        if run.get("state") == names.RUN_FAILED:
            raise AnalysisFailed(run_id, str(run.get("error") or "unknown error"))
        if time.monotonic() >= deadline:
            raise TimeoutError(f"run {run_id} of job {job_id} still running after {timeout_s:.0f} s")
        time.sleep(_POLL_S)


def analysis_run(job_id: str, run_id: str) -> dict[str, Any] | None:
    """One run's state (None if unknown)."""
    return batch_analysis.runs().get(job_id, run_id)


def analysis_runs(job_id: str, limit: int = 20) -> list[dict[str, Any]]:
    """A job's latest batch analysis and replay runs, newest first."""
    return batch_analysis.runs().list(job_id, limit)


def _check_finished(frontier: Frontier, job_id: str) -> None:
    state = frontier.jobs.raw_state(job_id).get("state")
    if state is None:
        raise InvalidTask("job", f"no job {job_id!r}")
    if state not in _FINISHED:
        raise InvalidTask("job", f"job {job_id} is {state}: analyse it once it has finished (or cancel it)")


def _check_name(name: str, known: list[str], kind: str) -> None:
    if name not in known:
        raise InvalidTask("analyzer", str(UnknownComponent(kind, name, known)))
