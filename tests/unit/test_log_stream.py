"""Cluster logs without sockets: stream levels per logger, the queries of `vcrawl logs`, JSON lines, context."""

from __future__ import annotations

import json
import logging
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from telemetry.log_context import ContextFilter, JsonFormatter, current_context, log_context, set_task
from telemetry.log_stream import FIELD_BYTES, MESSAGE_BYTES, TRACEBACK_BYTES, LogQuery, StreamShipper, level_of
from vcrawl.errors import ConfigError
from vcrawl.settings import Settings


def _never_connects() -> object:
    raise OSError("no Redis in unit tests")


def _shipper(queue_size: int = 100) -> StreamShipper:
    return StreamShipper(_never_connects, maxlen=1000, queue_size=queue_size, default_level=logging.WARNING,
                         poll_s=60)  # type: ignore[arg-type]  # fmt: skip


@contextmanager
def _logging_to(shipper: StreamShipper) -> Iterator[logging.Logger]:
    """A fresh logger whose lines go to ``shipper`` only; the shipper is closed after."""
    source = logging.getLogger(f"tests.unit.logs.{uuid.uuid4().hex[:8]}")
    source.propagate = False
    source.addHandler(shipper)
    try:
        yield source
    finally:
        source.removeHandler(shipper)
        shipper.close()


def test_a_loggers_stream_level_is_its_own_or_its_nearest_parents() -> None:
    shipper = _shipper()
    shipper.levels = {"engine": logging.INFO, "engine.fetch_step": logging.ERROR, "root": logging.ERROR}
    assert shipper.stream_level("engine.fetch_batch") == logging.INFO
    assert shipper.stream_level("engine.fetch_step") == logging.ERROR
    assert shipper.stream_level("engine") == logging.INFO
    assert shipper.stream_level("celery.worker") == logging.ERROR  # root: the default set live
    shipper.levels = {}
    assert shipper.stream_level("celery.worker") == logging.WARNING  # VCRAWL_LOG_STREAM_LEVEL


def test_lowering_a_stream_level_lowers_the_logger_and_restores_it_after() -> None:
    name = f"tests.unit.logs.{uuid.uuid4().hex[:8]}"
    logging.getLogger(name).setLevel(logging.WARNING)
    shipper = _shipper()

    shipper._apply_levels({name: logging.INFO})
    assert logging.getLogger(name).level == logging.INFO  # INFO lines are made, for the stream

    shipper._apply_levels({name: logging.ERROR})  # above what the process logs anyway: nothing to lower
    assert logging.getLogger(name).level == logging.WARNING
    shipper._apply_levels({name: logging.DEBUG})
    shipper._apply_levels({})
    assert logging.getLogger(name).level == logging.WARNING


def test_emit_never_raises_and_counts_what_it_drops() -> None:
    shipper = _shipper(queue_size=1)
    with _logging_to(shipper) as source:
        for index in range(50):
            source.warning("line %d", index)
        source.info("below the stream's level: not even queued")
    assert shipper.dropped >= 48 and shipper.shipped == 0


def test_a_huge_message_and_traceback_are_cut_to_their_bounds_and_say_so() -> None:
    cause: Exception | None = None
    for index in range(100):  # a chain of causes: a traceback of some 20 KB
        try:
            raise KeyError(f"cause {index}") from cause
        except KeyError as error:
            cause = error
    try:
        raise ValueError("the last straw") from cause
    except ValueError:
        record = logging.LogRecord("engine.x", logging.ERROR, __file__, 1, "page: %s", ("é" * 50_000,), sys.exc_info())
    record.url = "http://a.test/" + "p" * 10_000

    entry = _shipper()._entry(record)

    message, _, traceback = entry["msg"].partition("\n")
    assert message.startswith("page: é") and message.endswith(" more bytes]") and "… [cut: " in message
    assert len(message.encode()) <= MESSAGE_BYTES
    assert traceback.startswith("[cut: ") and traceback.rstrip().endswith("ValueError: the last straw")
    assert len(traceback.encode()) <= TRACEBACK_BYTES
    assert entry["url"].startswith("http://a.test/ppp") and len(entry["url"].encode()) <= FIELD_BYTES
    assert len(str(entry).encode()) < MESSAGE_BYTES + TRACEBACK_BYTES + FIELD_BYTES + 200


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        (LogQuery(), True),
        (LogQuery(job="j1"), True),
        (LogQuery(job="j2"), False),
        (LogQuery(node="w1@box"), True),
        (LogQuery(node="box"), True),
        (LogQuery(node="w1"), True),
        (LogQuery(node="w2"), False),
        (LogQuery(level=logging.WARNING), True),
        (LogQuery(level=logging.ERROR), False),
    ],
)
def test_a_query_picks_lines_by_job_node_and_level(query: LogQuery, expected: bool) -> None:
    entry = {"t": "1.0", "level": "WARNING", "logger": "engine", "msg": "x", "node": "w1@box", "job": "j1"}
    assert query.matches(entry) is expected


@pytest.mark.parametrize(
    ("entry", "from_info", "from_warning"),
    [
        ({"level": "Level 25", "levelno": "25"}, True, False),  # a level no process named
        ({"level": "SUBWARNING", "levelno": "25"}, True, False),  # named only in the process that logged it
        ({"level": "WARNING"}, True, True),  # shipped before lines carried levelno
        ({"level": "NOTICE"}, True, True),  # the same, a name unknown here: counted as WARNING
        ({"level": "DEBUG"}, False, False),
    ],
)
def test_a_query_reads_the_shipped_level_number_whatever_its_name(
    entry: dict[str, str], from_info: bool, from_warning: bool
) -> None:
    assert LogQuery(level=logging.INFO).matches(entry) is from_info
    assert LogQuery(level=logging.WARNING).matches(entry) is from_warning


def test_flush_waits_until_the_queued_lines_are_sent_or_dropped() -> None:
    shipper = _shipper()
    with _logging_to(shipper) as source:
        for index in range(3):
            source.warning("line %d", index)
        shipper.flush(timeout_s=10)
        assert shipper.dropped == 3  # Redis is away: dropped, and flush knew they were done with


def test_level_names_are_checked() -> None:
    assert level_of("info") == logging.INFO
    with pytest.raises(ValueError, match="log level must be one of"):
        level_of("LOUD")


def test_json_lines_carry_the_context_where_there_is_one() -> None:
    handler = logging.Handler()
    handler.addFilter(ContextFilter("w1@box"))
    handler.setFormatter(JsonFormatter())
    lines: list[str] = []
    handler.emit = lambda record: lines.append(handler.format(record))  # type: ignore[method-assign]
    source = logging.getLogger(f"tests.unit.logs.{uuid.uuid4().hex[:8]}")
    source.propagate = False
    source.addHandler(handler)
    set_task("task-1")
    try:
        with log_context(job="j1", url="http://a.test:8080/x"):
            source.warning("inside %s", "the fetch")
        source.warning("outside")
    finally:
        set_task(None)
    inside, outside = (json.loads(line) for line in lines)
    assert inside == {"time": inside["time"], "level": "WARNING", "logger": source.name, "node": "w1@box",
                      "message": "inside the fetch", "job": "j1", "task_id": "task-1",
                      "url": "http://a.test:8080/x"}  # fmt: skip
    assert outside["task_id"] == "task-1" and "job" not in outside and "url" not in outside
    assert current_context() == {"job": None, "task_id": None, "url": None}


def test_log_settings_are_validated() -> None:
    settings = Settings.from_env({"VCRAWL_LOG_FORMAT": "JSON", "VCRAWL_LOG_STREAM_LEVEL": "info"})
    assert (settings.log_format, settings.log_stream_level, settings.log_maxlen) == ("json", "INFO", 100_000)
    for name, value in (("VCRAWL_LOG_FORMAT", "xml"), ("VCRAWL_LOG_STREAM_LEVEL", "LOUD"),
                        ("VCRAWL_LOG_MAXLEN", "10"), ("VCRAWL_LOG_LEVELS_POLL_S", "0")):  # fmt: skip
        with pytest.raises(ConfigError, match=name):
            Settings.from_env({name: value})
