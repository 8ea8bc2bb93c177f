"""When the watchdog looks at a batch analysis run for lost messages: the rules of ``batch_analysis.lookout``."""

from __future__ import annotations

import pytest

from batch_analysis.lookout import LookPolicy, last_progress
from vcrawl.settings import Settings

POLICY = LookPolicy()
SENT = {"chunks": 40, "chunks_done": 12, "started_at": 1000.0, "sent_at": 1001.0, "progress_at": 1050.0}


@pytest.mark.parametrize(
    ("run", "now", "due"),
    [
        (SENT, 1059.9, False),  # a chunk mapped 9.9 s ago
        (SENT, 1060.0, True),  # nothing for 10 s: look
        ({**SENT, "progress_at": None}, 1011.0, True),  # sent, nothing mapped for 10 s
        # Not wholly sent yet (or the launcher died mid-way): 10 s plus 40 chunks at 100/s.
        ({**SENT, "sent_at": None, "progress_at": None}, 1010.3, False),
        ({**SENT, "sent_at": None, "progress_at": None}, 1010.5, True),
        # Looked at 1060, nothing lost, the queue long: the next look 20 s later, unless a chunk is mapped.
        ({**SENT, "looked_at": 1060.0, "look_every": 20.0}, 1079.9, False),
        ({**SENT, "looked_at": 1060.0, "look_every": 20.0}, 1080.0, True),
        ({**SENT, "looked_at": 1060.0, "look_every": 300.0, "progress_at": 1061.0}, 1071.0, True),
        # Every chunk mapped, no reduce begun: the reduce is due 15 s after the last map, not 10.
        ({**SENT, "chunks_done": 40}, 1064.9, False),
        ({**SENT, "chunks_done": 40}, 1065.1, True),
        # The reduce has begun: a reduce that runs long is looked at like a map.
        ({**SENT, "chunks_done": 40, "reducing_at": 1066.0}, 1075.9, False),
        ({**SENT, "chunks_done": 40, "reducing_at": 1066.0}, 1076.0, True),
    ],
)
def test_a_run_is_looked_at_soon_after_it_stops_moving(run: dict, now: float, due: bool) -> None:
    assert POLICY.is_due(run, now) is due


def test_the_first_look_comes_well_within_the_node_timeout_whatever_the_visibility_timeout() -> None:
    """The shipped policy does not depend on the visibility timeout (an hour): a look sees unacked messages."""
    settings = Settings()
    assert settings.visibility_timeout_s >= 3600
    assert POLICY.first_look_s + 5.0 < settings.node_timeout_s  # plus one watchdog period (WATCH_EVERY_S)


@pytest.mark.parametrize(
    ("every", "lost", "backlog", "expected"),
    [
        (None, 0, 5000, 20.0),  # nothing lost behind a long queue: back off
        (20.0, 0, 5000, 40.0),
        (160.0, 0, 5000, 300.0),  # at most the longest
        (300.0, 0, 5000, 300.0),
        (300.0, 2, 5000, 10.0),  # something was lost: look again soon
        (300.0, 0, 1000, 10.0),  # a short queue costs next to nothing: no back-off
    ],
)
def test_looks_back_off_only_while_nothing_is_lost_behind_a_long_queue(
    every: float | None, lost: int, backlog: int, expected: float
) -> None:
    assert POLICY.next_every(every, lost, backlog) == expected


def test_last_progress_is_the_latest_of_start_send_map_and_reduce() -> None:
    assert last_progress({"started_at": 5.0, "sent_at": 6.0, "progress_at": None, "reducing_at": 4.0}) == 6.0
    assert last_progress({}) == 0.0


@pytest.mark.parametrize(
    "fields",
    [
        {"first_look_s": 0.0},
        {"first_look_s": 400.0},  # beyond the longest
        {"reduce_due_s": 0.0},
        {"publish_per_s": -1.0},
        {"cheap_backlog": -1},
    ],
)
def test_a_policy_that_makes_no_sense_is_refused(fields: dict) -> None:
    with pytest.raises(ValueError, match="LookPolicy"):
        LookPolicy(**fields)
