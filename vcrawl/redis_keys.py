"""Every Redis key vcrawl uses, in one place."""

from __future__ import annotations

__all__ = ["PREFIX", "alert_sent", "host_gate", "task_status"]

PREFIX = "vcrawl"


def task_status(trail_id: str) -> str:
    """Hash with the status trail of one submitted task."""
    return f"{PREFIX}:task:{trail_id}"


def host_gate(host: str) -> str:
    """String that exists while ``host`` must not be fetched (politeness interval)."""
    return f"{PREFIX}:gate:{host}"


def alert_sent(trail_id: str, stage: str) -> str:
    """Marker that the admin alert for ``stage`` of a task went out (sent once)."""
    return f"{PREFIX}:alerted:{trail_id}:{stage}"
