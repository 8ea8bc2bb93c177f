"""One error hierarchy for vcrawl, safe to cross process boundaries.

::

    VcrawlError
    ├── ConfigError        bad settings, raised at start-up
    ├── PermanentError     retrying cannot help
    │   ├── InvalidTask        a payload field is wrong (refused at ``crawl.delay``)
    │   ├── UnknownComponent   no analyzer / fetcher / storage backend of that name
    │   ├── StorageRefused     a storage location outside the configured roots
    │   ├── MissingPage        the stored page an analysis needs is gone
    │   ├── NotJson            an api page's body is neither JSON nor JSON Lines
    │   ├── DownloadFailed     final non-200 status, too large, too many redirects, ...
    │   │   └── RobotsDisallowed  robots.txt disallows the URL (never requested)
    │   └── AttemptsExhausted  redelivered past its retry budget (its runs kept killing workers)
    ├── ProgramFailed      an external analyzer program failed on a page (retried as any analyzer)
    └── RetryableError     transient
        ├── FetchFailed        timeout, connection error, 429, 5xx
        ├── StorageFailed      the store failed for now (HDFS down, a 5xx from WebHDFS)
        ├── RecordsUnavailable the records database is out of reach (retried until it is back)
        └── ClusterDown        a watched cluster's Redis does not answer (``vcrawl serve`` over several)

Every constructor passes its arguments to ``super().__init__`` unchanged so
``exc.args`` rebuilds the exception (Celery serializes exceptions as JSON).
Attributes are plain ``str``/``int``/``float``.
"""

from __future__ import annotations

import re

__all__ = [
    "AnalysisFailed",
    "AttemptsExhausted",
    "ClusterDown",
    "ConfigError",
    "DownloadFailed",
    "FetchFailed",
    "InvalidTask",
    "MissingPage",
    "NotJson",
    "PermanentError",
    "ProgramFailed",
    "RecordsUnavailable",
    "RetryableError",
    "RobotsDisallowed",
    "StorageFailed",
    "StorageRefused",
    "UnknownComponent",
    "VcrawlError",
    "checked_regex",
    "kind_of",
]


class VcrawlError(Exception):
    """Base of every error vcrawl raises on purpose."""

    reason: str = "error"


class ConfigError(VcrawlError):
    """A setting is missing or malformed; names the variable and the value."""

    reason = "config"


class PermanentError(VcrawlError):
    """Retrying the same work cannot succeed."""


class InvalidTask(PermanentError, ValueError):
    """A task payload is refused; ``field`` names the offending field."""

    reason = "invalid_task"

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(field, problem)
        self.field, self.problem = field, problem

    def __str__(self) -> str:
        return f"{self.field}: {self.problem}"


def kind_of(value: object) -> str:
    """What ``value`` is, for an ``InvalidTask`` message: its type's name, ``null`` for None.

    >>> kind_of([1]), kind_of(None)
    ('list', 'null')
    """
    return "null" if value is None else type(value).__name__


def checked_regex(pattern: str, where: str) -> re.Pattern[str]:
    """``pattern`` compiled, for a spec's or payload's key ``where``.

    Raises:
        InvalidTask: not a regex Python can compile (also a huge repeat count, deep nesting).
    """
    try:
        return re.compile(pattern)
    except (re.error, OverflowError, RecursionError) as exc:
        raise InvalidTask(where, f"invalid regex {pattern!r}: {exc}") from None


class UnknownComponent(PermanentError, ValueError):
    """A registry has no entry under the given name."""

    reason = "unknown_component"

    def __init__(self, kind: str, name: str, known: list[str]) -> None:
        super().__init__(kind, name, known)
        self.kind, self.name, self.known = kind, name, list(known)

    def __str__(self) -> str:
        return f"no {self.kind} {self.name!r}; known: {', '.join(self.known) or '(none)'}"


class StorageRefused(PermanentError, ValueError):
    """A storage location escapes the configured roots or names an unknown backend."""

    reason = "storage_refused"

    def __init__(self, location: str, problem: str) -> None:
        super().__init__(location, problem)
        self.location, self.problem = location, problem

    def __str__(self) -> str:
        return f"storage location {self.location!r} refused: {self.problem}"


class MissingPage(PermanentError):
    """The stored page an analysis needs does not exist."""

    reason = "missing_page"

    def __init__(self, location: str) -> None:
        super().__init__(location)
        self.location = location

    def __str__(self) -> str:
        return f"stored page not found: {self.location}"


class NotJson(PermanentError):
    """An api page's body is neither one JSON document nor JSON Lines."""

    reason = "not_json"

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.url = url

    def __str__(self) -> str:
        return f"{self.url}: the body is neither JSON nor JSON Lines"


class DownloadFailed(PermanentError):
    """A download ended for good: a final non-200 status, a body over the cap, ..."""

    def __init__(self, url: str, reason: str, http_status: int | None = None) -> None:
        super().__init__(url, reason, http_status)
        self.url, self.reason, self.http_status = url, reason, http_status

    def __str__(self) -> str:
        status = f" (HTTP {self.http_status})" if self.http_status is not None else ""
        return f"download of {self.url} failed: {self.reason}{status}"


class RobotsDisallowed(DownloadFailed):
    """robots.txt disallows the URL for our token: it was not requested (RFC 9309)."""

    def __init__(self, url: str) -> None:
        super().__init__(url, "robots_blocked")
        self.args = (url,)  # Celery rebuilds the error from its args

    def __str__(self) -> str:
        return f"robots.txt disallows {self.url}"


class AttemptsExhausted(PermanentError):
    """A task came back more often than its retries allow (each run died with its worker)."""

    reason = "too_many_attempts"

    def __init__(self, stage: str, attempts: int) -> None:
        super().__init__(stage, attempts)
        self.stage, self.attempts = stage, attempts

    def __str__(self) -> str:
        return f"{self.stage} started {self.attempts} times without finishing; giving up"


class ProgramFailed(VcrawlError):
    """An external analyzer program failed on a page (exit status, signal, timeout, bad output).

    Neither permanent nor retryable: it is the analyzer's failure, not the infrastructure's, so it
    is retried and then alerted like an exception raised by any analyzer.
    """

    reason = "program_failed"

    def __init__(self, analyzer: str, url: str, problem: str) -> None:
        super().__init__(analyzer, url, problem)
        self.analyzer, self.url, self.problem = analyzer, url, problem

    def __str__(self) -> str:
        return f"analyzer program {self.analyzer!r} failed on {self.url}: {self.problem}"


class RetryableError(VcrawlError):
    """A transient failure: the same work may succeed later."""


class FetchFailed(RetryableError):
    """A fetch failed in a way a later attempt can fix (timeout, 5xx, 429, ...)."""

    def __init__(
        self,
        url: str,
        reason: str,
        http_status: int | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(url, reason, http_status, retry_after_s)
        self.url, self.reason = url, reason
        self.http_status, self.retry_after_s = http_status, retry_after_s

    def __str__(self) -> str:
        status = f" (HTTP {self.http_status})" if self.http_status is not None else ""
        return f"fetch of {self.url} failed: {self.reason}{status}"


class StorageFailed(RetryableError):
    """A store failed in a way a later attempt can fix (a NameNode restarting, a 5xx)."""

    reason = "storage_failed"

    def __init__(self, location: str, problem: str) -> None:
        super().__init__(location, problem)
        self.location, self.problem = location, problem

    def __str__(self) -> str:
        return f"storage at {self.location!r} failed: {self.problem}"


class RecordsUnavailable(RetryableError):
    """The records database (``VCRAWL_RECORDS_URL``) could not take or give records now: down,
    restarting, too slow. ``target`` is its URL without the password."""

    reason = "records_unavailable"

    def __init__(self, target: str, problem: str) -> None:
        super().__init__(target, problem)
        self.target, self.problem = target, problem

    def __str__(self) -> str:
        return f"records database {self.target} unavailable: {self.problem}"


class ClusterDown(RetryableError):
    """A cluster ``vcrawl serve`` watches cannot be reached now; ``reason`` holds no password."""

    def __init__(self, cluster: str, reason: str) -> None:
        super().__init__(cluster, reason)
        self.cluster, self.reason = cluster, reason

    def __str__(self) -> str:
        return f"cluster {self.cluster} is down: {self.reason}"


class AnalysisFailed(VcrawlError):
    """A batch analysis or replay run ended without a result (its error says why)."""

    def __init__(self, run: str, error: str) -> None:
        super().__init__(run, error)
        self.run, self.error = run, error

    def __str__(self) -> str:
        return f"run {self.run} failed: {self.error}"
