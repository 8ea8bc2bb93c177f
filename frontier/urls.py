"""The URL a crawl requests for a link, and the key that dedup compares.

A link is resolved and serialised by the WHATWG URL Standard, as browsers do (``ada-url``, a C++
implementation that passes the Standard's own test data): the request goes to the URL the page
means, escapes, ``[``, ``]`` and an empty ``?`` as written. On top of that, and only where the
request does not change meaning for a crawler: no fragment (never sent), no userinfo (a crawler
never sends credentials found in a link), no trailing dot on the host (one host, one politeness
key) and no tracking or session parameters (a job's ``drop_params``), the rest of the query in the
order it was written (robots.txt rules match it so). ``w3lib.url.canonicalize_url`` is not used:
it sorts the query (``?c=red&c=blue`` is not ``?c=blue&c=red`` to a last-wins server) and
rewrites ``a%20b`` as ``a+b``.

Dedup goes one step further (``dedup_key``): RFC 3986 section 6.2.2's percent-escape
normalisation, so ``/%7Euser`` and ``/~user`` are one page to the Bloom filter, fetched once, at
the spelling met first.

Non-http(s) URLs (``mailto:``, ``javascript:``, ``data:``, ``ftp:``) are returned with only the
surrounding whitespace stripped and the scheme lowercased; the scope filter drops them with the
reason ``scheme``.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Collection, Hashable
from urllib.parse import unquote, urlsplit

import ada_url

from vcrawl import whatwg_urls

__all__ = ["DEFAULT_TRACKING_PARAMS", "DropParams", "canonical_url", "dedup_key", "host_key", "origin"]

DEFAULT_TRACKING_PARAMS: frozenset[str] = frozenset(
    {
        # Analytics and ad-click ids; a trailing "*" makes a name a prefix.
        "utm_*",
        "utm_source",
        "utm_medium",
        "utm_campaign",
        "utm_term",
        "utm_content",
        "utm_id",
        "fbclid",
        "gclid",
        "dclid",
        "msclkid",
        "mc_cid",
        "mc_eid",
        "yclid",
        "igshid",
        "_ga",
        # Session ids, in the query or as ";name=value" path parameters.
        "jsessionid",
        "phpsessid",
        "sid",
        "sessionid",
        "aspsessionid",
    }
)
"""Query (and path-parameter) names dropped by default; compared lowercased and percent-decoded."""

DropParams = Collection[str] | Callable[[str], bool]
"""Names of parameters to drop (a trailing ``*`` makes a prefix), or a predicate on the lowercased name."""

_DEFAULT_PORTS = {"http": 80, "https": 443}
# C0 controls and space: what the WHATWG URL parser strips around a URL.
_C0_OR_SPACE = "".join(map(chr, range(0x21)))
_TAB_OR_NEWLINE = str.maketrans("", "", "\t\n\r")
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:")
# Registered names after IDNA: letters, digits, "-" and (seen in the wild) "_", no empty label.
_HOSTNAME = re.compile(r"[a-z0-9_-]+(?:\.[a-z0-9_-]+)*")
_MEMO_MAX_LENGTH = 2048
_ESCAPE = re.compile(r"%[0-9A-Fa-f]{2}")
_UNRESERVED = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")


def _escape_replacement(escape: str) -> str:
    char = chr(int(escape[1:], 16))
    return char if char in _UNRESERVED else escape.upper()


# Every "%xx" spelling mapped to its normal form (RFC 3986 6.2.2.1/6.2.2.2): decode unreserved, else upper-case.
_ESCAPES = {
    e: _escape_replacement(e) for e in (f"%{a}{b}" for a in "0123456789abcdefABCDEF" for b in "0123456789abcdefABCDEF")
}


def _normalize_escapes(text: str) -> str:
    if "%" not in text:
        return text
    return _ESCAPE.sub(lambda m: _ESCAPES[m.group()], text)


def _param_name(name: str) -> str:
    return (unquote(name) if "%" in name else name).lower()


@functools.lru_cache(maxsize=32)
def _compile_names(names: frozenset[str]) -> Callable[[str], bool]:
    exact = frozenset(n.lower() for n in names if not n.endswith("*"))
    prefixes = tuple(n[:-1].lower() for n in names if n.endswith("*"))
    if not prefixes:
        return exact.__contains__
    return lambda name: name in exact or name.startswith(prefixes)


def _drop_rule(drop_params: DropParams) -> Callable[[str], bool]:
    if callable(drop_params):
        return drop_params
    if isinstance(drop_params, str):
        raise ValueError("drop_params must be a collection of names, not a str")
    if isinstance(drop_params, frozenset):
        return _compile_names(drop_params)
    return _compile_names(frozenset(drop_params))


def _drop_path_params(path: str, drop: Callable[[str], bool]) -> str:
    # ";name=value" parameters inside path segments, e.g. "/cart;jsessionid=ABC".
    segments = path.split("/")
    for i, segment in enumerate(segments):
        if ";" in segment:
            head, *params = segment.split(";")
            kept = [p for p in params if not drop(_param_name(p.partition("=")[0]))]
            segments[i] = ";".join([head, *kept])
    return "/".join(segments)


def _clean_query(query: str, drop: Callable[[str], bool]) -> str | None:
    # The query as written but for the dropped pieces (None: all of it was dropped). The order is
    # kept: robots.txt rules match the query as written (RFC 9309 section 2.2.2), so a reordered
    # query is a URL the site never linked, which its rules may refuse or fail to refuse.
    pieces = query.split("&")
    kept = [piece for piece in pieces if not piece or not drop(_param_name(piece.partition("=")[0]))]
    if len(kept) == len(pieces):
        return query
    return "&".join(kept) if any(kept) else None


def _canonical_host(hostname: str) -> str:
    host = hostname[:-1] if hostname.endswith(".") else hostname  # the root label: "example.com." is "example.com"
    if not _HOSTNAME.fullmatch(host):
        raise ValueError(f"invalid host {hostname!r}")
    return host


def _canonical_authority(authority: str) -> str:
    # The WHATWG serialiser wrote it: host lowercased, IDN as punycode, IPv4 and IPv6 normalised,
    # a default port dropped; userinfo (dropped here) percent-encodes every "@" but its last.
    authority = authority.rpartition("@")[2]
    if authority.startswith("["):
        return authority
    host, _, port = authority.partition(":")
    if port == "0":
        raise ValueError("invalid port 0")
    return _canonical_host(host) + (":" + port if port else "")


def _canonical_absolute(url: str, drop: Callable[[str], bool]) -> str:
    match = _SCHEME.match(url)
    if match is None:
        raise ValueError("relative URL and no base")
    scheme = match.group()[:-1].lower()
    if scheme not in _DEFAULT_PORTS:
        return scheme + ":" + url[match.end() :].translate(_TAB_OR_NEWLINE)
    return _requested(_parsed(url), drop)


def _parsed(url: str, base: str | None = None) -> str:
    try:
        return whatwg_urls.resolve(base, url) if base is not None else whatwg_urls.parse(url)
    except ValueError:
        raise ValueError(f"not a URL: {url[:200]!r}") from None


def _requested(href: str, drop: Callable[[str], bool]) -> str:
    # A special URL's href is "scheme://authority/path[?query][#fragment]": no "/", "?" or "#"
    # in its authority, no "#" before its fragment, so plain string splitting is exact.
    scheme_end = href.index("://") + 3
    rest = href[scheme_end:].partition("#")[0]
    path_start = rest.index("/")
    authority = _canonical_authority(rest[:path_start])
    path, question, query = rest[path_start:].partition("?")
    if ";" in path and (kept := _drop_path_params(path, drop)) != path:
        # "/.;sid=1/" was no dot segment, "/./" is; a "/." ahead keeps a "//" start a path.
        path = ada_url.URL("/." + kept, "http://h").pathname
    if query:
        cleaned = _clean_query(query, drop)
        question, query = ("", "") if cleaned is None else ("?", cleaned)
    return f"{href[:scheme_end]}{authority}{path}{question}{query}"


@functools.lru_cache(maxsize=8192)
def _canonical_memo(url: str, drop_params: DropParams) -> str:
    # Navigation links repeat on every page of a site: most calls are hits.
    return _canonical_absolute(url, _drop_rule(drop_params))


def canonical_url(url: str, base: str | None = None, drop_params: DropParams = DEFAULT_TRACKING_PARAMS) -> str:
    """Return the URL a crawl requests for ``url`` (resolved against ``base`` first when given).

    http(s): the WHATWG URL Standard's serialisation (what a browser requests: scheme and host
    lowercased, IDN host as punycode, default port dropped, dot segments resolved, what must be
    escaped escaped and nothing else touched), less its fragment, userinfo, a trailing dot on the
    host and the dropped parameters; the query in the order it was written. Other schemes:
    stripped, scheme lowercased, otherwise as given. ``dedup_key`` is what dedup compares.

    Args:
        drop_params: names of query and ``;path`` parameters to drop (case-insensitive,
            a trailing ``*`` makes a prefix), or a predicate taking the lowercased name.

    Raises:
        ValueError: the URL cannot be parsed, is relative with no base, or an http(s)
            URL has no valid host or port.

    >>> canonical_url("HTTP://Example.COM:80/a/./b/../c?utm_source=x&b=2&a=1#top")
    'http://example.com/a/c?b=2&a=1'
    >>> canonical_url("../x%2zy?", base="http://example.com/a/b/c")
    'http://example.com/a/x%2zy?'
    """
    url = url.strip(_C0_OR_SPACE)
    if base is not None:
        url = _parsed(url, base.strip(_C0_OR_SPACE))
    # The default first: an isinstance check against an ABC costs more than the memo's lookup.
    if len(url) <= _MEMO_MAX_LENGTH and (drop_params is DEFAULT_TRACKING_PARAMS or isinstance(drop_params, Hashable)):
        return _canonical_memo(url, drop_params)
    return _canonical_absolute(url, _drop_rule(drop_params))


def dedup_key(url: str) -> str:
    """The key dedup compares for a ``canonical_url``: its percent-escapes normalised (RFC 3986
    section 6.2.2: unreserved characters decoded, the others' hex upper-cased).

    >>> dedup_key("http://example.com/%7euser?q=%2f")
    'http://example.com/~user?q=%2F'
    """
    return _normalize_escapes(url)


def host_key(url: str) -> str:
    """Return the politeness/frontier key of ``url``: lowercase host, ``:port`` only when not the default.

    Raises:
        ValueError: the URL has no host or a malformed port.
    """
    parts = urlsplit(url)
    host = parts.hostname
    if not host:
        raise ValueError(f"no host in {url!r}")
    if ":" in host:
        host = f"[{host}]"
    port = parts.port
    if port is None or port == _DEFAULT_PORTS.get(parts.scheme.lower()):
        return host
    return f"{host}:{port}"


def origin(url: str) -> str:
    """Return ``scheme://host[:port]`` of ``url``, the scope of its robots.txt (RFC 9309).

    Raises:
        ValueError: the URL has no host or a malformed port.
    """
    return f"{urlsplit(url).scheme.lower()}://{host_key(url)}"
