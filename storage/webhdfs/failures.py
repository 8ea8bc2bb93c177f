"""WebHDFS failures as vcrawl's errors: what HdfsCLI and requests raise, sorted into transient, refused, missing.

Package-internal: the backend catches `FOREIGN` around every call, and `classify` says whether
to retry it or which error to raise (MissingPage, StorageRefused, StorageFailed).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from urllib.parse import urlsplit

import hdfs
import requests
import urllib3

from vcrawl.errors import MissingPage, StorageFailed, StorageRefused, VcrawlError

__all__ = ["FOREIGN", "Failure", "StreamBroken", "classify", "refuse", "text"]

logger = logging.getLogger(__name__)

_PROBLEM_CHARS = 300  # of a server's error text kept in a failure reason
# RemoteException names that mean "ask again later": HA failover, NameNode start-up, overload.
_RETRIABLE = frozenset(
    {"RetriableException", "StandbyException", "SafeModeException", "ObserverRetryOnActiveException"}
)
_DENIED = frozenset({"AccessControlException", "SecurityException"})
# Everything HdfsCLI and requests raise for a failed call; KeyError is a 2xx answer missing a field.
FOREIGN: tuple[type[Exception], ...] = (
    hdfs.HdfsError,
    requests.RequestException,
    urllib3.exceptions.HTTPError,
    KeyError,
)


@dataclass(frozen=True)
class Failure:
    """A foreign failure, sorted: its kind (``"transient"``, ``"refused"`` or ``"missing"``) and why."""

    kind: str
    problem: str

    def error(self, location: str) -> VcrawlError:
        """Return vcrawl's error for this failure at `location`."""
        if self.kind == "missing":
            return MissingPage(location)
        if self.kind == "refused":
            return refuse(location, self.problem)
        return StorageFailed(location, self.problem)


class StreamBroken(Exception):
    """A transient failure while the body was on the wire; never leaves this package."""

    def __init__(self, problem: str) -> None:
        super().__init__(problem)
        self.problem = problem


def classify(error: Exception) -> Failure:
    """Sort a foreign exception into transient, refused (permanent) or missing."""
    if isinstance(error, requests.HTTPError) and error.response is not None:
        kind = "transient" if error.response.status_code >= 500 else "refused"
        return Failure(kind, _http_problem(error.response))
    if isinstance(error, requests.RequestException | urllib3.exceptions.HTTPError):
        # Connection refused or reset, timeouts, a body cut short: the next attempt may work.
        return Failure("transient", f"{type(error).__name__}: {text(str(error))}")
    if isinstance(error, KeyError):
        return Failure("transient", f"malformed WebHDFS answer (no {error})")
    name = getattr(error, "exception", None)
    message = text(getattr(error, "message", str(error)))
    if name in _RETRIABLE:
        return Failure("transient", f"{name}: {message}")
    if name == "FileNotFoundException":
        return Failure("missing", message)
    if name in _DENIED:
        return Failure("refused", f"{name}: {message}")
    if name is None and message.startswith("Unable to rename"):
        # RENAME answered false: another writer published first, or the temp file vanished.
        return Failure("transient", f"RENAME refused: {message}")
    if name is None and message.startswith("Authentication failure"):
        return Failure("refused", "authentication failed (HTTP 401): check VCRAWL_HDFS_USER or the Kerberos ticket")
    return Failure("refused", f"{name or 'HdfsError'}: {message}")


def text(message: object) -> str:
    """Return a server's error text (str or bytes), stripped and cut to a failure reason's length."""
    decoded = message.decode("utf-8", "replace") if isinstance(message, bytes) else str(message)
    return decoded.strip()[:_PROBLEM_CHARS]


def refuse(location: str, problem: str) -> StorageRefused:
    """Return the StorageRefused for `location` (to raise), logging why at debug."""
    logger.debug("refuse storage location %r: %s", location, problem)
    return StorageRefused(location, problem)


def _http_problem(response: requests.Response) -> str:
    where = urlsplit(response.url).netloc
    try:
        remote = response.json()["RemoteException"]
        detail = f"{remote['exception']}: {text(remote['message'])}"
    except (ValueError, KeyError, TypeError):
        detail = text(response.content) or response.reason
    return f"HTTP {response.status_code} from {where}: {detail}"
