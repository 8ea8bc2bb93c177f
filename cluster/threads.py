"""A thread pool whose size changes while it runs: what a worker's task slots are (``tasks.pool``).

``concurrent.futures.ThreadPoolExecutor`` (what Celery's ``threads`` pool runs on) can neither grow
after its first threads nor let one go, so a worker started with ``-c 8`` ran 8 tasks at once for
good. Here ``resize`` starts threads at once, or lets threads go as they finish the task in hand:
no task is cut short, and none starts on a thread past the new size.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

__all__ = ["ResizableThreads"]


_STOP = object()  # wakes an idle thread: it leaves if the pool is past its size or shut down


class ResizableThreads:
    """Run submitted calls on ``size`` threads; ``resize`` changes how many.

    As ``ThreadPoolExecutor``: idle threads wait in ``queue.SimpleQueue.get`` (C), and a thread is
    started only when a call finds none idle, so a worker runs as few threads as its load needs. A
    first version started every thread at once and waited on one ``threading.Condition``: U20 crawls
    took 15-25 % more CPU a page (threads' connections and caches spread over all of them, wake-ups
    under GIL contention). The lock here is held only to count.
    """

    def __init__(self, size: int, name: str = "vcrawl-slot") -> None:
        if size < 1:
            raise ValueError(f"a thread pool needs at least one thread, got {size}")
        self._lock = threading.Lock()
        self._work: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._threads: set[threading.Thread] = set()
        self._size = size
        self._running = 0
        self._closed = False
        self._name = name
        self._started = 0
        self._idle = threading.Semaphore(0)  # one count per thread waiting for work

    @property
    def size(self) -> int:
        """How many threads the pool runs (once those past a shrink have finished their task)."""
        return self._size

    @property
    def threads(self) -> int:
        """Threads alive now (more than ``size`` for a moment after a shrink)."""
        with self._lock:
            return len(self._threads)

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        """Run ``fn(*args, **kwargs)`` on the next free thread.

        Raises:
            RuntimeError: the pool was shut down.
        """
        if self._closed:
            raise RuntimeError("cannot submit to a thread pool that was shut down")
        future: Future[Any] = Future()
        self._work.put((future, fn, args, kwargs))
        if not self._idle.acquire(timeout=0):  # no thread waiting: one more, up to the size
            with self._lock:
                self._start_missing(1)
        return future

    def resize(self, size: int) -> None:
        """Run ``size`` threads: new ones start now; threads past it stop after their task in hand.

        Raises:
            ValueError: ``size`` is below 1.
        """
        if size < 1:
            raise ValueError(f"a thread pool needs at least one thread, got {size}")
        with self._lock:
            self._size = size
            self._start_missing(self._work.qsize())  # growing: threads for the work that waits
            past = len(self._threads) - size
        for _ in range(past):  # idle threads past the size leave now
            self._work.put(_STOP)

    def shutdown(self, wait: bool = True, cancel_futures: bool = False) -> None:
        """Take no more work; cancel what waits (``cancel_futures``); wait for the threads (``wait``)."""
        with self._lock:
            self._closed = True
            threads = list(self._threads)
        if cancel_futures:
            while True:
                try:
                    item = self._work.get_nowait()
                except queue.Empty:
                    break
                if item is not _STOP:
                    item[0].cancel()
        for _ in threads:  # after the work already queued: it is done first
            self._work.put(_STOP)
        if wait:
            for thread in threads:
                if thread is not threading.current_thread():
                    thread.join()

    def _start_missing(self, most: int) -> None:  # with the lock held
        for _ in range(most):
            if self._closed or len(self._threads) >= self._size:
                return
            self._started += 1
            thread = threading.Thread(target=self._serve, name=f"{self._name}-{self._started}", daemon=True)
            self._threads.add(thread)
            thread.start()

    def _serve(self) -> None:
        me = threading.current_thread()
        item: Any = None
        while True:
            if item is None:
                item = self._work.get()
            with self._lock:
                if item is _STOP:
                    if self._closed or len(self._threads) > self._size:
                        self._threads.discard(me)
                        self._idle.acquire(timeout=0)  # it waited as idle: it is not any more
                        return
                    item = None
                    continue
                handed_back = self._running >= self._size  # a shrink left size tasks running: not on this thread
                if handed_back:
                    self._threads.discard(me)
                else:
                    self._running += 1
            if handed_back:
                self._work.put(item)
                return
            future, fn, args, kwargs = item
            try:
                if future.set_running_or_notify_cancel():
                    try:
                        result = fn(*args, **kwargs)
                    except BaseException as exc:  # handed to whoever waits on the future, as the executor does
                        future.set_exception(exc)
                    else:
                        future.set_result(result)
            finally:
                with self._lock:
                    self._running -= 1
                    leave = len(self._threads) > self._size  # past the size after a shrink: the task in hand is done
                    if leave:
                        self._threads.discard(me)
            if leave:
                return
            # Idle only if nothing waits: a thread that counted itself idle and then took a call queued
            # before would leave a count no thread stands for, and a grown pool would start too few.
            try:
                item = self._work.get_nowait()
            except queue.Empty:
                item = None
                self._idle.release()
