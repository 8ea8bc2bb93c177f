"""A thread pool whose size changes while it runs: what a worker's task slots are (``tasks.pool``).

``concurrent.futures.ThreadPoolExecutor`` (what Celery's ``threads`` pool runs on) can neither grow
after its first threads nor let one go, so a worker started with ``-c 8`` ran 8 tasks at once for
good. Here ``resize`` starts threads at once, or lets threads go as they finish the task in hand:
no task is cut short, and none starts on a thread past the new size.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

__all__ = ["ResizableThreads"]


class ResizableThreads:
    """Run submitted calls on ``size`` threads; ``resize`` changes how many."""

    def __init__(self, size: int, name: str = "vcrawl-slot") -> None:
        if size < 1:
            raise ValueError(f"a thread pool needs at least one thread, got {size}")
        self._changed = threading.Condition()
        self._work: deque[tuple[Future[Any], Callable[..., Any], tuple[Any, ...], dict[str, Any]]] = deque()
        self._threads: set[threading.Thread] = set()
        self._size = size
        self._closed = False
        self._name = name
        self._started = 0
        with self._changed:
            self._start_missing()

    @property
    def size(self) -> int:
        """How many threads the pool runs (once those past a shrink have finished their task)."""
        return self._size

    @property
    def threads(self) -> int:
        """Threads alive now (more than ``size`` for a moment after a shrink)."""
        with self._changed:
            return len(self._threads)

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        """Run ``fn(*args, **kwargs)`` on the next free thread.

        Raises:
            RuntimeError: the pool was shut down.
        """
        future: Future[Any] = Future()
        with self._changed:
            if self._closed:
                raise RuntimeError("cannot submit to a thread pool that was shut down")
            self._work.append((future, fn, args, kwargs))
            self._changed.notify()
        return future

    def resize(self, size: int) -> None:
        """Run ``size`` threads: new ones start now; threads past it stop after their task in hand.

        Raises:
            ValueError: ``size`` is below 1.
        """
        if size < 1:
            raise ValueError(f"a thread pool needs at least one thread, got {size}")
        with self._changed:
            self._size = size
            self._start_missing()
            self._changed.notify_all()  # idle threads past the size leave now

    def shutdown(self, wait: bool = True, cancel_futures: bool = False) -> None:
        """Take no more work; cancel what waits (``cancel_futures``); wait for the threads (``wait``)."""
        with self._changed:
            self._closed = True
            if cancel_futures:
                while self._work:
                    self._work.popleft()[0].cancel()
            self._changed.notify_all()
            threads = list(self._threads)
        if wait:
            for thread in threads:
                if thread is not threading.current_thread():
                    thread.join()

    def _start_missing(self) -> None:  # with the lock held
        while not self._closed and len(self._threads) < self._size:
            self._started += 1
            thread = threading.Thread(target=self._serve, name=f"{self._name}-{self._started}", daemon=True)
            self._threads.add(thread)
            thread.start()

    def _serve(self) -> None:
        me = threading.current_thread()
        while True:
            with self._changed:
                while not self._work and not self._closed and len(self._threads) <= self._size:
                    self._changed.wait()
                if len(self._threads) > self._size or not self._work:  # past the size, or closed and drained
                    self._threads.discard(me)
                    return
                future, fn, args, kwargs = self._work.popleft()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = fn(*args, **kwargs)
            except BaseException as exc:  # handed to whoever waits on the future, as the executor does
                future.set_exception(exc)
            else:
                future.set_result(result)
