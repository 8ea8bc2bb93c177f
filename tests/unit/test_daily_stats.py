"""Statistics by UTC day: the day buckets, the report, its table, the setting, the API route and the CLI's options."""

from __future__ import annotations

import json
from typing import Any

import pytest

from api.server import JobApi
from cli.main import main
from cli.stats import format_daily
from frontier.scripts import lua_source
from frontier.statistics import stats_day, stats_days
from vcrawl import names
from vcrawl.errors import ConfigError
from vcrawl.settings import Settings
from views.daily import daily_report, day_entry

NOV_26 = 1_795_651_200.0  # 2026-11-26T00:00:00Z


@pytest.mark.parametrize(
    ("now", "days", "expected"),
    [
        (NOV_26, 1, ["2026-11-26"]),
        (NOV_26 - 0.001, 1, ["2026-11-25"]),  # the last millisecond of the day before
        (NOV_26 + 86399, 2, ["2026-11-25", "2026-11-26"]),
        (1_772_323_200.0, 3, ["2026-02-27", "2026-02-28", "2026-03-01"]),  # 2026-03-01: across a month's end
        (1_767_225_600.0, 2, ["2025-12-31", "2026-01-01"]),  # across a year's end
    ],
)
def test_days_are_utc_dates_oldest_first(now: float, days: int, expected: list[str]) -> None:
    assert stats_days(now, days) == expected
    assert stats_day(now) == expected[-1]


def test_a_day_entry_reports_failures_by_reason_as_status_does() -> None:
    counters = {"fetched": 5, "stored": 3, "bytes": 300, "failed:http_404": 2, "failed:timeout": 1, "new": 2,
                "changed": 1, "status:200": 3}  # fmt: skip
    assert day_entry("2026-11-26", counters) == {
        "day": "2026-11-26", "pages_fetched": 5, "pages_stored": 3, "bytes": 300,
        "failed": {"http_404": 2, "timeout": 1}, "new": 2, "changed": 1, "unchanged": 0,
    }  # fmt: skip


def test_the_report_lists_every_day_and_only_the_active_days_of_a_host() -> None:
    a = {"fetched": 2, "stored": 2, "bytes": 20, "failed": 0}
    b = {"fetched": 1, "stored": 0, "bytes": 0, "failed": 1}
    rows = [
        ("2026-11-24", {"fetched": 2, "stored": 2, "bytes": 20}, {"a.test": a}),
        ("2026-11-25", {}, {}),
        ("2026-11-26", {"fetched": 3, "stored": 2, "bytes": 20, "failed:http_500": 1}, {"a.test": a, "b.test": b}),
    ]

    report = daily_report("j", rows)
    only_b = daily_report("j", rows, host="b.test")

    assert [day["day"] for day in report["days"]] == ["2026-11-24", "2026-11-25", "2026-11-26"]
    assert [day["day"] for day in report["hosts"]["a.test"]] == ["2026-11-24", "2026-11-26"]
    assert report["totals"] == {"pages_fetched": 5, "pages_stored": 4, "bytes": 40, "failed": {"http_500": 1},
                                "new": 0, "changed": 0, "unchanged": 0}  # fmt: skip
    assert list(only_b["hosts"]) == ["b.test"] and only_b["days"] == report["days"]
    assert json.loads(json.dumps(report)) == report


def test_the_table_says_so_when_nothing_was_fetched() -> None:
    report = daily_report("quiet", [("2026-11-26", {}, {})])
    assert format_daily(report) == "job quiet, by UTC day (1 days)\nnothing fetched in these days"


def test_the_release_script_counts_the_day_counters_and_failures_into_the_day_buckets() -> None:
    release, reclaim = lua_source("release"), lua_source("reclaim")
    assert "{{" not in release and "{{" not in reclaim
    for counter in names.DAY_COUNTERS:
        assert f"['{counter}']" in release
    assert "KEYS[14]" in release and "KEYS[15]" in release and "ARGV[14]" in release
    assert "KEYS[6]" in reclaim and "KEYS[7]" in reclaim and "ARGV[4]" in reclaim


def test_the_retention_is_read_from_its_variable_and_must_be_a_day_or_more() -> None:
    assert Settings().stats_retention_days == 90
    assert Settings.from_env({"VCRAWL_STATS_RETENTION_DAYS": "7"}).stats_retention_days == 7
    with pytest.raises(ConfigError, match="VCRAWL_STATS_RETENTION_DAYS"):
        Settings.from_env({"VCRAWL_STATS_RETENTION_DAYS": "0"})
    with pytest.raises(ConfigError, match="VCRAWL_STATS_RETENTION_DAYS"):
        Settings.from_env({"VCRAWL_STATS_RETENTION_DAYS": "ninety"})


def _api(reports: dict[str, dict[str, Any]], asked: list[tuple[Any, ...]]) -> JobApi:
    def daily(job: str, days: int, now: float, host: str | None) -> dict[str, Any] | None:
        asked.append((job, days, now, host))
        return reports.get(job)

    def unused(*args: Any) -> Any:
        raise AssertionError("not called")

    return JobApi(token=None, start_job=unused, job_status=lambda job: {"job": job} if job in reports else None,
                  jobs=unused, cancel=unused, pause=unused, resume=unused, reconfigure=unused, failures=unused,
                  host_stats=unused, stats=unused, queues=unused, daily=daily, clock=lambda: NOV_26)  # fmt: skip


def test_the_api_serves_the_days_with_the_busiest_hosts_first() -> None:
    entry = {"day": "2026-11-26", "pages_stored": 0, "bytes": 0, "failed": 0}
    hosts = {"a.test": [{**entry, "pages_fetched": 1}], "b.test": [{**entry, "pages_fetched": 9}],
             "c.test": [{**entry, "pages_fetched": 5}]}  # fmt: skip
    asked: list[tuple[Any, ...]] = []
    api = _api({"j": {"job": "j", "by": "day", "days": [], "hosts": hosts, "totals": {}}}, asked)

    status, _, body = api.handle("GET", "/api/jobs/j/daily?days=30&limit=2&host=", {}, lambda: b"")
    missing, _, _ = api.handle("GET", "/api/jobs/nope/daily", {}, lambda: b"")
    bad, _, _ = api.handle("GET", "/api/jobs/j/daily?days=many", {}, lambda: b"")

    answer = json.loads(body)
    assert status == 200 and list(answer["hosts"]) == ["b.test", "c.test"] and answer["total_hosts"] == 3
    assert asked == [("j", 30, NOV_26, None)]
    assert missing == 404 and bad == 400


@pytest.mark.parametrize("argv", [["stats", "j", "--by", "minute"], ["stats", "j", "--days", "0"], ["stats"]])
def test_the_stats_command_refuses_bad_options(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2 and "usage" in capsys.readouterr().err
