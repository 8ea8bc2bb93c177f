"""The crawl pipeline as plain code: no Celery in here.

``tasks/`` (the Celery shell) decodes messages and calls these functions; the CLI and the API reach
them through the ``tasks`` facade. Below this floor: fetchers, analyzers, frontier, storage, telemetry,
vcrawl. Keeping the cluster whole (``cluster``), read models (``views``) and analysis after the crawl
(``batch_analysis``) are on the floor above.

- ``fetch_one`` (``engine.fetch_step``): the one fetch step, robots.txt to stored body, one outcome per URL,
  a package of its phases; its ``FetchContext`` holds ``FetchServices``, a ``FetchPolicy`` and a job's ``JobHooks``.
- ``analyze_one`` (``engine.analysis_step``): the one analysis step, links and the analyzer's result.
- ``run_fetch_batch`` / ``fold_release`` (``engine.fetch_batch``): a job's fetch batch and its lease's release;
  ``CrawlEnv`` (``engine.crawl_env``): what a job's batches use in a worker process.
- ``run_analyze_batch`` (``engine.analyze_batch``): a job's analysis batch, retries and admission.
- ``run_single_fetch`` / ``analyze_page`` (``engine.single``): a single ``crawl.delay`` task's steps.
- ``engine.api_pages``: ``page_type: api`` around both steps: its headers and secret, rate limits, records.
- ``engine.jobs``: job runtime, admission (``Link``); ``engine.trail``: a single task's status trail;
  ``engine.pump``: the frontier pump; ``engine.cycles``: scheduled cycles; ``engine.sitemaps``:
  sitemaps as a way in; ``engine.fetch_log``: one line per URL a job ended.
"""

from __future__ import annotations

from engine.analysis_step import Analysis, analyze_one
from engine.analyze_batch import AnalysisRetry, CarriedAnalysis, abandon_analysis, run_analyze_batch
from engine.crawl_env import CrawlEnv
from engine.fetch_batch import fetch_context, fold_release, run_fetch_batch
from engine.fetch_step import (
    Cycle,
    FetchContext,
    FetchItem,
    FetchPolicy,
    FetchServices,
    JobHooks,
    fetch_one,
    read_robots_rules,
    stops_batch,
)
from engine.outcomes import (
    Failed,
    FetchOutcome,
    Redirected,
    Retry,
    RobotsBlocked,
    RobotsFetched,
    Stored,
    Unchanged,
    Visit,
)
from engine.single import ComeBack, SingleEnv, analyze_page, fetch_single, run_single_fetch, validate

__all__ = [
    "Analysis",
    "AnalysisRetry",
    "CarriedAnalysis",
    "ComeBack",
    "CrawlEnv",
    "Cycle",
    "Failed",
    "FetchContext",
    "FetchItem",
    "FetchOutcome",
    "FetchPolicy",
    "FetchServices",
    "JobHooks",
    "Redirected",
    "Retry",
    "RobotsBlocked",
    "RobotsFetched",
    "SingleEnv",
    "Stored",
    "Unchanged",
    "Visit",
    "abandon_analysis",
    "analyze_one",
    "analyze_page",
    "fetch_context",
    "fetch_one",
    "fetch_single",
    "fold_release",
    "read_robots_rules",
    "run_analyze_batch",
    "run_fetch_batch",
    "run_single_fetch",
    "stops_batch",
    "validate",
]
