"""Run the fault suite and print what happened in each fault: ``make faults-report``.

Usage: ``.venv/bin/python tests/faults/report.py [--json FILE] [pytest args...]``. It runs
``pytest -m faults tests/faults`` with ``VCRAWL_FAULTS_REPORT`` set, then prints one block per
fault test with the figures the test noted (pages expected and stored, URLs fetched again,
seconds to recover ...). The exit status is pytest's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
_FIRST = ("fault", "passed", "state", "pages_expected", "pages_stored", "seconds")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path, help="also keep the JSON lines in this file")
    args, pytest_args = parser.parse_known_args(argv)
    with tempfile.TemporaryDirectory(prefix="vcrawl-faults-") as work:
        lines_file = Path(work) / "faults.jsonl"
        env = {**os.environ, "VCRAWL_FAULTS_REPORT": str(lines_file)}
        command = [sys.executable, "-m", "pytest", "-m", "faults", "-q", "-p", "no:cacheprovider",
                   str(REPO / "tests" / "faults"), *pytest_args]  # fmt: skip
        rc = subprocess.run(command, cwd=REPO, env=env, check=False).returncode
        lines = [json.loads(line) for line in lines_file.read_text().splitlines()] if lines_file.exists() else []
        if args.json is not None:
            args.json.write_text("".join(json.dumps(line, sort_keys=True) + "\n" for line in lines))
    print(render(lines))
    return rc


def render(lines: list[dict[str, Any]]) -> str:
    """One block per test: the fault, the verdict, then every figure it noted."""
    if not lines:
        return "no fault test reported anything"
    blocks = []
    for line in lines:
        verdict = "ok" if line.get("passed") else "FAILED"
        head = f"[{verdict}] {line.get('fault', line['test'])}  ({line['test']}, {line.get('seconds')} s)"
        figures = [f"    {key}: {line[key]}" for key in _FIRST[2:] if key in line and key != "seconds"]
        figures += [f"    {key}: {value}" for key, value in sorted(line.items()) if key not in (*_FIRST, "test")]
        blocks.append("\n".join([head, *figures]))
    passed = sum(1 for line in lines if line.get("passed"))
    return "\n\n".join(blocks) + f"\n\n{passed} of {len(lines)} fault tests passed"


if __name__ == "__main__":
    sys.exit(main())
