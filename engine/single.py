"""The stages as plain functions: validate, download, analyse. No Celery in here."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from analyzers import Page, check_rules, get_analyzer, run_analysis
from fetchers import Fetcher, FetcherRegistry, FetchRequest, IdentityPool, ProxyHealth, check_status, fetch_through
from storage import Storage, page_location, result_location
from vcrawl.errors import InvalidTask, StorageRefused, UnknownComponent
from vcrawl.payloads import AnalysisJob, DownloadTask, FetchedPage, FieldRule

__all__ = ["AnalysisOutcome", "analyze_page", "download", "stored_at", "validate"]

# Response headers worth carrying to the analysis stage and later re-crawls.
_KEPT_HEADERS = ("content-type", "content-length", "etag", "last-modified", "content-language")


def validate(data: Any, fetchers: FetcherRegistry, store: Storage) -> DownloadTask:
    """Check a payload against the schema and this process's registries; fill in paths.

    Raises:
        InvalidTask: naming the first wrong field.
    """
    task = DownloadTask.from_dict(data)
    try:
        fetchers.check(task.page_type)
    except UnknownComponent as exc:
        raise InvalidTask("page_type", str(exc)) from None
    try:
        get_analyzer(task.analyzer)
    except UnknownComponent as exc:
        raise InvalidTask("analyzer", str(exc)) from None
    if task.fields is not None:
        check_rules(task.fields)
    if task.wait_for is not None:
        check_selector("wait_for", task.wait_for)
    save_path = _location("save_path", store, task.save_path, page_location(task.url))
    result_path = _location("result_path", store, task.result_path, result_location(task.url, task.analyzer))
    if save_path == result_path:
        raise InvalidTask("result_path", "must differ from save_path")
    return task.with_paths(save_path, result_path)


def download(
    task: DownloadTask,
    fetcher: Fetcher,
    identities: IdentityPool,
    store: Storage,
    proxies: ProxyHealth | None = None,
) -> FetchedPage:
    """Fetch ``task.url`` with a random identity and store a 200 body at ``task.save_path``.

    With ``proxies`` (the cluster's proxy bench), the proxy is drawn among those not cooling
    off, and a static fetch's outcome goes on its record (a proxy's fault benches it).

    Raises:
        FetchFailed: a retry may help (timeouts, connection errors, 429, 5xx).
        DownloadFailed: it will not (404, too large, redirect loop, ...).
    """
    assert task.save_path is not None, "validate() fills in save_path"
    request = FetchRequest(
        url=task.url,
        user_agent=identities.user_agent(),
        referer=identities.referer(),
        proxy=identities.proxy() if proxies is None else proxies.draw(identities.proxies),
        js_function=task.js_function,
        wait_for=task.wait_for,
    )
    result = fetch_through(fetcher, request, proxies) if task.page_type == "static" else fetcher.fetch(request)
    check_status(result)
    store.write_bytes(task.save_path, result.body)
    return FetchedPage(
        url=task.url,
        final_url=result.final_url,
        save_path=task.save_path,
        http_status=result.status,
        bytes=len(result.body),
        content_type=result.content_type,
        elapsed_s=result.elapsed_s,
        headers={name: result.headers[name] for name in _KEPT_HEADERS if name in result.headers},
    )


@dataclass(frozen=True)
class AnalysisOutcome:
    """Where an analysis result went and how much it holds."""

    result_path: str
    result_bytes: int
    items: int


def analyze_page(fetched: FetchedPage, job: AnalysisJob, store: Storage) -> AnalysisOutcome:
    """Read the stored page, run the named analyzer, write its JSON result.

    Raises:
        MissingPage: the stored page is gone.
        UnknownComponent: no analyzer of that name in this process.
    """
    body = store.read_bytes(fetched.save_path)
    page = Page(url=fetched.final_url, body=body, content_type=fetched.content_type)
    result = run_analysis(page, job.analyzer, job.fields)
    data = json.dumps(result, ensure_ascii=False, separators=(",", ":")).encode()
    store.write_bytes(job.result_path, data)
    return AnalysisOutcome(stored_at(store, job.result_path), len(data), _count_items(result))


def _count_items(result: dict[str, Any]) -> int:
    """Links found, or fields that matched, for the status trail."""
    if isinstance(result.get("links"), list):
        return len(result["links"])
    fields = result.get("fields")
    if isinstance(fields, dict):
        return sum(1 for value in fields.values() if value not in (None, []))
    return 0


def check_selector(field: str, selector: str) -> None:
    """Refuse a CSS selector that does not compile.

    Raises:
        InvalidTask: naming ``field``.
    """
    try:
        check_rules({"wait_for": FieldRule(css=selector)})
    except InvalidTask as exc:
        raise InvalidTask(field, exc.problem) from None


def stored_at(store: Storage, location: str) -> str:
    """Where ``location`` is in this process's storage (an absolute path or a URL)."""
    return store.resolve(location, location)


def _location(name: str, store: Storage, given: str | None, default: str) -> str:
    """Check a storage location; keep it relative to the data root when it was given so.

    Relative locations travel in messages as they are, so each worker resolves them
    against its own ``VCRAWL_DATA``; absolute paths and URLs are checked and kept whole.
    """
    location = default if given is None else given
    try:
        resolved = store.resolve(location, default)
    except StorageRefused as exc:
        raise InvalidTask(name, str(exc)) from None
    if os.path.isabs(location) or "://" in location:
        return resolved
    return os.path.normpath(location)
