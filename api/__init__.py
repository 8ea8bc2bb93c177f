"""The job API and dashboard served by ``vcrawl serve``."""

from __future__ import annotations

from api.server import JobApi, make_server

__all__ = ["JobApi", "make_server", "real_api"]


def real_api(token: str | None) -> JobApi:
    """The API over this process's configured cluster (``tasks.configure`` first, or the env)."""
    import tasks
    from celeryconfig import ANALYSIS_QUEUE, DOWNLOAD_QUEUE, DYNAMIC_QUEUE, queue_lists

    frontier = tasks.deps.frontier()

    def queues() -> dict[str, int]:
        client = tasks.deps.redis_client()
        pipe = client.pipeline(transaction=False)
        names = (DOWNLOAD_QUEUE, DYNAMIC_QUEUE, ANALYSIS_QUEUE)
        for name in names:
            for key in queue_lists(name):
                pipe.llen(key)
        counts = pipe.execute()
        steps = len(queue_lists(DOWNLOAD_QUEUE))
        return {name: sum(counts[i * steps : (i + 1) * steps]) for i, name in enumerate(names)}

    return JobApi(
        token=token,
        start_job=tasks.start_job,
        job_status=tasks.job_status,
        jobs=frontier.jobs.jobs,
        cancel=tasks.cancel_job,
        pause=tasks.pause_job,
        resume=tasks.resume_job,
        reconfigure=tasks.reconfigure_job,
        failures=frontier.stats.failures,
        host_stats=frontier.stats.host_stats,
        stats=frontier.stats.stats,
        queues=queues,
    )
