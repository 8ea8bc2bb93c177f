"""``vcrawl.analyze``: run the named analyzer on a stored page, on the ``analysis`` queue."""

from __future__ import annotations

from celery import Task

from engine import single as pipeline
from tasks import deps
from tasks.app import app
from vcrawl.errors import AttemptsExhausted, PermanentError
from vcrawl.payloads import AnalysisJob, FetchedPage

__all__ = ["analyze"]


@app.task(
    name="vcrawl.analyze", bind=True, acks_late=True, max_retries=None, ignore_result=True, throws=(PermanentError,)
)
def analyze(self: Task, fetched: dict, job: dict) -> dict:
    """Analyse a fetched page; retried with backoff unless the error is permanent."""
    page, analysis = FetchedPage.from_dict(fetched), AnalysisJob.from_dict(job)
    trail = deps.trail()
    attempt = trail.analyzing(analysis.trail_id)
    if attempt > deps.analysis_retry().retries + 1:
        raise AttemptsExhausted("analysis", attempt)  # redelivered after killing workers: stop
    try:
        outcome = pipeline.analyze_page(page, analysis, deps.storage())
    except PermanentError:
        raise
    except Exception as exc:  # the task edge: any analyzer bug is retried, then alerted
        delay_s = deps.analysis_retry().delay_for(attempt)
        if delay_s is None:
            raise
        trail.will_retry(analysis.trail_id, "analysis", f"{type(exc).__name__}: {exc}", delay_s)
        raise self.retry(exc=exc, countdown=delay_s) from exc
    trail.analyzed(analysis.trail_id, outcome.result_path, outcome.result_bytes, outcome.items)
    return {"trail_id": analysis.trail_id, "result_path": outcome.result_path, "items": outcome.items}
