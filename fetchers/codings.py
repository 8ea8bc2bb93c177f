"""Content-Encoding decoders for ``fetchers.wire``: one coding, each call held to ``n`` bytes out."""

from __future__ import annotations

import zlib
from typing import Any

__all__ = ["decoders_for"]


def decoders_for(encoding: str) -> list[Any] | None:
    """The zlib decoder of a Content-Encoding ([] when there is none to apply); None for stacked codings.

    One coding only: a decoder's output feeding another could not be bounded by ``read1``'s ``n``
    (a gzip bomb inside a gzip bomb), and a chain of thousands would cost a decoder each. Servers
    compress once; a body compressed twice fails ``bad_encoding``.
    """
    codings = [part.strip().lower() for part in encoding.split(",")]
    codings = [coding for coding in codings if coding and coding != "identity"]
    if not codings:
        return []
    if len(codings) > 1:
        return None
    if codings[0] in ("gzip", "x-gzip"):
        return [zlib.decompressobj(16 + zlib.MAX_WBITS)]
    if codings[0] == "deflate":
        return [_Deflate()]
    return []  # as urllib3 does: a coding it cannot decode leaves the body as it came


class _Deflate:
    """``deflate`` as servers send it: zlib-wrapped as RFC 9110 says, or raw as some do."""

    def __init__(self) -> None:
        self._inner = zlib.decompressobj()
        self._first = True

    @property
    def unconsumed_tail(self) -> bytes:
        return self._inner.unconsumed_tail

    def decompress(self, data: bytes, n: int = 0) -> bytes:
        if self._first and data:
            self._first = False
            try:
                return self._inner.decompress(data, n)
            except zlib.error:
                self._inner = zlib.decompressobj(-zlib.MAX_WBITS)
        return self._inner.decompress(data, n)

    def flush(self) -> bytes:
        return self._inner.flush()
