"""A bundle's released batches go to analysis together: by partition, at most so many, not for long."""

from __future__ import annotations

from typing import Any

from engine.fetch_bundle import AnalysisGatherer


def _released(batch: str, cycle: int = 0, pages: int = 1) -> dict[str, Any]:
    return {"job": "j", "batch": batch, "cycle": cycle, "pages": [{"url": f"http://h/{n}"} for n in range(pages)],
            "redirects": []}  # fmt: skip


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_batches_of_one_partition_go_together_once_there_are_enough() -> None:
    sent: list[list[str]] = []
    gatherer = AnalysisGatherer(lambda group: sent.append([item["batch"] for item in group]), most=3, most_s=9.0)
    for batch in ("1.ab", "2.ab~1", "3.ab", "4.ab~1", "5.ab"):
        gatherer.add(_released(batch))
    assert sent == [["1.ab", "3.ab", "5.ab"]]  # partition 0 is full; partition 1 waits for a third
    gatherer.send_all()
    assert sent == [["1.ab", "3.ab", "5.ab"], ["2.ab~1", "4.ab~1"]]


def test_a_batch_waits_at_most_its_time_and_one_with_nothing_to_analyse_is_not_sent() -> None:
    clock, sent = _Clock(), []
    gatherer = AnalysisGatherer(sent.append, clock=clock, most=8, most_s=0.5)
    gatherer.add(_released("1.ab", pages=0))  # its lease was gone: nothing handed on
    gatherer.add(_released("2.ab"))
    clock.now += 0.3
    gatherer.add(_released("3.ab"))
    gatherer.send_due()
    assert sent == []
    clock.now += 0.2  # the first has waited 0.5 s: it goes, with what came since
    gatherer.send_due()
    assert [[item["batch"] for item in group] for group in sent] == [["2.ab", "3.ab"]]
    gatherer.send_all()
    assert len(sent) == 1


def test_batches_of_different_cycles_are_never_sent_together() -> None:
    sent: list[list[str]] = []
    gatherer = AnalysisGatherer(lambda group: sent.append([item["batch"] for item in group]), most=2)
    for batch, cycle in (("1.ab", 1), ("2.ab", 2), ("3.ab", 1)):
        gatherer.add(_released(batch, cycle))
    assert sent == [["1.ab", "3.ab"]]
