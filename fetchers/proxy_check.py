"""Checking a candidate proxy against the operator's check URL before it joins the pool.

The check URL (``VCRAWL_PROXY_CHECK_URL``) answers with what it sees of a request, as JSON in
the httpbin form: ``origin``, the address(es) the request came from (a comma-separated list when
it passed proxies that said so), and optionally ``headers``, the request's headers. It is asked
once directly, to learn the crawler's own address, then through each candidate.

A candidate passes when the check answers 200 with such JSON through it within
``max_latency_s`` (``too_slow`` otherwise), and the answer does not show the crawler's own address
in ``origin`` or in a header (X-Forwarded-For, Forwarded, X-Real-IP, ...): a *transparent* proxy
is rejected, since the sites would see and rate-limit the crawler's address through it all the
same. One that passes is ``anonymous`` when it announces itself (Via, X-Forwarded-For with another
address, ...), ``elite`` when nothing in the answer says a proxy was there.
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

from fetchers.base import SLOW_REASONS, Fetcher, FetchRequest, FetchResult
from fetchers.netguard import embedded_ipv4
from vcrawl.errors import DownloadFailed, FetchFailed

__all__ = ["CheckUnusable", "ProxyCheck", "Verdict", "check_proxy", "own_addresses", "seen_addresses"]

# Request headers by which a proxy announces itself or the client it forwards for.
_PROXY_HEADERS = frozenset(
    {"via", "x-forwarded-for", "forwarded", "x-real-ip", "client-ip", "x-client-ip", "x-proxy-id", "proxy-connection"}
)
_IP_TOKEN = re.compile(r"[0-9A-Fa-f:.]{3,}")


class CheckUnusable(Exception):
    """The check URL, asked directly, did not answer what a check needs (the harvest cannot run)."""

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(url, reason)
        self.url, self.reason = url, reason

    def __str__(self) -> str:
        return f"proxy check URL {self.url}: {self.reason}"


@dataclass(frozen=True)
class ProxyCheck:
    """What a candidate is checked with."""

    check_url: str
    max_latency_s: float = 5.0
    user_agent: str = "vcrawl"


@dataclass(frozen=True)
class Verdict:
    """A candidate's check: ``reason`` is None when it passed."""

    proxy: str
    reason: str | None
    latency_s: float | None = None
    anonymity: str = ""  # "elite" or "anonymous" when it passed; "transparent" when rejected for it

    @property
    def passed(self) -> bool:
        """True if the proxy may join the pool."""
        return self.reason is None


def seen_addresses(answer: Mapping[str, Any]) -> frozenset[str]:
    """The addresses a check answer shows: ``origin`` and the values of headers other than Host.

    >>> sorted(seen_addresses({"origin": "203.0.113.9, 198.51.100.4", "headers": {"Host": "192.0.2.1"}}))
    ['198.51.100.4', '203.0.113.9']
    >>> sorted(seen_addresses({"origin": "203.0.113.9", "headers": {"Forwarded": 'for="[2001:db8::7]"'}}))
    ['2001:db8::7', '203.0.113.9']
    """
    texts = [str(answer.get("origin", ""))]
    headers = answer.get("headers")
    if isinstance(headers, Mapping):
        texts += [str(value) for name, value in headers.items() if str(name).lower() != "host"]
    found = set()
    for text in texts:
        for token in _IP_TOKEN.findall(text):
            address = _address(token)
            if address is not None:
                found.add(address)
    return frozenset(found)


def _address(token: str) -> str | None:
    """The address in a token, normalised: an IPv4 ``a.b.c.d:port`` loses its port, and an IPv6
    address that stands for an IPv4 one (``::ffff:a.b.c.d``, as a dual-stack server shows an IPv4
    client) is that IPv4 address, so either form of the crawler's address is recognised.

    >>> _address("203.0.113.9:8080"), _address("::ffff:203.0.113.9"), _address("2001:DB8::7"), _address("::1")
    ('203.0.113.9', '203.0.113.9', '2001:db8::7', '::1')
    """
    # As it is first: stripping ".:" (a sentence's full stop) would cut "::ffff:..." and "::1".
    texts = [token, token.strip(".:")] + ([token.rsplit(":", 1)[0].strip(".:")] if token.count(":") == 1 else [])
    for text in texts:
        try:
            address = ipaddress.ip_address(text)
        except ValueError:
            continue
        return str(embedded_ipv4(address) or address)
    return None


def own_addresses(fetcher: Fetcher, check: ProxyCheck) -> frozenset[str]:
    """The addresses the check URL sees for this process, asked without a proxy.

    Raises:
        CheckUnusable: the check URL failed, or answered something other than JSON with ``origin``.
    """
    try:
        result = fetcher.fetch(FetchRequest(url=check.check_url, user_agent=check.user_agent))
    except (FetchFailed, DownloadFailed) as exc:
        raise CheckUnusable(check.check_url, exc.reason) from exc
    answer = _answer(result)
    if isinstance(answer, str):
        raise CheckUnusable(check.check_url, answer)
    own = frozenset(_address(part.strip()) for part in str(answer["origin"]).split(","))
    if None in own or not own:
        raise CheckUnusable(check.check_url, f"origin is not a list of addresses: {answer['origin']!r}")
    return cast("frozenset[str]", own)  # None refused just above


def check_proxy(fetcher: Fetcher, check: ProxyCheck, proxy: str, own: frozenset[str]) -> Verdict:
    """Ask the check URL through ``proxy``; never raises for what the proxy does.

    ``fetcher`` should give up at ``check.max_latency_s`` (its total timeout): a proxy slower
    than that is rejected either way.
    """
    request = FetchRequest(url=check.check_url, user_agent=check.user_agent, proxy=proxy)
    try:
        result = fetcher.fetch(request)
    except (FetchFailed, DownloadFailed) as exc:
        reason = "too_slow" if exc.reason in SLOW_REASONS else exc.reason
        return Verdict(proxy, reason)
    latency_s = round(result.elapsed_s, 4)
    answer = _answer(result)
    if isinstance(answer, str):
        return Verdict(proxy, answer, latency_s)
    if latency_s > check.max_latency_s:
        return Verdict(proxy, "too_slow", latency_s)
    if seen_addresses(answer) & own:
        return Verdict(proxy, "transparent", latency_s, "transparent")
    headers = answer.get("headers")
    names = {str(name).lower() for name in headers} if isinstance(headers, Mapping) else set()
    return Verdict(proxy, None, latency_s, "anonymous" if names & _PROXY_HEADERS else "elite")


def _answer(result: FetchResult) -> dict[str, Any] | str:
    """The check's JSON answer, or why it is not one (a reason)."""
    if result.status != 200:
        return f"http_{result.status}"
    try:
        answer = json.loads(result.body)
    except (ValueError, UnicodeDecodeError):
        return "bad_answer"
    if not isinstance(answer, dict) or not isinstance(answer.get("origin"), str):
        return "bad_answer"
    return answer
