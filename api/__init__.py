"""The job API and dashboard served by ``vcrawl serve``: its routes (``api.server``), the routes of several
clusters (``api.monitor``) and its bounded HTTP wire (``api.http``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from api.http import HttpLimits, make_server
from api.monitor import ClusterRoutes, Monitor, summarize
from api.server import JobApi
from vcrawl.targets.clusters import DEFAULT_CLUSTER_NAME

__all__ = ["HttpLimits", "JobApi", "Monitor", "make_server", "real_api"]


def real_api(token: str | None, clusters: Mapping[str, str] | None = None, name: str = DEFAULT_CLUSTER_NAME) -> JobApi:
    """The API over this process's configured cluster (``tasks.configure`` first, or the env), named ``name``,
    and over ``clusters`` (name -> Redis URL) under ``/api/clusters/NAME/...``.

    Raises:
        ConfigError: a URL of ``clusters`` that vcrawl cannot use.
    """
    import tasks

    own = tasks.ClusterClient.own(name)
    clients = [own, *(tasks.ClusterClient.named(other, url, own.settings) for other, url in (clusters or {}).items())]
    routes = {}
    for client in clients:
        summary = client.bind(
            lambda limit: summarize(tasks.list_jobs, tasks.job_state, tasks.queue_lengths, tasks.ring_nodes, limit)
        )
        cluster_api = _job_api(token, client.bind, outputs=client is own)
        routes[client.name] = ClusterRoutes(client.name, client.shown_url, cluster_api, client.health, summary)
    # Today's routes, on this process's cluster as they were (a Redis error: a 500, as before).
    api = _job_api(token, lambda function: function, outputs=True)
    api.clusters = Monitor(routes, name).answer
    return api


def _job_api(token: str | None, bind: Callable[[Callable[..., Any]], Callable[..., Any]], outputs: bool) -> JobApi:
    """A JobApi whose every function is the façade's, made by ``bind`` to act on one cluster.

    ``outputs``: a job's status lists its files in storage. Not for another cluster: its workers' data root
    need not be this process's.
    """
    import tasks

    return JobApi(
        token=token,
        start_job=bind(tasks.start_job),
        job_status=bind(lambda job_id: tasks.job_status(job_id, with_outputs=outputs)),
        job_summary=bind(lambda job_id: tasks.job_status(job_id, with_outputs=False)),
        jobs=bind(tasks.list_jobs),
        cancel=bind(tasks.cancel_job),
        pause=bind(tasks.pause_job),
        resume=bind(tasks.resume_job),
        reconfigure=bind(tasks.reconfigure_job),
        job_spec=bind(tasks.job_spec),
        failures=bind(tasks.job_failures),
        host_stats=bind(tasks.host_stats),
        stats=bind(tasks.job_stats),
        queues=bind(tasks.queue_lengths),
        nodes=bind(lambda with_hosts: tasks.ring_nodes(with_hosts=with_hosts)),
        resize_node=bind(tasks.resize_node),
        daily=bind(tasks.job_daily),
        analyses=bind(tasks.analysis_runs),
        logs=bind(tasks.read_logs),
        cluster_settings=bind(tasks.cluster_settings),
        set_setting=bind(tasks.set_cluster_setting),
        unset_setting=bind(tasks.unset_cluster_setting),
    )
