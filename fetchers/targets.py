"""The request target as the URL Standard wrote it, not as urllib3 would re-escape it.

requests and urllib3 percent-encode a URL's path and query by RFC 3986's rules before sending it:
a stray ``%`` becomes ``%25``, ``[`` ``]`` ``|`` become escapes, lowercase escapes are upper-cased
and an empty ``?`` is lost. A browser sends the WHATWG URL Standard's serialisation as it stands,
and so do vcrawl's URLs (``frontier.urls``): the server must see the URL its page meant. The
static fetcher names the URL it sends (``sending_as_written``) and its connections put that
URL's target on the request line (``AsWritten``), in place of urllib3's re-escaped one.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

__all__ = ["AsWritten", "sending_as_written", "target_as_written"]

_WRITTEN: ContextVar[str | None] = ContextVar("vcrawl_target_as_written", default=None)


@contextmanager
def sending_as_written(url: str) -> Iterator[None]:
    """Inside the block, the calling thread's request to ``url`` goes out with ``url``'s own target."""
    token = _WRITTEN.set(url)
    try:
        yield
    finally:
        _WRITTEN.reset(token)


def target_as_written(target: str) -> str:
    """The request target to send in place of urllib3's ``target``: the written URL's path and
    query (origin form) or the whole URL (absolute form, to a proxy); no fragment either way.

    >>> with sending_as_written("http://h.test/a%2zb[c]?#f"):
    ...     target_as_written("/a%252zb%5Bc%5D"), target_as_written("http://h.test/a%252zb%5Bc%5D")
    ('/a%2zb[c]?', 'http://h.test/a%2zb[c]?')
    """
    written = _WRITTEN.get()
    if written is None:
        return target
    written = written.partition("#")[0]
    if not target.startswith("/"):
        return written
    authority_start = written.find("://") + 3
    path_start = written.find("/", authority_start)
    return written[path_start:] if path_start != -1 else "/"


class AsWritten:
    """Mixed into urllib3's connection classes: send the target as written (``target_as_written``)."""

    def request(self, method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        return super().request(method, target_as_written(url), *args, **kwargs)  # type: ignore[misc]
