"""Shared test set-up: the analyzer plugin site on sys.path (found through its entry points), and
the loopback networks the test sites use, allowed for the whole session."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from fetchers.netguard import NetworkPolicy, parse_networks

PLUGIN_SITE = Path(__file__).parent / "plugin_site"
# Before anything looks up analyzers: entry points are read once per process.
sys.path.insert(0, str(PLUGIN_SITE))

# vcrawl refuses non-public addresses by default (SSRF guard); the test sites live on loopback only.
TEST_ALLOWED_NETWORKS = ("127.0.0.0/8", "::1/128")
LOOPBACK_POLICY = NetworkPolicy(allowed=parse_networks(TEST_ALLOWED_NETWORKS))
# Read by Settings.from_env() in this process and inherited by every subprocess (workers, the CLI).
os.environ["VCRAWL_ALLOWED_NETWORKS"] = ",".join(TEST_ALLOWED_NETWORKS)

# Fixtures every test directory may use: registered here, defined beside the harness they start.
from tests.postgres import postgres_server, records_database  # noqa: E402, F401
