"""The top floor: the ``vcrawl`` command line, its embedded runner, the demo, Flower and a local Redis.

It talks to the cluster only through the ``tasks`` façade.
"""

from __future__ import annotations

from cli.main import main

__all__ = ["main"]
