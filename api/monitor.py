"""Several crawler clusters behind one ``vcrawl serve``: ``/api/clusters`` and ``/api/clusters/NAME/...``.

Each cluster has a ``JobApi`` of its own, whose functions act on that cluster (``tasks.ClusterClient``).
``Monitor.answer`` lists the clusters and hands ``/api/clusters/NAME/<rest>`` to NAME's routes as
``/api/<rest>``, once the request passed the server's checks (origin, token: ``JobApi.handle``) and the
cluster answers a health check. A cluster that does not answer is listed as down with its error (within
``LIST_DEADLINE_S`` however slow it is), its routes answer 503, and the other clusters go on.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import wait as wait_for
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from api.server import JobApi, RequestRefused, json_response
from vcrawl.errors import ClusterDown

__all__ = ["LIST_DEADLINE_S", "ClusterRoutes", "Monitor", "summarize"]

logger = logging.getLogger(__name__)

LIST_DEADLINE_S = 5.0
"""The longest ``GET /api/clusters`` waits for a cluster's summary; one that has none by then is listed as down."""
_SUMMARY_JOBS = 100  # the newest jobs whose states a cluster's summary counts (?limit= up to 1000)

Answer = tuple[int, dict[str, str], bytes]


@dataclass(frozen=True)
class ClusterRoutes:
    """One cluster as the monitor serves it."""

    name: str
    url: str  # its Redis URL without the password
    api: JobApi  # its routes; every function acts on this cluster
    health: Callable[[], str | None]  # why it is down now, or None
    summary: Callable[[int], dict[str, Any]]  # jobs by state (of the newest N), queues, nodes; may raise ClusterDown


@dataclass(frozen=True)
class Monitor:
    """The clusters by name (in the order given) and the one today's unscoped routes act on."""

    clusters: Mapping[str, ClusterRoutes]
    default: str
    list_deadline_s: float = LIST_DEADLINE_S

    def answer(
        self,
        method: str,
        path: str,
        query: dict[str, list[str]],
        headers: Mapping[str, str],
        read_body: Callable[[], bytes],
    ) -> Answer:
        """Answer a request under ``/api/clusters`` that passed the server's checks."""
        try:
            return self._answer(method, path, query, headers, read_body)
        except RequestRefused as exc:
            return json_response(exc.status, {"error": exc.message})

    def _answer(
        self,
        method: str,
        path: str,
        query: dict[str, list[str]],
        headers: Mapping[str, str],
        read_body: Callable[[], bytes],
    ) -> Answer:
        rest = path.removeprefix("/api/clusters").removeprefix("/")
        name, _, tail = rest.partition("/")
        if not rest:
            if method != "GET":
                return _not_allowed(method)
            return json_response(200, {"default": self.default, "clusters": self.listing(_limit(query))})
        cluster = self.clusters.get(unquote(name))
        if cluster is None:
            return json_response(404, {"error": f"no cluster {unquote(name)[:60]!r}; known: {sorted(self.clusters)}"})
        if not tail:
            if method != "GET":
                return _not_allowed(method)
            return json_response(200, self._entry(cluster, _limit(query)))
        if (problem := cluster.health()) is not None:
            return _down(cluster.name, f"cluster {cluster.name} is down: {problem}")
        try:
            return cluster.api.route(method, "/api/" + tail, query, headers, read_body)
        except ClusterDown as exc:
            return _down(cluster.name, str(exc))

    def listing(self, limit: int) -> list[dict[str, Any]]:
        """Every cluster's entry, asked in parallel; one without an answer within the deadline is down."""
        pool = ThreadPoolExecutor(max_workers=min(16, len(self.clusters)) or 1, thread_name_prefix="cluster-summary")
        try:
            futures = {name: pool.submit(self._entry, cluster, limit) for name, cluster in self.clusters.items()}
            wait_for(futures.values(), timeout=self.list_deadline_s)
        finally:
            pool.shutdown(wait=False, cancel_futures=True)  # a slow one finishes in its thread, bounded by its timeouts
        entries = []
        for name, future in futures.items():
            if future.done() and not future.cancelled():
                entries.append(future.result())
            else:
                cluster = self.clusters[name]
                logger.warning("cluster %s gave no summary within %g s", name, self.list_deadline_s)
                entries.append({**_head(cluster, self.default), "up": False,
                                "error": f"no answer within {self.list_deadline_s:g} s"})  # fmt: skip
        return entries

    def _entry(self, cluster: ClusterRoutes, limit: int) -> dict[str, Any]:
        problem = cluster.health()
        if problem is None:
            try:
                return {**_head(cluster, self.default), "up": True, "error": None, **cluster.summary(limit)}
            except ClusterDown as exc:
                problem = exc.reason
        return {**_head(cluster, self.default), "up": False, "error": problem}


def summarize(
    jobs: Callable[[int], list[str]],
    job_state: Callable[[str], str | None],
    queues: Callable[[], dict[str, int]],
    nodes: Callable[[bool], dict[str, Any]],
    limit: int,
) -> dict[str, Any]:
    """A cluster's summary from its façade functions: the states of its newest ``limit`` jobs, its queues, its
    nodes (alive of all) and their pages/s together."""
    listed = jobs(limit)
    states = Counter(job_state(job) or "unknown" for job in listed)
    members = nodes(False)
    rows = members.get("nodes", [])
    return {
        "jobs": {"listed": len(listed), "states": dict(sorted(states.items()))},
        "queues": queues(),
        "nodes": {"alive": sum(1 for row in rows if row.get("alive")), "total": len(rows)},
        "pages_per_s": round(sum(float(row.get("pages_per_s") or 0.0) for row in rows), 2),
    }


def _head(cluster: ClusterRoutes, default: str) -> dict[str, Any]:
    return {"name": cluster.name, "url": cluster.url, "default": cluster.name == default}


def _limit(query: dict[str, list[str]]) -> int:
    raw = query.get("limit", [str(_SUMMARY_JOBS)])[-1]
    try:
        return min(max(int(raw), 1), 1000)
    except ValueError:
        raise RequestRefused(400, f"limit must be an integer, got {raw[:40]!r}") from None


def _down(name: str, message: str) -> Answer:
    status, headers, body = json_response(503, {"error": message, "cluster": name})
    return status, {**headers, "Retry-After": "2"}, body


def _not_allowed(method: str) -> Answer:
    status, headers, body = json_response(405, {"error": f"{method} not allowed here"})
    return status, {**headers, "Allow": "GET"}, body
