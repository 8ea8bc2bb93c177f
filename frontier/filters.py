"""Pure scope filters: why a canonical URL is not worth crawling, or None to keep it."""

from __future__ import annotations

import ipaddress
import re
from collections import Counter
from dataclasses import dataclass, field
from urllib.parse import urlsplit

__all__ = ["DEFAULT_SKIP_SUFFIXES", "REASONS", "Scope", "reject_reason"]

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
    if not url.startswith(("http://", "https://")):
        return "scheme"
    if len(url) > scope.max_url_length:
        return "too_long"
    if depth > scope.max_depth:
        return "depth"
    parts = urlsplit(url)
    if scope.hosts or scope.domains:
        host = parts.hostname or ""
        if host not in scope.hosts and host not in scope.domains and not host.endswith(scope._domain_suffixes):
            return "host"
    if scope.deny and any(pattern.search(url) for pattern in scope.deny):
        return "deny"
    if scope.allow and not any(pattern.search(url) for pattern in scope.allow):
        return "allow"
    path = parts.path
    if path.lower().endswith(scope._suffixes):
        return "suffix"
    if _is_trap(path, scope.max_segment_repeats):
        return "trap"
    return None
