"""Finding analysis messages by their task id, in the form kombu really writes them: waiting on
the analysis queue, and unacknowledged (taken by a consumer, not yet acknowledged).

The watchdog that sends a lost analysis again runs with real workers in
tests/faults/test_lost_analysis.py.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
from kombu import Connection

from celeryconfig import ANALYSIS_QUEUE
from cli.local_redis import LocalRedis
from tasks.batches import analyze_batch
from tasks.lost_analyses import analysis_ids_present, analysis_task_id

_DB = 7  # a database of the session's server that no worker consumes


@pytest.fixture
def broker(redis_server: LocalRedis) -> Iterator[str]:
    url = redis_server.url.rsplit("/", 1)[0] + f"/{_DB}"
    client = redis.Redis.from_url(url)
    client.flushdb()
    yield url
    client.flushdb()


def test_analysis_ids_are_found_queued_and_unacknowledged(broker: str) -> None:
    client = redis.Redis.from_url(broker)
    with Connection(broker) as connection:
        for batch in ("1", "2", "3"):
            fetched = {"job": "job-x", "batch": batch, "cycle": 0, "pages": [], "redirects": []}
            analyze_batch.apply_async((fetched,), task_id=analysis_task_id("job-x", batch), connection=connection,
                                      queue=ANALYSIS_QUEUE)  # fmt: skip
        assert analysis_ids_present(client) == {analysis_task_id("job-x", batch) for batch in ("1", "2", "3")}

        queue = connection.SimpleQueue(ANALYSIS_QUEUE)
        taken = queue.get(timeout=5)  # held by a consumer: in kombu's unacked hash, off the queue
        assert client.hlen("unacked") == 1
        assert analysis_ids_present(client) == {analysis_task_id("job-x", batch) for batch in ("1", "2", "3")}

        taken.ack()
        [held] = [taken.headers["id"]]
        assert analysis_ids_present(client) == {analysis_task_id("job-x", batch) for batch in ("1", "2", "3")} - {held}
        queue.close()


def test_a_message_that_only_names_an_analysis_as_its_parent_is_not_that_analysis(broker: str) -> None:
    client = redis.Redis.from_url(broker)
    with Connection(broker) as connection:
        analyze_batch.apply_async(({"job": "job-x", "batch": "4"},), task_id="some-other-task", connection=connection,
                                  queue=ANALYSIS_QUEUE, parent_id=analysis_task_id("job-x", "4"),
                                  root_id=analysis_task_id("job-x", "4"))  # fmt: skip
    assert client.llen(ANALYSIS_QUEUE) == 1
    assert analysis_ids_present(client) == set()
