"""The job API and dashboard served by ``vcrawl serve``: its routes (``api.server``) and its bounded
HTTP wire (``api.http``)."""

from __future__ import annotations

from api.http import HttpLimits, make_server
from api.server import JobApi

__all__ = ["HttpLimits", "JobApi", "make_server", "real_api"]


def real_api(token: str | None) -> JobApi:
    """The API over this process's configured cluster (``tasks.configure`` first, or the env)."""
    import tasks

    return JobApi(
        token=token,
        start_job=tasks.start_job,
        job_status=tasks.job_status,
        job_summary=lambda job_id: tasks.job_status(job_id, with_outputs=False),
        jobs=tasks.list_jobs,
        cancel=tasks.cancel_job,
        pause=tasks.pause_job,
        resume=tasks.resume_job,
        reconfigure=tasks.reconfigure_job,
        job_spec=tasks.job_spec,
        failures=tasks.job_failures,
        host_stats=tasks.host_stats,
        stats=tasks.job_stats,
        queues=tasks.queue_lengths,
        nodes=lambda with_hosts: tasks.ring_nodes(with_hosts=with_hosts),
        resize_node=tasks.resize_node,
        daily=tasks.job_daily,
        analyses=tasks.analysis_runs,
        logs=tasks.read_logs,
    )
