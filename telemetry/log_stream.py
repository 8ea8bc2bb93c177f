"""The cluster log stream: every worker's log lines in one Redis Stream, read by ``vcrawl logs``.

``StreamShipper`` is a logging handler. A line goes to the stream when its level reaches its
logger's stream level: the nearest of the logger and its parents in the levels hash (``vcrawl
log-level engine INFO``), else the cluster's ``VCRAWL_LOG_STREAM_LEVEL``. A background thread polls
that hash every few seconds, so a change needs no restart, and lowers a logger's own level when the
stream wants more than the process logs locally (the local handlers keep their level).

Shipping never blocks or breaks the caller: ``emit`` only puts the line on a bounded queue (full:
the line is dropped and counted), and the thread sends batches with ``XADD ... MAXLEN ~ N``. Redis
away: the batch is dropped and counted, local logging goes on, and one line says how many were
lost once Redis is back. The thread and the Redis client are made per process on first use, so a
prefork child (forked with the parent's handler) starts its own.

A line carries its level's number (``levelno``) as well as its name: a reader filters on the number,
so a level only the writing process knows (billiard's ``SUBWARNING``, an unnamed ``Level 25``) reads
back as any other.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import redis

from telemetry.log_context import CONTEXT_FIELDS, iso_time
from vcrawl import redis_keys
from vcrawl.settings import LOG_LEVELS

__all__ = [
    "DEFAULT_LOGGER",
    "FIELD_BYTES",
    "JOB_STREAM_TTL_S",
    "MESSAGE_BYTES",
    "TRACEBACK_BYTES",
    "LogQuery",
    "StreamShipper",
    "cut_text",
    "entry_level",
    "format_entry",
    "job_stream_maxlen",
    "level_of",
    "read_entries",
    "read_new_entries",
    "set_stream_level",
    "stream_levels",
]

logger = logging.getLogger(__name__)

DEFAULT_LOGGER = "root"  # the levels hash's field for every logger not named in it
JOB_STREAM_TTL_S = 7 * 86400  # a job's own stream goes a week after its last line
_BATCH = 500  # lines per XADD pipeline
# What a line may hold, in UTF-8 bytes: the stream is for reading, not for dumps (docs/logs.md sizes
# the stream from these). Longer text is cut and says so.
MESSAGE_BYTES = 2048
TRACEBACK_BYTES = 4096  # its last part: the innermost frames and the exception
FIELD_BYTES = 512  # each of logger, node, job, task id and URL (a long URL, mostly)
_BACKOFF_MAX_S = 5.0
_FIELDS = {"job": "job", "task_id": "task", "url": "url"}  # record attribute -> stream field


def cut_text(text: str, limit_bytes: int, keep_tail: bool = False) -> str:
    """``text`` in at most ``limit_bytes`` of UTF-8, marked where it was cut; its head, or its tail.

    >>> cut_text("0123456789" * 8, 60)
    '01234567890123456789… [cut: 60 more bytes]'
    >>> cut_text("0123456789" * 8, 60, keep_tail=True)
    '[cut: 60 bytes before] …01234567890123456789'
    >>> cut_text("é" * 3, 6)
    'ééé'
    """
    encoded = text.encode("utf-8", "replace")
    if len(encoded) <= limit_bytes:
        return text
    room = max(0, limit_bytes - 40)  # the marker's own bytes: under 40 with a count of up to 16 digits
    if keep_tail:
        kept = encoded[len(encoded) - room :].decode("utf-8", "ignore")
        return f"[cut: {len(encoded) - len(kept.encode())} bytes before] …{kept}"
    kept = encoded[:room].decode("utf-8", "ignore")
    return f"{kept}… [cut: {len(encoded) - len(kept.encode())} more bytes]"


def job_stream_maxlen(maxlen: int) -> int:
    """A job's own stream keeps a tenth of the cluster's (at least 100 lines).

    >>> job_stream_maxlen(100_000), job_stream_maxlen(500)
    (10000, 100)
    """
    return max(100, maxlen // 10)


def level_of(name: str) -> int:
    """A level's number from its name (``WARNING`` -> 30).

    Raises:
        ValueError: not one of DEBUG, INFO, WARNING, ERROR, CRITICAL.
    """
    upper = name.strip().upper()
    if upper not in LOG_LEVELS:
        raise ValueError(f"log level must be one of {', '.join(LOG_LEVELS)}, got {name!r}")
    return logging.getLevelNamesMapping()[upper]


def entry_level(entry: Mapping[str, str]) -> int:
    """A stream entry's level number: its ``levelno``; for a line shipped without one, from its level name.

    A name this process does not know (a level only the writing process registered) counts as WARNING:
    shown by default and from WARNING on, not hidden as if it were below DEBUG.

    >>> entry_level({"level": "Level 25", "levelno": "25"}), entry_level({"level": "ERROR"})
    (25, 40)
    >>> entry_level({"level": "NOTICE"})  # shipped without levelno, by a process that named level 25
    30
    """
    if (number := entry.get("levelno", "")).isdigit():
        return int(number)
    return logging.getLevelNamesMapping().get(entry.get("level", ""), logging.WARNING)


class StreamShipper(logging.Handler):
    """A handler that ships lines to the cluster log stream (see the module's docstring)."""

    def __init__(
        self,
        client: Callable[[], redis.Redis],
        *,
        maxlen: int,
        queue_size: int,
        default_level: int,
        poll_s: float,
        job_ttl_s: float = JOB_STREAM_TTL_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__()
        self._client_factory = client
        self.maxlen, self.queue_size, self.default_level, self.poll_s = maxlen, queue_size, default_level, poll_s
        self.job_maxlen, self.job_ttl_s = job_stream_maxlen(maxlen), job_ttl_s
        self._clock = clock
        self.levels: Mapping[str, int] = {}  # logger -> stream level, from Redis (replaced whole by the thread)
        self.dropped = 0  # lines lost: queue full or Redis away (per process)
        self.shipped = 0
        self._lowered: dict[str, int] = {}  # logger -> its own level before the stream lowered it
        # Lines put and not yet sent or dropped: its unfinished_tasks (the thread calls task_done).
        self._queue: queue.Queue[dict[str, str]] = queue.Queue(queue_size)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        # A fork (a prefork pool child) copies this handler, not its thread, and maybe a lock held
        # by another thread: the child starts afresh.
        after_fork = weakref.WeakMethod(self._forget_parent)
        os.register_at_fork(after_in_child=lambda: (method := after_fork()) is not None and method())

    def _forget_parent(self) -> None:
        self._start_lock = threading.Lock()
        self._queue = queue.Queue(self.queue_size)
        self._stop = threading.Event()
        self._thread = None

    # The caller's side: never blocks, never raises.

    def emit(self, record: logging.LogRecord) -> None:
        if record.name == logger.name or threading.current_thread() is self._thread:
            return  # the shipper's own trouble stays local: shipping it would loop
        try:
            if record.levelno < self.stream_level(record.name):
                return
            self.start()
            self._queue.put_nowait(self._entry(record))
        except queue.Full:
            self.dropped += 1
        except Exception:  # a logging handler must not raise into the code that logs
            self.dropped += 1

    def stream_level(self, name: str) -> int:
        """The level from which ``name``'s lines are shipped: its own or its nearest parent's, else the default."""
        levels = self.levels
        while name:
            if name in levels:
                return levels[name]
            name = name.rpartition(".")[0]
        return levels.get(DEFAULT_LOGGER, self.default_level)

    def start(self) -> StreamShipper:
        """Start this process's shipping thread if it does not run (first use, or first use after a fork)."""
        if self._thread is not None:
            return self
        with self._start_lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="vcrawl-log-shipper", daemon=True)
                self._thread.start()
        return self

    def flush(self, timeout_s: float = 1.0) -> None:
        """Wait up to ``timeout_s`` for the queued lines to be sent or dropped (at shutdown)."""
        if self._thread is None:  # nothing queued in this process
            return
        lines = self._queue
        with lines.all_tasks_done:  # the condition Queue.join waits on, here with a timeout
            lines.all_tasks_done.wait_for(lambda: not lines.unfinished_tasks, timeout_s)

    def close(self) -> None:
        self.flush()
        self._stop.set()
        super().close()

    def _entry(self, record: logging.LogRecord) -> dict[str, str]:
        message = cut_text(record.getMessage(), MESSAGE_BYTES)
        if record.exc_info:
            message += "\n" + cut_text(logging.Formatter().formatException(record.exc_info), TRACEBACK_BYTES, True)
        entry = {
            "t": f"{record.created:.3f}",
            "level": record.levelname,
            "levelno": str(record.levelno),
            "logger": cut_text(record.name, FIELD_BYTES),
            "msg": message,
            "node": cut_text(str(getattr(record, "node", "") or ""), FIELD_BYTES),
        }
        for attribute, name in _FIELDS.items():
            value = getattr(record, attribute, None)
            if value not in (None, "", "???"):
                entry[name] = cut_text(str(value), FIELD_BYTES)
        return entry

    # The shipping thread.

    def _run(self) -> None:
        client: redis.Redis | None = None
        next_poll, backoff_s, reported = 0.0, 0.0, self.dropped
        while not self._stop.is_set():
            batch = self._take(wait_s=0.5)
            now = time.monotonic()
            try:
                client = client or self._client_factory()
                if now >= next_poll:
                    next_poll = now + self.poll_s
                    self._apply_levels(stream_levels(client))
                missed = self.dropped - reported  # Redis is back: say what it missed, before what comes next
                if batch or missed:
                    self._send(client, [self._lost_line(missed), *batch] if missed else batch)
                    self.shipped += len(batch)
                    reported += missed
                backoff_s = 0.0
            except Exception as exc:  # Redis away or failing: drop, count, keep logging locally
                self.dropped += len(batch)
                if backoff_s == 0.0:
                    logger.warning("log stream: Redis unreachable, dropping lines until it is back: %r", exc)
                backoff_s = min(_BACKOFF_MAX_S, max(0.5, backoff_s * 2))
            finally:
                for _ in batch:  # sent or dropped: flush() waits for no more
                    self._queue.task_done()
            if backoff_s:
                self._stop.wait(backoff_s)

    def _take(self, wait_s: float) -> list[dict[str, str]]:
        try:
            batch = [self._queue.get(timeout=wait_s)]
        except queue.Empty:
            return []
        while len(batch) < _BATCH:
            try:
                batch.append(self._queue.get_nowait())
            except queue.Empty:
                break
        return batch

    def _send(self, client: redis.Redis, batch: list[dict[str, str]]) -> None:
        # A job's lines also go to the job's own stream: `vcrawl logs --job` and the dashboard read
        # those few, not the whole cluster's stream.
        pipe = client.pipeline(transaction=False)
        jobs = set()
        for entry in batch:
            pipe.xadd(redis_keys.log_stream(), entry, maxlen=self.maxlen, approximate=True)  # type: ignore[arg-type]
            if job := entry.get("job"):
                jobs.add(job)
                pipe.xadd(redis_keys.job_log_stream(job), entry, maxlen=self.job_maxlen,  # type: ignore[arg-type]
                          approximate=True)  # fmt: skip
        for job in jobs:
            pipe.expire(redis_keys.job_log_stream(job), int(self.job_ttl_s))
        pipe.execute()

    def _lost_line(self, count: int) -> dict[str, str]:
        node = next((str(getattr(f, "node", "")) for f in self.filters if getattr(f, "node", None)), "")
        message = f"{count} log lines of this process were dropped (Redis unreachable or slow)"
        return {"t": f"{self._clock():.3f}", "level": "WARNING", "levelno": str(logging.WARNING), "logger": logger.name,
                "node": node, "msg": message}  # fmt: skip

    def _apply_levels(self, levels: Mapping[str, int]) -> None:
        """Take the stream levels read from Redis; lower a logger's own level where the stream wants more."""
        self.levels = dict(levels)
        wanted = {name: level for name, level in levels.items() if level < _own_effective(name, self._lowered)}
        for name in [name for name in self._lowered if name not in wanted]:
            _logger(name).setLevel(self._lowered.pop(name))
        for name, level in wanted.items():
            target = _logger(name)
            if name not in self._lowered:
                self._lowered[name] = target.level
            if target.level != level:
                target.setLevel(level)


def _logger(name: str) -> logging.Logger:
    return logging.getLogger() if name == DEFAULT_LOGGER else logging.getLogger(name)


def _own_effective(name: str, lowered: Mapping[str, int]) -> int:
    """The effective level ``name`` would have without the stream's changes."""
    current = name
    while True:
        if current in lowered:
            if lowered[current]:
                return lowered[current]
        else:
            level = _logger(current).level
            if level:
                return level
        if current == DEFAULT_LOGGER:
            return logging.WARNING
        current = current.rpartition(".")[0] or DEFAULT_LOGGER


# Levels, as the operator sets them.


def stream_levels(client: redis.Redis) -> dict[str, int]:
    """The levels hash: logger -> level number (unknown names in it are skipped)."""
    levels: dict[str, int] = {}
    for name, raw in client.hgetall(redis_keys.log_levels()).items():  # type: ignore[union-attr]
        try:
            levels[str(name)] = level_of(str(raw))
        except ValueError:
            logger.debug("log stream: level %r of %s is not a level; ignored", raw, name)
    return levels


def set_stream_level(client: redis.Redis, name: str, level: str | None) -> None:
    """Ship ``name``'s lines (and its children's) from ``level`` on; None: back to the default.

    ``name`` is a logger (``engine``, ``engine.fetch_step``, ``celery``) or ``root`` for every logger.

    Raises:
        ValueError: ``level`` is not a level name, or ``name`` is empty.
    """
    if not name.strip():
        raise ValueError("name a logger (or root)")
    if level is None:
        client.hdel(redis_keys.log_levels(), name.strip())
        return
    client.hset(redis_keys.log_levels(), name.strip(), logging.getLevelName(level_of(level)))


# Reading the stream.


@dataclass(frozen=True)
class LogQuery:
    """Which lines to show: of a job, of a node (its name ``w1@box`` or host ``box``), from a level on."""

    job: str | None = None
    node: str | None = None
    level: int = logging.DEBUG

    def matches(self, entry: Mapping[str, str]) -> bool:
        """True if ``entry`` (a stream entry's fields) is one of the lines asked for."""
        if self.job is not None and entry.get("job") != self.job:
            return False
        if self.node is not None:
            node = entry.get("node", "")
            if self.node not in (node, node.partition("@")[2]) and not node.startswith(self.node + "@"):
                return False
        return entry_level(entry) >= self.level


def read_entries(
    client: redis.Redis, query: LogQuery, limit: int, scan_max: int = 200_000
) -> list[tuple[str, dict[str, str]]]:
    """The last ``limit`` matching lines, oldest first, as (stream id, fields); at most ``scan_max`` looked at.

    A job's lines come from the job's own stream (``job_stream_maxlen`` of them at most).
    """
    found: list[tuple[str, dict[str, str]]] = []
    end, scanned, page, key = "+", 0, 1000, _stream_of(query)
    while len(found) < limit and scanned < scan_max:
        entries: Any = client.xrevrange(key, max=end, min="-", count=page)
        if not entries:
            break
        for entry_id, fields in entries:
            if query.matches(fields):
                found.append((entry_id, fields))
                if len(found) >= limit:
                    break
        scanned += len(entries)
        end = "(" + entries[-1][0]
        if len(entries) < page:
            break
    return list(reversed(found))


def read_new_entries(
    client: redis.Redis, query: LogQuery, after: str, block_ms: int
) -> tuple[list[tuple[str, dict[str, str]]], str]:
    """Lines added after stream id ``after`` (``$``: from now), waiting up to ``block_ms`` for some.

    Returns the matching ones and the id to read after next time.
    """
    key = _stream_of(query)
    if after == "$":
        last: Any = client.xrevrange(key, count=1)
        after = last[0][0] if last else "0-0"
    reply: Any = client.xread({key: after}, count=1000, block=block_ms)
    entries: Iterable[tuple[str, dict[str, str]]] = reply[0][1] if reply else []
    found = []
    for entry_id, fields in entries:
        after = entry_id
        if query.matches(fields):
            found.append((entry_id, fields))
    return found, after


def _stream_of(query: LogQuery) -> str:
    return redis_keys.log_stream() if query.job is None else redis_keys.job_log_stream(query.job)


def format_entry(fields: Mapping[str, str]) -> str:
    """One stream entry as a line of text.

    >>> print(format_entry({"t": "0.5", "level": "WARNING", "logger": "engine.fetch_step", "node": "w1@box",
    ...                     "job": "j1", "url": "http://a.test:81/x", "msg": "robots.txt unreachable"}))
    1970-01-01T00:00:00.500Z WARNING w1@box engine.fetch_step [job=j1 url=http://a.test:81/x] robots.txt unreachable
    """
    context = " ".join(f"{name}={fields[name]}" for name in ("job", "task", "url") if fields.get(name))
    when = iso_time(float(fields.get("t") or 0))
    head = f"{when} {fields.get('level', '?')} {fields.get('node') or '-'} {fields.get('logger', '?')}"
    return f"{head} [{context}] {fields.get('msg', '')}" if context else f"{head} {fields.get('msg', '')}"


assert set(_FIELDS) == set(CONTEXT_FIELDS), "every context field has its stream field"
