"""The job API and dashboard served by ``vcrawl serve``."""

from __future__ import annotations

from api.server import JobApi, make_server

__all__ = ["JobApi", "make_server", "real_api"]


def real_api(token: str | None) -> JobApi:
    """The API over this process's configured cluster (``tasks.configure`` first, or the env)."""
    import tasks
    from celeryconfig import ANALYSIS_QUEUE, DOWNLOAD_QUEUE, DYNAMIC_QUEUE

    frontier = tasks.deps.frontier()

    def queues() -> dict[str, int]:
        # kombu's Redis transport keeps a queue as a list per priority step: 'name' and 'name\x06\x16N'.
        client = tasks.deps.redis_client()
        pipe = client.pipeline(transaction=False)
        names = (DOWNLOAD_QUEUE, DYNAMIC_QUEUE, ANALYSIS_QUEUE)
        steps = ("", "\x06\x163", "\x06\x166", "\x06\x169")
        for name in names:
            for step in steps:
                pipe.llen(name + step)
        counts = pipe.execute()
        return {name: sum(counts[i * len(steps) : (i + 1) * len(steps)]) for i, name in enumerate(names)}

    return JobApi(
        token=token,
        start_job=tasks.start_job,
        job_status=tasks.job_status,
        jobs=frontier.jobs,
        cancel=tasks.cancel_job,
        pause=tasks.pause_job,
        resume=tasks.resume_job,
        reconfigure=tasks.reconfigure_job,
        failures=frontier.failures,
        host_stats=frontier.host_stats,
        stats=frontier.stats,
        queues=queues,
    )
