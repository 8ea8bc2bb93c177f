"""When the watchdog looks at a running batch analysis run for lost messages, as plain rules.

kombu's Redis transport takes a message off its queue (BRPOP) before it notes it as unacknowledged:
a worker killed between the two loses a map for good, and the chord would wait for ever. A look is
one pass over the analysis queue and kombu's ``unacked`` hash; a map that is not done and is in
neither is sent again. Looking needs no wait for the visibility timeout: an unacknowledged message
is seen where it is, so a look can come as soon as a run stops moving.

- A run whose chord was wholly sent (``sent_at``) is looked at ``first_look_s`` after its last
  progress (a chunk mapped, the reduce begun, the chord sent), well within the node timeout (30 s).
- A run whose launcher may still be publishing (no ``sent_at``: publishing, or the launcher died
  mid-way) waits longer, by its chunks at a publish rate far below a producer's (~700/s).
- A look that finds nothing lost while the queue is long (a run waiting its turn) backs off,
  doubling up to ``longest_look_s``: a pass over a long queue costs; any progress starts again at
  ``first_look_s``. Over a short queue a pass costs next to nothing, so it does not back off.
- A run whose chunks are all mapped and whose reduce has not begun ``reduce_due_s`` after gets its
  reduce sent again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["LookPolicy", "last_progress"]


def last_progress(run: Mapping[str, Any]) -> float:
    """When the run last moved: started, chord sent, a chunk mapped, or the reduce begun."""
    return max(float(run.get(name) or 0.0) for name in ("started_at", "sent_at", "progress_at", "reducing_at"))


@dataclass(frozen=True)
class LookPolicy:
    """When a run gets a look, and how the looks back off while nothing is lost."""

    first_look_s: float = 10.0  # no progress this long: look (the node timeout is 30 s)
    longest_look_s: float = 300.0  # a run waiting behind a long queue is looked at at least this often
    reduce_due_s: float = 15.0  # the reduce follows the last map within a second; this long without it: resend
    publish_per_s: float = 100.0  # a launcher publishes a chord's maps far faster (~700/s)
    cheap_backlog: int = 1000  # messages a pass reads for next to nothing: no back-off below this

    def __post_init__(self) -> None:
        if not 0 < self.first_look_s <= self.longest_look_s:
            raise ValueError(f"LookPolicy: need 0 < first_look_s <= longest_look_s, got {self}")
        if self.reduce_due_s <= 0 or self.publish_per_s <= 0 or self.cheap_backlog < 0:
            raise ValueError(f"LookPolicy: reduce_due_s and publish_per_s must be > 0, cheap_backlog >= 0: {self}")

    def is_due(self, run: Mapping[str, Any], now: float) -> bool:
        """True if ``run`` (``AnalysisRuns.get``) should be looked at now.

        >>> policy = LookPolicy()
        >>> run = {"chunks": 4, "chunks_done": 2, "started_at": 100.0, "sent_at": 101.0}
        >>> policy.is_due(run, 110.0), policy.is_due(run, 111.5)
        (False, True)
        >>> policy.is_due({**run, "looked_at": 111.5, "look_every": 20.0}, 121.5)  # backed off
        False
        >>> policy.is_due({**run, "looked_at": 111.5, "look_every": 20.0, "progress_at": 112.0}, 122.5)
        True
        """
        moved = last_progress(run)
        chunks = int(run.get("chunks") or 0)
        if run.get("chunks_done") == chunks and not run.get("reducing_at"):
            return now - moved > self.reduce_due_s
        looked_at = run.get("looked_at")
        if looked_at is not None and looked_at >= moved:  # nothing moved since the last look
            return now - looked_at >= float(run.get("look_every") or self.first_look_s)
        wait_s = self.first_look_s if run.get("sent_at") else self.first_look_s + chunks / self.publish_per_s
        return now - moved >= wait_s

    def next_every(self, every_s: float | None, lost: int, backlog: int) -> float:
        """How long after this look the next one comes while the run does not move.

        >>> policy = LookPolicy()
        >>> policy.next_every(None, lost=0, backlog=50_000), policy.next_every(160.0, lost=0, backlog=50_000)
        (20.0, 300.0)
        >>> policy.next_every(80.0, lost=1, backlog=50_000), policy.next_every(80.0, lost=0, backlog=20)
        (10.0, 10.0)
        """
        if lost or backlog <= self.cheap_backlog:
            return self.first_look_s
        return min(self.longest_look_s, 2 * max(self.first_look_s, every_s or self.first_look_s))
