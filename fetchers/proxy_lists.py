"""Reading a proxy source's page: the candidate proxies it lists, as ``scheme://host:port`` URLs.

A source page is web content: rows that do not hold a usable host and port are skipped (and
counted), never an error. A host is an IPv4 or IPv6 address or a DNS name; a port is 1-65535.
"""

from __future__ import annotations

import ipaddress
import logging
import re
from collections.abc import Iterable, Iterator

import lxml.html
from lxml import etree

from vcrawl.proxy_sources import ProxySource

__all__ = ["candidate_url", "read_source"]

logger = logging.getLogger(__name__)

# host:port, an IPv6 host in brackets ([2001:db8::1]:3128).
_HOST_PORT = re.compile(r"^\s*(?:\[([0-9A-Fa-f:.]+)\]|([0-9A-Za-z.-]+)):([0-9]{1,5})\b")
_DNS_NAME = re.compile(r"^(?=.{1,253}$)([A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.)+[A-Za-z]{2,63}$")


def candidate_url(scheme: str, host: str, port: str | int) -> str | None:
    """The proxy URL for ``host`` and ``port``, or None when either is not usable.

    >>> candidate_url("http", " 203.0.113.7 ", "8080"), candidate_url("http", "2001:db8::1", 3128)
    ('http://203.0.113.7:8080', 'http://[2001:db8::1]:3128')
    >>> candidate_url("http", "proxy.example.net", "0"), candidate_url("http", "<b>x</b>", "80")
    (None, None)
    >>> candidate_url("http", "203.0.113.7", "80\u00b2"), candidate_url("http", "203.0.113.7", "\u0668\u0660")
    (None, None)
    """
    host, text = host.strip().strip("[]"), str(port).strip()
    # str.isdigit() is true for "²" (int() refuses it) and for other scripts' digits ("٨٠", which
    # int() reads as 80): a port is ASCII digits only, as in frontier.urls' authorities.
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= 65535:
        return None
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        if not _DNS_NAME.match(host):
            return None
        return f"{scheme}://{host.lower()}:{int(text)}"
    shown = f"[{address}]" if address.version == 6 else str(address)
    return f"{scheme}://{shown}:{int(text)}"


def read_source(source: ProxySource, body: bytes) -> list[str]:
    """The distinct candidates listed on ``source``'s page, in page order."""
    text = body.decode("utf-8", "replace")
    if source.format == "lines":
        pairs: Iterable[tuple[str, str]] = _lines(text)
    elif source.format == "table":
        pairs = _table(source, text)
    else:
        assert source.pattern is not None  # checked by ProxySource
        pairs = ((m.group("host") or "", m.group("port") or "") for m in re.finditer(source.pattern, text))
    found: dict[str, None] = {}
    skipped = 0
    for host, port in pairs:
        url = candidate_url(source.scheme, host, port)
        if url is None:
            skipped += 1
        else:
            found[url] = None
    if skipped:
        logger.debug("proxy source %s: %d entries without a usable host and port skipped", source.url, skipped)
    return list(found)


def _lines(text: str) -> Iterator[tuple[str, str]]:
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        yield _host_port(line)


def _table(source: ProxySource, text: str) -> Iterator[tuple[str, str]]:
    try:
        document = lxml.html.document_fromstring(text)
    except (etree.LxmlError, ValueError):  # an empty or unparsable page lists nothing
        return
    tables = document.xpath("//table")
    if source.table >= len(tables):
        logger.info("proxy source %s: no table %d on the page (%d found)", source.url, source.table, len(tables))
        return
    rows = [[_cell_text(cell) for cell in row.xpath("./th|./td")] for row in tables[source.table].xpath(".//tr")]
    rows = [row for row in rows if row]
    header = rows[0] if rows else []
    host_at = _column(source.host_column, header)
    port_at = _column(source.port_column, header) if source.port_column is not None else None
    if host_at is None or (source.port_column is not None and port_at is None):
        logger.info("proxy source %s: columns %r/%r not in the header %r", source.url, source.host_column,
                    source.port_column, header)  # fmt: skip
        return
    for row in rows:
        if host_at >= len(row) or (port_at is not None and port_at >= len(row)):
            continue
        if port_at is None:
            yield _host_port(row[host_at])
        else:
            yield row[host_at], row[port_at]


def _host_port(text: str) -> tuple[str, str]:
    match = _HOST_PORT.match(text)
    return (match.group(1) or match.group(2), match.group(3)) if match else ("", "")


def _column(wanted: int | str | None, header: list[str]) -> int | None:
    """A column's index: given as such, or found by its header text (case and spaces ignored)."""
    if isinstance(wanted, int):
        return wanted
    if wanted is None:
        return None
    names = [name.strip().lower() for name in header]
    key = wanted.strip().lower()
    return names.index(key) if key in names else None


def _cell_text(cell: etree._Element) -> str:
    return " ".join("".join(cell.itertext()).split())
