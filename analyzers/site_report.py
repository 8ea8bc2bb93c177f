"""The ``site-report`` batch analyzer: per host, what the crawl found.

Per host: stored pages and their bytes, final HTTP status per URL, content types and link depths
of the stored pages, failures by reason, the domains its pages link to most (counted as linking
pages), and its broken links (final status 400 or more) with every stored page that links to
them. Links are the ``href`` of ``<a>`` and ``<area>``, made absolute against the page's base
URL and put in the crawl's canonical form, so they meet the URLs of the fetch log.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from typing import Any
from urllib.parse import urljoin, urlsplit

from analyzers.batch import CrawledUrl, MapContext
from analyzers.page import is_html

__all__ = ["TOP_DOMAINS", "SiteReport", "hostname"]

TOP_DOMAINS = 10  # outgoing domains listed per host
_HYPERLINKS = ("a", "area")
_COUNTERS = ("status_codes", "content_types", "depth", "failed", "outgoing")


class SiteReport:
    """Map: a chunk's per-host counts and broken-link referrers. Reduce: their sums and unions."""

    def map(self, urls: Sequence[CrawledUrl], context: MapContext) -> dict[str, Any]:
        """Count one chunk of the job's URLs, by host."""
        hosts: dict[str, dict[str, Any]] = {}
        for crawled in urls:
            host = _host_entry(hosts, crawled.host)
            if crawled.status is not None:
                host["status_codes"][str(crawled.status)] += 1
            if crawled.outcome == "stored":
                host["pages"] += 1
                host["bytes"] += crawled.bytes
                host["content_types"][crawled.mime or "unknown"] += 1
                host["depth"][str(crawled.depth)] += 1
            elif crawled.reason:
                host["failed"][crawled.reason] += 1
            if crawled.status is not None and crawled.status >= 400:
                host["broken"].setdefault(crawled.url, [])
                host["statuses"][crawled.url] = crawled.status
            if crawled.page is not None and is_html(crawled.content_type):
                _count_links(hosts, host, crawled, context)
        return {name: _plain(entry) for name, entry in hosts.items()}

    def reduce(self, partials: Iterable[dict[str, Any]]) -> dict[str, Any]:
        """Sum the chunks' counts; list each host's top outgoing domains and broken links."""
        totals: dict[str, dict[str, Any]] = {}
        for partial in partials:
            for name, counts in partial.items():
                host = _host_entry(totals, name)
                host["pages"] += counts["pages"]
                host["bytes"] += counts["bytes"]
                for counter in _COUNTERS:
                    host[counter].update(counts[counter])
                for url, (status, referrers) in counts["broken"].items():
                    known = host["broken"].setdefault(url, [])
                    known.extend(referrers)
                    if status is not None:
                        host["statuses"][url] = status
        report = {name: _final(totals[name]) for name in sorted(totals)}
        return {
            "hosts": report,
            "totals": {
                "hosts": len(report),
                "pages": sum(entry["pages"] for entry in report.values()),
                "bytes": sum(entry["bytes"] for entry in report.values()),
                "broken_links": sum(len(entry["broken_links"]) for entry in report.values()),
            },
        }


def hostname(host: str) -> str:
    """The name of a ``host[:port]`` (a domain has no port).

    >>> hostname("127.0.0.1:8080"), hostname("Example.com"), hostname("[::1]:80")
    ('127.0.0.1', 'example.com', '::1')
    """
    return urlsplit(f"//{host}").hostname or host.lower()


def _host_entry(hosts: dict[str, dict[str, Any]], name: str) -> dict[str, Any]:
    entry = hosts.get(name)
    if entry is None:
        entry = {"pages": 0, "bytes": 0, "broken": {}, "statuses": {}}
        entry.update({counter: Counter() for counter in _COUNTERS})
        hosts[name] = entry
    return entry


def _count_links(hosts: dict[str, dict[str, Any]], host: dict[str, Any], page: CrawledUrl, context: MapContext) -> None:
    """The page's distinct hyperlink targets: their domains, and the broken ones it refers to."""
    assert page.page is not None
    own = hostname(page.host)
    targets = {target for target in (context.canonical(href) for href in _hyperlinks(page)) if target}
    domains = {urlsplit(target).hostname or "" for target in targets}
    host["outgoing"].update(domain for domain in domains if domain and domain != own)
    for target in targets:
        status = context.final_status(target)
        if status is not None and status >= 400:
            target_host = _host_entry(hosts, urlsplit(target).netloc)
            target_host["broken"].setdefault(target, []).append(page.url)
            target_host["statuses"][target] = status


def _hyperlinks(page: CrawledUrl) -> Iterator[str]:
    assert page.page is not None
    base = page.page.base_url
    for element in page.page.tree.iter(*_HYPERLINKS):
        href = element.get("href")
        if href is None or not href.strip():
            continue
        try:
            yield urljoin(base, href.strip())
        except ValueError:  # a malformed href (an invalid IPv6 literal, ...): no link
            continue


def _plain(entry: dict[str, Any]) -> dict[str, Any]:
    """A partial's JSON form: counters as dicts, each broken URL with its status and referrers."""
    plain = {"pages": entry["pages"], "bytes": entry["bytes"]}
    plain.update({counter: dict(entry[counter]) for counter in _COUNTERS})
    plain["broken"] = {url: [entry["statuses"].get(url), refs] for url, refs in entry["broken"].items()}
    return plain


def _final(entry: dict[str, Any]) -> dict[str, Any]:
    outgoing: Counter[str] = entry["outgoing"]
    top = sorted(outgoing.items(), key=lambda item: (-item[1], item[0]))[:TOP_DOMAINS]
    return {
        "pages": entry["pages"],
        "bytes": entry["bytes"],
        "status_codes": dict(sorted(entry["status_codes"].items())),
        "content_types": dict(sorted(entry["content_types"].items())),
        "depth": {key: entry["depth"][key] for key in sorted(entry["depth"], key=int)},
        "failed": dict(sorted(entry["failed"].items())),
        "top_outgoing_domains": [{"domain": domain, "pages": count} for domain, count in top],
        "broken_links": {
            url: {"status": entry["statuses"].get(url), "referrers": sorted(set(entry["broken"][url]))}
            for url in sorted(entry["broken"])
        },
    }
