"""Pure scope filters: why a canonical URL is not worth crawling, or None to keep it.

The built-in admission filters (``scope``, ``deny``, ``allow``, ``suffix``, ``trap``) are registered
in the ``vcrawl.filters`` entry-point group like a plug-in's (``frontier.filter_registry``): each
entry point names a factory ``(params) -> UrlFilter``, and a ``UrlFilter`` maps a canonical URL and
its ``AdmissionContext`` to a reason to drop it, or None. ``suffix`` and ``trap`` take params when a
job lists them in its ``filter_chain``; the others are configured by the job's scope alone.
"""

from __future__ import annotations

import ipaddress
import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from vcrawl.errors import InvalidTask, kind_of

__all__ = [
    "DEFAULT_SKIP_SUFFIXES",
    "MAX_SEGMENT_REPEATS",
    "MAX_SKIP_SUFFIXES",
    "REASONS",
    "AdmissionContext",
    "Scope",
    "UrlFilter",
    "allow_filter",
    "deny_filter",
    "reject_reason",
    "scope_filter",
    "suffix_filter",
    "trap_filter",
]

REASONS: tuple[str, ...] = ("scheme", "too_long", "depth", "host", "deny", "allow", "suffix", "trap")
"""Every reason ``reject_reason`` returns, in the order the checks run."""

DEFAULT_SKIP_SUFFIXES: frozenset[str] = frozenset(
    {
        # images
        *(".jpg", ".jpeg", ".png", ".gif", ".bmp", ".webp", ".svg", ".svgz", ".ico", ".tif", ".tiff", ".avif"),
        *(".heic", ".psd", ".raw", ".cr2", ".nef"),
        # audio and video
        *(".mp3", ".wav", ".ogg", ".oga", ".opus", ".flac", ".aac", ".m4a", ".wma", ".mid", ".midi"),
        *(".mp4", ".m4v", ".avi", ".mov", ".wmv", ".flv", ".mkv", ".webm", ".mpg", ".mpeg", ".3gp", ".ogv"),
        # archives and packages
        *(".zip", ".rar", ".7z", ".tar", ".gz", ".tgz", ".bz2", ".xz", ".zst", ".lz", ".cab", ".deb", ".rpm"),
        # documents
        *(".pdf", ".ps", ".eps", ".doc", ".docx", ".xls", ".xlsx", ".ppt", ".pptx", ".odt", ".ods", ".odp"),
        *(".rtf", ".epub", ".mobi"),
        # page assets and fonts
        *(".css", ".js", ".mjs", ".map", ".woff", ".woff2", ".ttf", ".otf", ".eot", ".swf"),
        # executables and disk images
        *(".exe", ".msi", ".dmg", ".iso", ".img", ".apk", ".bin", ".dll", ".so", ".jar", ".torrent"),
    }
)
"""Path suffixes of non-page files (lowercase, with the dot); ``.json``/``.xml`` are kept (feeds, sitemaps)."""

MAX_SKIP_SUFFIXES = 1000
"""The most suffixes a ``suffix`` filter's params may list (each of ``suffixes``, ``add``, ``keep``)."""
MAX_SEGMENT_REPEATS = 100
"""The highest ``max_segment_repeats`` a ``trap`` filter's params may set."""

_HOST = re.compile(r"[a-z0-9_-]+(?:\.[a-z0-9_-]+)*")


@dataclass(frozen=True)
class Scope:
    """What a crawl may follow; empty ``hosts`` and ``domains`` means any host.

    ``hosts`` are exact host names as ``canonical_url`` writes them (lowercase, punycode,
    no port; an IPv6 literal with or without brackets). ``domains`` match the domain
    itself and every subdomain. ``allow``/``deny`` are searched in the canonical URL.
    """

    hosts: frozenset[str]
    domains: tuple[str, ...]
    allow: tuple[re.Pattern[str], ...]
    deny: tuple[re.Pattern[str], ...]
    max_depth: int
    max_url_length: int = 2048
    skip_suffixes: frozenset[str] = DEFAULT_SKIP_SUFFIXES
    max_segment_repeats: int = 3
    _domain_suffixes: tuple[str, ...] = field(default=(), init=False, repr=False, compare=False)
    _suffixes: tuple[str, ...] = field(default=(), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.hosts, str) or isinstance(self.domains, str):
            raise ValueError("Scope.hosts and Scope.domains are collections of names, not a str")
        hosts = frozenset(_scope_host(h) for h in self.hosts)
        for domain in self.domains:
            if not _HOST.fullmatch(domain):
                raise ValueError(f"Scope.domains takes lowercase domains without a leading dot, got {domain!r}")
        for suffix in self.skip_suffixes:
            if not suffix.startswith(".") or suffix != suffix.lower():
                raise ValueError(f"Scope.skip_suffixes takes lowercase suffixes with the dot, got {suffix!r}")
        if self.max_depth < 0 or self.max_url_length < 1 or self.max_segment_repeats < 1:
            raise ValueError("Scope.max_depth must be >= 0, max_url_length and max_segment_repeats >= 1")
        object.__setattr__(self, "hosts", hosts)
        object.__setattr__(self, "_domain_suffixes", tuple("." + d for d in self.domains))
        object.__setattr__(self, "_suffixes", tuple(self.skip_suffixes))


def _scope_host(host: str) -> str:
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if ":" in host:
        try:
            return ipaddress.IPv6Address(host).compressed  # the spelling urlsplit gives for a canonical URL
        except ValueError:
            raise ValueError(f"Scope.hosts takes host names without a port, got {host!r}") from None
    if not _HOST.fullmatch(host):
        raise ValueError(f"Scope.hosts takes lowercase ASCII (punycode) host names, got {host!r}")
    return host


def _is_trap(path: str, max_repeats: int) -> bool:
    segments = [s for s in path.split("/") if s]
    previous = ""
    for segment in segments:
        # "/foo/foo/": a relative link resolved against its own directory, one level deeper each
        # time. Numbers are exempt: "/2024/05/05/" is a date.
        if segment == previous and not segment.isdigit():
            return True
        previous = segment
    if len(segments) <= max_repeats:
        return False
    return max(Counter(segments).values()) > max_repeats


def reject_reason(url: str, depth: int, scope: Scope) -> str | None:
    """Return why the canonical ``url`` found at ``depth`` is out of ``scope`` (one of REASONS), or None.

    A path is a ``trap`` when a segment occurs more than ``max_segment_repeats`` times
    (``/a/b/a/b/a/b/a/b``) or a non-numeric segment repeats right after itself (``/a/a``).

    >>> reject_reason("https://example.com/logo.PNG", 0, Scope(frozenset(), (), (), (), max_depth=3))
    'suffix'
    """
    context = AdmissionContext("", depth, scope)
    for check in _BUILTIN_CHECKS:
        if (reason := check(url, context)) is not None:
            return reason
    return None


@dataclass(frozen=True)
class AdmissionContext:
    """What an admission filter knows about a link besides its canonical URL.

    ``scope`` is the job's scope as it applies to this link (seeds are not held to ``allow``;
    sitemaps to neither ``allow`` nor the suffixes); ``source_url`` is the page or redirect the
    link came from ("" for seeds, sitemaps and due URLs of a scheduled job).
    """

    job_id: str
    depth: int
    scope: Scope
    source_url: str = ""
    seed: bool = False
    sitemap: bool = False


class UrlFilter(Protocol):
    """An admission filter: why a canonical URL is dropped (a short reason, counted as
    ``filtered:<reason>``), or None to keep it. Pure: no I/O, the same answer every time."""

    def __call__(self, url: str, context: AdmissionContext) -> str | None:
        """Return why ``url`` is dropped, or None."""
        ...


def _scope_check(url: str, context: AdmissionContext) -> str | None:
    scope = context.scope
    if not url.startswith(("http://", "https://")):
        return "scheme"
    if len(url) > scope.max_url_length:
        return "too_long"
    if context.depth > scope.max_depth:
        return "depth"
    if scope.hosts or scope.domains:
        host = _host(url)
        if host not in scope.hosts and host not in scope.domains and not host.endswith(scope._domain_suffixes):
            return "host"
    return None


def _deny_check(url: str, context: AdmissionContext) -> str | None:
    deny = context.scope.deny
    return "deny" if deny and any(pattern.search(url) for pattern in deny) else None


def _allow_check(url: str, context: AdmissionContext) -> str | None:
    allow = context.scope.allow
    return "allow" if allow and not any(pattern.search(url) for pattern in allow) else None


def _suffix_check(url: str, context: AdmissionContext) -> str | None:
    return "suffix" if _path(url).lower().endswith(context.scope._suffixes) else None


def _trap_check(url: str, context: AdmissionContext) -> str | None:
    return "trap" if _is_trap(_path(url), context.scope.max_segment_repeats) else None


# A canonical http(s) URL is "scheme://host[:port]/path[?query]" (frontier.urls): its host and path
# are found by string, at a fifth of urlsplit's cost, three times for each of a page's links.
def _host(url: str) -> str:
    """The host of the canonical ``url``, as ``urlsplit(url).hostname`` gives it.

    >>> _host("http://h.test:8800/a"), _host("https://[::1]:8080/"), _host("http://h.test?q")
    ('h.test', '::1', 'h.test')
    """
    start = _authority_start(url)
    end = _authority_end(url, start)
    if url.startswith("[", start):
        return url[start + 1 : url.index("]", start)]
    return url[start:end].partition(":")[0]


def _path(url: str) -> str:
    """The path of the canonical ``url``, as ``urlsplit(url).path`` gives it.

    >>> _path("http://h.test/a/b.PNG?x=/c"), _path("http://h.test")
    ('/a/b.PNG', '')
    """
    start = _authority_end(url, _authority_start(url))
    end = len(url)
    for mark in "?#":
        found = url.find(mark, start, end)
        if found != -1:
            end = found
    return url[start:end]


def _authority_start(url: str) -> int:
    return url.find("://") + 3 if "://" in url else 0


def _authority_end(url: str, start: int) -> int:
    end = len(url)
    for mark in "/?#":
        found = url.find(mark, start, end)
        if found != -1:
            end = found
    return end


@dataclass(frozen=True)
class _BuiltinFilter:
    """A built-in filter's factory taking no params (raises InvalidTask naming any): the job's ``scope``,
    ``max_depth`` and the defaults configure its check."""

    name: str
    check: UrlFilter

    def __call__(self, params: Mapping[str, Any]) -> UrlFilter:
        if params:
            first = str(next(iter(params)))
            raise InvalidTask(first, f"the {self.name!r} filter takes no params: the job's scope configures it")
        return self.check


_BUILTIN_CHECKS = (_scope_check, _deny_check, _allow_check, _suffix_check, _trap_check)


def suffix_filter(params: Mapping[str, Any]) -> UrlFilter:
    """The ``suffix`` filter: paths of non-page files (reason ``suffix``; sitemaps are exempt).

    Params (all optional): ``suffixes`` replaces ``DEFAULT_SKIP_SUFFIXES``, ``add`` adds to the list,
    ``keep`` takes out of it; each a list of suffixes with the dot, matched case-insensitively.

    >>> check = suffix_filter({"add": [".json"], "keep": [".PDF"]})
    >>> context = AdmissionContext("", 0, Scope(frozenset(), (), (), (), max_depth=1))
    >>> check("http://a.test/x.json", context), check("http://a.test/x.pdf", context)
    ('suffix', None)

    Raises:
        InvalidTask: naming the param (``suffixes``, ``add``, ``keep``, or an unknown one).
    """
    _known_params(params, ("suffixes", "add", "keep"))
    if not params:
        return _suffix_check
    suffixes = _suffix_list(params, "suffixes") if "suffixes" in params else DEFAULT_SKIP_SUFFIXES
    if "suffixes" in params and not suffixes:
        raise InvalidTask("suffixes", "needs at least one suffix; leave suffix out of the chain to keep every one")
    chosen = tuple(sorted((suffixes | _suffix_list(params, "add")) - _suffix_list(params, "keep")))

    def check(url: str, context: AdmissionContext) -> str | None:
        if context.sitemap:  # the way in, not a page: a sitemap may well be .xml.gz
            return None
        return "suffix" if chosen and _path(url).lower().endswith(chosen) else None

    return check


def trap_filter(params: Mapping[str, Any]) -> UrlFilter:
    """The ``trap`` filter: repeated path segments (reason ``trap``).

    Params (optional): ``max_segment_repeats``, how often a segment may occur (1..100, default 3).

    Raises:
        InvalidTask: naming the param.
    """
    _known_params(params, ("max_segment_repeats",))
    if not params:
        return _trap_check
    repeats = params["max_segment_repeats"]
    if isinstance(repeats, bool) or not isinstance(repeats, int) or not 1 <= repeats <= MAX_SEGMENT_REPEATS:
        raise InvalidTask("max_segment_repeats", f"must be an integer from 1 to {MAX_SEGMENT_REPEATS}, got {repeats!r}")

    def check(url: str, context: AdmissionContext) -> str | None:
        return "trap" if _is_trap(_path(url), repeats) else None

    return check


def _known_params(params: Mapping[str, Any], known: tuple[str, ...]) -> None:
    for name in params:
        if name not in known:
            raise InvalidTask(str(name), f"unknown param; known: {', '.join(known)}")


def _suffix_list(params: Mapping[str, Any], name: str) -> frozenset[str]:
    """A list param of path suffixes (``.pdf``), lowercased: bounded in count and length, no '/', '?' or '#'."""
    value = params.get(name, [])
    if not isinstance(value, list | tuple):
        raise InvalidTask(name, f"must be a list of suffixes such as '.pdf', got {kind_of(value)}")
    if len(value) > MAX_SKIP_SUFFIXES:
        raise InvalidTask(name, f"may hold at most {MAX_SKIP_SUFFIXES} suffixes, got {len(value)}")
    for index, suffix in enumerate(value):
        if not isinstance(suffix, str) or not _SUFFIX.fullmatch(suffix):
            raise InvalidTask(f"{name}[{index}]", f"must be a suffix with its dot, such as '.pdf' (2-32 characters, "
                                                  f"ASCII, no '/', '?', '#' or spaces), got {suffix!r}")  # fmt: skip
    return frozenset(suffix.lower() for suffix in value)


_SUFFIX = re.compile(r"\.[A-Za-z0-9._~%!$&'()*+,;=:@-]{1,31}")  # RFC 3986 path characters: a canonical path's

scope_filter = _BuiltinFilter("scope", _scope_check)
"""The ``scope`` filter: scheme, URL length, depth, then hosts and domains (reasons ``scheme``,
``too_long``, ``depth``, ``host``)."""
deny_filter = _BuiltinFilter("deny", _deny_check)
"""The ``deny`` filter: the job's ``scope.deny`` regexes (reason ``deny``)."""
allow_filter = _BuiltinFilter("allow", _allow_check)
"""The ``allow`` filter: the job's ``scope.allow`` regexes (reason ``allow``)."""
