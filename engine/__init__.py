"""The crawl pipeline as plain code: no Celery in here.

``tasks/`` (the Celery shell) decodes messages and calls these functions; the CLI and the API reach
them through the ``tasks`` facade. Below this floor: fetchers, analyzers, frontier, storage, vcrawl.
"""

from __future__ import annotations
