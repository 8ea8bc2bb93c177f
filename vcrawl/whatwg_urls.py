"""URLs as the WHATWG URL Standard writes them, and the links whose resolution needs no parser.

ada-url parses and serialises URLs as browsers do, but its calls release the GIL (cffi): in a
worker of many threads each call may wait for the GIL to come back, so a page's links and their
admission went at a third of the speed. Most URLs a crawl meets are plain (a lowercase host, a path
of characters the Standard leaves alone), and the Standard writes them as they stand:
``serialized`` tells those apart with one regular expression, and ``resolve`` joins a plain
relative link to a serialised base as strings (its "." and ".." segments too), and takes an
absolute or scheme-relative link that is serialised already as it stands. Anything else goes to
ada-url. The tests hold both to ada-url on random URLs.
"""

from __future__ import annotations

import re

import ada_url

__all__ = ["Resolver", "parse", "resolve", "serialized"]

_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
# A host the host parser gives back as it stands: a dotted quad with no leading zeros, or lowercase
# labels whose last does not begin with a digit (else the IPv4 parser reads it). No "xn--" label:
# checked apart (ada-url validates Punycode).
_HOST = rf"(?:{_OCTET}(?:\.{_OCTET}){{3}}|(?:[a-z0-9_-]+\.)*[a-z_-][a-z0-9_-]*)"
_PATH = r"/[A-Za-z0-9\-._~!$&'()*+,;=:@%/\[\]|]*"  # no C0, space, " # < > ? ` { } ^ \ or non-ASCII
_QUERY = r"\?[A-Za-z0-9\-._~!$&()*+,;=:@%/?\[\]|^`{}]*"  # the special-query set escapes ' too
_FRAGMENT = r"#[A-Za-z0-9\-._~!$&'()*+,;=:@%/?\[\]|^{}#]*"
_SERIALIZED = re.compile(rf"(https?)://({_HOST})(?::([1-9][0-9]{{0,4}}))?({_PATH})(?:{_QUERY})?(?:{_FRAGMENT})?")
# A relative link with nothing to escape, no scheme (no ":" before a "/") and no authority ("//").
_PLAIN_HREF = re.compile(rf"(?!//)[A-Za-z0-9\-._~!$&'()*+,;=@%/\[\]|]*(?:{_QUERY})?(?:{_FRAGMENT})?")
_DEFAULT_PORT = {"http": "80", "https": "443"}


def serialized(url: str) -> bool:
    """True if ``url`` is an http(s) URL the Standard's serialiser writes as it stands.

    >>> serialized("http://127.0.1.1:8800/a/b.html?q=1#top"), serialized("http://Example.com/"), serialized("http://h/a/../b")
    (True, False, False)
    """
    match = _SERIALIZED.fullmatch(url)
    if match is None:
        return False
    scheme, host, port, path = match.groups()
    if port is not None and (port == _DEFAULT_PORT[scheme] or int(port) > 65535):
        return False
    if "xn--" in host or "/." in path:  # Punycode to validate; a "." or ".." segment to resolve
        return False
    return "%2" not in path or ("%2e" not in path and "%2E" not in path)  # "%2e" is a "." in a segment


def parse(url: str) -> str:
    """``url`` serialised by the Standard (its ``href``).

    Raises:
        ValueError: the Standard refuses it.
    """
    return url if serialized(url) else ada_url.URL(url).href


def resolve(base: str, href: str) -> str:
    """``href`` resolved against the serialised URL ``base``, serialised, as a browser resolves a link.

    Raises:
        ValueError: the Standard refuses it.

    >>> resolve("http://h.test/a/b?x#y", "c/d.html#e"), resolve("http://h.test/a/b", "?q")
    ('http://h.test/a/c/d.html#e', 'http://h.test/a/b?q')
    >>> resolve("http://h.test/a/b/c", "../../d"), resolve("https://h.test/a", "//o.test/x")
    ('http://h.test/d', 'https://o.test/x')
    """
    return Resolver(base)(href)


class Resolver:
    """``resolve`` against one base: what the links of a page share (is the base serialised, where
    its path starts and its directory ends) is worked out once, not once per link."""

    __slots__ = ("_base", "_dir", "_origin", "_path", "_plain", "_scheme", "_unfragmented")

    def __init__(self, base: str) -> None:
        self._base = base
        self._plain = serialized(base)
        if self._plain:
            self._scheme = base[: base.index(":") + 1]
            self._unfragmented = base.partition("#")[0]
            path_start = base.index("/", len(self._scheme) + 2)
            self._origin = base[:path_start]
            self._path = self._unfragmented[path_start:].partition("?")[0]
            self._dir = self._origin + self._path[: self._path.rfind("/") + 1]

    def __call__(self, href: str) -> str:
        """``href`` resolved; see ``resolve``.

        Raises:
            ValueError: the Standard refuses it.
        """
        if self._plain:
            if serialized(href):  # an absolute link written as the Standard writes it: the base plays no part
                return href
            if href[:2] == "//":  # scheme-relative: the base's scheme, then a URL of its own
                absolute = self._scheme + href
                if serialized(absolute):
                    return absolute
            elif _PLAIN_HREF.fullmatch(href):
                joined = self._joined(href)
                if serialized(joined):
                    return joined
                if "%2" not in href:  # "%2e" segments are dot segments too: the parser's
                    joined = _without_dot_segments(joined)
                    if serialized(joined):
                        return joined
        return ada_url.join_url(self._base, href)

    def _joined(self, href: str) -> str:
        # The Standard's relative resolution for a link with no scheme and no authority, as strings.
        if not href or href[0] == "#":
            return self._unfragmented + href
        if href[0] == "/":
            return self._origin + href
        if href[0] == "?":
            return self._origin + self._path + href
        return self._dir + href


def _without_dot_segments(url: str) -> str:
    # The path state's "." and ".." segments of a special URL: ".." drops the segment before it (never
    # the root), "." goes, and either one last leaves the path ending in "/".
    path_start = url.index("/", url.index("://") + 3)
    path_end = min((at for at in (url.find("?", path_start), url.find("#", path_start)) if at >= 0), default=len(url))
    segments = url[path_start + 1 : path_end].split("/")
    kept: list[str] = []
    for index, segment in enumerate(segments):
        if segment == "..":
            if kept:
                kept.pop()
        elif segment != ".":
            kept.append(segment)
            continue
        if index == len(segments) - 1:
            kept.append("")
    return url[:path_start] + "/" + "/".join(kept) + url[path_end:]
