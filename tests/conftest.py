"""Shared test set-up: the analyzer plugin site on sys.path (found through its entry points)."""

from __future__ import annotations

import sys
from pathlib import Path

PLUGIN_SITE = Path(__file__).parent / "plugin_site"
# Before anything looks up analyzers: entry points are read once per process.
sys.path.insert(0, str(PLUGIN_SITE))
