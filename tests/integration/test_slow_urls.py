"""A slow URL does not hold its host: a tarpit is given up and retried behind the host's other pages.

A tarpit answers at once, then sends a byte every few seconds, so no read ever times out. Each test
runs a job on the session's worker against a real local site with a tarpit and ordinary pages on
one host, one request at a time, and reads the order of the requests from the server's log.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from engine.fetch_step.host_trouble import SLOW_HOST_BUDGET
from tests.integration.conftest import AlertSinks, run_job
from tests.integration.test_job_alerts import alerts_about
from tests.site import Response, TestSite, header_trickle
from vcrawl.jobs import PolitenessSpec
from vcrawl.settings import Settings

pytestmark = pytest.mark.usefixtures("worker")

ORDINARY = [f"/ok/{n}.html" for n in range(20)]


def page(*links: str) -> str:
    return "<html><body>" + "".join(f'<a href="{href}">{href}</a>' for href in links) + "</body></html>"


def tarpit(byte_every_s: float) -> Response:
    """A 200 that promises 100 kB and sends one byte every ``byte_every_s``, for minutes."""
    return Response(chunks=[b" "] * 400, chunk_pause_s=byte_every_s, headers={"Content-Length": "100000"})


def serve_tarpit_site(site: TestSite, byte_every_s: float) -> None:
    """The index links the tarpit first, so it is fetched before the ordinary pages."""
    site.add_page("/", page("/tarpit.html", *ORDINARY))
    site.add_response("/tarpit.html", tarpit(byte_every_s))
    for path in ORDINARY:
        site.add_page(path, page())


def test_a_tarpit_is_given_up_and_retried_behind_its_hosts_other_pages(site: TestSite) -> None:
    serve_tarpit_site(site, byte_every_s=0.4)
    limits = {"min_rate_bytes_s": 1024, "slow_window_s": 1.0, "retries": 1}

    status = run_job({"seeds": [site.url("/")], "politeness": {"min_interval_s": 0.02, "jitter": 0}, "limits": limits})

    assert status["state"] == "completed", status
    assert status["pages_stored"] == 21 and status["failed"] == {"too_slow": 1}, status
    tries = site.requests_to("/tarpit.html")
    ordinary_at = sorted(seen.at for path in ORDINARY for seen in site.requests_to(path))
    assert len(tries) == 2 and len(ordinary_at) == 20
    # The first try went first (linked first) and was given up after about a window; its retry
    # waited behind all 20 ordinary pages, which did not wait for it.
    assert tries[0].at < ordinary_at[0] < tries[0].at + 3.0
    assert tries[1].at > ordinary_at[-1]


@pytest.mark.long  # make test-long: the shipped timeouts, tens of seconds
def test_a_tarpit_at_the_shipped_defaults(site: TestSite) -> None:
    """The twin at vcrawl's shipped limits and politeness: a byte every 3 s, 20 ordinary pages."""
    shipped, politeness = Settings(), PolitenessSpec()
    limits = {
        name: getattr(shipped, name)
        for name in ("connect_timeout_s", "read_timeout_s", "total_timeout_s", "min_rate_bytes_s", "slow_window_s")
    } | {"retries": shipped.fetch_retries}
    serve_tarpit_site(site, byte_every_s=3.0)

    status = run_job(
        {"seeds": [site.url("/")], "politeness": dataclasses.asdict(politeness), "limits": limits}, timeout_s=150
    )

    assert status["state"] == "completed", status
    assert status["failed"] == {"too_slow": 1} and status["pages_stored"] == 21, status
    tries = site.requests_to("/tarpit.html")
    ordinary_at = sorted(seen.at for path in ORDINARY for seen in site.requests_to(path))
    assert len(tries) == 1 + shipped.fetch_retries and len(ordinary_at) == 20
    # Order, not wall time (a bound of 15 s on the whole crawl left ~1.8 s to a loaded machine).
    # The first try is given up at the 6 s byte (under 1 KiB/s over the 5 s window), not held until
    # total_timeout_s (60 s): the host's next page follows (6.4 s after the try when unloaded).
    assert tries[0].at < ordinary_at[0] < tries[0].at + 12.0
    # Its retries wait behind all 20 ordinary pages, which do not wait for them: a host held behind
    # the tarpit's retries would fetch them only after the third try.
    assert ordinary_at[-1] < tries[1].at


@pytest.mark.long  # make test-long: the shipped timeouts, tens of seconds
def test_a_trickled_head_at_the_shipped_defaults_fails_at_once_and_the_job_ends(site: TestSite) -> None:
    """A URL answered with a status line, then a header line every 2 s, forever, among 20 ordinary
    pages, at vcrawl's shipped limits and politeness: it is given up a floor window (5 s) after its
    first byte, not retried (a tarpit trickles again), and the job ends by itself."""
    shipped, politeness = Settings(), PolitenessSpec()
    limits = {
        name: getattr(shipped, name)
        for name in ("connect_timeout_s", "read_timeout_s", "total_timeout_s", "min_rate_bytes_s", "slow_window_s")
    } | {"retries": shipped.fetch_retries}
    site.add_page("/", page("/tarpit.html", *ORDINARY))
    site.add_response("/tarpit.html", header_trickle(2.0))
    for path in ORDINARY:
        site.add_page(path, page())

    status = run_job(
        {"seeds": [site.url("/")], "politeness": dataclasses.asdict(politeness), "limits": limits}, timeout_s=90
    )

    assert status["state"] == "completed", status
    assert status["failed"] == {"slow_head": 1} and status["pages_stored"] == 21, status
    assert status["retries"] == 0, status
    (tried,) = site.requests_to("/tarpit.html")
    ordinary_at = sorted(seen.at for path in ORDINARY for seen in site.requests_to(path))
    assert len(ordinary_at) == 20
    # The host's next request follows the give-up (a window after the tarpit's first byte, plus the
    # pause), not total_timeout_s (60 s) later; a loaded machine gets some slack.
    assert tried.at + shipped.slow_window_s <= ordinary_at[0] < tried.at + 12.0


def test_a_host_that_keeps_timing_out_is_paused_and_reported(site: TestSite, alert_sinks: AlertSinks) -> None:
    pits = [f"/pit/{n}.html" for n in range(SLOW_HOST_BUDGET + 2)]
    site.add_page("/", page(*pits))
    for path in pits:
        site.add_response(path, tarpit(0.3))
    job: dict[str, Any] = {
        "seeds": [site.url("/")],
        "politeness": {"min_interval_s": 0.0},
        "limits": {"min_rate_bytes_s": 1024, "slow_window_s": 0.5, "retries": 0},
    }

    status = run_job(job, timeout_s=60)

    assert status["state"] == "completed" and status["failed"] == {"too_slow": len(pits)}, status
    host = site.base.split("//")[1]
    hooks, mails = alerts_about(alert_sinks, f"host {host} keeps timing out in job {status['job']}")
    assert len(hooks) == 1 and len(mails) == 1
    assert hooks[0]["details"]["slow"] >= SLOW_HOST_BUDGET


@pytest.mark.long  # make test-long: the shipped timeouts, tens of seconds
def test_a_host_that_keeps_timing_out_is_reported_at_the_shipped_rate_floor(
    site: TestSite, alert_sinks: AlertSinks
) -> None:
    """The twin of the test above at the shipped floor and window (1 KiB/s over 5 s), a byte every 3 s.

    Retries are off: they add attempts, not a different path to the budget (about 6 s per pit here).
    """
    shipped = Settings()
    pits = [f"/pit/{n}.html" for n in range(SLOW_HOST_BUDGET + 1)]
    site.add_page("/", page(*pits))
    for path in pits:
        site.add_response(path, tarpit(3.0))
    # The shipped timeouts too: the session's 3 s read timeout would race the 3 s drip.
    limits = {
        name: getattr(shipped, name)
        for name in ("connect_timeout_s", "read_timeout_s", "total_timeout_s", "min_rate_bytes_s", "slow_window_s")
    } | {"retries": 0}

    status = run_job({"seeds": [site.url("/")], "politeness": {"min_interval_s": 0.0}, "limits": limits}, timeout_s=120)

    assert status["state"] == "completed" and status["failed"] == {"too_slow": len(pits)}, status
    host = site.base.split("//")[1]
    hooks, mails = alerts_about(alert_sinks, f"host {host} keeps timing out in job {status['job']}")
    assert len(hooks) == 1 and len(mails) == 1
    assert hooks[0]["details"]["slow"] >= SLOW_HOST_BUDGET
