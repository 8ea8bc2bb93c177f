"""bench/engine_figures.py as plain code: reports compared across engines, a Spark run's phases from its
event log, the medians. Loaded from its file: bench/ on sys.path would hide the project's `storage`."""

from __future__ import annotations

import doctest
import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


def load_figures() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_engine_figures", BENCH / "engine_figures.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


figures = load_figures()

SITE_REPORT = {
    "job": "j1", "analyzer": "site-report", "cycle": None, "run": "site-report-1", "urls": 3,
    "hosts": {"127.0.1.1:18893": {"pages": 2, "broken_links": [{"url": "http://127.0.1.1:18893/m", "status": 404}]}},
    "totals": {"hosts": 1, "pages": 2, "broken_links": 1}, "generated_at": 1796045681.5,
}  # fmt: skip


def test_doctests_of_the_module_pass():
    assert doctest.testmod(figures).failed == 0


def test_reports_differing_in_run_and_times_only_are_equal():
    spark = {**SITE_REPORT, "run": "spark-7", "generated_at": 2.0, "engine": "spark", "elapsed_s": 9.1}
    check = figures.compare_reports({"chord": [SITE_REPORT, SITE_REPORT], "spark": [spark]})
    assert check["equal"] and check["equal_unordered"]
    assert check["differences"] == []
    assert check["digests"]["chord"] == check["digests"]["spark"]


def test_a_different_count_makes_reports_differ_and_names_where():
    spark = json.loads(json.dumps(SITE_REPORT))
    spark["hosts"]["127.0.1.1:18893"]["pages"] = 3
    check = figures.compare_reports({"chord": [SITE_REPORT], "spark": [spark]})
    assert not check["equal"] and not check["equal_unordered"]
    assert check["differences"] == ["$.hosts.127.0.1.1:18893.pages: 2 != 3"]


def test_reports_differing_only_in_list_order_are_equal_unordered_not_equal():
    chord = {"clusters": [{"size": 2, "urls": ["a", "b"]}, {"size": 2, "urls": ["c", "d"]}]}
    spark = {"clusters": [{"size": 2, "urls": ["c", "d"]}, {"size": 2, "urls": ["a", "b"]}]}
    check = figures.compare_reports({"chord": [chord], "spark": [spark]})
    assert not check["equal"]
    assert check["equal_unordered"]
    assert check["differences"][0] == '$.clusters[0].urls[0]: "a" != "c"'


def test_no_reports_is_not_equal():
    assert not figures.compare_reports({})["equal"]


def test_differences_stop_at_the_limit():
    left, right = {f"k{n}": n for n in range(50)}, {f"k{n}": -n - 1 for n in range(50)}
    assert len(figures.report_differences(left, right)) == figures.MAX_DIFFERENCES


def write_event_log(folder: Path, files: list[list[dict]]) -> Path:
    """Spark 4's rolling layout: events/eventlog_v2_<app>/events_<n>_<app>, one JSON event a line."""
    app = folder / "events" / "eventlog_v2_local-1"
    app.mkdir(parents=True)
    (app / "appstatus_local-1").write_text("")
    for number, events in enumerate(files, start=1):
        (app / f"events_{number}_local-1").write_text("".join(json.dumps(e) + "\n" for e in events))
    return folder / "events"


def task_end(run_ms: int, cpu_ns: int, gc_ms: int = 0, stage: int = 0) -> dict:
    metrics = {"Executor Run Time": run_ms, "Executor CPU Time": cpu_ns, "Executor Deserialize Time": 10,
               "JVM GC Time": gc_ms}  # fmt: skip
    return {"Event": "SparkListenerTaskEnd", "Stage ID": stage, "Task Info": {"Launch Time": 0, "Finish Time": 0},
            "Task Metrics": metrics}  # fmt: skip


def stage_completed(stage: int, name: str, submitted_ms: int, completed_ms: int) -> dict:
    info = {"Stage ID": stage, "Stage Name": name, "Submission Time": submitted_ms, "Completion Time": completed_ms}
    return {"Event": "SparkListenerStageCompleted", "Stage Info": info}


def test_spark_phases_split_the_wall_time_from_the_event_log(tmp_path):
    # Process from t=100 s to t=130 s; app starts at 106, jobs 110-118 and 120-124, app ends at 127.
    first = [
        {"Event": "SparkListenerApplicationStart", "Timestamp": 106_000},
        {"Event": "SparkListenerJobStart", "Job ID": 0, "Submission Time": 110_000},
        task_end(7_000, 2_000_000_000),
        task_end(8_000, 3_000_000_000, gc_ms=500),
        stage_completed(0, "count at spark.py:187", 110_000, 118_000),
        {"Event": "SparkListenerJobEnd", "Job ID": 0, "Completion Time": 118_000},
    ]
    second = [
        {"Event": "SparkListenerJobStart", "Job ID": 1, "Submission Time": 120_000},
        task_end(4_000, 1_000_000_000, stage=1),
        stage_completed(1, "collect at spark.py:201", 120_000, 124_000),
        {"Event": "SparkListenerJobEnd", "Job ID": 1, "Completion Time": 124_000},
        {"Event": "SparkListenerApplicationEnd", "Timestamp": 127_000},
    ]
    events = figures.read_events(write_event_log(tmp_path, [first, second]))
    phases = figures.spark_phases(events, start=100.0, end=130.0, cores=2)
    assert {k: phases[k] for k in ("launch", "to_first_job", "jobs", "between_jobs", "after_jobs", "exit")} == {
        "launch": 6.0, "to_first_job": 4.0, "jobs": 12.0, "between_jobs": 2.0, "after_jobs": 3.0, "exit": 3.0,
    }  # fmt: skip
    assert sum(phases[k] for k in ("launch", "to_first_job", "jobs", "between_jobs", "after_jobs", "exit")) == 30.0
    assert phases["spark_jobs"] == 2
    assert phases["tasks"] == {"count": 3, "run_s": 19.0, "jvm_cpu_s": 6.0, "deserialize_s": 0.03, "gc_s": 0.5,
                               "slot_use": round(19.0 / 24.0, 3)}  # fmt: skip
    assert phases["stages"] == [
        {"stage": "count at spark.py:187", "wall_s": 8.0, "tasks": 2, "run_s": 15.0},
        {"stage": "collect at spark.py:201", "wall_s": 4.0, "tasks": 1, "run_s": 4.0},
    ]


def test_overlapping_jobs_count_once():
    events = [
        {"Event": "SparkListenerApplicationStart", "Timestamp": 1_000},
        {"Event": "SparkListenerJobStart", "Job ID": 0, "Submission Time": 2_000},
        {"Event": "SparkListenerJobStart", "Job ID": 1, "Submission Time": 3_000},
        {"Event": "SparkListenerJobEnd", "Job ID": 0, "Completion Time": 5_000},
        {"Event": "SparkListenerJobEnd", "Job ID": 1, "Completion Time": 6_000},
        {"Event": "SparkListenerApplicationEnd", "Timestamp": 6_500},
    ]
    phases = figures.spark_phases(events, start=0.0, end=7.0, cores=2)
    assert phases["jobs"] == 4.0 and phases["between_jobs"] == 0.0


def test_an_event_log_without_application_start_is_refused():
    with pytest.raises(ValueError, match="ApplicationStart"):
        figures.spark_phases([{"Event": "SparkListenerJobStart", "Job ID": 0, "Submission Time": 1}], 0.0, 1.0, 2)


def test_an_event_dir_with_two_applications_is_refused(tmp_path):
    (tmp_path / "app-1").write_text("{}\n")
    (tmp_path / "app-2").write_text("{}\n")
    with pytest.raises(ValueError, match="expected one application"):
        figures.read_events(tmp_path)


def test_a_plain_event_file_is_read(tmp_path):
    (tmp_path / "local-1").write_text(json.dumps({"Event": "SparkListenerApplicationStart", "Timestamp": 5}) + "\n")
    assert figures.read_events(tmp_path) == [{"Event": "SparkListenerApplicationStart", "Timestamp": 5}]


def test_summary_takes_medians_per_analyzer_and_engine():
    def row(engine: str, wall: float, phases: dict) -> dict:
        return {"analyzer": "site-report", "engine": engine, "pages": 100, "wall_s": wall, "pages_per_s": 100 / wall,
                "cpu_s": wall, "cores_used": 1.0, "other_cores": 0.0, "phases_s": phases}  # fmt: skip

    rows = [row("chord", 1.0, {"maps": 0.5}), row("chord", 2.0, {"maps": 1.5}), row("chord", 4.0, {"maps": 3.5}),
            row("spark", 10.0, {"jobs": 4.0, "tasks": {"count": 2}})]  # fmt: skip
    chord, spark = figures.summarize(rows)
    assert (chord["engine"], chord["runs"], chord["wall_s"], chord["pages_per_s"]) == ("chord", 3, 2.0, 50.0)
    assert chord["pages_per_s_range"] == [25.0, 100.0]
    assert chord["phases_s"] == {"maps": 1.5}
    assert spark["phases_s"] == {"jobs": 4.0}  # nested figures stay in the runs, not the medians
    assert "| site-report | spark | 1 | 100 | 10.0 |" in figures.table([chord, spark])
