"""Unit tests for analyzers/programs.py: external programs as analyzers, run as real processes.

Each program is a small Python script the test writes (shebang: this interpreter). Scripts note
their PIDs (and their children's) in a file; every PID noted is killed after the test, also when
it fails, so a broken kill path leaves nothing behind.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from analyzers import Page, ProgramAnalyzer, Registry, load_programs
from analyzers.programs import DEFAULT_MEMORY_MB, DEFAULT_TIMEOUT_S, MAX_OUTPUT_BYTES
from vcrawl.errors import ConfigError, ProgramFailed

URL = "http://example.com/page.html"
PAGE = Page(URL, b"<html><head><title>Hello</title></head><body>hi</body></html>", "text/html; charset=utf-8")
MARGIN_S = 3.0  # a killed program's call returns within its timeout plus this

# The result every "ok" program writes: what it was given, so tests can check the contract.
OK_BODY = """
import json, os, re, sys
source, target = sys.argv[-2], sys.argv[-1]
body = sys.stdin.buffer.read() if source == "-" else open(source, "rb").read()
title = re.search(rb"<title>(.*?)</title>", body)
result = {
    "length": len(body),
    "title": title.group(1).decode() if title else None,
    "args": sys.argv[1:],
    "cwd": os.getcwd(),
    "cwd_mode": oct(os.stat(os.getcwd()).st_mode & 0o777),
    "env": dict(os.environ),
}
if target == "-":
    json.dump(result, sys.stdout)
else:
    with open(target, "w") as out:
        json.dump(result, out)
"""
# Starts a child that sleeps 10 minutes and notes the child's PID (PIDS: the test's PID file).
SPAWN_SLEEPER = """
import subprocess
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
with open(PIDS, "a") as pid_file:
    pid_file.write(f"{child.pid}\\n")
"""


@pytest.fixture
def pids(tmp_path: Path) -> Iterator[Path]:
    """The file scripts append PIDs to; every PID in it is SIGKILLed after the test."""
    path = tmp_path / "pids"
    path.touch()
    yield path
    for pid in _noted(path):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.fixture
def script(tmp_path: Path, pids: Path) -> Callable[[str, str], str]:
    """``script(name, body)``: an executable Python script that notes its PID, returns its path.

    ``PIDS`` in `body` is the PID file's path, as a Python literal.
    """

    def write(name: str, body: str) -> str:
        path = tmp_path / name
        note = "with open(PIDS, 'a') as _pids: _pids.write(f'{os.getpid()}\\n')\n"
        text = f"#!{sys.executable}\nimport os, sys\n{note}{textwrap.dedent(body)}"
        path.write_text(text.replace("PIDS", repr(str(pids))))
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
        return str(path)

    return write


def _noted(path: Path) -> list[int]:
    return [int(line) for line in path.read_text().split()]


def _is_gone(pid: int) -> bool:
    """True if `pid` has exited (a zombie counts: it no longer runs and nobody here reaps it)."""
    try:
        with open(f"/proc/{pid}/stat") as stat_file:
            return stat_file.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


def _wait_gone(pids: list[int], timeout_s: float = 2.0) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while (alive := [pid for pid in pids if not _is_gone(pid)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return alive


def _failure(analyzer: ProgramAnalyzer, page: Page = PAGE) -> ProgramFailed:
    with pytest.raises(ProgramFailed) as caught:
        analyzer(page, None)
    assert caught.value.analyzer == analyzer.name and caught.value.url == page.url
    return caught.value


# --- success: the contract ------------------------------------------------------------------------


def test_a_program_that_exits_0_returns_the_json_object_it_wrote_to_output(script):
    program = ProgramAnalyzer("titles", (script("ok.py", OK_BODY), "--flag"))

    result = program(PAGE, None)

    assert (result["length"], result["title"]) == (len(PAGE.body), "Hello")
    flag, source, target = result["args"]
    assert flag == "--flag" and Path(source).parent == Path(target).parent == Path(result["cwd"])
    assert result["cwd_mode"] == "0o700"  # private to the worker's user
    assert not Path(result["cwd"]).exists()  # the private directory is gone with its files


def test_a_program_sees_only_the_documented_environment(script, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("VCRAWL_REDIS_URL", "redis://:s3cret@127.0.0.1:6379/0")
    monkeypatch.setenv("VCRAWL_SMTP_PASSWORD", "s3cret")
    program = ProgramAnalyzer("titles", (script("ok.py", OK_BODY),))

    env = program(PAGE, None)["env"]

    assert set(env) == {"PATH", "LANG", "HOME", "TMPDIR", "VCRAWL_URL", "VCRAWL_CONTENT_TYPE", "VCRAWL_ANALYZER"}
    assert (env["VCRAWL_URL"], env["VCRAWL_CONTENT_TYPE"], env["VCRAWL_ANALYZER"]) == (
        URL,
        "text/html; charset=utf-8",
        "titles",
    )
    assert "s3cret" not in json.dumps(env)


def test_stream_mode_gives_the_body_on_stdin_and_takes_the_object_from_stdout(script):
    body = b"<title>Big</title>" + b"x" * (2 * 1024 * 1024)  # far more than a pipe buffer
    program = ProgramAnalyzer("titles", (script("ok.py", OK_BODY),), io="stream")

    result = program(Page(URL, body), None)

    assert (result["length"], result["title"], result["args"]) == (len(body), "Big", ["-", "-"])


def test_a_stream_program_that_does_not_read_its_input_is_judged_by_its_exit_and_output(script):
    program = ProgramAnalyzer("skims", (script("skims.py", "print('{\"read\": false}')"),), io="stream")

    assert program(Page(URL, b"x" * (4 * 1024 * 1024)), None) == {"read": False}  # its closed stdin is no error


def test_a_program_that_exits_0_and_leaves_a_child_running_returns_and_the_child_is_killed(script, pids):
    body = SPAWN_SLEEPER + "open(sys.argv[2], 'w').write('{\"ok\": true}')"
    program = ProgramAnalyzer("leaves", (script("leaves.py", body),), timeout_s=20)

    started = time.monotonic()
    assert program(PAGE, None) == {"ok": True}

    assert time.monotonic() - started < 5  # not held until the timeout by the child's open pipe
    assert _wait_gone(_noted(pids)) == []


# --- failures: each one raises ProgramFailed with the stderr tail -----------------------------------


def test_a_program_that_exits_3_fails_with_its_status_and_stderr(script):
    program = ProgramAnalyzer("three", (script("three.py", "print('no luck today', file=sys.stderr); sys.exit(3)"),))

    failure = _failure(program)

    assert "exited with status 3" in failure.problem and "no luck today" in failure.problem


def test_a_program_that_crashes_fails_with_the_end_of_its_traceback(script):
    program = ProgramAnalyzer("crash", (script("crash.py", "raise RuntimeError('analyzer bug here')"),))

    failure = _failure(program)

    assert "exited with status 1" in failure.problem and "RuntimeError: analyzer bug here" in failure.problem


def test_a_program_killed_by_a_signal_fails_naming_it(script):
    program = ProgramAnalyzer("segv", (script("segv.py", "import signal; os.kill(os.getpid(), signal.SIGSEGV)"),))

    assert "killed by signal SIGSEGV" in _failure(program).problem


def test_a_program_that_hangs_is_killed_at_its_timeout_with_its_children(script, pids):
    body = SPAWN_SLEEPER + "print('working on it', file=sys.stderr, flush=True)\nimport time; time.sleep(600)"
    program = ProgramAnalyzer("hangs", (script("hangs.py", body),), timeout_s=1.5)

    started = time.monotonic()
    failure = _failure(program)
    took_s = time.monotonic() - started

    assert "timed out after 1.5s" in failure.problem and "working on it" in failure.problem
    assert 1.5 <= took_s < 1.5 + MARGIN_S
    noted = _noted(pids)
    assert len(noted) == 2 and _wait_gone(noted) == []  # the program and the child it started


def test_a_program_that_closes_its_pipes_and_hangs_is_still_killed_at_its_timeout(script, pids):
    body = "import time\nos.close(0); os.close(1); os.close(2)\ntime.sleep(600)"
    program = ProgramAnalyzer("quiet", (script("quiet.py", body),), timeout_s=1.0, io="stream")

    started = time.monotonic()
    assert "timed out after 1s" in _failure(program).problem
    assert time.monotonic() - started < 1.0 + MARGIN_S
    assert _wait_gone(_noted(pids)) == []


@pytest.mark.parametrize(
    ("io", "writes", "problem"),
    [
        pytest.param("files", "open(sys.argv[2], 'w').write('<html>not json')", "output is not JSON", id="not-json"),
        pytest.param(
            "files", "open(sys.argv[2], 'w').write('[1, 2]')", "output is a JSON list, not an object", id="a-list"
        ),
        pytest.param("files", "open(sys.argv[2], 'w').write('{\"x\": NaN}')", "NaN is not JSON", id="nan"),
        pytest.param("files", "pass", "exited with status 0 but wrote no output file", id="no-output-file"),
        pytest.param("stream", "print('hello')", "output is not JSON", id="stream-not-json"),
        pytest.param("stream", "pass", "output is not JSON", id="stream-nothing"),
    ],
)
def test_a_program_without_a_json_object_fails(script, io: str, writes: str, problem: str):
    program = ProgramAnalyzer("bad", (script("bad.py", f"sys.stdin.buffer.read()\n{writes}"),), io=io)

    assert problem in _failure(program).problem


@pytest.mark.parametrize("io", ["files", "stream"])
def test_output_past_the_cap_fails(script, io: str):
    out = "sys.stdout" if io == "stream" else "open(sys.argv[2], 'w')"
    body = f"sys.stdin.buffer.read()\n{out}.write('{{\"x\": \"' + 'a' * {MAX_OUTPUT_BYTES} + '\"}}')"
    program = ProgramAnalyzer("big", (script("big.py", body),), io=io)

    assert f"wrote more than {MAX_OUTPUT_BYTES} bytes of output" in _failure(program).problem


def test_a_program_allocating_past_its_memory_limit_fails(script):
    program = ProgramAnalyzer("hog", (script("hog.py", "hog = bytearray(400 * 1024 * 1024)"),), memory_mb=200)

    failure = _failure(program)

    assert "exited with status 1" in failure.problem and "MemoryError" in failure.problem


def test_the_shipped_memory_limit_holds_a_program_allocating_past_it(script):
    # The twin of the test above at the default 1024 MB: 1.5 GiB is refused.
    program = ProgramAnalyzer("hog", (script("hog.py", "hog = bytearray(1536 * 1024 * 1024)"),))

    assert program.memory_mb == DEFAULT_MEMORY_MB == 1024
    assert "MemoryError" in _failure(program).problem


def test_a_program_within_the_shipped_memory_limit_works(script):
    body = "hog = bytearray(300 * 1024 * 1024)\nopen(sys.argv[2], 'w').write('{\"mb\": %d}' % (len(hog) >> 20))"
    assert ProgramAnalyzer("hog", (script("hog.py", body),))(PAGE, None) == {"mb": 300}


def test_a_program_that_cannot_start_fails_rather_than_raising_os_errors(tmp_path: Path):
    broken = tmp_path / "broken.sh"
    broken.write_text("#!/no/such/interpreter\n")
    broken.chmod(0o755)

    assert "could not start" in _failure(ProgramAnalyzer("broken", (str(broken),))).problem


@pytest.mark.slow
@pytest.mark.long  # make test-long: a minute at the shipped timeout
def test_a_hanging_program_is_killed_at_the_shipped_60s_timeout(script, pids):
    # The twin of the short-timeout test: the default users run (about a minute).
    program = ProgramAnalyzer("hangs", (script("hangs.py", "import time; time.sleep(600)"),))
    assert program.timeout_s == DEFAULT_TIMEOUT_S == 60.0

    started = time.monotonic()
    failure = _failure(program)
    took_s = time.monotonic() - started

    assert "timed out after 60s" in failure.problem and 60.0 <= took_s < 60.0 + MARGIN_S
    assert _wait_gone(_noted(pids)) == []


# --- the programs file ----------------------------------------------------------------------------


def test_the_programs_file_applies_the_defaults_and_reads_yaml_or_json(script, tmp_path: Path):
    ok = script("ok.py", OK_BODY)
    (tmp_path / "programs.json").write_text(json.dumps({
        "plain": {"command": [ok]},
        "tuned": {"command": [ok, "--fast"], "timeout_s": 5, "memory_mb": 256, "io": "stream"},
    }))  # fmt: skip
    (tmp_path / "programs.yaml").write_text(f"plain:\n  command: [{ok}]\n")

    programs = load_programs(tmp_path / "programs.json")

    assert programs["plain"] == ProgramAnalyzer("plain", (ok,), 60.0, 1024, "files")
    assert programs["tuned"] == ProgramAnalyzer("tuned", (ok, "--fast"), 5.0, 256, "stream")
    assert load_programs(tmp_path / "programs.yaml") == {"plain": programs["plain"]}


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        pytest.param({"command": ["ok.py"]}, "not an absolute path to an executable file", id="relative"),
        pytest.param({"command": ["/no/such/program"]}, "not an absolute path to an executable file", id="missing"),
        pytest.param({"command": ["NOT_EXECUTABLE"]}, "not an absolute path to an executable file", id="no-x-bit"),
        pytest.param({"command": ["DIRECTORY"]}, "not an absolute path to an executable file", id="a-directory"),
        pytest.param({"command": "OK --flag"}, "command must be a list (no shell)", id="a-string"),
        pytest.param({"command": []}, "command must be a non-empty list", id="empty"),
        pytest.param({"command": ["OK"], "timeout_s": 0}, "timeout_s must be above 0", id="zero-timeout"),
        pytest.param({"command": ["OK"], "timeout_s": "1m"}, "timeout_s must be a number", id="timeout-text"),
        pytest.param({"command": ["OK"], "memory_mb": 1.5}, "memory_mb must be an integer", id="memory-float"),
        pytest.param({"command": ["OK"], "memory_mb": 4}, "memory_mb must be at least 16", id="memory-tiny"),
        pytest.param({"command": ["OK"], "io": "socket"}, "io must be one of", id="bad-io"),
        pytest.param({"command": ["OK"], "shell": True}, "unknown keys ['shell']", id="unknown-key"),
        pytest.param(["OK"], "must be a mapping with a 'command'", id="not-a-mapping"),
    ],
)
def test_a_malformed_programs_file_is_a_config_error_naming_the_variable_and_entry(
    script, tmp_path: Path, entry: object, message: str
):
    ok = script("ok.py", OK_BODY)
    (tmp_path / "plain.txt").write_text("")
    (tmp_path / "dir").mkdir()
    spelled = {"OK": ok, "NOT_EXECUTABLE": str(tmp_path / "plain.txt"), "DIRECTORY": str(tmp_path / "dir")}
    text = json.dumps({"prog": entry})
    for placeholder, value in spelled.items():
        text = text.replace(f'"{placeholder}', f'"{value}')
    path = tmp_path / "programs.json"
    path.write_text(text)

    with pytest.raises(ConfigError) as caught:
        load_programs(path)

    assert f"VCRAWL_ANALYZER_PROGRAMS={path}" in str(caught.value) and message in str(caught.value)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param(None, "cannot read it", id="missing-file"),
        pytest.param("{not: [valid", "cannot read it", id="bad-yaml"),
        pytest.param("[1, 2]", "must map analyzer names to programs", id="a-list"),
        pytest.param('{"has space": {"command": ["/bin/true"]}}', "is not an analyzer name", id="bad-name"),
    ],
)
def test_an_unreadable_programs_file_is_a_config_error(tmp_path: Path, text: str | None, message: str):
    path = tmp_path / "programs.yaml"
    if text is not None:
        path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_programs(path)


def test_an_empty_programs_file_has_no_programs(tmp_path: Path):
    (tmp_path / "programs.yaml").write_text("")
    assert load_programs(tmp_path / "programs.yaml") == {}


# --- the registry ---------------------------------------------------------------------------------


def test_the_registry_lists_and_runs_programs(script):
    program = ProgramAnalyzer("titles", (script("ok.py", OK_BODY),))
    registry = Registry(entry_points=[], programs=lambda: {"titles": program})

    assert registry.names() == ["fields", "links", "titles"]
    assert registry.run(PAGE, "titles", None)["title"] == "Hello"


@pytest.mark.parametrize(
    ("name", "entry_points", "kind"),
    [
        pytest.param("links", [], "built-in", id="built-in"),
        pytest.param(
            "dumps", [importlib.metadata.EntryPoint("dumps", "json:dumps", "vcrawl.analyzers")], "plugin", id="plugin"
        ),
    ],
)
def test_a_program_named_like_another_analyzer_is_a_config_error(script, name: str, entry_points: list, kind: str):
    program = ProgramAnalyzer(name, (script("ok.py", OK_BODY),))
    registry = Registry(entry_points=entry_points, programs=lambda: {name: program})

    with pytest.raises(ConfigError, match=f"analyzer program '{name}' .* uses the name of a {kind} analyzer"):
        registry.load()


def test_the_installed_registry_reads_the_programs_file_of_vcrawl_analyzer_programs(script, tmp_path: Path):
    # A fresh interpreter: the installed registry loads once per process, as a worker's does.
    path = tmp_path / "programs.yaml"
    path.write_text(f"titles:\n  command: [{script('ok.py', OK_BODY)}]\n")
    code = "from analyzers import analyzer_names; print(' '.join(analyzer_names()))"
    env = {**os.environ, "VCRAWL_ANALYZER_PROGRAMS": str(path)}

    listed = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)

    assert listed.returncode == 0, listed.stderr
    assert "titles" in listed.stdout.split() and "links" in listed.stdout.split()
