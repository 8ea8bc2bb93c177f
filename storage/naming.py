"""Default storage locations derived from URLs, relative to the data root, and who may write where.

The data root is shared by areas that never overlap: a crawl job writes only under
``jobs/<job id>/`` (``JOBS_DIR``), single ``crawl.delay`` tasks only under ``pages/`` and
``results/`` (``SINGLE_TASK_AREAS``), and vcrawl's own state lives in dot-directories
(``.spool/``, ``.vcrawl-redis/``). ``single_task_area_problem`` is the rule a single task's
``save_path`` and ``result_path`` are held to.

A page's or result's location is ``<host>/<up to 3 directories>/<slug>__<hash>.<ext>``: readable segments made
only of ``[a-z0-9._-]``, plus the first 10 hex digits of the SHA-256 of the full URL so URLs that
slug alike (query strings, case, punctuation) never share a file. Callers pass the canonical URL
when equivalent spellings should share a location.
"""

from __future__ import annotations

import functools
import hashlib
import re
import unicodedata
from urllib.parse import SplitResult, unquote, urlsplit

__all__ = [
    "ANALYSES_DIR",
    "FETCH_LOG_DIR",
    "JOBS_DIR",
    "PAGES_DIR",
    "RESULTS_DIR",
    "SINGLE_TASK_AREAS",
    "analyses_result_location",
    "job_analysis_run_location",
    "job_fetch_log_location",
    "job_page_location",
    "job_records_location",
    "job_replay_location",
    "job_result_location",
    "job_warc_location",
    "page_location",
    "result_location",
    "single_task_area_problem",
]

PAGES_DIR = "pages"
"""Single tasks' pages (``page_location``); a job keeps its own ``pages/`` under its folder."""
RESULTS_DIR = "results"
"""Single tasks' analysis results (``result_location``); a job keeps its own ``results/`` under its folder."""
JOBS_DIR = "jobs"
"""One folder per crawl job, ``jobs/<job id>/``: everything the job writes."""
ANALYSES_DIR = "analyses"
"""Batch analyses over several jobs at once (``analyses_result_location``): they belong to no one job."""
FETCH_LOG_DIR = "fetch-log"
"""A job's fetch log parts (``jobs/<job>/fetch-log/``): one JSON line per URL it finished."""
SINGLE_TASK_AREAS = (PAGES_DIR, RESULTS_DIR)
"""The top-level directories of the data root a single task's ``save_path``/``result_path`` may name."""

_MAX_SEGMENT = 60  # characters per segment; keeps a location under ~400 characters overall
_MAX_DIRS = 3
_HASH_CHARS = 10
_UNSAFE = re.compile(r"[^a-z0-9._-]+")
_DASHES = re.compile(r"-{2,}")
_PAGE_SUFFIX = re.compile(r"\.html?$", re.IGNORECASE)
_ANALYZER = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}\Z")
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}\Z")
_DEFAULT_PORTS = {"http": 80, "https": 443}


def page_location(url: str) -> str:
    """Return where the page fetched from `url` is stored by default.

    >>> page_location("https://Example.com/products/widget-1")
    'pages/example.com/products/widget-1__31c94e6afd.html'
    >>> page_location("https://example.com/products/widget-1?color=red")
    'pages/example.com/products/widget-1__fd793cff24.html'
    >>> page_location("http://example.com:8080/")
    'pages/example.com_8080/index__4cc86262d3.html'
    >>> page_location("https://bücher.example/Café/Über%20uns.html")
    'pages/xn--bcher-kva.example/cafe/uber-uns__7e6f4fb0f7.html'
    >>> page_location("https://example.com/a/b/c/d/e/page")
    'pages/example.com/a/b/c/page__4f5bc4141d.html'
    """
    return f"{PAGES_DIR}/{_stem(url)}.html"


def job_page_location(job_id: str, cycle: int, url: str) -> str:
    """Where a crawl job stores the page fetched from ``url``; a scheduled job keeps one folder per cycle.

    >>> job_page_location("shop", 0, "https://example.com/a")
    'jobs/shop/pages/example.com/a__2dce0a4c50.html'
    >>> job_page_location("shop", 3, "https://example.com/a")
    'jobs/shop/cycle-3/pages/example.com/a__2dce0a4c50.html'
    """
    return f"{_job_folder(job_id, cycle if cycle else None)}/{page_location(url)}"


def job_result_location(job_id: str, analyzer: str, cycle: int | None) -> str:
    """Where a batch analyzer's result over a job (or over one cycle of it) is written.

    >>> job_result_location("shop", "site-report", None)
    'jobs/shop/results/site-report.json'
    >>> job_result_location("shop", "site-report", 3)
    'jobs/shop/cycle-3/results/site-report.json'
    """
    return f"{_job_folder(job_id, cycle)}/{RESULTS_DIR}/{analyzer}.json"


def analyses_result_location(run_id: str, analyzer: str) -> str:
    """Where a batch analyzer's result over several jobs is written (``vcrawl analyze --jobs``).

    >>> analyses_result_location("site-report-20261130-101500-spark-3fa2", "site-report")
    'analyses/site-report-20261130-101500-spark-3fa2/site-report.json'
    """
    return f"{ANALYSES_DIR}/{_checked_name(run_id)}/{_checked_name(analyzer)}.json"


def job_records_location(job_id: str) -> str:
    """Where a job's record parts are (``vcrawl export`` reads them).

    >>> job_records_location("shop"), job_warc_location("shop"), job_fetch_log_location("shop")
    ('jobs/shop/records', 'jobs/shop/warc', 'jobs/shop/fetch-log')
    """
    return f"{_job_folder(job_id, None)}/records"


def job_warc_location(job_id: str) -> str:
    """Where a job's WARC files and their CDXJ indexes are."""
    return f"{_job_folder(job_id, None)}/warc"


def job_fetch_log_location(job_id: str) -> str:
    """Where a job's fetch log parts are."""
    return f"{_job_folder(job_id, None)}/{FETCH_LOG_DIR}"


def job_analysis_run_location(job_id: str, run_id: str) -> str:
    """Where a batch analysis run keeps its work files (the map's parts).

    >>> job_analysis_run_location("shop", "r1"), job_replay_location("shop", "r2")
    ('jobs/shop/analysis/r1', 'jobs/shop/replays/r2')
    """
    return f"{_job_folder(job_id, None)}/analysis/{run_id}"


def job_replay_location(job_id: str, run_id: str) -> str:
    """Where a replay's records (``records/``) and its summary (``summary.json``) go, beside the crawl's own."""
    return f"{_job_folder(job_id, None)}/replays/{run_id}"


def single_task_area_problem(relative: str) -> str | None:
    """Why a single task may not write at ``relative`` (a path under the data root), or None if it may.

    A single task writes a file under ``pages/`` or ``results/``, never into a hidden file or
    directory there: other jobs' files, their records and vcrawl's own state are out of its reach.

    >>> single_task_area_problem("pages/example.com/a.html") is None
    True
    >>> single_task_area_problem("jobs/shop/pages/a.html")
    'is outside the single-task areas: a single task writes only under pages/ or results/ of the data root'
    >>> single_task_area_problem("results/.cache/a.json")
    "has the hidden component '.cache': a single task never writes hidden files or directories"
    """
    area, _, rest = relative.partition("/")
    if area not in SINGLE_TASK_AREAS or not rest:
        areas = " or ".join(f"{name}/" for name in SINGLE_TASK_AREAS)
        return f"is outside the single-task areas: a single task writes only under {areas} of the data root"
    for part in rest.split("/"):
        if part.startswith("."):
            return f"has the hidden component {part!r}: a single task never writes hidden files or directories"
    return None


def result_location(url: str, analyzer: str) -> str:
    """Return where `analyzer`'s result for the page at `url` is stored by default.

    >>> result_location("https://Example.com/products/widget-1", "links")
    'results/links/example.com/products/widget-1__31c94e6afd.json'

    Raises:
        ValueError: `analyzer` is not a registry name (letters, digits, ``_.-``, at most 64).
    """
    if not _ANALYZER.match(analyzer):
        raise ValueError(f"not an analyzer name: {analyzer!r}")
    return f"{RESULTS_DIR}/{analyzer}/{_stem(url)}.json"


def _checked_name(name: str) -> str:
    """A run's or analyzer's name as one path segment (it names a folder or file of its own)."""
    if not _NAME.match(name):
        raise ValueError(f"not a run or analyzer name: {name!r}")
    return name


def _job_folder(job_id: str, cycle: int | None) -> str:
    """A job's folder, or one cycle's folder inside it."""
    return f"{JOBS_DIR}/{job_id}" + ("" if cycle is None else f"/cycle-{cycle}")


def _stem(url: str) -> str:
    parts = urlsplit(url)
    *directories, last = parts.path.split("/")
    segments = [slug for slug in (_slug(unquote(raw)) for raw in directories) if slug][:_MAX_DIRS]
    name = _slug(_PAGE_SUFFIX.sub("", unquote(last))) or "index"
    digest = hashlib.sha256(url.encode("utf-8", "surrogatepass")).hexdigest()[:_HASH_CHARS]
    return "/".join([_netloc_host(parts.scheme, parts.netloc), *segments, f"{name}__{digest}"])


@functools.lru_cache(maxsize=4096)
def _netloc_host(scheme: str, netloc: str) -> str:
    # A crawl stores thousands of pages per host: its IDNA encoding and slug are worked out once.
    return _host(urlsplit(f"{scheme}://{netloc}/"))


def _host(parts: SplitResult) -> str:
    hostname = parts.hostname or ""
    try:
        hostname = hostname.encode("idna").decode("ascii")
    except UnicodeError:
        pass  # not valid IDNA (empty or over-long label, odd characters): the slug below still makes it safe
    # No collapsing of "--" here (punycode needs it); keep the end of an over-long host, since the
    # registrable domain says more than the first labels.
    if ":" in hostname:  # IPv6 literal, already without its brackets
        host = "ipv6-" + _slug(hostname)
    else:
        host = _trim(_UNSAFE.sub("-", _ascii(hostname)), keep_end=True) or "no-host"
    try:
        port = parts.port
    except ValueError:  # a malformed port: the hash of the full URL still tells such URLs apart
        port = None
    if port is not None and port != _DEFAULT_PORTS.get(parts.scheme.lower()):
        host = f"{host}_{port}"
    return host


@functools.lru_cache(maxsize=8192)  # a site's directory names repeat on every page under them
def _slug(text: str) -> str:
    """Return `text` as lowercase ``[a-z0-9._-]``, at most 60 characters, never ``.`` or ``..``.

    >>> _slug("Über uns!!  (2024)")
    'uber-uns-2024'
    >>> [_slug(".."), _slug(".hidden"), _slug("日本語")]
    ['', 'hidden', '']
    """
    return _trim(_DASHES.sub("-", _UNSAFE.sub("-", _ascii(text))))


def _ascii(text: str) -> str:
    # NFKD splits accents off their letters, so "Café" keeps its "cafe" instead of losing the "é".
    return unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii").lower()


def _trim(slug: str, keep_end: bool = False) -> str:
    # Leading dots would hide files; "." and ".." must never be a segment; trim again after cutting.
    slug = slug.strip("-.")
    slug = slug[-_MAX_SEGMENT:] if keep_end else slug[:_MAX_SEGMENT]
    return slug.strip("-.")
