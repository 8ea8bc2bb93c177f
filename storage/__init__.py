"""Where crawled pages and analysis results are kept: a router over backends keyed by URL scheme,
and every location in the data root (``storage.naming``: pages, results, a job's folder)."""

from __future__ import annotations

from storage.base import Backend, BackendFactory
from storage.local import LocalBackend
from storage.naming import (
    ANALYSES_DIR,
    JOBS_DIR,
    PAGES_DIR,
    RESULTS_DIR,
    SINGLE_TASK_AREAS,
    analyses_result_location,
    job_analysis_run_location,
    job_fetch_log_location,
    job_page_location,
    job_records_location,
    job_replay_location,
    job_result_location,
    job_warc_location,
    page_location,
    result_location,
    single_task_area_problem,
)
from storage.registry import BACKENDS, Storage
from storage.warc import REVISIT_MIME, CdxEntry, WarcWriter, lookup, read_response
from storage.webhdfs import WebHdfsBackend, webhdfs_factory

__all__ = [
    "ANALYSES_DIR",
    "BACKENDS",
    "JOBS_DIR",
    "PAGES_DIR",
    "RESULTS_DIR",
    "REVISIT_MIME",
    "SINGLE_TASK_AREAS",
    "Backend",
    "BackendFactory",
    "CdxEntry",
    "LocalBackend",
    "Storage",
    "WarcWriter",
    "WebHdfsBackend",
    "analyses_result_location",
    "job_analysis_run_location",
    "job_fetch_log_location",
    "job_page_location",
    "job_records_location",
    "job_replay_location",
    "job_result_location",
    "job_warc_location",
    "lookup",
    "page_location",
    "read_response",
    "result_location",
    "single_task_area_problem",
    "webhdfs_factory",
]
