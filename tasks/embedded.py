"""A Celery worker inside this process, for ``vcrawl demo`` / ``vcrawl crawl`` and tests."""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from types import TracebackType
from typing import Any

from celery import signals
from celery.worker import WorkController
from celery.worker import state as worker_state

from celeryconfig import ANALYSIS_QUEUE, DOWNLOAD_QUEUE, DYNAMIC_QUEUE
from tasks.app import app

__all__ = ["EmbeddedWorker"]

logger = logging.getLogger(__name__)


class _ReadyWorkController(WorkController):
    """A WorkController that says when its consumer is ready."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.ready = threading.Event()
        super().__init__(*args, **kwargs)

    def on_consumer_ready(self, consumer: Any) -> None:
        super().on_consumer_ready(consumer)
        # Sent by `celery worker` (celery.apps.worker), not by a bare WorkController.
        signals.worker_ready.send(sender=consumer)
        self.ready.set()


class EmbeddedWorker:
    """Run a thread-pool worker for the given queues in a background thread.

    Leaving the ``with`` block asks for a warm shutdown: running tasks finish,
    unstarted ones stay in the broker for the next worker (``acks_late``).
    """

    def __init__(
        self,
        queues: Sequence[str] = (DOWNLOAD_QUEUE, DYNAMIC_QUEUE, ANALYSIS_QUEUE),
        concurrency: int = 8,
        hostname: str = "embedded@localhost",
        loglevel: str = "WARNING",
        start_timeout_s: float = 30.0,
        stop_timeout_s: float = 30.0,
    ) -> None:
        self._queues = list(queues)
        self._concurrency = concurrency
        self._hostname = hostname
        self._loglevel = loglevel
        self._start_timeout_s = start_timeout_s
        self._stop_timeout_s = stop_timeout_s
        self._thread: threading.Thread | None = None
        self.worker: _ReadyWorkController | None = None

    def start(self) -> EmbeddedWorker:
        """Start the worker and wait until it consumes.

        Raises:
            RuntimeError: it did not become ready in time.
        """
        app.finalize()
        # Signatures resolve through the current app; without this a worker thread falls back to
        # Celery's default app, which reads celeryconfig from the environment alone.
        app.set_current()
        app.set_default()
        worker_state.should_stop = None
        worker_state.should_terminate = None
        self.worker = _ReadyWorkController(
            app=app,
            hostname=self._hostname,
            pool="threads",
            concurrency=self._concurrency,
            queues=self._queues,
            loglevel=self._loglevel,
            without_mingle=True,
            without_gossip=True,
            without_heartbeat=True,
            ready_callback=None,
        )
        self._thread = threading.Thread(target=self.worker.start, name="vcrawl-worker", daemon=True)
        self._thread.start()
        if not self.worker.ready.wait(self._start_timeout_s):
            self.stop()
            raise RuntimeError(f"embedded worker not ready within {self._start_timeout_s}s")
        logger.debug("embedded worker consuming %s", self._queues)
        return self

    def stop(self, timeout_s: float | None = None) -> bool:
        """Warm shutdown: let running tasks finish for up to ``timeout_s``; return True if it ended.

        A task still running after that is left behind; with ``acks_late`` its message
        is redelivered to the next worker.
        """
        if self._thread is None:
            return True
        worker_state.should_stop = 0  # what SIGTERM does: a warm shutdown of the consumer loop
        self._thread.join(self._stop_timeout_s if timeout_s is None else timeout_s)
        stopped = not self._thread.is_alive()
        if not stopped:
            logger.warning("embedded worker still busy; leaving its running tasks behind")
        worker_state.should_stop = None
        self._thread = None
        return stopped

    def __enter__(self) -> EmbeddedWorker:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
