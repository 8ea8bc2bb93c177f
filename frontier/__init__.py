"""Deciding when (and later which) URLs may be fetched."""

from __future__ import annotations

from frontier.politeness import HostGate

__all__ = ["HostGate"]
