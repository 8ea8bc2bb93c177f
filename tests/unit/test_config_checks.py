"""Start-up checks of the configuration, and what importing ``tasks`` does (nothing to kombu)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from storage import Storage
from tests.cluster import REPO
from vcrawl.errors import ConfigError
from vcrawl.settings import Settings, child_environment


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        (Settings(data="hdfs://127.0.0.1:9/crawl"), "VCRAWL_HDFS_USER"),
        (
            Settings(data="hdfs://127.0.0.1:9/crawl", hdfs_user="u", hdfs_namenodes=("10.0.0.1:9870",)),
            "VCRAWL_HDFS_NAMENODES",
        ),
        (Settings(data="hdfs://127.0.0.1/crawl", hdfs_user="u"), "VCRAWL_DATA"),
        (Settings(data="s3://bucket/crawl"), "VCRAWL_DATA"),
    ],
)
def test_a_data_root_the_run_cannot_use_is_named_before_anything_is_sent(settings: Settings, named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        Storage.check_settings(settings)


def test_a_good_data_root_passes_the_check_without_making_anything(tmp_path: Path) -> None:
    Storage.check_settings(Settings(data=str(tmp_path / "not-yet")))
    Storage.check_settings(Settings(data="hdfs://127.0.0.1:9/crawl", hdfs_user="vcrawl"))
    assert not (tmp_path / "not-yet").exists()


def test_settings_say_which_variables_were_given() -> None:
    given = Settings.from_env({"VCRAWL_REDIS_URL": "redis://10.0.0.5:6379/0", "VCRAWL_TASK_EVENTS": "false"})
    assert given.is_given("redis_url") and given.is_given("task_events") and not given.is_given("data")
    assert not Settings().is_given("redis_url")
    assert given == Settings(redis_url="redis://10.0.0.5:6379/0", task_events=False)  # where from is not compared
    assert "VCRAWL_GIVEN" not in given.to_env()


def test_a_child_environment_carries_the_settings_over_this_one() -> None:
    env = child_environment(Settings(data="/srv/crawl"))
    assert env["VCRAWL_DATA"] == "/srv/crawl" and "PATH" in env
    assert "VCRAWL_GIVEN" not in env


def test_importing_tasks_leaves_kombu_alone_until_the_app_is_configured() -> None:
    script = (
        "from kombu.transport import redis as t\n"
        "def patched(): return (getattr(t.QoS.ack, '_vcrawl_guard', False),"
        " getattr(t.Channel._create_client, '_vcrawl_reuse', False))\n"
        "import tasks\n"
        "print(patched())\n"
        "tasks.app.conf.broker_url\n"
        "print(patched())\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["(False,", "False)", "(True,", "True)"]
