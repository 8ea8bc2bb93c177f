"""The Spark engine's executor functions without Spark: folding a fetch log as ``latest_by_url`` does,
and placing a stored page's capture."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from batch_analysis.spark_input import StorageRoot, capture_of, kept, later, log_entries, settle
from engine.fetch_log import LoggedUrl, latest_by_url

_LINE = st.builds(
    LoggedUrl,
    url=st.sampled_from(["http://a.test/1", "http://a.test/2", "http://b.test/"]),
    outcome=st.sampled_from(["stored", "failed", "unchanged", "redirect"]),
    status=st.sampled_from([200, 404, None]),
    cycle=st.integers(0, 2),
    at=st.sampled_from([1.0, 2.0, 3.0]),  # few values: ties happen, and the later line must win them
)


@settings(max_examples=200, deadline=None)
@given(parts=st.lists(st.lists(_LINE, max_size=6), min_size=1, max_size=3), cycle=st.sampled_from([None, 0, 1]))
def test_folding_the_parts_in_any_order_keeps_what_latest_by_url_keeps(
    tmp_path_factory: object, parts: list[list[LoggedUrl]], cycle: int | None
) -> None:
    folder = Path(tmp_path_factory.mktemp("log"))  # type: ignore[attr-defined]
    root = StorageRoot(str(folder))
    names = []
    for index, lines in enumerate(parts):
        name = folder / f"part-{index:03d}.jsonl"
        name.write_text("".join(json.dumps(line.to_json()) + "\n" for line in lines) + "torn {\n")
        names.append(str(name))
    expected = {line.url: line.to_json() for line in latest_by_url((line for p in parts for line in p), cycle)}

    by_url: dict[str, list] = {}
    for index, name in reversed(list(enumerate(names))):  # any order: Spark folds as partitions come
        for url, entry in log_entries(root, index, name):
            if cycle is None or entry[1].get("cycle", 0) == cycle:
                by_url.setdefault(url, []).append(kept(entry))
    folded = {url: settle(functools.reduce(later, folds), cycle is None) for url, folds in by_url.items()}

    assert folded == expected


def test_a_stored_line_gets_the_capture_nearest_its_fetch_time() -> None:
    first = ("20261101120000", "a.warc.gz", 0, 100)
    second = ("20261108120001", "b.warc.gz", 0, 100)
    assert capture_of({"fetched_at": "2026-11-01T12:00:01+00:00"}, [second, first]) == first
    assert capture_of({"fetched_at": "2026-11-08T12:00:00+00:00"}, [first, second]) == second
    assert capture_of({}, [first, second]) == second  # no fetch time: the latest
    assert capture_of({"fetched_at": "2026-11-01T12:00:00+00:00"}, []) is None


def test_without_java_the_spark_engine_says_what_to_install_in_one_line(tmp_path: Path) -> None:
    env = {key: value for key, value in os.environ.items() if key != "JAVA_HOME"}
    env.update(PATH=str(tmp_path), VCRAWL_DATA=str(tmp_path / "data"))  # no java on this PATH
    done = subprocess.run([sys.executable, "-m", "cli", "analyze", "any-job", "--analyzer", "site-report",
                           "--engine", "spark"], env=env, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        "vcrawl: --engine spark needs a Java runtime (17 or later) for Spark: install one (Debian: apt install "
        "openjdk-17-jre-headless) or set JAVA_HOME"
    )
    args = [sys.executable, "-m", "cli", "analyze", "any-job", "--analyzer", "site-report", "--master", "local[2]"]
    chord_only = subprocess.run(args, env=env, capture_output=True, text=True, timeout=60)
    assert chord_only.returncode == 2 and "need --engine spark" in chord_only.stderr
