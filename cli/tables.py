"""Plain-text tables for the ``vcrawl`` subcommands (``nodes``, ``proxies``, ``stats``)."""

from __future__ import annotations

from collections.abc import Collection, Sequence

__all__ = ["aligned"]


def aligned(rows: Sequence[Sequence[str]], right: Collection[int] = ()) -> list[str]:
    """The rows as lines, columns two spaces apart; columns in ``right`` (numbers) are right-aligned.

    >>> print("\\n".join(aligned([("HOST", "PAGES"), ("a.example", "12"), ("b", "3")], right={1})))
    HOST       PAGES
    a.example     12
    b              3
    """
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.rjust(widths[i]) if i in right else cell.ljust(widths[i])
                      for i, cell in enumerate(row)).rstrip() for row in rows]  # fmt: skip
