"""`celery -A tasks beat` with its clock SHIFT_S seconds ahead: `python -m tests.shifted_clock_beat SHIFT_S ARGS`.

Celery's crontab and RedBeat read the time through ``app.now()`` (the schedule's ``now``, the
entries' last run, the due scores in Redis). Shifting that one clock in the beat process puts a
minute boundary a few seconds away, so a test sees a real ``cron`` schedule fire through RedBeat
and a worker without waiting up to a minute. Nothing else in the process, nor the worker, is shifted.
"""

from __future__ import annotations

import sys
from datetime import datetime, timedelta

from celery import Celery


def main(argv: list[str]) -> None:
    """Shift ``Celery.now`` by ``argv[0]`` seconds, then run ``celery beat`` with the rest of ``argv``."""
    shift = timedelta(seconds=float(argv[0]))
    real_now = Celery.now

    def shifted_now(self: Celery) -> datetime:
        return real_now(self) + shift

    Celery.now = shifted_now  # type: ignore[method-assign]
    from tasks import app  # after the shift: nothing reads the clock at import, but be sure

    app.start(["beat", *argv[1:]])


if __name__ == "__main__":
    main(sys.argv[1:])
