"""The ``dynamic`` fetcher: Selenium driving headless Chromium, for pages that load content with JS.

One browser per worker process, reused across tasks, one page at a time. A browser is
started with the proxy of the request that started it and keeps it for its lifetime (a
proxy pool rotates as browsers are replaced). Chromium reaches the network only through the
browser's egress guard (``fetchers.egress``), which applies the network policy to every
request the page makes. The browser is
replaced after ``max_pages`` pages, after a crash, or when it stops answering, and quit when
the process shuts down; its processes run in their own process group, so a browser that
will not quit is killed as a whole. The page's HTTP status and the status of the requests a
lazy-load function triggers come from Chromium's network log (chromedriver's performance log).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import urllib3.exceptions
from selenium import webdriver
from selenium.common.exceptions import JavascriptException, TimeoutException, WebDriverException
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service

from fetchers.base import FetchRequest, FetchResult
from fetchers.browser_actions import ActionRunner
from fetchers.egress import EgressGuard
from fetchers.netguard import PUBLIC_ONLY, NetworkPolicy, Resolver
from vcrawl.errors import DownloadFailed, FetchFailed

__all__ = ["BrowserConfig", "BrowserFetcher", "chromium_processes"]

logger = logging.getLogger(__name__)

# Root in a container, no GPU, no background traffic: the flags Debian's Chromium needs here.
_CHROMIUM_FLAGS = (
    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
    "--disable-background-networking", "--disable-extensions", "--disable-sync", "--disable-default-apps",
    "--no-first-run", "--disable-component-update", "--mute-audio", "--window-size=1280,2000",
    # One page at a time: no back-forward cache, no process per site, few renderers kept around.
    "--disable-features=BackForwardCache,site-per-process,IsolateOrigins,NetworkTimeServiceQuerying",
    "--disable-site-isolation-trials",
    "--renderer-process-limit=1", "--in-process-gpu",
    # Everything goes through the egress guard: loopback too, no QUIC, no WebRTC UDP around it.
    "--proxy-bypass-list=<-loopback>", "--disable-quic", "--force-webrtc-ip-handling-policy=disable_non_proxied_udp",
)  # fmt: skip
_LAZY_TYPES = frozenset({"XHR", "Fetch"})
_POLL_S = 0.02


@dataclass(frozen=True)
class BrowserConfig:
    """Where the browser is and how long it may take."""

    chromium_path: str = "/usr/bin/chromium"
    chromedriver_path: str = "/usr/bin/chromedriver"
    page_timeout_s: float = 20.0
    lazy_timeout_s: float = 10.0
    idle_s: float = 0.3
    max_pages: int = 50  # memory grows ~3-4 MB a page; a restart costs ~0.5 s
    actions_timeout_s: float = 30.0  # a rule's browser actions, all of them (fetchers.browser_actions)
    max_body_bytes: int = 10 * 1024 * 1024


class BrowserFetcher:
    """Loads a page in headless Chromium, runs its lazy-load function, returns the rendered DOM.

    Every request of the page obeys ``policy`` (default: public addresses only) narrowed by the
    request's ``networks``; names resolve with ``resolver``.
    """

    def __init__(
        self,
        config: BrowserConfig,
        clock: Callable[[], float] = time.monotonic,
        policy: NetworkPolicy = PUBLIC_ONLY,
        resolver: Resolver = socket.getaddrinfo,
    ) -> None:
        self._config = config
        self._clock = clock
        self._policy = policy
        self._resolver = resolver
        self._guard: EgressGuard | None = None
        self._lock = threading.Lock()  # one browser, one page at a time
        self._driver: webdriver.Chrome | None = None
        self._proxy: str | None = None
        self._pages = 0
        self.starts = 0  # browsers started by this fetcher (for tests and stats)

    def fetch(self, request: FetchRequest) -> FetchResult:
        """Render ``request.url``; with ``js_function``, call it and wait for what it loads.

        Raises:
            FetchFailed: timeouts, a crashed browser (replaced for the retry), a lazy request
                that failed on the network.
            DownloadFailed: ``js_function_missing``, ``lazy_http_<status>``, ``too_large``,
                ``blocked_address`` (the page, or a redirect of it, is at a refused address).
        """
        with self._lock:
            started = self._clock()
            try:
                result = self._render(request, started)
            except (FetchFailed, DownloadFailed):
                raise
            except TimeoutException as exc:
                self._recover_after_timeout()
                raise FetchFailed(request.url, "timeout") from exc
            except (WebDriverException, OSError, urllib3.exceptions.HTTPError) as exc:
                logger.warning("browser failed on %s, replacing it: %s", request.url, str(exc).splitlines()[0])
                self.close()
                raise FetchFailed(request.url, "browser_crashed") from exc
            self._pages += 1
            if self._pages >= self._config.max_pages:
                logger.debug("browser served %d pages: replacing it", self._pages)
                self.close()
            return result

    def start(self) -> float:
        """Start the browser now (it starts on first use anyway); return the seconds it took."""
        with self._lock:
            started = self._clock()
            self._ensure()
            return self._clock() - started

    def memory_bytes(self, field: str = "Pss") -> int:
        """Memory of the browser: chromedriver, Chromium and its renderers (0 if none).

        ``Pss`` (default) shares each shared page among the processes using it, so the sum
        is what the browser really costs; ``Rss`` counts shared libraries once per process.
        """
        group = _process_group(self._driver) if self._driver is not None else None
        if group is None:
            return 0
        total = 0
        for pid in chromium_processes():
            try:
                if os.getpgid(pid) != group:
                    continue
                with open(f"/proc/{pid}/smaps_rollup") as rollup:
                    for line in rollup:
                        if line.startswith(f"{field}:"):
                            total += int(line.split()[1]) * 1024
            except (OSError, ValueError):
                continue
        return total

    def close(self, force: bool = False) -> None:
        """Quit the browser and kill its process group; ``force`` kills first (a browser that hangs)."""
        driver, self._driver = self._driver, None
        guard, self._guard = self._guard, None
        self._pages = 0
        if guard is not None:  # Chromium loses its only way out at once
            guard.close()
        if driver is None:
            return
        group = _process_group(driver)
        if force:
            _kill_group(group)
        try:
            driver.quit()
        except Exception as exc:  # a dead browser cannot quit politely; the group kill ends it
            logger.debug("browser quit failed: %r", exc)
        _kill_group(group)

    def _ensure(self, proxy: str | None = None) -> webdriver.Chrome:
        if self._driver is not None:
            return self._driver
        self._proxy = proxy
        os.environ.setdefault("SE_OFFLINE", "true")  # never let Selenium Manager download anything
        options = Options()
        options.binary_location = self._config.chromium_path
        for flag in _CHROMIUM_FLAGS:
            options.add_argument(flag)
        # Chromium takes its proxy at start: a browser keeps the guard, and the guard the proxy it was given.
        if self._guard is not None:  # left by a start that failed before the browser ran
            self._guard.close()
        guard = EgressGuard(self._policy, proxy, self._resolver, connect_timeout_s=self._config.page_timeout_s)
        self._guard = guard.start()
        options.add_argument(f"--proxy-server={guard.url}")
        options.set_capability("goog:loggingPrefs", {"performance": "ALL"})
        # chromedriver must not wait for page loads itself: this fetcher waits, with its own limits.
        options.page_load_strategy = "none"
        # Its own process group: the browser's processes can be killed together.
        service = Service(self._config.chromedriver_path, popen_kw={"start_new_session": True})
        started = self._clock()
        driver = webdriver.Chrome(service=service, options=options)
        self._driver = driver  # from here on, close() can end it whatever fails next
        driver.set_page_load_timeout(self._config.page_timeout_s)
        driver.set_script_timeout(self._config.lazy_timeout_s)
        driver.execute_cdp_cmd("Network.enable", {})
        self.starts += 1
        logger.debug("browser started in %.2fs", self._clock() - started)
        self._driver = driver
        return driver

    def _render(self, request: FetchRequest, started: float) -> FetchResult:
        driver = self._ensure(request.proxy)
        assert self._guard is not None, "a running browser has its egress guard"
        self._guard.begin(self._policy.narrowed(request.networks))
        driver.get_log("performance")  # drop what earlier pages left
        driver.execute_cdp_cmd("Network.setExtraHTTPHeaders", {"headers": {}})
        driver.execute_cdp_cmd("Network.setUserAgentOverride", {"userAgent": request.user_agent})
        navigate: dict[str, Any] = {"url": request.url}
        if request.referer is not None:
            # Extra headers would block the navigation; Page.navigate takes the referrer itself.
            navigate.update(referrer=request.referer, referrerPolicy="unsafeUrl")
        self._navigate(driver, navigate, request.url)
        self._wait(lambda: driver.execute_script("return document.readyState") == "complete",
                   self._config.page_timeout_s, request.url, "timeout")  # fmt: skip
        events = _network_events(driver)
        if not request.follow_redirects and (hop := _first_redirect(events)) is not None:
            # Chromium followed it already, but a job admits the target as a link of its own (as
            # static): the redirect is the result and what the target sent is dropped.
            return FetchResult(url=request.url, final_url=request.url, status=hop[0], headers={"location": hop[1]},
                               elapsed_s=self._clock() - started)  # fmt: skip
        status = _document_status(events)
        if status is None:  # no HTTP response for the page at all: nothing real to store
            if self._guard is not None and self._guard.was_refused(_document_url(events) or request.url):
                raise DownloadFailed(request.url, "blocked_address")
            raise FetchFailed(request.url, "no_response")
        if status != 200:
            return FetchResult(url=request.url, final_url=driver.current_url, status=status,
                               elapsed_s=self._clock() - started)  # fmt: skip
        if request.js_function is not None:
            self._run_lazy_load(driver, request)
        elif request.wait_for is not None:
            self._wait(lambda: bool(driver.execute_script("return !!document.querySelector(arguments[0])",
                                                          request.wait_for)),
                       self._config.lazy_timeout_s, request.url, "wait_for_timeout")  # fmt: skip
        else:
            self._wait_idle(driver, [], request.url)
        if request.actions:
            config = self._config
            ActionRunner(driver, request.url, lambda: _network_events(driver), config.actions_timeout_s,
                         config.idle_s, config.lazy_timeout_s, self._clock).run(request.actions)  # fmt: skip
            if urlsplit(driver.current_url).hostname != urlsplit(request.url).hostname:
                # A click or submit led off the page's host: what is there is not this URL's to store.
                raise DownloadFailed(request.url, "action_left_host")
        html = driver.execute_script("return document.documentElement.outerHTML")
        body = html.encode("utf-8")
        if len(body) > self._config.max_body_bytes:
            raise DownloadFailed(request.url, "too_large", 200)
        return FetchResult(
            url=request.url,
            final_url=driver.current_url,
            status=200,
            headers={"content-type": "text/html; charset=utf-8"},
            body=body,
            elapsed_s=self._clock() - started,
            reason="OK",
            request_headers={
                "User-Agent": request.user_agent,
                **({"Referer": request.referer} if request.referer else {}),
            },
        )

    def _navigate(self, driver: webdriver.Chrome, params: dict[str, Any], url: str) -> None:
        """Start the navigation; a server that never answers must not hold the worker.

        ``Page.navigate`` returns when the response headers arrive, and chromedriver answers
        nothing else meanwhile, so it runs in a helper thread; past the page timeout the
        browser is replaced (killing it ends the helper's call too).
        """
        failure: list[BaseException] = []
        answer: list[dict[str, Any]] = []

        def navigate() -> None:
            try:
                answer.append(driver.execute_cdp_cmd("Page.navigate", params))
            except BaseException as exc:  # handed to the caller below
                failure.append(exc)

        helper = threading.Thread(target=navigate, name="vcrawl-navigate", daemon=True)
        helper.start()
        helper.join(self._config.page_timeout_s)
        if helper.is_alive():
            logger.warning("no response from %s within %ss; replacing the browser", url, self._config.page_timeout_s)
            self.close(force=True)
            helper.join(5)
            raise FetchFailed(url, "timeout")
        if failure:
            raise failure[0]
        if answer and answer[0].get("errorText"):
            # The guard refused the page or the redirect it ended at: nothing reached that address.
            target = _document_url(_network_events(driver)) or url
            if self._guard is not None and self._guard.was_refused(target):
                raise DownloadFailed(url, "blocked_address")
            # Connection refused, no such host, TLS failure...: Chromium would show its own error page.
            raise FetchFailed(url, "navigation_failed")

    def _run_lazy_load(self, driver: webdriver.Chrome, request: FetchRequest) -> None:
        """Call the page's function and wait until the requests it started have finished."""
        function = request.js_function
        assert function is not None
        kind = driver.execute_script(f"try {{ return typeof {function}; }} catch (e) {{ return 'undefined'; }}")
        if kind != "function":
            raise DownloadFailed(request.url, "js_function_missing")
        if request.referer is not None:  # after navigation, extra headers reach the page's own requests
            driver.execute_cdp_cmd("Network.setExtraHTTPHeaders", {"headers": {"Referer": request.referer}})
        _network_events(driver)  # what came before the call is not its doing
        script_error: JavascriptException | None = None
        try:
            # WebDriver awaits a returned Promise, up to the script timeout.
            driver.execute_script(f"return {function}();")
        except JavascriptException as exc:  # often the lazy request failed: its status says more
            script_error = exc
        triggered: dict[str, dict[str, Any]] = {}
        self._wait_idle(driver, [triggered], request.url, require_request=script_error is None)
        for info in triggered.values():
            status = info.get("status")
            if status is not None and status != 200:
                raise DownloadFailed(request.url, f"lazy_http_{status}", status)
            if info.get("failed"):
                raise FetchFailed(request.url, "lazy_request_failed")
        if script_error is not None:
            raise DownloadFailed(request.url, "js_function_error") from script_error

    def _wait_idle(
        self,
        driver: webdriver.Chrome,
        sinks: list[dict[str, dict[str, Any]]],
        url: str,
        require_request: bool = False,
    ) -> None:
        """Wait until no request is in flight for ``idle_s`` (after at least one, if required)."""
        requests: dict[str, dict[str, Any]] = sinks[0] if sinks else {}
        deadline = self._clock() + self._config.lazy_timeout_s
        quiet_since = self._clock()
        while True:
            for event in _network_events(driver):
                _track(requests, event)
            in_flight = [r for r in requests.values() if not r.get("done")]
            now = self._clock()
            if require_request and requests and not in_flight:
                return  # what the function asked for has arrived
            if in_flight or (require_request and not requests):
                quiet_since = now
            elif now - quiet_since >= self._config.idle_s:
                return
            if now > deadline:
                raise FetchFailed(url, "lazy_timeout")
            time.sleep(_POLL_S)

    def _wait(self, ready: Callable[[], bool], timeout_s: float, url: str, reason: str) -> None:
        deadline = self._clock() + timeout_s
        while not ready():
            if self._clock() > deadline:
                self._recover_after_timeout()
                raise FetchFailed(url, reason)
            time.sleep(_POLL_S)

    def _recover_after_timeout(self) -> None:
        """Stop a page that hangs; replace the browser if it no longer answers."""
        driver = self._driver
        if driver is None:
            return
        try:
            driver.execute_cdp_cmd("Page.stopLoading", {})
            driver.execute_cdp_cmd("Page.navigate", {"url": "about:blank"})
            driver.execute_script("return 1")
        except Exception as exc:  # it does not answer any more: start afresh next time
            logger.warning("browser stopped answering after a timeout; replacing it: %r", exc)
            self.close()


def _network_events(driver: webdriver.Chrome) -> list[dict[str, Any]]:
    events = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"].startswith("Network."):
            events.append(message)
    return events


def _track(requests: dict[str, dict[str, Any]], event: dict[str, Any]) -> None:
    """Follow the page's XHR/fetch requests through Chromium's network events."""
    params = event["params"]
    request_id = params.get("requestId")
    method = event["method"]
    if method == "Network.requestWillBeSent" and params.get("type") in _LAZY_TYPES:
        requests[request_id] = {"url": params["request"]["url"]}
    elif request_id in requests:
        if method == "Network.responseReceived":
            requests[request_id]["status"] = params["response"]["status"]
        elif method == "Network.loadingFinished":
            requests[request_id]["done"] = True
        elif method == "Network.loadingFailed":
            requests[request_id].update(done=True, failed=True)


def _document_url(events: list[dict[str, Any]]) -> str | None:
    """The URL of the page's last document request (a redirect's target comes after its source)."""
    url = None
    for event in events:
        if event["method"] == "Network.requestWillBeSent" and event["params"].get("type") == "Document":
            url = event["params"]["request"]["url"]
    return url


def _first_redirect(events: list[dict[str, Any]]) -> tuple[int, str] | None:
    """The page's first HTTP redirect: (status, target URL), or None.

    Chromium sends a redirect's target under the requestId of its source, with the
    ``redirectResponse``; the page's own navigation is the first document request.
    """
    page_request = None
    for event in events:
        if event["method"] != "Network.requestWillBeSent" or event["params"].get("type") != "Document":
            continue
        params = event["params"]
        if page_request is None:
            page_request = params["requestId"]
        elif params["requestId"] == page_request and "redirectResponse" in params:
            return int(params["redirectResponse"]["status"]), params["request"]["url"]
    return None


def _document_status(events: list[dict[str, Any]]) -> int | None:
    """The HTTP status of the page itself (the last document response: redirects come first)."""
    status = None
    for event in events:
        if event["method"] == "Network.responseReceived" and event["params"].get("type") == "Document":
            status = int(event["params"]["response"]["status"])
    return status


def _process_group(driver: webdriver.Chrome) -> int | None:
    process = getattr(driver.service, "process", None)
    if process is None:
        return None
    try:
        return os.getpgid(process.pid)
    except ProcessLookupError:
        return None


def _kill_group(group: int | None) -> None:
    if group is None:
        return
    try:
        os.killpg(group, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def chromium_processes() -> list[int]:
    """PIDs of the chromium and chromedriver processes on this machine (for leak checks)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/comm") as comm:
                name = comm.read().strip()
            with open(f"/proc/{entry}/stat") as stat:
                state = stat.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and (name.startswith("chrom") or name == "chromedriver"):
            pids.append(int(entry))
    return pids
