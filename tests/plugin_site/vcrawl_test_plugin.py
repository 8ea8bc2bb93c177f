"""A third-party analyzer plugin used by the tests, found through its entry point."""

from __future__ import annotations

import threading
from typing import Any

CALLS: list[str] = []
_lock = threading.Lock()


def always_fails(page: Any, rules: Any) -> dict:
    """An analyzer with a bug: it raises on every page."""
    with _lock:
        CALLS.append(page.url)
    raise RuntimeError(f"analyzer bug on {page.url}")


def word_count(page: Any, rules: Any) -> dict:
    """A working plugin analyzer: counts the words of the page text."""
    return {"url": page.url, "words": len(page.tree.text_content().split())}
