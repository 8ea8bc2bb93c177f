"""vcrawl: a distributed vertical web crawler built as a Celery task graph.

This package holds the shared vocabulary (payloads, errors, settings, Redis keys and replies,
names, job specs and documents, policies, schedules, the Lua loader) and imports no other package
of the project; the stages live in ``fetchers``, ``analyzers``, ``storage`` and ``frontier``, the
pipeline in ``engine``, the cluster's keeping in ``cluster``, the Celery shell in ``tasks``, and
the command line and job API on the top floor, in ``cli`` and ``api`` (docs/architecture.md).
"""

from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["__version__"]
