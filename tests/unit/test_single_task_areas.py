"""A single task writes only files under ``pages/`` and ``results/`` of the data root, however it spells them."""

from __future__ import annotations

import functools
import os
from pathlib import Path

import pytest

from engine.single import check_area
from storage import (
    BACKENDS,
    SINGLE_TASK_AREAS,
    Storage,
    WebHdfsBackend,
    job_page_location,
    job_result_location,
    page_location,
    result_location,
    single_task_area_problem,
)
from vcrawl.errors import InvalidTask

OUTSIDE = "is outside the single-task areas: a single task writes only under pages/ or results/ of the data root"
HIDDEN = "has the hidden component"
URL = "https://example.com/products/widget-1"


@pytest.mark.parametrize(
    ("relative", "problem"),
    [
        ("pages/a.html", None),
        ("pages/example.com/deep/er/a.html", None),
        ("results/links/example.com/a.json", None),
        ("results/mine.json", None),
        ("pages/a..b.html", None),  # dots inside a name are fine: only a leading one hides it
        ("jobs/other-job/pages/x.html", OUTSIDE),
        ("jobs/other-job/records/injected.jsonl", OUTSIDE),
        ("jobs/other-job/results/site-report.json", OUTSIDE),
        (".vcrawl-redis/appendonly.aof", OUTSIDE),
        (".spool/records/x.jsonl", OUTSIDE),
        ("proxies/one.html", OUTSIDE),
        ("x.html", OUTSIDE),
        ("pages", OUTSIDE),
        ("Pages/a.html", OUTSIDE),
        ("pagesx/a.html", OUTSIDE),
        ("pages/.hidden/a.html", HIDDEN),
        ("results/links/.a.json", HIDDEN),
        ("pages/x/.a.html.0123456789abcdef.tmp", HIDDEN),  # a temp name of a write in progress
    ],
)
def test_the_area_rule(relative: str, problem: str | None) -> None:
    found = single_task_area_problem(relative)
    assert found is None if problem is None else found is not None and found.startswith(problem)


def test_the_defaults_are_inside_the_areas_and_job_files_are_not() -> None:
    assert SINGLE_TASK_AREAS == ("pages", "results")
    for location in (page_location(URL), result_location(URL, "links"), result_location(URL, "fields")):
        assert single_task_area_problem(location) is None, location
    for location in (job_page_location("pages", 0, URL), job_result_location("results", "links", None),
                     job_result_location("links", "site-report", 2)):  # fmt: skip
        assert location.startswith("jobs/") and single_task_area_problem(location) == OUTSIDE


@pytest.fixture
def local(tmp_path: Path) -> Storage:
    return Storage(str(tmp_path / "data"))


@pytest.fixture
def hdfs() -> Storage:
    """An ``hdfs://`` data root; the area check sends nothing to HDFS."""
    factory = functools.partial(WebHdfsBackend, user="u", allowed_namenodes=["nn:9870"])
    return Storage("hdfs://nn:9870/crawl", backends={**BACKENDS, "hdfs": factory})


# (location, refused with): "{root}" is the data root as a path (local) or URL (hdfs).
LOCAL_CASES: list[tuple[str, str | None]] = [
    ("pages/shop/a.html", None),
    ("results/r.json", None),
    ("{root}/pages/shop/a.html", None),
    ("file://{root}/results/links/a.json", None),
    ("results/../pages/a.html", None),
    ("jobs/other-job/pages/x.html", OUTSIDE),
    ("jobs/other-job/records/injected.jsonl", OUTSIDE),
    (".vcrawl-redis/appendonly.aof", OUTSIDE),
    (".vcrawl-redis/appendonlydir/appendonly.aof.1.incr.aof", OUTSIDE),
    (".spool/records/x.jsonl", OUTSIDE),
    ("proxies/one.html", OUTSIDE),
    ("page.html", OUTSIDE),
    ("{root}/jobs/other-job/pages/x.html", OUTSIDE),
    ("file://{root}/.spool/warc/x.warc.gz", OUTSIDE),
    ("pages/../jobs/x/records/r.jsonl", OUTSIDE),
    ("pages/.hidden/a.html", HIDDEN),
    ("../x.html", "storage location '../x.html' refused: escapes the storage root"),
    ("/etc/passwd", "storage location '/etc/passwd' refused: escapes the storage root"),
]
HDFS_CASES: list[tuple[str, str | None]] = [
    ("pages/shop/a.html", None),
    ("{root}/results/links/a.json", None),
    ("{root}/jobs/other-job/records/injected.jsonl", OUTSIDE),
    ("jobs/other-job/pages/x.html", OUTSIDE),
    ("{root}/.spool/records/x.jsonl", OUTSIDE),
    ("{root}/page.html", OUTSIDE),
    ("results/.x/a.json", HIDDEN),
    ("hdfs://nn:9870/other/pages/a.html", "escapes the storage root"),
    ("/srv/data/pages/a.html", "is a local path but the data root is hdfs://nn:9870/crawl"),
]


def _check(store: Storage, root: str, location: str, problem: str | None) -> None:
    location = location.format(root=root)
    if problem is None:
        check_area("save_path", store, location)
        return
    with pytest.raises(InvalidTask) as refused:
        check_area("save_path", store, location)
    assert refused.value.field == "save_path"
    assert problem in refused.value.problem


@pytest.mark.parametrize(("location", "problem"), LOCAL_CASES, ids=[case[0] for case in LOCAL_CASES])
def test_single_task_locations_on_a_local_root(local: Storage, location: str, problem: str | None) -> None:
    _check(local, os.path.realpath(local.describe()), location, problem)


@pytest.mark.parametrize(("location", "problem"), HDFS_CASES, ids=[case[0] for case in HDFS_CASES])
def test_single_task_locations_on_an_hdfs_root(hdfs: Storage, location: str, problem: str | None) -> None:
    _check(hdfs, "hdfs://nn:9870/crawl", location, problem)


def test_a_symlinked_directory_in_the_area_cannot_lead_into_a_job(local: Storage) -> None:
    root = Path(local.describe())
    (root / "jobs" / "other-job" / "pages").mkdir(parents=True)
    (root / "pages").mkdir()
    (root / "pages" / "door").symlink_to(root / "jobs" / "other-job" / "pages", target_is_directory=True)
    with pytest.raises(InvalidTask, match="outside the single-task areas"):
        check_area("result_path", local, "pages/door/x.html")


def test_the_message_names_the_field_and_the_location_as_given(local: Storage) -> None:
    with pytest.raises(InvalidTask) as refused:
        check_area("result_path", local, "/abs/x", shown="jobs/j/x.json")
    assert str(refused.value).startswith("result_path: storage location '/abs/x' refused")
    with pytest.raises(InvalidTask) as refused:
        check_area("result_path", local, str(Path(local.describe()) / "jobs/j/x.json"), shown="jobs/j/x.json")
    assert str(refused.value) == f"result_path: 'jobs/j/x.json' {OUTSIDE}"
