"""``python -m tasks.celery_worker NAME THREADS QUEUES LOGLEVEL``: one worker of a local run, as
``celery -A tasks worker -P threads -c THREADS -Q QUEUES -n NAME -l LOGLEVEL --without-mingle
--without-gossip`` starts it, without the ``celery`` command line around it.

That command line imports click's REPL, Flower's command and Pygments' Python lexer before it
reads a flag: about a quarter of a second of CPU per worker start, none of it used by a worker
(``vcrawl crawl`` starts one per core for every run). The worker itself is the same
``app.Worker`` the command builds. Deployments keep ``celery -A tasks worker`` (docs/cluster.md).
"""

from __future__ import annotations

import sys

__all__ = ["main"]


def main(argv: list[str]) -> int:
    """Run the worker until it is stopped; return its exit code."""
    name, threads, queues, loglevel = argv
    from celery.utils.log import mlevel

    from tasks import app

    worker = app.Worker(
        hostname=name, pool_cls="threads", concurrency=int(threads), queues=queues.split(","),
        loglevel=mlevel(loglevel), without_mingle=True, without_gossip=True,
    )  # fmt: skip
    worker.start()
    return int(worker.exitcode or 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
