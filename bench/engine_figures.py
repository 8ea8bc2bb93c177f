"""Plain figures of bench/analysis_engines.py: reports compared across engines, where a Spark run's time
went (from its event log), the medians. No processes, no sockets: tests/unit/test_bench_engine_figures.py.
"""

from __future__ import annotations

import hashlib
import json
import statistics
from collections.abc import Iterable
from pathlib import Path
from typing import Any

# What differs between two runs of the same analyzer over the same crawl, whichever the engine: the run's
# id and times, and the engine's own name and settings. Everything else must be equal.
VOLATILE_KEYS = frozenset({"run", "generated_at", "started_at", "finished_at", "elapsed_s", "engine", "master"})
MAX_EVENT_LOG_BYTES = 512 * 1024 * 1024  # a Spark event log is ours, but still read within a bound
MAX_DIFFERENCES = 10


def normalized_report(report: Any) -> Any:
    """``report`` without the keys of ``VOLATILE_KEYS``, at any depth.

    >>> normalized_report({"run": "r1", "totals": {"pages": 3, "generated_at": 1.0}, "urls": 4})
    {'totals': {'pages': 3}, 'urls': 4}
    """
    if isinstance(report, dict):
        return {key: normalized_report(value) for key, value in report.items() if key not in VOLATILE_KEYS}
    if isinstance(report, list):
        return [normalized_report(value) for value in report]
    return report


def unordered(report: Any) -> Any:
    """``report`` with every list sorted (by its items' JSON): equal when two reports differ only in order."""
    if isinstance(report, dict):
        return {key: unordered(value) for key, value in report.items()}
    if isinstance(report, list):
        return sorted((unordered(value) for value in report), key=lambda item: json.dumps(item, sort_keys=True))
    return report


def report_digest(report: Any) -> str:
    """SHA-256 (first 16 hex digits) of the normalized report as canonical JSON."""
    text = json.dumps(normalized_report(report), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def report_differences(left: Any, right: Any, path: str = "$", limit: int = MAX_DIFFERENCES) -> list[str]:
    """Where two normalized reports differ, as JSON paths with both values (at most ``limit``).

    >>> report_differences({"a": [1, 2], "b": 1}, {"a": [1, 3], "c": 1})
    ['$.a[1]: 2 != 3', '$.b: only left', '$.c: only right']
    """
    out: list[str] = []
    _differences(normalized_report(left), normalized_report(right), path, out, limit)
    return out


def _differences(left: Any, right: Any, path: str, out: list[str], limit: int) -> None:
    if len(out) >= limit:
        return
    if isinstance(left, dict) and isinstance(right, dict):
        for key in sorted(set(left) | set(right)):
            if key not in right:
                out.append(f"{path}.{key}: only left")
            elif key not in left:
                out.append(f"{path}.{key}: only right")
            else:
                _differences(left[key], right[key], f"{path}.{key}", out, limit)
            if len(out) >= limit:
                return
    elif isinstance(left, list) and isinstance(right, list):
        if len(left) != len(right):
            out.append(f"{path}: {len(left)} items != {len(right)}")
        for index, (a, b) in enumerate(zip(left, right, strict=False)):
            _differences(a, b, f"{path}[{index}]", out, limit)
            if len(out) >= limit:
                return
    elif left != right:
        out.append(f"{path}: {_short(left)} != {_short(right)}")


def _short(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 80 else text[:77] + "..."


def compare_reports(reports: dict[str, list[Any]]) -> dict[str, Any]:
    """Are the reports of every engine (``{engine: [report per run]}``) equal, once normalized?

    ``equal``: one digest over all runs; ``equal_unordered``: equal up to the order of lists;
    ``differences``: where the first report of the first two engines differ.
    """
    digests = {engine: sorted({report_digest(r) for r in runs}) for engine, runs in reports.items()}
    everything = [r for runs in reports.values() for r in runs]
    if not everything:
        return {"equal": False, "equal_unordered": False, "digests": digests, "differences": ["no reports"]}
    shapes = {json.dumps(unordered(normalized_report(r)), sort_keys=True) for r in everything}
    firsts = [runs[0] for runs in reports.values() if runs]
    differences = report_differences(firsts[0], firsts[1]) if len(firsts) > 1 else []
    return {"equal": len({d for ds in digests.values() for d in ds}) == 1, "equal_unordered": len(shapes) == 1,
            "digests": digests, "differences": differences}  # fmt: skip


def read_events(event_dir: Path) -> list[dict[str, Any]]:
    """The events of the one application logged under ``event_dir`` (Spark 4's rolling ``eventlog_v2_*``
    folder of ``events_<n>_<app>`` files, or a plain event file), in order.

    Raises:
        ValueError: no event log, more than one application, or a log over ``MAX_EVENT_LOG_BYTES``.
    """
    apps = [p for p in event_dir.iterdir() if not p.name.startswith(".")] if event_dir.is_dir() else []
    if len(apps) != 1:
        raise ValueError(f"event log dir {event_dir}: expected one application, found {sorted(p.name for p in apps)}")
    app = apps[0]
    files = [app] if app.is_file() else sorted(app.glob("events_*"), key=_event_file_number)
    if sum(f.stat().st_size for f in files) > MAX_EVENT_LOG_BYTES:
        raise ValueError(f"event log {app} is over {MAX_EVENT_LOG_BYTES} bytes")
    events = []
    for file in files:
        with open(file, encoding="utf-8") as lines:
            events += [json.loads(line) for line in lines if line.strip()]
    return events


def _event_file_number(path: Path) -> int:
    parts = path.name.split("_")
    return int(parts[1]) if len(parts) > 2 and parts[1].isdigit() else 0


def spark_phases(events: Iterable[dict[str, Any]], start: float, end: float, cores: int) -> dict[str, Any]:
    """Where a Spark run's wall time (``start``-``end``, epoch s, of the CLI process) went, from its events.

    ``launch``: process start to the SparkContext's start (Python imports, the JVM, spark-submit);
    ``to_first_job``: the context's set-up and the driver's work before the first job; ``jobs``: time
    with a Spark job running; ``between_jobs``: driver work between jobs; ``after_jobs``: last job to
    the application's end (the driver's own work after the jobs, ``stop()`` begins); ``exit``: to the
    process's exit (the rest of ``stop()``, JVM shutdown). ``tasks``: their count, the sum of their
    executor run time, its share of the jobs' slot time (``cores`` slots), JVM CPU, deserialization, GC;
    ``stages``: per stage (in id order), its name (the call site), wall, tasks and their executor run time.
    """
    app_start = app_end = None
    jobs: dict[int, list[float]] = {}
    stages: dict[int, dict[str, Any]] = {}  # stage id -> name, wall, tasks, executor run time
    tasks = {"count": 0, "run_s": 0.0, "jvm_cpu_s": 0.0, "deserialize_s": 0.0, "gc_s": 0.0}
    for event in events:
        kind = event.get("Event")
        if kind == "SparkListenerApplicationStart":
            app_start = event["Timestamp"] / 1000
        elif kind == "SparkListenerApplicationEnd":
            app_end = event["Timestamp"] / 1000
        elif kind == "SparkListenerJobStart":
            jobs.setdefault(event["Job ID"], [0.0, 0.0])[0] = event["Submission Time"] / 1000
        elif kind == "SparkListenerJobEnd":
            jobs.setdefault(event["Job ID"], [0.0, 0.0])[1] = event["Completion Time"] / 1000
        elif kind == "SparkListenerStageCompleted":
            info = event["Stage Info"]
            stage = stages.setdefault(info["Stage ID"], {"tasks": 0, "run_s": 0.0})
            stage["stage"] = info.get("Stage Name", "")
            stage["wall_s"] = (info.get("Completion Time", 0) - info.get("Submission Time", 0)) / 1000
        elif kind == "SparkListenerTaskEnd" and event.get("Task Metrics"):
            metrics = event["Task Metrics"]
            stage = stages.setdefault(event.get("Stage ID", -1), {"tasks": 0, "run_s": 0.0})
            stage["tasks"] += 1
            stage["run_s"] += metrics.get("Executor Run Time", 0) / 1000
            tasks["count"] += 1
            tasks["run_s"] += metrics.get("Executor Run Time", 0) / 1000
            tasks["jvm_cpu_s"] += metrics.get("Executor CPU Time", 0) / 1e9
            tasks["deserialize_s"] += metrics.get("Executor Deserialize Time", 0) / 1000
            tasks["gc_s"] += metrics.get("JVM GC Time", 0) / 1000
    if app_start is None:
        raise ValueError("the event log has no SparkListenerApplicationStart")
    app_end = end if app_end is None else app_end
    spans = sorted(span for span in jobs.values() if span[0] and span[1])
    busy = _union_s(spans)
    first = spans[0][0] if spans else app_end
    last = max((span[1] for span in spans), default=app_end)
    phases = {"launch": app_start - start, "to_first_job": first - app_start, "jobs": busy,
              "between_jobs": (last - first) - busy, "after_jobs": app_end - last, "exit": end - app_end}  # fmt: skip
    out: dict[str, Any] = {name: round(value, 2) for name, value in phases.items()}
    out["spark_jobs"] = len(spans)
    out["tasks"] = {name: round(value, 2) for name, value in tasks.items()}
    out["tasks"]["slot_use"] = round(tasks["run_s"] / (busy * cores), 3) if busy > 0 and cores else None
    out["stages"] = [{"stage": st.get("stage", ""), "wall_s": round(st.get("wall_s", 0.0), 2), "tasks": st["tasks"],
                      "run_s": round(st["run_s"], 2)} for _, st in sorted(stages.items())]  # fmt: skip
    return out


def _union_s(spans: list[list[float]]) -> float:
    """Seconds covered by sorted [begin, end] spans (jobs may overlap)."""
    total, reach = 0.0, float("-inf")
    for begin, finish in spans:
        if finish > reach:
            total += finish - max(begin, reach)
            reach = finish
    return total


FIGURES = ("wall_s", "pages_per_s", "cpu_s", "cores_used", "other_cores")


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (analyzer, engine): the median of each figure and of each phase, pages/s min and max."""
    out = []
    for key in dict.fromkeys((row["analyzer"], row["engine"]) for row in rows):
        runs = [row for row in rows if (row["analyzer"], row["engine"]) == key]
        line: dict[str, Any] = {"analyzer": key[0], "engine": key[1], "runs": len(runs), "pages": runs[0]["pages"]}
        for figure in FIGURES:
            line[figure] = round(statistics.median(row[figure] for row in runs), 2)
        line["pages_per_s_range"] = [min(r["pages_per_s"] for r in runs), max(r["pages_per_s"] for r in runs)]
        phased = [r["phases_s"] for r in runs if r.get("phases_s")]
        names = [name for name, value in (phased[0] if phased else {}).items() if isinstance(value, int | float)]
        line["phases_s"] = {name: round(statistics.median(p[name] for p in phased), 2) for name in names}
        out.append(line)
    return out


def table(summary: list[dict[str, Any]]) -> str:
    """The medians as a markdown table, one row per (analyzer, engine)."""
    lines = ["| analyzer | engine | runs | pages | wall s | pages/s [min-max] | CPU s | cores used "
             "| other work (cores) | phases s (median) |", "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for s in summary:
        lo, hi = s["pages_per_s_range"]
        phases = ", ".join(f"{name} {value}" for name, value in s["phases_s"].items())
        lines.append(f"| {s['analyzer']} | {s['engine']} | {s['runs']} | {s['pages']} | {s['wall_s']} "
                     f"| {s['pages_per_s']} [{lo}-{hi}] | {s['cpu_s']} | {s['cores_used']} | {s['other_cores']} "
                     f"| {phases} |")  # fmt: skip
    return "\n".join(lines)
