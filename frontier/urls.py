"""The canonical form of a URL: one spelling per page, so dedup and politeness see one key.

w3lib's ``safe_url_string`` does the hard part (WHATWG-style parsing, IDN hosts to
punycode, percent-encoding of unsafe characters, tab/newline removal, ``\\`` as ``/``).
The rest is RFC 3986 section 6.2.2 syntax-based normalization done here, because
``w3lib.url.canonicalize_url`` changes meaning in ways a crawler must not: it sorts the
query (``?c=red&c=blue`` is not ``?c=blue&c=red`` to a last-wins server, and robots.txt
rules match the query as the site wrote it), rewrites ``a%20b`` to ``a+b`` and turns
``?flag`` into ``?flag=``.

Non-http(s) URLs (``mailto:``, ``javascript:``, ``data:``, ``ftp:``) are returned with
only the surrounding whitespace stripped and the scheme lowercased; the scope filter
drops them with the reason ``scheme``.
"""

from __future__ import annotations

import functools
import ipaddress
import re
from collections.abc import Callable, Collection, Hashable
from urllib.parse import unquote, urljoin, urlsplit

from w3lib.url import safe_url_string

__all__ = ["DEFAULT_TRACKING_PARAMS", "DropParams", "canonical_url", "host_key", "origin"]

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
_AUTHORITY_END = re.compile(r"[/?]")
# "scheme://authority" of an http(s) base, for joining root-relative links ("/about").
_ORIGIN = re.compile(r"[Hh][Tt][Tt][Pp][Ss]?://[^/?#\\]+")
# What safe_url_string returns unchanged (checked against it in the tests): skip its cost.
_ALREADY_SAFE = re.compile(r"https?://[A-Za-z0-9_.-]+(?::[0-9]+)?(?:[/?][A-Za-z0-9._~!$&()*+,;=:@/?%-]*)?(?:#.*)?")
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


def _remove_dot_segments(path: str) -> str:
    # RFC 3986 section 5.2.4, for a path that starts with "/".
    if "/." not in path:
        return path
    segments = path[1:].split("/")
    out: list[str] = []
    for segment in segments[:-1]:
        if segment == "..":
            if out:
                out.pop()
        elif segment != ".":
            out.append(segment)
    last = segments[-1]
    if last == "..":
        if out:
            out.pop()
        out.append("")
    elif last == ".":
        out.append("")
    else:
        out.append(last)
    return "/" + "/".join(out)


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


def _clean_query(query: str, drop: Callable[[str], bool]) -> str:
    # The order is kept: robots.txt rules match the query as written (RFC 9309 section 2.2.2), so
    # a reordered query is a URL the site never linked, which its rules may refuse or fail to refuse.
    kept = []
    for piece in query.split("&"):
        if piece and not drop(_param_name(piece.partition("=")[0])):
            kept.append(_normalize_escapes(piece))
    return "&".join(kept)


def _canonical_host(hostname: str) -> str:
    if not hostname:
        raise ValueError("no host")
    host = hostname.lower()
    if host.endswith("."):  # the root label: "example.com." is "example.com"
        host = host[:-1]
    if not _HOSTNAME.fullmatch(host):
        raise ValueError(f"invalid host {hostname!r}")
    return host


def _canonical_authority(netloc: str, scheme: str) -> str:
    # Userinfo is dropped: a crawler never sends credentials found in a link.
    netloc = netloc.rpartition("@")[2]
    if netloc.startswith("["):
        end = netloc.find("]")
        if end == -1 or (end + 1 < len(netloc) and netloc[end + 1] != ":"):
            raise ValueError(f"invalid host {netloc!r}")
        host = f"[{ipaddress.IPv6Address(netloc[1:end]).compressed}]"
        port_text = netloc[end + 2 :]
    else:
        hostname, _, port_text = netloc.partition(":")
        host = _canonical_host(hostname)
    if not port_text:
        return host
    if not (port_text.isascii() and port_text.isdigit()) or not 0 < int(port_text) <= 65535:
        raise ValueError(f"invalid port {port_text!r}")
    port = int(port_text)
    return host if port == _DEFAULT_PORTS[scheme] else f"{host}:{port}"


def _canonical_absolute(url: str, drop: Callable[[str], bool]) -> str:
    match = _SCHEME.match(url)
    if match is None:
        raise ValueError("relative URL and no base")
    scheme = match.group()[:-1].lower()
    if scheme not in _DEFAULT_PORTS:
        return scheme + ":" + url[match.end() :].translate(_TAB_OR_NEWLINE)
    # safe_url_string returns a clean "scheme://authority/path?query#fragment" (or raises
    # ValueError), so plain string splitting is enough from here on.
    safe = url if _ALREADY_SAFE.fullmatch(url) else safe_url_string(url)
    prefix = scheme + "://"
    if not safe.startswith(prefix):
        raise ValueError("no host")
    rest = safe[len(prefix) :].partition("#")[0]
    authority_end = _AUTHORITY_END.search(rest)
    cut = authority_end.start() if authority_end else len(rest)
    netloc = _canonical_authority(rest[:cut], scheme)
    path, _, query = rest[cut:].partition("?")
    path = _normalize_escapes(path) or "/"
    if ";" in path:
        path = _drop_path_params(path, drop)
    path = _remove_dot_segments(path)
    query = _clean_query(query, drop) if query else ""
    return f"{scheme}://{netloc}{path}?{query}" if query else f"{scheme}://{netloc}{path}"


@functools.lru_cache(maxsize=8192)
def _canonical_memo(url: str, drop_params: DropParams) -> str:
    # Navigation links repeat on every page of a site: most calls are hits.
    return _canonical_absolute(url, _drop_rule(drop_params))


def _join(base: str, href: str) -> str:
    # RFC 3986 section 5.2 for an http(s) base, without urljoin's cost; dot segments are
    # resolved later by _canonical_absolute. Any other base goes through urljoin.
    if (match := _SCHEME.match(href)) is not None:
        if match.group()[:-1].lower() not in _DEFAULT_PORTS or href.startswith("//", match.end()):
            return href
        return urljoin(base, href)  # "http:page" is relative to an http base
    if (origin_match := _ORIGIN.match(base)) is None:
        return urljoin(base, href)
    base_origin = origin_match.group()
    if href.startswith("//"):
        return base_origin[: base_origin.index(":") + 1] + href
    if href.startswith("/"):
        return base_origin + href
    rest = base[origin_match.end() :].partition("#")[0]
    if not href or href.startswith("#"):
        return base_origin + rest
    path = rest.partition("?")[0]
    if href.startswith("?"):
        return base_origin + path + href
    return base_origin + (path[: path.rfind("/") + 1] or "/") + href


def canonical_url(url: str, base: str | None = None, drop_params: DropParams = DEFAULT_TRACKING_PARAMS) -> str:
    """Return the canonical form of ``url`` (joined with ``base`` first when given).

    http(s): lowercase scheme and host, IDN host as punycode, no userinfo, no default
    port, no trailing dot on the host, percent-escapes normalized, dot segments
    resolved, empty path as ``/``, no fragment, no dropped parameters, the query in the
    order it was written. Other schemes: stripped, scheme lowercased, otherwise as given.

    Args:
        drop_params: names of query and ``;path`` parameters to drop (case-insensitive,
            a trailing ``*`` makes a prefix), or a predicate taking the lowercased name.

    Raises:
        ValueError: the URL cannot be parsed, is relative with no base, or an http(s)
            URL has no valid host or port.

    >>> canonical_url("HTTP://Example.COM:80/a/./b/../c?utm_source=x&b=2&a=1#top")
    'http://example.com/a/c?b=2&a=1'
    """
    url = url.strip(_C0_OR_SPACE)
    if base is not None:
        url = _join(base.strip(_C0_OR_SPACE), url.translate(_TAB_OR_NEWLINE))
    if len(url) <= _MEMO_MAX_LENGTH and isinstance(drop_params, Hashable):
        return _canonical_memo(url, drop_params)
    return _canonical_absolute(url, _drop_rule(drop_params))


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
