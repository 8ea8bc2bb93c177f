"""WARC records of one capture: a fetch as ``response`` + ``request``, a re-fetch as ``revisit``.

`Captures` builds the records (WARC/1.1 headers, the archived HTTP headers, dates, digests) and
hands them to a sink's ``_capture``; `write_capture` writes them at the end of a spool file and
returns the capture's index entry. Both are package-internal: `WarcWriter` and `WarcStage` are
the sinks.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from http import HTTPStatus
from io import BytesIO
from typing import Any
from urllib.parse import urlsplit

from warcio.statusandheaders import StatusAndHeaders
from warcio.timeutils import datetime_to_iso_date, timestamp_to_iso_date

from frontier.url_ids import url_id
from storage.warc.index import REVISIT_MIME, TIMESTAMP, CdxEntry
from storage.warc.spool import Spool

__all__ = ["SERVER_NOT_MODIFIED", "URL_ID_HEADER"]  # Captures, RecordWrite and write_capture are package-internal

# WARC/1.1 section 6.7: a revisit whose server answered 304 (the payload is that of the record referred to).
SERVER_NOT_MODIFIED = "http://netpreserve.org/warc/1.1/revisit/server-not-modified"
# The URL's global id on every capture (frontier.url_ids), so WARC joins records and database rows. WARC 1.1
# allows fields of its own (section 5); the WARC- prefix is left to the standard's.
URL_ID_HEADER = "Vcrawl-Url-Id"
_WARC_DATE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,9})?Z$")
_DIGEST = re.compile(r"^(?:sha1:)?([A-Z2-7]{32})$")
_LINE_BREAKS = re.compile(r"[\r\n]+")
# The crawler archives the decoded entity, so the wire's transfer framing no longer describes it.
_DECODED_AWAY = frozenset({"content-encoding", "transfer-encoding", "content-length"})

# Writes a capture's records into a spool; returns the indexed record and its (offset, length).
RecordWrite = Callable[[Spool], tuple[Any, int, int]]


class Captures:
    """What every capture sink offers (a writer's file, a fetch batch's stage): the two kinds of capture."""

    def _capture(self, url: str, timestamp: str, status: int, mime: str, write: RecordWrite) -> CdxEntry:
        raise NotImplementedError

    def write_exchange(
        self,
        url: str,
        *,
        request_headers: Mapping[str, str],
        status: int,
        reason: str,
        response_headers: Mapping[str, str],
        body: bytes,
        fetched_at: datetime,
        ip: str | None = None,
    ) -> CdxEntry:
        """Archive one fetch as a ``response`` record then a ``request`` record (``WARC-Concurrent-To``).

        `body` is the decoded entity, as the crawler keeps it: ``Content-Encoding`` and
        ``Transfer-Encoding`` are dropped from the archived headers and ``Content-Length`` is
        set to ``len(body)``. The request record holds ``GET <path?query> HTTP/1.1`` and
        `request_headers` (plus ``Host`` if absent). The entry is readable once its file ships.

        Raises:
            ValueError: not an http(s) URL, a naive `fetched_at`, a bad status or IP address.
        """
        target, host = _request_target(url)
        warc_date, timestamp = _warc_date(fetched_at)
        warc_headers = {"WARC-Date": warc_date, URL_ID_HEADER: url_id(url)}
        if ip is not None:
            warc_headers["WARC-IP-Address"] = str(ipaddress.ip_address(ip))
        response_http = StatusAndHeaders(
            _status_line(status, reason),
            [*_header_pairs(response_headers), ("Content-Length", str(len(body)))],
            protocol="HTTP/1.1",
        )
        sent = _header_pairs(request_headers, drop=frozenset())
        if not any(name.lower() == "host" for name, _ in sent):
            sent.insert(0, ("Host", host))
        request_http = StatusAndHeaders(f"GET {target} HTTP/1.1", sent, is_http_request=True)

        def write(spool: Spool) -> tuple[Any, int, int]:
            return _write_exchange(spool, url, body, response_http, request_http, warc_headers)

        return self._capture(url, timestamp, status, _mime(response_headers), write)

    def write_revisit(
        self,
        url: str,
        *,
        fetched_at: datetime,
        status: int,
        response_headers: Mapping[str, str],
        refers_to_uri: str,
        refers_to_date: datetime | str,
        digest: str,
        not_modified: bool = False,
    ) -> CdxEntry:
        """Archive a re-fetch whose payload is unchanged as a ``revisit`` record (identical-payload-digest,
        or server-not-modified with `not_modified`: the server answered 304).

        The record holds the HTTP status and headers only; the payload, and so its length and
        encoding headers, are those of the capture it refers to. `refers_to_date` is a datetime,
        a 14-digit CDX timestamp or a WARC date; `digest` is base32 SHA-1 (``CdxEntry.digest``,
        with or without ``sha1:``), that of the capture referred to.

        Raises:
            ValueError: a malformed date, digest, status or URL.
        """
        _request_target(url)
        warc_date, timestamp = _warc_date(fetched_at)
        bare = _bare_digest(digest)
        http = StatusAndHeaders(_status_line(status, ""), _header_pairs(response_headers), protocol="HTTP/1.1")
        refers_date = _refers_to_date(refers_to_date)

        def write(spool: Spool) -> tuple[Any, int, int]:
            record = spool.writer.create_revisit_record(
                url,
                f"sha1:{bare}",
                refers_to_uri,
                refers_to_date=refers_date,
                http_headers=http,
                warc_headers_dict={"WARC-Date": warc_date, URL_ID_HEADER: url_id(url)},
            )
            if not_modified:
                record.rec_headers.replace_header("WARC-Profile", SERVER_NOT_MODIFIED)
            offset, length = spool.write(record)
            return record, offset, length

        return self._capture(url, timestamp, status, REVISIT_MIME, write)


def write_capture(
    spool: Spool, location: str, url: str, timestamp: str, status: int, mime: str, write: RecordWrite
) -> CdxEntry:
    """Write one capture at the end of ``spool``; return its index line (``location``: the file it names)."""
    mark = spool.size()
    try:
        record, offset, length = write(spool)
    except BaseException:
        # Cut the half-written member off, so the file stays a valid WARC.
        spool.file.seek(mark)
        spool.file.truncate()
        raise
    return CdxEntry(
        url=url,
        timestamp=timestamp,
        status=status,
        digest=_bare_digest(record.rec_headers.get_header("WARC-Payload-Digest")),
        mime=mime,
        warc=location,
        offset=offset,
        length=length,
    )


def _write_exchange(
    spool: Spool,
    url: str,
    body: bytes,
    response_http: StatusAndHeaders,
    request_http: StatusAndHeaders,
    warc_headers: dict[str, str],
) -> tuple[Any, int, int]:
    """Write the ``response`` then the ``request`` record of one fetch; return the response and its place."""
    response = spool.writer.create_warc_record(
        url,
        "response",
        payload=BytesIO(body),
        length=len(body),
        http_headers=response_http,
        warc_headers_dict=warc_headers,
    )
    request = spool.writer.create_warc_record(
        url,
        "request",
        payload=BytesIO(),
        length=0,
        http_headers=request_http,
        warc_headers_dict={
            **warc_headers,
            "WARC-Concurrent-To": response.rec_headers.get_header("WARC-Record-ID"),
        },
    )
    offset, length = spool.write(response)
    spool.write(request)
    return response, offset, length


def _request_target(url: str) -> tuple[str, str]:
    """Return the request line target (path?query) and the Host header value of `url`."""
    parts = urlsplit(url)
    if parts.scheme.lower() not in ("http", "https") or not parts.netloc:
        raise ValueError(f"WARC captures need an http(s) URL, got {url!r}")
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return target, parts.netloc.rsplit("@", 1)[-1]


def _warc_date(when: datetime) -> tuple[str, str]:
    """Return the WARC-Date and the 14-digit timestamp of `when`, both to the second, in UTC.

    Whole seconds, so a revisit's ``WARC-Refers-To-Date`` made from a CDX timestamp equals the
    ``WARC-Date`` of the record it refers to (WARC/1.1 makes fractions optional).
    """
    if when.tzinfo is None:
        raise ValueError(f"fetched_at must be timezone-aware, got {when!r}")
    utc = when.astimezone(UTC).replace(tzinfo=None, microsecond=0)
    return datetime_to_iso_date(utc), utc.strftime("%Y%m%d%H%M%S")


def _refers_to_date(value: datetime | str) -> str:
    if isinstance(value, datetime):
        return _warc_date(value)[0]
    if TIMESTAMP.match(value):
        return timestamp_to_iso_date(value)
    if _WARC_DATE.match(value):
        return value
    raise ValueError(f"refers_to_date must be a datetime, 14 digits or a WARC date, got {value!r}")


def _bare_digest(digest: str) -> str:
    """Return the base32 of a SHA-1 digest given with or without its ``sha1:`` label."""
    match = _DIGEST.match(digest)
    if match is None:
        raise ValueError(f"digest must be a base32 SHA-1 (optionally 'sha1:'-prefixed), got {digest!r}")
    return match.group(1)


def _status_line(status: int, reason: str) -> str:
    if not 100 <= status <= 999:
        raise ValueError(f"HTTP status must be 100-999, got {status}")
    if not reason:
        try:
            reason = HTTPStatus(status).phrase
        except ValueError:
            return str(status)
    return f"{status} {_LINE_BREAKS.sub(' ', reason)}"


def _header_pairs(headers: Mapping[str, str], drop: frozenset[str] = _DECODED_AWAY) -> list[tuple[str, str]]:
    # A line break inside a header from the web would split the archived header block.
    return [
        (_LINE_BREAKS.sub(" ", name), _LINE_BREAKS.sub(" ", value))
        for name, value in headers.items()
        if name.lower() not in drop
    ]


def _mime(headers: Mapping[str, str]) -> str:
    for name, value in headers.items():
        if name.lower() == "content-type":
            return value.split(";", 1)[0].strip().lower() or "unk"
    return "unk"
