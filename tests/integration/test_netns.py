"""The partition lab (tests/netns.py): a process in the namespace reaches the root end of the link
until it is cut, not while it is cut, and again once healed; nothing is left behind."""

from __future__ import annotations

import subprocess
import sys
import urllib.request
from collections.abc import Iterator

import pytest

from tests.netns import Lab, lab_or_skip
from tests.site import TestSite

# One GET from inside the namespace: prints the status, or the error's class name.
GET = """
import sys, urllib.request
try:
    print(urllib.request.urlopen(sys.argv[1], timeout=float(sys.argv[2])).status)
except OSError as e:
    print(type(getattr(e, "reason", e)).__name__)
"""


@pytest.fixture
def lab() -> Iterator[Lab]:
    with lab_or_skip() as made:
        yield made


def get_from_lab(lab: Lab, url: str, timeout_s: float = 1.0) -> str:
    done = subprocess.run(lab.command([sys.executable, "-c", GET, url, str(timeout_s)]), capture_output=True,
                          text=True, timeout=30)  # fmt: skip
    return done.stdout.strip() or done.stderr.strip()


def namespaces() -> str:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=10).stdout


def test_the_link_passes_until_cut_drops_silently_and_heals(lab: Lab) -> None:
    with TestSite(lab.root_address) as site:
        url = site.add_page("/", "<p>hi</p>")
        assert get_from_lab(lab, url) == "200"
        assert [seen.client_host for seen in site.seen] == [lab.lab_address]
        lab.cut()
        assert get_from_lab(lab, url) == "TimeoutError"  # dropped without a word, not refused
        assert len(site.seen) == 1
        with TestSite(lab.root_address) as other:  # the root namespace still reaches its end of the link
            assert urllib.request.urlopen(other.add_page("/", "x"), timeout=2).status == 200
        lab.heal()
        assert get_from_lab(lab, url, timeout_s=5.0) == "200"


def test_closing_a_lab_leaves_no_namespace_and_no_link() -> None:
    with lab_or_skip() as lab:
        assert lab.name in namespaces()
    links = subprocess.run(["ip", "-br", "link"], capture_output=True, text=True, timeout=10).stdout
    assert lab.name not in namespaces() and lab.root_dev not in links
