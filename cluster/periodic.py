"""A daemon thread that calls one function at a fixed period until stopped (a worker's watchers)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

__all__ = ["Periodic"]

logger = logging.getLogger(__name__)


class Periodic:
    """Call ``look`` every ``every_s`` in a daemon thread named ``name``; an exception is logged and
    the next period tries again (Redis away for a moment, a failover under way)."""

    def __init__(self, name: str, every_s: float, look: Callable[[], object]) -> None:
        self._name, self._every_s, self._look = name, every_s, look
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> Periodic:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _run(self) -> None:
        while not self._stop.wait(self._every_s):
            try:
                self._look()
            except Exception:
                logger.exception("%s: look failed", self._name)
