"""The output shipper's decisions (cluster.outputs), with an in-memory ledger and writers: no sockets."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from cluster.outputs import OutputShipper, is_output_due
from frontier.history import UrlHistory
from vcrawl.jobs import RevisitSpec


@dataclass
class MemoryLedger:
    """OutputLedger's notes, in a dict (job -> writer -> cycle)."""

    notes: dict[str, dict[str, int]] = field(default_factory=dict)

    def note(self, job_id: str, writer: str, cycle: int) -> None:
        self.notes.setdefault(job_id, {}).setdefault(writer, cycle)

    def clear(self, job_id: str, writer: str) -> None:
        self.notes.get(job_id, {}).pop(writer, None)


@dataclass
class MemoryWriters:
    """This process's writers: which jobs hold unshipped output; what was shipped."""

    pending: set[str] = field(default_factory=set)
    known: set[str] = field(default_factory=set)
    shipped: list[str] = field(default_factory=list)
    written_while_shipping: set[str] = field(default_factory=set)

    def write(self, job_id: str) -> None:
        self.known.add(job_id)
        self.pending.add(job_id)

    def jobs(self) -> list[str]:
        return sorted(self.known)

    def has_pending(self, job_id: str) -> bool:
        return job_id in self.pending

    def ship(self, job_id: str) -> None:
        self.shipped.append(job_id)
        self.pending.discard(job_id)
        if job_id in self.written_while_shipping:  # a late batch wrote as the files rolled
            self.pending.add(job_id)


@dataclass
class Jobs:
    states: dict[str, tuple[str | None, int]] = field(default_factory=dict)

    def state(self, job_id: str) -> tuple[str | None, int]:
        return self.states.get(job_id, (None, 0))


def shipper() -> tuple[OutputShipper, MemoryLedger, MemoryWriters, Jobs]:
    ledger, writers, jobs = MemoryLedger(), MemoryWriters(), Jobs()
    return OutputShipper(ledger, writers, jobs.state, writer="w1"), ledger, writers, jobs  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("state", "current", "noted", "due"),
    [
        ("running", 0, 0, False),
        ("paused", 0, 0, False),
        ("completed", 0, 0, True),
        ("cancelled", 0, 0, True),
        ("failed", 0, 0, True),
        (None, 0, 0, True),  # the job is gone: nothing will complete it
        ("running", 2, 1, True),  # the next cycle runs: the one the output was written in is over
        ("running", 2, 2, False),
    ],
)
def test_output_is_due_when_the_job_or_its_cycle_is_over(
    state: str | None, current: int, noted: int, due: bool
) -> None:
    assert is_output_due(state, current, noted) is due


def test_a_running_jobs_output_stays_noted_until_the_job_completes() -> None:
    outputs, ledger, writers, jobs = shipper()
    jobs.states["j"] = ("running", 0)
    writers.write("j")
    outputs.note("j")

    assert outputs.ship_due() == [] and writers.shipped == []
    assert ledger.notes == {"j": {"w1": 0}}

    jobs.states["j"] = ("completed", 0)
    assert outputs.ship_due() == ["j"]
    assert writers.shipped == ["j"] and ledger.notes == {"j": {}}
    assert outputs.ship_due() == []  # nothing left: shipped once


def test_an_announced_completion_ships_at_once() -> None:
    outputs, ledger, writers, jobs = shipper()
    jobs.states["j"] = ("running", 0)  # the poll would not ship yet; the announcement says it completed
    writers.write("j")
    outputs.note("j")

    assert outputs.ship_due(announced="j") == ["j"] and ledger.notes == {"j": {}}


def test_a_cycle_over_ships_while_the_next_cycle_runs() -> None:
    outputs, ledger, writers, jobs = shipper()
    jobs.states["s"] = ("running", 1)
    writers.write("s")
    outputs.note("s")
    jobs.states["s"] = ("running", 2)  # cycle 1 completed and cycle 2 started before the poll looked

    assert outputs.ship_due() == ["s"] and ledger.notes == {"s": {}}


def test_output_written_during_a_shipment_is_noted_again() -> None:
    outputs, ledger, writers, jobs = shipper()
    jobs.states["s"] = ("running", 1)
    writers.write("s")
    outputs.note("s")
    writers.written_while_shipping.add("s")
    jobs.states["s"] = ("running", 2)

    outputs.ship_due()

    assert writers.shipped == ["s"] and ledger.notes == {"s": {"w1": 2}}  # pending in the cycle running now


def test_a_lost_note_is_written_again_by_the_poll() -> None:
    outputs, ledger, writers, jobs = shipper()
    jobs.states["j"] = ("running", 0)
    writers.write("j")
    outputs.note("j")
    ledger.notes.clear()  # e.g. a Redis restart without persistence

    outputs.ship_due()

    assert ledger.notes == {"j": {"w1": 0}}


def test_a_job_with_nothing_pending_and_no_note_is_left_alone() -> None:
    outputs, ledger, writers, jobs = shipper()
    writers.known.add("done")
    jobs.states["done"] = ("completed", 0)

    assert outputs.ship_due() == [] and writers.shipped == [] and ledger.notes == {}


def test_ship_all_ships_every_job_and_clears_the_notes() -> None:
    outputs, ledger, writers, jobs = shipper()
    for job_id in ("a", "b"):
        jobs.states[job_id] = ("running", 0)
        writers.write(job_id)
        outputs.note(job_id)

    outputs.ship_all()

    assert writers.shipped == ["a", "b"] and ledger.notes == {"a": {}, "b": {}}


def test_the_last_capture_survives_the_history_round_trip() -> None:
    first = UrlHistory(1).after_visit(cycle_started_s=100.0, revisit=RevisitSpec(), status=200, headers={},
                                      changed=True, digest="h1", capture="20260101000000 " + "A" * 32)  # fmt: skip
    again = UrlHistory.decode(first.encode()).after_visit(cycle_started_s=200.0, revisit=RevisitSpec(), status=304)

    assert again.capture == first.capture == "20260101000000 " + "A" * 32
    assert UrlHistory.decode('[1,100.0,60.0,"",0,"h1"]').capture == ""  # a record from before captures were kept
