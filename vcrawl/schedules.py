"""Schedules of recurring crawl jobs, run by Celery beat with RedBeat (entries live in Redis).

A schedule names a job, says when it fires (``every`` seconds or a 5-field ``cron``
expression, in UTC) and what a firing does while the previous cycle still runs (``overlap``:
``skip`` it, or ``cancel`` the running cycle and start anew). Each firing sends
``vcrawl.start_cycle``, which starts the job's next cycle; the job's id is the schedule's name.

Schedules come from a schedules file (``VCRAWL_SCHEDULES_FILE``, loaded into ``beat_schedule``
when beat starts) or are added at run time (``vcrawl schedule add``); RedBeat picks up changes
in Redis on its next tick, and its lock lets only one of several beats fire.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml
from celery.schedules import crontab, schedule

from vcrawl.errors import InvalidTask
from vcrawl.jobs import JobSpec, load_job_file

__all__ = [
    "OVERLAP_POLICIES",
    "START_CYCLE_TASK",
    "Schedule",
    "ScheduleStore",
    "beat_schedule",
    "describe",
    "load_schedules_file",
    "parse_cron",
    "schedule_from_dict",
]

START_CYCLE_TASK = "vcrawl.start_cycle"
OVERLAP_POLICIES = ("skip", "cancel")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}\Z")
_CRON_FIELDS = ("minute", "hour", "day_of_month", "month_of_year", "day_of_week")


def parse_cron(expression: str) -> crontab:
    """A 5-field cron expression (minute hour day-of-month month day-of-week) as a Celery crontab.

    >>> parse_cron("*/15 2-4 * * mon-fri")
    <crontab: */15 2-4 * * mon-fri (m/h/dM/MY/d)>

    Raises:
        InvalidTask: (``cron``) not 5 fields, or a field out of range.
    """
    parts = expression.split()
    if len(parts) != len(_CRON_FIELDS):
        raise InvalidTask("cron", f"needs 5 fields (minute hour day-of-month month day-of-week), got {expression!r}")
    try:
        return crontab(**dict(zip(_CRON_FIELDS, parts, strict=True)))
    except (ValueError, TypeError) as exc:
        raise InvalidTask("cron", f"invalid cron expression {expression!r}: {exc}") from None


@dataclass(frozen=True)
class Schedule:
    """A recurring job: exactly one of ``every_s`` and ``cron``."""

    name: str
    spec: JobSpec
    every_s: float | None = None
    cron: str | None = None
    overlap: str = "skip"

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise InvalidTask("name", f"must be 1-128 letters, digits or . _ : - , got {self.name!r}")
        if (self.every_s is None) == (self.cron is None):
            raise InvalidTask("every", "give exactly one of every (seconds) and cron")
        if self.every_s is not None and not (math.isfinite(self.every_s) and 1 <= self.every_s <= 366 * 86400):
            raise InvalidTask("every", f"must be between 1 and {366 * 86400} seconds, got {self.every_s}")
        if self.cron is not None:
            parse_cron(self.cron)
        if self.overlap not in OVERLAP_POLICIES:
            raise InvalidTask("overlap", f"must be one of {', '.join(OVERLAP_POLICIES)}, got {self.overlap!r}")
        if self.spec.id != self.name:
            object.__setattr__(self, "spec", self.spec.with_id(self.name))

    def celery_schedule(self) -> schedule:
        """When it fires, as Celery's schedule object."""
        if self.cron is not None:
            return parse_cron(self.cron)
        assert self.every_s is not None
        return schedule(timedelta(seconds=self.every_s))

    def when(self) -> str:
        """``every 3600s`` or ``cron 0 * * * *``."""
        return f"cron {self.cron}" if self.cron is not None else f"every {self.every_s:g}s"

    def beat_entry(self) -> dict[str, Any]:
        """The ``beat_schedule`` entry: a firing sends ``vcrawl.start_cycle``."""
        return {
            "task": START_CYCLE_TASK,
            "schedule": self.celery_schedule(),
            "args": [self.name],
            "kwargs": {"spec": self.spec.to_dict(), "overlap": self.overlap, "when": self.when()},
        }


def schedule_from_dict(data: Any, base_dir: Path | None = None, where: str = "") -> Schedule:
    """A schedule from a mapping: ``name``, ``every`` or ``cron``, ``overlap``, and ``job``
    (a job mapping) or ``job_file`` (a path, relative to ``base_dir``).

    Raises:
        InvalidTask: ``field`` names the bad key (prefixed with ``where``).
    """
    if not isinstance(data, Mapping):
        raise InvalidTask(where.rstrip(".") or "schedule", "must be a mapping")
    known = {"name", "every", "cron", "overlap", "job", "job_file"}
    for key in data:
        if key not in known:
            raise InvalidTask(f"{where}{key}", f"unknown key; known: {', '.join(sorted(known))}")
    name = data.get("name")
    if ("job" in data) == ("job_file" in data):
        raise InvalidTask(f"{where}job", "give exactly one of job (a mapping) and job_file (a path)")
    try:
        if "job" in data:
            job = data["job"] if not isinstance(data["job"], Mapping) else {**data["job"], "id": name}
            spec = JobSpec.from_dict(job)
        else:
            path = Path(str(data["job_file"]))
            spec = load_job_file(path if path.is_absolute() or base_dir is None else base_dir / path)
        every = data.get("every")
        if every is not None and (isinstance(every, bool) or not isinstance(every, int | float)):
            raise InvalidTask("every", f"must be a number of seconds, got {every!r}")
        cron = data.get("cron")
        if cron is not None and not isinstance(cron, str):
            raise InvalidTask("cron", f"must be a string, got {cron!r}")
        return Schedule(
            str(name) if name is not None else "",
            spec,
            every_s=float(every) if every is not None else None,
            cron=cron,
            overlap=data.get("overlap", "skip"),
        )
    except InvalidTask as exc:
        field = exc.field if exc.field in known or exc.field == "name" else f"job.{exc.field}"
        raise InvalidTask(f"{where}{field}", exc.problem) from None


def load_schedules_file(path: str | Path) -> list[Schedule]:
    """Read a schedules file (YAML or JSON): ``schedules: [ {name, every|cron, job|job_file}, ... ]``.

    Raises:
        InvalidTask: ``field`` is ``file`` or the path of the bad key (``schedules[1].cron``).
    """
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))  # YAML is a superset of JSON
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise InvalidTask("file", f"cannot read schedules from {path}: {exc}") from None
    if not isinstance(data, Mapping) or set(data) != {"schedules"} or not isinstance(data["schedules"], list):
        raise InvalidTask("schedules", f"{path} must hold one key, schedules, with a list of schedules")
    schedules = [
        schedule_from_dict(item, path.parent, f"schedules[{index}].") for index, item in enumerate(data["schedules"])
    ]
    names = [s.name for s in schedules]
    for index, name in enumerate(names):
        if name in names[:index]:
            raise InvalidTask(f"schedules[{index}].name", f"{name!r} is used twice")
    return schedules


def beat_schedule(path: str | Path | None) -> dict[str, dict[str, Any]]:
    """``beat_schedule`` for Celery from a schedules file (empty without one)."""
    if not path:
        return {}
    return {item.name: item.beat_entry() for item in load_schedules_file(path)}


class ScheduleStore:
    """Add, change, list and remove schedules in Redis while beat runs (RedBeat entries)."""

    def __init__(self, app: Any) -> None:
        from redbeat import RedBeatSchedulerEntry
        from redbeat.schedulers import ensure_conf, get_redis

        self._app = app
        self._entry = RedBeatSchedulerEntry
        ensure_conf(app)
        self._redis = get_redis(app)

    def add(self, item: Schedule) -> None:
        """Store a schedule; one with the same name is replaced and keeps its last run.

        A new ``every`` schedule fires on beat's next tick, a new ``cron`` one at its next match.
        """
        definition = item.beat_entry()
        try:
            previous = self._entry.from_key(self._entry.generate_key(self._app, item.name), app=self._app)
        except KeyError:
            previous = None
        entry = self._entry(
            item.name, definition["task"], definition["schedule"], args=definition["args"],
            kwargs=definition["kwargs"], app=self._app,
        )  # fmt: skip
        if previous is not None and previous.last_run_at is not None:
            entry.last_run_at = previous.last_run_at
        elif item.every_s is not None:
            entry.last_run_at = entry.default_now() - timedelta(seconds=item.every_s)
        entry.save()

    def remove(self, name: str) -> bool:
        """Delete a schedule; False if there was none. A running cycle is not stopped."""
        key = self._entry.generate_key(self._app, name)
        if not self._redis.exists(key):
            return False
        self._entry(name, app=self._app).delete()
        return True

    def list(self) -> list[dict[str, Any]]:
        """Every schedule with its next and last firing (epoch seconds), soonest first."""
        conf = self._app.redbeat_conf
        rows = []
        for key, score in self._redis.zrange(conf.schedule_key, 0, -1, withscores=True):
            try:
                entry = self._entry.from_key(key, app=self._app)
            except KeyError:
                continue
            if entry.task != START_CYCLE_TASK:
                continue
            last = entry.last_run_at
            rows.append(
                {
                    "name": entry.name,
                    "when": entry.kwargs.get("when", str(entry.schedule)),
                    "overlap": entry.kwargs.get("overlap", "skip"),
                    "seeds": entry.kwargs.get("spec", {}).get("seeds", []),
                    "next_run_at": score if score >= 0 else None,
                    "last_run_at": _epoch(last) if last is not None else None,
                    "total_run_count": int(getattr(entry, "total_run_count", 0) or 0),
                }
            )
        return rows

    def get(self, name: str) -> dict[str, Any] | None:
        """The stored entry's ``args`` and ``kwargs`` (None if there is no such schedule)."""
        try:
            entry = self._entry.from_key(self._entry.generate_key(self._app, name), app=self._app)
        except KeyError:
            return None
        return {"args": list(entry.args), "kwargs": dict(entry.kwargs)}


def _epoch(value: datetime) -> float:
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return round(value.timestamp(), 3)


def describe(rows: list[dict[str, Any]]) -> str:
    """A table of ``ScheduleStore.list`` rows for people."""
    if not rows:
        return "no schedules"
    lines = [f"{'NAME':24} {'WHEN':22} {'OVERLAP':8} {'NEXT (UTC)':20} RUNS  SEEDS"]
    for row in rows:
        next_at = row["next_run_at"]
        when_next = datetime.fromtimestamp(next_at, UTC).strftime("%Y-%m-%d %H:%M:%S") if next_at else "-"
        seeds = json.dumps(row["seeds"][:2]) + (" ..." if len(row["seeds"]) > 2 else "")
        lines.append(
            f"{row['name']:24} {row['when']:22} {row['overlap']:8} {when_next:20} {row['total_run_count']:<5} {seeds}"
        )
    return "\n".join(lines)
