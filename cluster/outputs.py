"""A finished job's output reaches storage within seconds: its WARC files, their indexes and record parts.

Every worker process keeps one WARC writer, one record writer and one fetch log writer per job,
spooled locally and shipped whole. Left alone, a WARC file ships at 1 GiB or when the worker
stops, so a ``completed`` job's archive would be incomplete for as long as the workers run.

* ``OutputLedger`` (Redis, per job): which writers (worker processes) hold output of the job not
  shipped yet. A process notes itself when one of its writers of the job opens a file, before
  the capture or record is written (so before the batch that wrote it can complete the job), and
  clears its note once it shipped what it held. Each process also beats while it lives: the note
  of a process silent for the node timeout (killed) no longer counts as pending.
* ``OutputShipper`` (a thread per worker process): when a job completes (announced on a Redis
  pub/sub channel by whoever completed it, and a poll every ``poll_s`` in case a message is
  missed or nobody announced: a lease that ran out can complete a job too), it rolls and ships
  this process's writers of the job, then clears the process's note.

A job's status counts the live notes (``outputs_pending``): ``vcrawl submit --wait`` returns once
the job is completed and that count is 0, so the files are in storage when it returns.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

import redis

from vcrawl import names, redis_keys
from vcrawl.redis_replies import text

__all__ = ["LocalOutputs", "OutputLedger", "OutputShipper", "is_output_due", "writer_token"]

logger = logging.getLogger(__name__)

_FINISHED = frozenset(names.FINAL_STATES)
_LISTEN_S = 0.25


def writer_token() -> str:
    """A name for this process in the ledger: host, pid and a random part (a new one after a fork)."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"


def is_output_due(state: str | None, current_cycle: int, noted_cycle: int) -> bool:
    """True when output noted in ``noted_cycle`` is due in storage: the job is finished, or its
    cycle is over (a scheduled job may be running its next cycle already).

    >>> is_output_due("completed", 0, 0), is_output_due("running", 0, 0), is_output_due("paused", 0, 0)
    (True, False, False)
    >>> is_output_due("running", 3, 2), is_output_due(None, 0, 0)
    (True, True)
    """
    return state is None or state in _FINISHED or current_cycle > noted_cycle


class OutputLedger:
    """Which worker processes hold a job's output not shipped yet (Redis)."""

    def __init__(self, client: redis.Redis, alive_s: float) -> None:
        self._redis = client
        self._alive_ms = max(1, int(alive_s * 1000))

    def note(self, job_id: str, writer: str, cycle: int) -> None:
        """``writer`` holds output of ``job_id`` written in ``cycle`` (the first cycle noted is kept)."""
        pipe = self._redis.pipeline(transaction=False)
        pipe.hsetnx(redis_keys.job_output_writers(job_id), writer, cycle)
        pipe.set(redis_keys.output_writer_alive(writer), 1, px=self._alive_ms)
        pipe.execute()

    def clear(self, job_id: str, writer: str) -> None:
        """``writer`` shipped what it held of ``job_id``."""
        self._redis.hdel(redis_keys.job_output_writers(job_id), writer)

    def noted(self, job_id: str) -> dict[str, int]:
        """Every note of ``job_id``: writer -> the cycle it noted (live writers or not)."""
        raw = self._redis.hgetall(redis_keys.job_output_writers(job_id))
        return {text(writer): int(cycle) for writer, cycle in raw.items()}

    def pending(self, job_id: str) -> list[str]:
        """The live writers still holding output of ``job_id``, sorted."""
        writers = sorted(self.noted(job_id))
        if not writers:
            return []
        pipe = self._redis.pipeline(transaction=False)
        for writer in writers:
            pipe.exists(redis_keys.output_writer_alive(writer))
        return [writer for writer, alive in zip(writers, pipe.execute(), strict=True) if alive]

    def beat(self, writer: str) -> None:
        """``writer``'s process is alive (for the ledger's alive time)."""
        self._redis.set(redis_keys.output_writer_alive(writer), 1, px=self._alive_ms)

    def announce(self, job_id: str, cycle: int) -> None:
        """Tell every shipper that ``job_id`` (in ``cycle``) completed."""
        message = json.dumps({"job": job_id, "cycle": cycle}, separators=(",", ":"))
        self._redis.publish(redis_keys.outputs_channel(), message)

    def subscribe(self) -> Any:
        """A pub/sub subscribed to completion announcements (``get_message`` gives them)."""
        pubsub = self._redis.pubsub(ignore_subscribe_messages=True)
        pubsub.subscribe(redis_keys.outputs_channel())
        return pubsub


class LocalOutputs(Protocol):
    """This process's writers, by job."""

    def jobs(self) -> list[str]:
        """Jobs this process has writers for."""
        ...

    def has_pending(self, job_id: str) -> bool:
        """True if a writer of ``job_id`` holds a line or capture not shipped yet."""
        ...

    def ship(self, job_id: str) -> None:
        """Roll and ship every writer of ``job_id`` (raises if the store fails; nothing is lost)."""
        ...


class OutputShipper:
    """A process's thread that ships a job's output when the job (or its cycle) completes."""

    def __init__(
        self,
        ledger: OutputLedger,
        local: LocalOutputs,
        job_state: Callable[[str], tuple[str | None, int]],
        writer: str | None = None,
        poll_s: float = 2.0,
    ) -> None:
        """``job_state(job)`` gives the job's state and current cycle (state None: unknown)."""
        self.writer = writer_token() if writer is None else writer
        self._ledger = ledger
        self._local = local
        self._job_state = job_state
        self._poll_s = poll_s
        self._lock = threading.Lock()  # guards _noted and the ledger note; never held while shipping
        self._ship_lock = threading.Lock()  # one shipment at a time
        self._noted: dict[str, int] = {}  # job -> the cycle this process's note names
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> OutputShipper:
        """Run in a daemon thread (once while running)."""
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return self
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="vcrawl-outputs", daemon=True)
            self._thread.start()
        return self

    def stop_soon(self) -> None:
        """Tell the thread to stop, without waiting for it (``stop`` waits)."""
        self._stop.set()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the thread (the worker's shutdown ships what is left itself)."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)

    def note(self, job_id: str) -> None:
        """A writer of ``job_id`` in this process opened a file: note it (once until shipped).

        Called under the writer's own lock, so it never waits for a shipment (which takes that lock).
        """
        if job_id in self._noted:
            return
        with self._lock:
            if job_id not in self._noted:
                self._note(job_id)

    def ship_due(self, announced: str | None = None) -> list[str]:
        """Ship the output of every job of this process that is due (and of ``announced``); return them.

        A job not due keeps its note (noted again: a Redis restart may have lost it; output written
        after a shipment is noted here if its writer's own note raced with the shipment).
        """
        shipped = []
        for job_id in sorted(set(self._local.jobs()) | set(self._noted)):
            noted = self._noted.get(job_id)
            if noted is None and not self._local.has_pending(job_id):
                continue
            state, cycle = self._job_state(job_id)
            if job_id == announced or is_output_due(state, cycle, cycle if noted is None else noted):
                self.ship(job_id)
                shipped.append(job_id)
                continue
            with self._lock:
                if job_id in self._noted:
                    self._ledger.note(job_id, self.writer, self._noted[job_id])
                else:
                    self._note(job_id)
        return shipped

    def ship(self, job_id: str) -> None:
        """Roll and ship this process's writers of ``job_id``, then clear its note."""
        with self._ship_lock:
            self._local.ship(job_id)  # outside _lock: it takes the writers' locks, under which they note
            with self._lock:
                self._noted.pop(job_id, None)
                self._ledger.clear(job_id, self.writer)
                if self._local.has_pending(job_id):  # written meanwhile (a late batch, the next cycle)
                    self._note(job_id)
        logger.info("job %s: this process's WARC files and record parts shipped", job_id)

    def ship_all(self) -> None:
        """Ship every job's output of this process and clear its notes (at worker shutdown)."""
        for job_id in sorted(set(self._local.jobs()) | set(self._noted)):
            self.ship(job_id)

    def _note(self, job_id: str) -> None:
        _state, cycle = self._job_state(job_id)
        self._ledger.note(job_id, self.writer, cycle)
        self._noted[job_id] = cycle

    def _run(self) -> None:
        pubsub: Any = None
        next_poll = 0.0
        while not self._stop.is_set():
            try:
                if pubsub is None:
                    pubsub = self._ledger.subscribe()
                # Short waits on the subscription (no command is sent), so a stop is noticed at once.
                announced = _announced_job(pubsub.get_message(timeout=_LISTEN_S))
                if announced is not None and announced not in self._local.jobs():
                    announced = None  # another process's job
                if announced is None and time.monotonic() < next_poll:
                    continue
                self._ledger.beat(self.writer)
                self.ship_due(announced)
                next_poll = time.monotonic() + self._poll_s
            except Exception:  # a Redis restart or a failing store: try again on the next round
                logger.exception("output shipper round failed")
                _close(pubsub)
                pubsub = None
                self._stop.wait(1.0)
        _close(pubsub)


def _announced_job(message: Any) -> str | None:
    if not message or message.get("type") != "message":
        return None
    try:
        return str(json.loads(message["data"])["job"])
    except (ValueError, KeyError, TypeError):
        logger.warning("output shipper: unreadable announcement %r", message)
        return None


def _close(pubsub: Any) -> None:
    if pubsub is not None:
        try:
            pubsub.close()
        except Exception:  # a broken connection is dropped either way
            logger.debug("closing the announcement subscription failed", exc_info=True)
