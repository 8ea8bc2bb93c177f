"""The cluster log stream end to end: a `celery worker` subprocess ships its lines to Redis, `vcrawl logs` reads them.

One worker for the module (JSON lines, shipped defaults otherwise) on a Redis of its own, driven
through the CLI: the session's in-process `worker` (no log shipper) must not take its batches, or
their lines would be logged where no stream sees them. The tests without a worker use the session's
Redis; every job here has an id of its own, so lines of other tests in a shared stream never match.
"""

from __future__ import annotations

import json
import logging
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import redis

from cli.local_redis import LocalRedis
from tasks.redis_clients import make_redis_client
from telemetry.log_context import ContextFilter, log_context
from telemetry.log_stream import JOB_STREAM_TTL_S, StreamShipper
from tests.cluster import REPO, cluster_env, start_job, start_worker, stop_worker
from tests.ports import free_port
from vcrawl.settings import Settings

_API_TOKEN = "cluster-logs-token-0123"  # vcrawl serve wants 16 characters at least
_CELERY_TEXT_LINE = re.compile(r"^\[\d{4}-\d\d-\d\d [\d:,]+: (DEBUG|INFO|WARNING|ERROR|CRITICAL)/")


@pytest.fixture(scope="module")
def log_worker(vcrawl_settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A plain worker at -l warning writing JSON lines, alone on its own Redis; its environment and log file."""
    directory = tmp_path_factory.mktemp("cluster-logs")
    with LocalRedis(directory / "redis") as server:
        data = str(directory / "data")
        settings = replace(vcrawl_settings, redis_url=server.url, frontier_url=None, data=data, log_format="json")
        env, log = cluster_env(settings), directory / "worker.log"
        process = start_worker(env, "logs-test", log, concurrency=4, loglevel="WARNING")
        try:
            yield {"env": env, "log": log, "dir": directory}
        finally:
            stop_worker(process)


def _vcrawl(env: dict[str, str], *args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "cli", *args], env=env, cwd=REPO, capture_output=True, text=True,
                          timeout=30)  # fmt: skip
    assert done.returncode == 0, f"vcrawl {' '.join(args)} exited {done.returncode}:\n{done.stderr[-2000:]}"
    return done.stdout


def _wait_for_line(env: dict[str, str], job: str, needle: str, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while True:
        out = _vcrawl(env, "logs", "--job", job)
        if needle in out:
            return out
        if time.monotonic() > deadline:
            raise AssertionError(f"no line with {needle!r} for job {job} in {timeout_s} s; got:\n{out}")
        time.sleep(0.5)


def _submit(worker: dict[str, Any], job: dict[str, Any], wait: bool = False) -> None:
    """``vcrawl submit`` on the worker's Redis; ``wait``: until the job has completed (at most 20 s)."""
    job_file = Path(worker["dir"]) / f"{job['id']}.json"
    job_file.write_text(json.dumps(job))
    _vcrawl(worker["env"], "submit", str(job_file), *(("--wait", "--timeout", "20") if wait else ()))


def _messages(env: dict[str, str], job: str, *options: str) -> str:
    """The job's lines in the stream as ``LEVEL message``, read with ``vcrawl logs --json``."""
    rows = _vcrawl(env, "logs", "--job", job, "--json", *options).splitlines()
    return "\n".join(f"{fields['level']} {fields['msg']}" for fields in map(json.loads, rows))


def test_a_warning_in_a_task_is_read_back_with_vcrawl_logs(log_worker: dict[str, Any]) -> None:
    env, port, job = log_worker["env"], free_port(), f"logs-{uuid.uuid4().hex[:8]}"
    start_job(env, {"id": job, "seeds": [f"http://127.0.0.1:{port}/nothing-listens-here"],
                    "scope": {"hosts": ["127.0.0.1"]}, "allowed_networks": ["127.0.0.0/8"]})  # fmt: skip

    out = _wait_for_line(env, job, f":{port}", timeout_s=30)

    line = next(line for line in out.splitlines() if f":{port}" in line)
    assert "WARNING" in line and f"job={job}" in line and "robots.txt" in line
    assert "logs-test@" in line  # the worker's node name
    entries = [json.loads(row) for row in _vcrawl(env, "logs", "--job", job, "--json").splitlines()]
    assert entries and all(entry["job"] == job and entry["task"] for entry in entries)
    with _api_server(env, _API_TOKEN) as base:  # the job API's view of the same lines
        request = urllib.request.Request(f"{base}/api/jobs/{job}/logs?level=warning",
                                         headers={"Authorization": f"Bearer {_API_TOKEN}"})  # fmt: skip
        with urllib.request.urlopen(request, timeout=10) as answer:
            lines = json.load(answer)["lines"]
        assert any(f":{port}" in line["url"] and line["level"] == "WARNING" and line["id"] for line in lines)
        request = urllib.request.Request(f"{base}/api/jobs/{job}/logs?level=loud",
                                         headers={"Authorization": f"Bearer {_API_TOKEN}"})  # fmt: skip
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=10)
        # Read while the server runs: urlopen raised on the headers, the body may still be on its way.
        assert refused.value.code == 400 and "log level must be one of" in json.load(refused.value)["error"]


@contextmanager
def _api_server(env: dict[str, str], token: str) -> Iterator[str]:
    """``vcrawl serve`` on a free loopback port over ``env``'s Redis; its base URL."""
    command = [sys.executable, "-m", "cli", "serve", "--port", "0"]
    process = subprocess.Popen(command, env={**env, "VCRAWL_API_TOKEN": token}, cwd=REPO, stderr=subprocess.PIPE,
                               text=True)  # fmt: skip
    try:
        line = process.stderr.readline() if process.stderr else ""  # the one line it prints once it listens
        assert "http://127.0.0.1:" in line, line
        yield "http://" + line.split("http://", 1)[1].split("/", 1)[0]
    finally:
        process.terminate()
        process.wait(10)


def test_a_level_changed_live_takes_effect_without_a_restart(log_worker: dict[str, Any]) -> None:
    env = log_worker["env"]
    # A job narrowed to another address: its host is refused, logged at INFO ("refused by the network policy").
    refused = {"seeds": [f"http://127.0.0.1:{free_port()}/x"], "scope": {"hosts": ["127.0.0.1"]},
               "allowed_networks": ["127.0.0.2/32"]}  # fmt: skip
    before, after = f"lv-{uuid.uuid4().hex[:8]}", f"lv-{uuid.uuid4().hex[:8]}"
    try:
        _submit(log_worker, {"id": before, **refused}, wait=True)
        time.sleep(1.0)  # a shipped line is in Redis within half a second
        assert "refused by the network policy" not in _messages(env, before)

        assert "INFO" in _vcrawl(env, "log-level", "engine.fetch_step", "INFO")
        changed = time.monotonic()
        time.sleep(2 * Settings().log_levels_poll_s)  # two of the workers' polls, at their shipped default
        _submit(log_worker, {"id": after, **refused}, wait=True)

        out = _wait_for_line(env, after, "refused by the network policy", timeout_s=10)
        assert " INFO " in next(line for line in out.splitlines() if "refused by the network policy" in line)
        assert time.monotonic() - changed < 20  # within seconds, the worker never restarted
        listing = _vcrawl(env, "log-level")
        assert re.search(r"^engine\.fetch_step +INFO$", listing, re.MULTILINE)
        # Not set: the workers' own default, which the CLI cannot know; it labels its own as such.
        assert re.search(r"^root \(not set\) +each worker's VCRAWL_LOG_STREAM_LEVEL \(WARNING in this shell\)$",
                         listing, re.MULTILINE)  # fmt: skip
    finally:
        _vcrawl(env, "log-level", "engine.fetch_step", "reset")
    worker_log = Path(log_worker["log"]).read_text()
    assert "refused by the network policy" not in worker_log  # the console keeps the worker's -l warning


def test_worker_lines_are_json_with_context(log_worker: dict[str, Any]) -> None:
    port, job = free_port(), f"json-{uuid.uuid4().hex[:8]}"
    _submit(log_worker, {"id": job, "seeds": [f"http://127.0.0.1:{port}/x"], "scope": {"hosts": ["127.0.0.1"]},
                         "allowed_networks": ["127.0.0.0/8"]})  # fmt: skip
    _wait_for_line(log_worker["env"], job, f":{port}", timeout_s=30)

    rows = Path(log_worker["log"]).read_text().splitlines()
    assert not [row for row in rows if _CELERY_TEXT_LINE.match(row)]
    lines = [json.loads(row) for row in rows if row.startswith("{")]
    ours = [line for line in lines if line.get("job") == job]
    assert ours, rows[-20:]
    assert {"time", "level", "logger", "message", "node", "job", "task_id", "url"} <= set(ours[0])
    assert f":{port}/" in ours[0]["url"] and ours[0]["node"].startswith("logs-test@")


def _spare_db(url: str) -> redis.Redis:
    # Another database of the session's Redis: the stream key there is this test's own.
    return redis.Redis.from_url(url.rsplit("/", 1)[0] + "/9", decode_responses=True)


def _shipper(client: Any, **overrides: Any) -> StreamShipper:
    options: dict[str, Any] = {"maxlen": 100, "queue_size": 10_000, "default_level": logging.WARNING, "poll_s": 2.0}
    return StreamShipper(client, **{**options, **overrides})


def _logger_with(name: str, *handlers: logging.Handler) -> logging.Logger:
    target = logging.getLogger(name)
    target.propagate = False
    target.handlers = list(handlers)
    target.setLevel(logging.WARNING)
    return target


def test_the_stream_and_a_jobs_stream_are_bounded(vcrawl_settings: Settings) -> None:
    client = _spare_db(vcrawl_settings.redis_url)
    client.delete("vcrawl:logs", "vcrawl:logs:job:{bounded}")
    shipper = _shipper(lambda: _spare_db(vcrawl_settings.redis_url), maxlen=200)
    shipper.addFilter(ContextFilter("t@box"))
    target = _logger_with("tests.logs.bounded", shipper)
    try:
        with log_context(job="bounded"):
            for index in range(3000):
                target.warning("line %d", index)
        shipper.flush(timeout_s=10)
        assert shipper.shipped == 3000 and shipper.dropped == 0
        # MAXLEN ~ trims whole stream nodes (100 entries each by default): about the cap, never the lot.
        assert 200 <= client.xlen("vcrawl:logs") <= 400
        assert 100 <= client.xlen("vcrawl:logs:job:{bounded}") <= 300  # a job's own: a tenth, at least 100
        assert 0 < client.ttl("vcrawl:logs:job:{bounded}") <= JOB_STREAM_TTL_S
        last = client.xrevrange("vcrawl:logs:job:{bounded}", count=1)[0][1]
        assert last["msg"] == "line 2999" and last["job"] == "bounded" and last["node"] == "t@box"
    finally:
        shipper.close()
        client.delete("vcrawl:logs", "vcrawl:logs:job:{bounded}")


def test_redis_down_drops_lines_and_local_logging_goes_on() -> None:
    dead = f"redis://127.0.0.1:{free_port()}/0"  # nobody listens: Redis is down for the shipper
    shipper = _shipper(lambda: redis.Redis.from_url(dead, socket_connect_timeout=1), queue_size=100)
    local: list[logging.LogRecord] = []
    capture = logging.Handler()
    capture.emit = local.append  # type: ignore[method-assign]
    target = _logger_with("tests.logs.down", capture, shipper)
    try:
        started = time.monotonic()
        for index in range(2000):  # a task that logs a lot while Redis is away
            target.warning("still working %d", index)
        elapsed = time.monotonic() - started
        assert elapsed < 2.0  # never waits for Redis
        assert len(local) == 2000
        deadline = time.monotonic() + 10
        while shipper.dropped < 1900 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert shipper.dropped >= 1900 and shipper.shipped == 0  # the queue holds 100: the rest are counted drops
    finally:
        shipper.close()


def test_a_level_the_reader_never_named_is_read_by_its_number(vcrawl_settings: Settings) -> None:
    # A worker may log at a level only it named (billiard's SUBWARNING, 25) or that nobody named.
    job = f"lv25-{uuid.uuid4().hex[:8]}"
    shipper = _shipper(lambda: make_redis_client(vcrawl_settings), maxlen=100_000, default_level=logging.DEBUG)
    shipper.addFilter(ContextFilter("lv@box"))
    source = _logger_with("tests.logs.level25", shipper)
    source.setLevel(logging.DEBUG)
    try:
        with log_context(job=job):
            source.log(25, "between info and warning")
            source.warning("a warning")
        shipper.flush(timeout_s=5)
    finally:
        shipper.close()
    env = cluster_env(vcrawl_settings)
    assert _messages(env, job, "--level", "info") == "Level 25 between info and warning\nWARNING a warning"
    assert _messages(env, job, "--level", "warning") == "WARNING a warning"


def test_follow_prints_new_lines_and_stops_cleanly_on_ctrl_c(vcrawl_settings: Settings) -> None:
    job = f"follow-{uuid.uuid4().hex[:8]}"
    # Started as from a terminal, with SIGINT at its default: a child inherits an ignored SIGINT, and Python
    # then keeps ignoring it. In `make test` one did (SigIgn showed SIGINT and SIGQUIT, as glibc's system()
    # leaves them while it waits, in a test process whose other threads start children too).
    follower = subprocess.Popen([sys.executable, "-m", "cli", "logs", "--job", job, "--follow"],
                                env=cluster_env(vcrawl_settings), cwd=REPO, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # fmt: skip
    printed: list[str] = []
    reader = threading.Thread(target=lambda: printed.extend(iter(follower.stdout.readline, "")), daemon=True)
    reader.start()
    shipper = _shipper(lambda: make_redis_client(vcrawl_settings), maxlen=100_000)
    shipper.addFilter(ContextFilter("f@box"))
    source = _logger_with("tests.logs.follow", shipper)

    def ship(message: str) -> None:
        with log_context(job=job, url="http://127.0.0.1:9/followed"):
            source.warning(message)
        shipper.flush(timeout_s=5)

    def wait_printed(message: str) -> None:
        deadline = time.monotonic() + 20
        while not any(message in line for line in printed):
            assert time.monotonic() < deadline and follower.poll() is None, f"{message!r} not printed: {printed}"
            time.sleep(0.1)

    try:
        ship("the first line")
        wait_printed("the first line")  # the command runs: what comes now, only following shows
        ship("a line that came later")
        wait_printed("a line that came later")
        follower.send_signal(signal.SIGINT)
        try:
            follower.wait(10)
        except subprocess.TimeoutExpired:  # say how it stood: its signal masks (SIGINT is bit 2)
            status = Path(f"/proc/{follower.pid}/status").read_text()
            masks = [line for line in status.splitlines() if line.startswith(("SigIgn", "SigCgt", "SigBlk", "State"))]
            raise AssertionError(f"vcrawl logs --follow did not stop on SIGINT: {masks}") from None
        err = follower.stderr.read()
    finally:
        shipper.close()
        if follower.poll() is None:
            follower.kill()
            follower.wait(5)
    assert follower.returncode == 130 and "Traceback" not in err
    assert "url=http://127.0.0.1:9/followed" in printed[-1] and "f@box" in printed[-1]
