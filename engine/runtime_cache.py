"""This process's runtimes of jobs: (job id, cycle) -> JobRuntime, rebuilt when the job's spec or the
cluster's live settings change."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from engine.jobs import JobRuntime, build_runtime
from frontier import Frontier
from vcrawl.errors import InvalidTask
from vcrawl.jobs import JobSpec
from vcrawl.settings import Settings

__all__ = ["RuntimeCache"]


class RuntimeCache:
    """(job id, cycle) -> JobRuntime for this process.

    A spec changes when a new cycle starts, or when an operator reconfigures a running job
    (``spec_rev``): a cached runtime is checked against the job's revision every ``recheck_s``,
    so a change reaches every worker within that time. ``settings`` may be a function returning
    the process's current settings: a runtime built from other settings (the cluster's live
    settings changed, ``vcrawl config set``) is built again on its next use.
    """

    def __init__(
        self,
        frontier: Frontier,
        settings: Settings | Callable[[], Settings],
        session: Any,
        client: Any,
        size: int = 64,
        recheck_s: float = 2.0,
        clock: Any = time.monotonic,
    ) -> None:
        self._frontier, self._session, self._client = frontier, session, client
        self._settings = settings if callable(settings) else lambda: settings
        self._size, self._recheck_s, self._clock = size, recheck_s, clock
        self._cache: dict[tuple[str, int], tuple[JobRuntime, float, Settings]] = {}
        self._lock = threading.Lock()

    def get(self, job_id: str, cycle: int = 0) -> JobRuntime:
        """The runtime of ``job_id`` in ``cycle`` (0: a one-off job).

        Raises:
            InvalidTask: no such job.
        """
        settings = self._settings()
        cached = self._cache.get((job_id, cycle))
        if cached is not None and cached[2] is settings:
            runtime, checked, _ = cached
            if self._clock() - checked < self._recheck_s:
                return runtime
            if self._frontier.jobs.spec_rev(job_id) == runtime.spec_rev:
                self._cache[(job_id, cycle)] = (runtime, self._clock(), settings)
                return runtime
        state = self._frontier.jobs.raw_state(job_id)
        if not state.get("spec"):
            raise InvalidTask("job", f"no job {job_id!r}")
        spec = JobSpec.from_dict(json.loads(state["spec"]))
        started_s = float(state.get("started_at") or 0) if cycle else 0.0
        runtime = build_runtime(spec, settings, self._session, self._client, cycle, started_s)
        runtime = replace(runtime, spec_rev=int(state.get("spec_rev") or 0))
        if cycle and int(state.get("cycle") or 0) != cycle:
            return runtime  # a late message of another cycle: its work is refused anyway; not cached
        with self._lock:
            if len(self._cache) >= self._size and (job_id, cycle) not in self._cache:
                self._cache.pop(next(iter(self._cache)))
            self._cache[(job_id, cycle)] = (runtime, self._clock(), settings)
        return runtime
