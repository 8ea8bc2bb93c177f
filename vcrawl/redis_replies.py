"""Redis replies as Python values, whether the client decodes responses or not."""

from __future__ import annotations

__all__ = ["text"]


def text(value: object) -> str:
    """A reply as text: bytes decoded as UTF-8 (an undecodable byte becomes U+FFFD), None as "".

    >>> text(b"running"), text("running"), text(None), text(3)
    ('running', 'running', '', '3')
    """
    if value is None:
        return ""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value if isinstance(value, str) else str(value)
