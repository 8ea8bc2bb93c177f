"""Where crawled pages and analysis results are kept: a router over backends keyed by URL scheme."""

from __future__ import annotations

from storage.base import Backend, BackendFactory
from storage.local import LocalBackend
from storage.naming import page_location, result_location
from storage.registry import BACKENDS, Storage

__all__ = [
    "BACKENDS",
    "Backend",
    "BackendFactory",
    "LocalBackend",
    "Storage",
    "page_location",
    "result_location",
]
