"""vcrawl: a distributed vertical web crawler built as a Celery task graph.

This package holds the shared vocabulary (payloads, errors, settings, Redis keys)
and the command line; the stages live in ``tasks``, ``fetchers``, ``analyzers``,
``storage`` and ``frontier``.
"""

from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["__version__"]
