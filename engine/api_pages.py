"""The ``api`` page type around the one fetch and analysis steps: its request headers, the secret kept
out of what is stored, the API's rate-limit headers, and its answers read into records and links.

An api page is fetched by the static fetcher (the same network guard, proxies and body limits),
asking for JSON and carrying the rule's ``auth`` secret, which only the worker's settings hold
(``VCRAWL_API_AUTH_<NAME>``). Its answer is read by ``analyzers.api``: every record becomes a
record of the job; the next page is a link at the page's own depth (paging never spends
``max_depth``), follow-up URLs are links one level deeper.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from analyzers import ApiAnswer, read_answer
from engine.jobs import Link
from engine.outcomes import FetchOutcome
from fetchers import FetchResult
from frontier.url_ids import url_id
from storage import Storage
from vcrawl.api_rules import ApiSpec, auth_variable
from vcrawl.errors import ConfigError, InvalidTask
from vcrawl.payloads import FetchedPage, Rule

__all__ = [
    "ACCEPT",
    "MASK",
    "api_headers",
    "api_links",
    "api_records",
    "auth_header",
    "check_secrets",
    "masked_headers",
    "masked_result",
    "rate_limit_wait_s",
    "read_api_page",
    "single_result",
    "with_rate_limit",
]

logger = logging.getLogger(__name__)

ACCEPT = "application/json, application/x-ndjson;q=0.9, */*;q=0.1"
MASK = "***"
# "Header-Name: value" sets that header; any other value is the Authorization header's.
_HEADER_LINE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9-]{0,63}):\s*(\S.*)\Z")
# A reset this large is a point in time (epoch seconds), not seconds from now (GitHub's X-RateLimit-Reset).
_EPOCH_FROM = 1_000_000_000


def auth_header(secret: str) -> tuple[str, str]:
    """The header a secret's value sets.

    >>> auth_header("Bearer abc"), auth_header("X-Api-Key: k-123")
    (('Authorization', 'Bearer abc'), ('X-Api-Key', 'k-123'))
    """
    secret = secret.strip()
    if (match := _HEADER_LINE.match(secret)) is not None:
        return match.group(1), match.group(2).strip()
    return "Authorization", secret


def api_headers(rule: Rule, secrets: Mapping[str, str]) -> dict[str, str]:
    """The headers of an api page's request: JSON asked for, and the rule's auth header.

    Raises:
        ConfigError: the rule names an auth secret this worker does not have (no retry can mend it:
            a job fails and says which variable to set).
    """
    headers = {"Accept": ACCEPT}
    if rule.auth is None:
        return headers
    secret = secrets.get(rule.auth)
    if secret is None or not secret.strip():
        raise ConfigError(
            f"auth {rule.auth!r} of the api rule {rule.pattern!r}: {auth_variable(rule.auth)} is not set on this worker"
        )
    name, value = auth_header(secret)
    headers[name] = value
    return headers


def check_secrets(rules: Sequence[Rule], secrets: Mapping[str, str]) -> None:
    """Refuse rules naming an auth secret missing from ``secrets``: for a process whose settings are
    its workers' (``vcrawl crawl`` runs its own). A job submitted to a cluster is not checked here: the
    submitting process may hold no secrets; a worker without one fails the job, naming the variable.

    Raises:
        InvalidTask: naming ``rules[<i>].auth`` and the variable to set.
    """
    for index, rule in enumerate(rules):
        if rule.auth is not None and rule.auth not in secrets:
            raise InvalidTask(f"rules[{index}].auth", f"{auth_variable(rule.auth)} is not set for the workers")


def masked_headers(headers: Mapping[str, str], rule: Rule, secrets: Mapping[str, str]) -> dict[str, str]:
    """``headers`` with the rule's auth header's value as ``***`` (WARC request records keep headers)."""
    if rule.auth is None or rule.auth not in secrets:
        return dict(headers)
    name = auth_header(secrets[rule.auth])[0].lower()
    return {key: MASK if key.lower() == name else value for key, value in headers.items()}


def rate_limit_wait_s(headers: Mapping[str, str], now: float, longest_s: float) -> float:
    """How long the host wants no request: its rate limit is spent (``X-RateLimit-Remaining: 0`` or
    ``RateLimit-Remaining: 0``) until ``X-RateLimit-Reset``/``RateLimit-Reset`` (seconds from now, or
    epoch seconds when that large); at most ``longest_s``; 0 when the limit is not spent or unknown.
    ``headers`` are lower-cased (``FetchResult.headers``).

    >>> rate_limit_wait_s({"x-ratelimit-remaining": "0", "x-ratelimit-reset": "7"}, 0.0, 600.0)
    7.0
    >>> rate_limit_wait_s({"ratelimit-remaining": "0", "ratelimit-reset": "1700000030"}, 1700000000.0, 600.0)
    30.0
    >>> rate_limit_wait_s({"x-ratelimit-remaining": "12", "x-ratelimit-reset": "7"}, 0.0, 600.0)
    0.0
    """
    for prefix in ("x-ratelimit-", "ratelimit-"):
        remaining = _number(headers.get(f"{prefix}remaining"))
        if remaining is None or remaining > 0:
            continue
        reset = _number(headers.get(f"{prefix}reset"))
        if reset is None:
            continue
        wait = reset - now if reset >= _EPOCH_FROM else reset
        return max(0.0, min(wait, longest_s))
    return 0.0


def _number(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        number = float(value.split(",", 1)[0].strip())  # a repeated header joined by requests: the first
    except ValueError:
        return None
    return number if number == number and abs(number) != float("inf") else None


def with_rate_limit(outcome: FetchOutcome, result: FetchResult, now: float, longest_s: float) -> FetchOutcome:
    """The outcome with the host's wait its rate-limit headers ask for (0: the outcome as it is)."""
    wait_s = rate_limit_wait_s(result.headers, now, longest_s)
    if wait_s <= 0:
        return outcome
    logger.info("%s: rate limit spent, host waits %.1fs", result.url, wait_s)
    return replace(outcome, visit=replace(outcome.visit, host_wait_s=wait_s))


def masked_result(result: FetchResult, rule: Rule, secrets: Mapping[str, str]) -> FetchResult:
    """The result with the secret masked in the request headers it carries (for WARC)."""
    if rule.auth is None:
        return result
    return replace(result, request_headers=masked_headers(result.request_headers, rule, secrets))


def read_api_page(store: Storage, page: FetchedPage, spec: ApiSpec) -> ApiAnswer:
    """Read a stored api page's answer by its rule's api spec.

    Raises:
        MissingPage: the stored page is gone.
        NotJson: the body is neither JSON nor JSON Lines.
    """
    return read_answer(store.read_bytes(page.save_path), page.content_type, page.url, spec)


def single_result(answer: ApiAnswer) -> dict[str, Any]:
    """A single task's result of an api page: its records, and the next page and follow-ups it names
    (a single task fetches one URL: they are reported, not fetched)."""
    return {"records": list(answer.records), "next": answer.next_url, "follow": list(answer.follow)}


def api_links(answer: ApiAnswer, page: FetchedPage, redirects_left: int) -> tuple[Link, ...]:
    """The answer's links: the next page at the page's depth, follow-ups one deeper."""
    links = [Link(answer.next_url, page.depth, redirects_left)] if answer.next_url is not None else []
    links.extend(Link(url, page.depth + 1, redirects_left) for url in answer.follow)
    return tuple(links)


def api_records(answer: ApiAnswer, page: FetchedPage, job_id: str) -> list[dict[str, Any]]:
    """The job's records of one answer, one per API record, in the shape of every job record."""
    return [
        {
            "url": page.url,
            "url_id": url_id(page.url),
            "final_url": page.final_url,
            "fetched_at": page.fetched_at,
            "ip": page.ip,
            "job": job_id,
            "analyzer": "api",
            "index": index,
            "data": record,
        }
        for index, record in enumerate(answer.records)
    ]
