"""Argument types shared by the ``vcrawl`` subcommands (argparse ``type=`` callables)."""

from __future__ import annotations

import argparse

__all__ = ["positive_int"]


def positive_int(raw: str) -> int:
    """A whole number of at least 1 (``--limit``, ``--days``).

    >>> positive_int("14")
    14
    >>> positive_int("0")
    Traceback (most recent call last):
    argparse.ArgumentTypeError: must be at least 1, got 0

    Raises:
        argparse.ArgumentTypeError: not a whole number, or below 1 (argparse prints it as a usage error).
    """
    try:
        value = int(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, got {raw!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value
