"""External programs as analyzers: an operator's executable, run once per page (docs/analyzer-programs.md).

Programs are configured on the worker only (``VCRAWL_ANALYZER_PROGRAMS``, a YAML or JSON file
read by ``load_programs``); a message only names the analyzer. The contract, in short:

- io ``files``: ``command... INPUT OUTPUT``: INPUT holds the page body, the program writes a JSON
  object to OUTPUT (both in a private temporary directory, also the program's cwd, HOME and TMPDIR).
- io ``stream``: ``command... - -``: the body on stdin, the JSON object on stdout.
- Environment: ``PATH``, ``LANG``, ``HOME``, ``TMPDIR``, ``VCRAWL_URL``, ``VCRAWL_CONTENT_TYPE``,
  ``VCRAWL_ANALYZER``; nothing else of the worker's (its Redis password stays with it).
- Exit status 0 and a JSON object: success, the object is the analyzer's result. Anything else
  (a non-zero status, a signal, no or bad output, the timeout) raises ``ProgramFailed``.
- The program runs in a new session; at its timeout, and whenever it ends, its whole process group
  is killed (SIGKILL), so nothing it started outlives it. ``RLIMIT_AS`` caps its memory.
"""

from __future__ import annotations

import json
import logging
import os
import re
import resource
import selectors
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import yaml

from analyzers.page import Page
from vcrawl.errors import ConfigError, ProgramFailed
from vcrawl.payloads import FieldRule

__all__ = [
    "DEFAULT_MEMORY_MB",
    "DEFAULT_TIMEOUT_S",
    "IO_FILES",
    "IO_MODES",
    "IO_STREAM",
    "MAX_OUTPUT_BYTES",
    "ProgramAnalyzer",
    "load_programs",
]

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 60.0
DEFAULT_MEMORY_MB = 1024
IO_FILES, IO_STREAM = "files", "stream"
IO_MODES = (IO_FILES, IO_STREAM)
MAX_OUTPUT_BYTES = 16 * 1024 * 1024  # a runaway program cannot fill the worker's memory
MIN_MEMORY_MB = 16  # below this not even a small interpreter starts
STDERR_TAIL_BYTES = 2000  # the end of stderr kept for the error message
SETTING = "VCRAWL_ANALYZER_PROGRAMS"

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}\Z")  # what a job's rule may name (vcrawl.payloads)
_KEYS = frozenset({"command", "timeout_s", "memory_mb", "io"})
_PATH = "/usr/local/bin:/usr/bin:/bin"  # fixed: the worker's own PATH may name its virtualenv
_CHUNK = 64 * 1024
_POLL_S = 0.1  # how often the pipe loop checks whether the program has exited
_DRAIN_S = 2.0  # after the program ended: time for its pipes to deliver what is left


@dataclass(frozen=True)
class ProgramAnalyzer:
    """An external program as an analyzer: ``analyzer(page, rules) -> dict`` like any other.

    Field rules are not passed to the program. Raises ``ProgramFailed`` when the program fails.
    """

    name: str
    command: tuple[str, ...]
    timeout_s: float = DEFAULT_TIMEOUT_S
    memory_mb: int = DEFAULT_MEMORY_MB
    io: str = IO_FILES
    max_output_bytes: int = field(default=MAX_OUTPUT_BYTES, repr=False)

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise ConfigError(f"analyzer program name {self.name!r} is not an analyzer name (letters, digits, _.-)")
        if not self.command or not all(isinstance(part, str) for part in self.command):
            raise ConfigError(f"analyzer program {self.name!r}: command must be a non-empty list of strings")
        executable = self.command[0]
        if not os.path.isabs(executable) or not os.path.isfile(executable) or not os.access(executable, os.X_OK):
            raise ConfigError(
                f"analyzer program {self.name!r}: {executable!r} is not an absolute path to an executable file"
            )
        if not 0 < self.timeout_s < float("inf"):
            raise ConfigError(f"analyzer program {self.name!r}: timeout_s must be above 0, got {self.timeout_s!r}")
        if self.memory_mb < MIN_MEMORY_MB:
            raise ConfigError(
                f"analyzer program {self.name!r}: memory_mb must be at least {MIN_MEMORY_MB}, got {self.memory_mb!r}"
            )
        if self.io not in IO_MODES:
            raise ConfigError(f"analyzer program {self.name!r}: io must be one of {IO_MODES}, got {self.io!r}")

    def __call__(self, page: Page, rules: Mapping[str, FieldRule] | None) -> dict[str, Any]:
        """Run the program on `page` and return the JSON object it wrote.

        Raises:
            ProgramFailed: it could not start, exited non-zero, died of a signal, timed out, or wrote
                no JSON object (the message ends with the tail of its stderr).
        """
        try:
            with tempfile.TemporaryDirectory(prefix=f"vcrawl-{self.name}-", ignore_cleanup_errors=True) as tmp:
                return self._run_in(Path(tmp), page)
        except OSError as exc:  # the worker's OSError means storage trouble: this is the program's
            raise ProgramFailed(self.name, page.url, f"{type(exc).__name__}: {exc}") from exc

    def _run_in(self, work: Path, page: Page) -> dict[str, Any]:
        env = {
            "PATH": _PATH,
            "LANG": "C.UTF-8",
            "HOME": str(work),
            "TMPDIR": str(work),
            "VCRAWL_URL": page.url,
            "VCRAWL_CONTENT_TYPE": page.content_type or "",
            "VCRAWL_ANALYZER": self.name,
        }
        if self.io == IO_FILES:
            source, target = work / "input", work / "output"
            source.write_bytes(page.body)
            args, stdin = [*self.command, str(source), str(target)], None
        else:
            target, args, stdin = None, [*self.command, "-", "-"], page.body
        run = _run(args, stdin, env, work, self.timeout_s, self.memory_mb, self.max_output_bytes)
        logger.debug("analyzer program %s on %s: %s in %.2fs", self.name, page.url, run.describe(), run.took_s)
        if run.problem is None and target is not None:
            run.output, run.problem = _read_output(target, self.max_output_bytes)
        if run.problem is None:
            result = _parse_output(run.output)
            if isinstance(result, dict):
                return result
            run.problem = result
        stderr = run.tail.decode("utf-8", "replace").strip()
        raise ProgramFailed(self.name, page.url, f"{run.problem}; stderr: {stderr or '(empty)'}")


@dataclass
class _Run:
    """How one run went: `problem` is None for exit status 0 within the limits."""

    returncode: int | None = None
    output: bytes = b""  # stdout (stream mode)
    tail: bytes = b""  # the end of stderr
    problem: str | None = None
    took_s: float = 0.0

    def describe(self) -> str:
        return self.problem or "exit status 0"


def _run(
    args: list[str], stdin: bytes | None, env: dict[str, str], cwd: Path, timeout_s: float, memory_mb: int,
    max_output_bytes: int,
) -> _Run:  # fmt: skip
    """Run `args` in a session of its own; kill the session's group at the timeout and at the end."""
    stream = stdin is not None
    try:
        process = subprocess.Popen(  # no shell: the command is the operator's list
            args,
            stdin=subprocess.PIPE if stream else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE if stream else subprocess.STDOUT,  # files: stdout is diagnostics too
            cwd=cwd,
            env=env,
            close_fds=True,
            start_new_session=True,
            # Only setrlimit runs between fork and exec: no lock another thread could hold.
            preexec_fn=partial(_limit_child, memory_mb * 1024 * 1024),
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return _Run(problem=f"could not start {args[0]}: {exc}")
    run = _Run()
    started = time.monotonic()
    try:
        _pump(process, stdin or b"", run, started + timeout_s, max_output_bytes)
        if run.problem is None:
            try:  # all pipes closed: the program may still be running
                process.wait(max(0.0, started + timeout_s - time.monotonic()))
            except subprocess.TimeoutExpired:
                run.problem = "timeout"
    finally:
        _kill_group(process.pid)  # at the timeout, or whatever it left running after it ended
        run.returncode = process.wait()
        for pipe in (process.stdin, process.stdout, process.stderr):
            if pipe is not None:
                pipe.close()
    run.took_s = time.monotonic() - started
    if run.problem == "timeout":
        run.problem = f"timed out after {timeout_s:g}s (killed with its process group)"
    elif run.problem is None:
        run.problem = _exit_problem(run.returncode)
    return run


def _pump(process: subprocess.Popen[bytes], body: bytes, run: _Run, deadline: float, max_output_bytes: int) -> None:
    """Feed stdin and read stdout/stderr until the pipes close, the deadline passes or the output overflows."""
    out, tail = bytearray(), bytearray()
    selector = _selector(process, body)
    capture = process.stderr is not None  # stream mode: stdout is the result
    view, written = memoryview(body), 0
    ended_at: float | None = None
    try:
        while selector.get_map():
            now = time.monotonic()
            if ended_at is None and process.poll() is not None:
                ended_at = now
                _kill_group(process.pid)  # a child still holding the pipes would keep them open
            until = deadline if ended_at is None else min(deadline, ended_at + _DRAIN_S)
            if now >= until:
                if ended_at is None:
                    run.problem = "timeout"
                break
            for key, _ in selector.select(min(until - now, _POLL_S)):
                if key.fileobj is process.stdin:
                    written = _feed(selector, process, view, written)
                    continue
                data = os.read(key.fd, _CHUNK)
                if not data:
                    selector.unregister(key.fileobj)
                elif capture and key.fileobj is process.stdout:
                    out += data
                    if len(out) > max_output_bytes:
                        run.problem = f"wrote more than {max_output_bytes} bytes of output"
                        return
                else:
                    tail += data
                    del tail[:-STDERR_TAIL_BYTES]
    finally:
        selector.close()
        run.output, run.tail = bytes(out), bytes(tail)


def _selector(process: subprocess.Popen[bytes], body: bytes) -> selectors.BaseSelector:
    """Watch the program's pipes: stdin (stream mode, while there is body left), stdout, stderr."""
    selector = selectors.DefaultSelector()
    if process.stdin is not None:
        if body:
            os.set_blocking(process.stdin.fileno(), False)
            selector.register(process.stdin, selectors.EVENT_WRITE)
        else:
            process.stdin.close()
    assert process.stdout is not None
    selector.register(process.stdout, selectors.EVENT_READ)
    if process.stderr is not None:
        selector.register(process.stderr, selectors.EVENT_READ)
    return selector


def _feed(selector: selectors.BaseSelector, process: subprocess.Popen[bytes], view: memoryview, written: int) -> int:
    """Write the next chunk of the body to stdin, closing it at the end; return the bytes written so far."""
    assert process.stdin is not None
    try:
        written += os.write(process.stdin.fileno(), view[written : written + _CHUNK])
    except BrokenPipeError:  # it stopped reading: its exit status will tell
        written = len(view)
    if written >= len(view):
        selector.unregister(process.stdin)
        process.stdin.close()
    return written


def _limit_child(memory_bytes: int) -> None:
    """In the child before exec: cap its address space; no core files."""
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = memory_bytes if hard == resource.RLIM_INFINITY else min(memory_bytes, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # the group is gone already


def _exit_problem(returncode: int) -> str | None:
    """Describe a non-zero exit status; None for 0.

    >>> _exit_problem(0), _exit_problem(3), _exit_problem(-9)
    (None, 'exited with status 3', 'killed by signal SIGKILL')
    """
    if returncode == 0:
        return None
    if returncode < 0:
        try:
            return f"killed by signal {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exited with status {returncode}"


def _read_output(target: Path, max_output_bytes: int) -> tuple[bytes, str | None]:
    """The OUTPUT file of a run that exited 0, or why it cannot be used."""
    try:
        size = target.stat().st_size
        if size > max_output_bytes:
            return b"", f"wrote more than {max_output_bytes} bytes of output"
        return target.read_bytes(), None
    except FileNotFoundError:
        return b"", "exited with status 0 but wrote no output file"


def _parse_output(data: bytes) -> dict[str, Any] | str:
    """The program's JSON object, or what is wrong with its output.

    >>> _parse_output(b'{"n": 1}'), _parse_output(b"[1]"), _parse_output(b"NaN")
    ({'n': 1}, 'output is a JSON list, not an object', 'output is not JSON: NaN is not JSON')
    """
    try:
        value = json.loads(data.decode("utf-8"), parse_constant=_refuse_constant)
    except (UnicodeDecodeError, ValueError) as exc:
        return f"output is not JSON: {exc}"
    if not isinstance(value, dict):
        return f"output is a JSON {_JSON_TYPES.get(type(value), type(value).__name__)}, not an object"
    return value


_JSON_TYPES = {list: "list", str: "string", int: "number", float: "number", bool: "boolean", type(None): "null"}


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def load_programs(path: str | Path) -> dict[str, ProgramAnalyzer]:
    """Read the analyzer programs file (YAML or JSON): ``name -> {command, timeout_s, memory_mb, io}``.

    Raises:
        ConfigError: the file cannot be read, or an entry is malformed (naming the file and the entry).
    """
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))  # YAML is a superset of JSON
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(f"{SETTING}={path}: cannot read it: {exc}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{SETTING}={path}: must map analyzer names to programs, got a {type(data).__name__}")
    try:
        return {str(name): _program(str(name), entry) for name, entry in data.items()}
    except ConfigError as exc:
        raise ConfigError(f"{SETTING}={path}: {exc}") from None


def _program(name: str, entry: Any) -> ProgramAnalyzer:
    if not isinstance(entry, dict):
        raise ConfigError(f"analyzer program {name!r} must be a mapping with a 'command', got {entry!r}")
    if unknown := set(entry) - _KEYS:
        raise ConfigError(f"analyzer program {name!r}: unknown keys {sorted(map(str, unknown))}, known {sorted(_KEYS)}")
    command = entry.get("command")
    if not isinstance(command, list):
        raise ConfigError(f"analyzer program {name!r}: command must be a list (no shell), got {command!r}")
    timeout_s = entry.get("timeout_s", DEFAULT_TIMEOUT_S)
    memory_mb = entry.get("memory_mb", DEFAULT_MEMORY_MB)
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float):
        raise ConfigError(f"analyzer program {name!r}: timeout_s must be a number, got {timeout_s!r}")
    if isinstance(memory_mb, bool) or not isinstance(memory_mb, int):
        raise ConfigError(f"analyzer program {name!r}: memory_mb must be an integer, got {memory_mb!r}")
    return ProgramAnalyzer(name, tuple(command), float(timeout_s), memory_mb, str(entry.get("io", IO_FILES)))
