"""Reading Sentinel's failover announcements (tests/integration/test_sentinel_fence.py fences a real one)."""

from __future__ import annotations

from cluster.fence import Address, FailoverEvent, read_event


def test_a_switch_names_the_old_and_the_new_primary() -> None:
    event = read_event("+switch-master", "m 10.0.0.1 6379 10.0.0.2 6380", "m")
    assert event == FailoverEvent("switched", Address("10.0.0.1", 6379), Address("10.0.0.2", 6380))


def test_a_selected_replica_names_the_primary_to_fence() -> None:
    event = read_event("+selected-slave", "slave 10.0.0.2:6380 10.0.0.2 6380 @ m 10.0.0.1 6379", "m")
    assert event == FailoverEvent("selected", Address("10.0.0.1", 6379))


def test_a_failover_tried_names_the_primary_to_fence() -> None:
    """The first sign (two or three Sentinel ticks before the replica is promoted): the fence pauses here."""
    event = read_event("+try-failover", "master m 10.0.0.1 6379", "m")
    assert event == FailoverEvent("trying", Address("10.0.0.1", 6379))
    assert read_event("+try-failover", "master other 10.0.0.1 6379", "m") is None


def test_events_of_other_primaries_and_other_channels_are_ignored() -> None:
    assert read_event("+switch-master", "other 10.0.0.1 6379 10.0.0.2 6380", "m") is None
    assert read_event("+sdown", "master m 10.0.0.1 6379", "m") is None
    assert read_event("+switch-master", "m 10.0.0.1 port 10.0.0.2 6380", "m") is None
    aborted = read_event("-failover-abort-no-good-slave", "master m 10.0.0.1 6379", "m")
    assert aborted is not None and aborted.kind == "aborted" and aborted.old == Address("10.0.0.1", 6379)
