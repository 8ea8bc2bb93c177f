"""Finding analysis messages by their task id, in the form kombu really writes them: waiting on
the analysis queue, and unacknowledged (taken by a consumer, not yet acknowledged).

The watchdog that sends a lost analysis again runs with real workers in
tests/faults/test_lost_analysis.py.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import redis
from celery.exceptions import Reject
from kombu import Connection

from celeryconfig import ANALYSIS_QUEUE
from tasks import batches as analysis_tasks
from tasks.batch_analysis import batch_map, map_task_id, maps_present, message_exists
from tasks.batches import analysis_batch_failed, analysis_batches_failed, analyze_batch, analyze_batches
from tasks.broker.lost_analyses import analysis_ids_present, analysis_task_id


@pytest.mark.parametrize("decoded", [True, False], ids=["vcrawl's client (str)", "raw (bytes)"])
def test_analysis_ids_are_found_queued_and_unacknowledged(spare_broker: str, decoded: bool) -> None:
    client = redis.Redis.from_url(spare_broker, decode_responses=decoded)
    with Connection(spare_broker) as connection:
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


def test_a_message_that_only_names_an_analysis_as_its_parent_is_not_that_analysis(spare_broker: str) -> None:
    client = redis.Redis.from_url(spare_broker, decode_responses=True)
    with Connection(spare_broker) as connection:
        analyze_batch.apply_async(({"job": "job-x", "batch": "4"},), task_id="some-other-task", connection=connection,
                                  queue=ANALYSIS_QUEUE, parent_id=analysis_task_id("job-x", "4"),
                                  root_id=analysis_task_id("job-x", "4"))  # fmt: skip
    assert client.llen(ANALYSIS_QUEUE) == 1
    assert analysis_ids_present(client) == set()


@pytest.mark.parametrize("decoded", [True, False], ids=["vcrawl's client (str)", "raw (bytes)"])
def test_a_batch_analysis_map_is_found_by_its_task_id_queued_and_unacknowledged(
    spare_broker: str, decoded: bool
) -> None:
    client = redis.Redis.from_url(spare_broker, decode_responses=decoded)
    with Connection(spare_broker) as connection:
        batch_map.apply_async(("job-x", "run-1", 3), task_id=map_task_id("run-1", 3), connection=connection,
                              ignore_result=True, queue=ANALYSIS_QUEUE)  # fmt: skip
        assert message_exists(client, ANALYSIS_QUEUE, map_task_id("run-1", 3))
        assert not message_exists(client, ANALYSIS_QUEUE, map_task_id("run-1", 4))
        queue = connection.SimpleQueue(ANALYSIS_QUEUE)
        taken = queue.get(timeout=5)
        assert message_exists(client, ANALYSIS_QUEUE, map_task_id("run-1", 3))  # unacknowledged now
        taken.ack()
        assert not message_exists(client, ANALYSIS_QUEUE, map_task_id("run-1", 3))
        queue.close()


def test_the_maps_of_every_run_are_found_in_one_pass_queued_and_unacknowledged(spare_broker: str) -> None:
    client = redis.Redis.from_url(spare_broker, decode_responses=True)
    with Connection(spare_broker) as connection:
        for run_id, index in (("run-1", 0), ("run-1", 2), ("run-2", 0)):
            batch_map.apply_async(("job-x", run_id, index), task_id=map_task_id(run_id, index),
                                  connection=connection, ignore_result=True, queue=ANALYSIS_QUEUE,
                                  parent_id=map_task_id("run-9", 9))  # fmt: skip
        analyze_batch.apply_async(({"job": "job-x", "batch": "4"},), task_id=analysis_task_id("job-x", "4"),
                                  connection=connection, queue=ANALYSIS_QUEUE)  # fmt: skip
        expected = {map_task_id("run-1", 0), map_task_id("run-1", 2), map_task_id("run-2", 0)}
        assert maps_present(client) == expected  # not the analysis, not a parent's id
        queue = connection.SimpleQueue(ANALYSIS_QUEUE)
        taken = queue.get(timeout=5)
        assert client.hlen("unacked") == 1 and maps_present(client) == expected
        taken.ack()
        assert len(maps_present(client)) == 2
        queue.close()


def test_a_gathered_analysis_is_found_by_each_of_its_batches(spare_broker: str) -> None:
    client = redis.Redis.from_url(spare_broker, decode_responses=True)
    gathered = [{"job": "job-g", "batch": batch, "cycle": 0, "pages": [], "redirects": []} for batch in ("7", "8")]
    with Connection(spare_broker) as connection:
        analyze_batches.apply_async((gathered,), task_id=analysis_task_id("job-g", "7+8"), connection=connection,
                                    queue=ANALYSIS_QUEUE)  # fmt: skip
    assert {analysis_task_id("job-g", "7"), analysis_task_id("job-g", "8")} <= analysis_ids_present(client)


def test_an_analysis_whose_retry_could_not_be_sent_is_left_to_the_watchdog_not_abandoned(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Celery raises Reject when a retry cannot be published (the broker restarting): abandoning the
    batches then would finish their pages without their links (seen in acceptance check 21)."""
    abandoned: list[str] = []
    monkeypatch.setattr(analysis_tasks.analysis_batch, "abandon_analysis",
                        lambda _env, fetched, *_: abandoned.append(fetched["batch"]))  # fmt: skip
    one = {"job": "job-r", "batch": "1", "cycle": 0, "pages": [], "redirects": []}
    two = [{**one, "batch": "2"}, {**one, "batch": "3"}]
    unsent = Reject(ConnectionError("broker down"), requeue=False)

    analysis_batch_failed(SimpleNamespace(args=[one]), unsent, "")
    analysis_batches_failed(SimpleNamespace(args=[two]), unsent, "")
    assert abandoned == []  # their hand-overs stay in the frontier: the watchdog sends them again

    analysis_batch_failed(SimpleNamespace(args=[one]), RuntimeError("retries spent"), "")
    analysis_batches_failed(SimpleNamespace(args=[two]), RuntimeError("retries spent"), "")
    assert abandoned == ["1", "2", "3"]
