"""Bounded waits for tests: poll a condition instead of sleeping a fixed time and hoping."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_until(check: Callable[[], Any], timeout_s: float, what: str | Callable[[], str], poll_s: float = 0.01) -> Any:
    """Return ``check()``'s first truthy value; fail naming ``what`` (or what it returns then) after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        if value := check():
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"not within {timeout_s} s: {what() if callable(what) else what}")
        time.sleep(poll_s)
