"""Runs a rule's browser actions (``vcrawl.browser_actions``) on a loaded page, as a user would.

After each action the page is given time to settle: until no request of its own (documents, XHR and
fetch, scripts, styles, images) has been in flight for ``idle_s`` and its document is complete. The
whole list runs within one budget: once it is spent, the remaining clicks and scrolls are skipped and
the page is read as it stands; a ``wait_for`` whose element never came fails the fetch
(``wait_for_timeout``), as a rule's own ``wait_for`` does. A navigation an action starts (a submit, a
link clicked) is followed, and a page it leads to that is not a 200 fails the fetch
(``action_http_<status>``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from selenium.common.exceptions import (
    ElementClickInterceptedException,
    ElementNotInteractableException,
    JavascriptException,
    NoSuchElementException,
    StaleElementReferenceException,
    WebDriverException,
)
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys

from fetchers.page_scripts import page_script
from vcrawl.browser_actions import BrowserAction
from vcrawl.errors import DownloadFailed, FetchFailed, UnknownComponent

__all__ = ["ActionRunner"]

logger = logging.getLogger(__name__)

# Requests a page finishes; event streams, sockets and media may never end and are not waited for.
_SETTLED_TYPES = frozenset({"Document", "XHR", "Fetch", "Script", "Stylesheet", "Image", "Font"})
_POLL_S = 0.02
_SHOWN = "var e = document.querySelector(arguments[0]); return !!e && e.getClientRects().length > 0;"
_SCROLL_END = "window.scrollTo(0, Math.max(document.body.scrollHeight, document.documentElement.scrollHeight));"


class ActionRunner:
    """One page's actions. ``events`` drains Chromium's network events (a list of CDP messages)."""

    def __init__(
        self,
        driver: Any,
        url: str,
        events: Callable[[], list[dict[str, Any]]],
        budget_s: float,
        idle_s: float,
        wait_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._driver, self._url, self._events = driver, url, events
        self._clock = clock
        self._deadline = clock() + budget_s
        self._idle_s, self._wait_s = idle_s, wait_s
        self.done = 0  # actions carried out (a click or scroll repeated counts once per repeat)
        self._main_frame = ""

    def run(self, actions: tuple[BrowserAction, ...]) -> None:
        """Carry out ``actions`` in order.

        Raises:
            DownloadFailed: ``action_target_missing`` (nothing to type into), ``action_http_<status>``,
                ``page_script_error``, ``unknown_page_script``.
            FetchFailed: ``wait_for_timeout``.
        """
        self._events()  # what the page did before the first action is not theirs
        self._main_frame = self._driver.execute_cdp_cmd("Page.getFrameTree", {})["frameTree"]["frame"]["id"]
        for action in actions:
            if self._spent() and action.verb != "wait_for":
                logger.info("%s: browser actions budget spent; reading the page as it stands", self._url)
                return
            getattr(self, f"_{action.verb}")(action)

    def _click(self, action: BrowserAction) -> None:
        for _ in range(action.repeat):
            if self._spent() or not self._driver.execute_script(_SHOWN, action.target):
                return  # gone (or never there): nothing more to reveal
            try:
                element = self._driver.find_element(By.CSS_SELECTOR, action.target)
                try:
                    element.click()
                except (ElementClickInterceptedException, ElementNotInteractableException):
                    # An overlay over it (a cookie banner): the page's own click handler still runs.
                    self._driver.execute_script("arguments[0].click();", element)
            except (NoSuchElementException, StaleElementReferenceException):
                return  # it went away between the check and the click
            self.done += 1
            self._settle()
        if action.until_gone and self._driver.execute_script(_SHOWN, action.target):
            logger.info("%s: %s still there after %d clicks", self._url, action.target, action.repeat)

    def _scroll(self, action: BrowserAction) -> None:
        script = _SCROLL_END if action.target == "end" else f"window.scrollBy(0, {int(action.target)});"
        for _ in range(action.repeat):
            if self._spent():
                return
            self._driver.execute_script(script)
            self.done += 1
            self._settle()

    def _type(self, action: BrowserAction) -> None:
        try:
            element = self._driver.find_element(By.CSS_SELECTOR, action.target)
            element.clear()
            element.send_keys(action.text)
            if action.submit:
                element.send_keys(Keys.ENTER)  # as a user submits: the form's own handlers run
        except (NoSuchElementException, StaleElementReferenceException, ElementNotInteractableException) as exc:
            raise DownloadFailed(self._url, "action_target_missing") from exc
        self.done += 1
        self._settle()

    def _wait_for(self, action: BrowserAction) -> None:
        deadline = self._clock() + self._wait_s
        while not self._present(action.target):
            if self._clock() > deadline:
                raise FetchFailed(self._url, "wait_for_timeout")
            time.sleep(_POLL_S)
        self.done += 1

    def _script(self, action: BrowserAction) -> None:
        try:
            source = page_script(action.target)
        except UnknownComponent as exc:  # validated at submit; this worker lacks the plug-in
            raise DownloadFailed(self._url, "unknown_page_script") from exc
        try:
            self._driver.execute_script(source)  # a returned Promise is awaited, up to the script timeout
        except JavascriptException as exc:
            raise DownloadFailed(self._url, "page_script_error") from exc
        self.done += 1
        self._settle()

    def _present(self, selector: str) -> bool:
        try:
            return bool(self._driver.execute_script("return !!document.querySelector(arguments[0]);", selector))
        except JavascriptException:  # a document being replaced: not there yet
            return False

    def _spent(self) -> bool:
        return self._clock() >= self._deadline

    def _settle(self) -> None:
        """Wait until the page is quiet for ``idle_s`` (or the budget is spent); a document it navigated to
        must have been a 200."""
        requests: dict[str, dict[str, Any]] = {}
        quiet_since = self._clock()
        while not self._spent():
            for event in self._events():
                _track(requests, event, self._main_frame)
            now = self._clock()
            if any(not r.get("done") for r in requests.values()) or not self._complete():
                quiet_since = now
            elif now - quiet_since >= self._idle_s:
                break
            time.sleep(_POLL_S)
        for info in requests.values():
            status = info.get("status")
            if info.get("document") and status is not None and status != 200:
                raise DownloadFailed(self._url, f"action_http_{status}", status)

    def _complete(self) -> bool:
        try:
            return self._driver.execute_script("return document.readyState") == "complete"
        except WebDriverException:  # mid-navigation: the old document is gone, the new one not there
            return False


def _track(requests: dict[str, dict[str, Any]], event: dict[str, Any], main_frame: str) -> None:
    params = event["params"]
    request_id = params.get("requestId")
    method = event["method"]
    if method == "Network.requestWillBeSent" and params.get("type") in _SETTLED_TYPES:
        # The page's own document (not an iframe's): the page the action led to.
        requests[request_id] = {"document": params.get("type") == "Document" and params.get("frameId") == main_frame}
    elif request_id in requests:
        if method == "Network.responseReceived":
            requests[request_id]["status"] = params["response"]["status"]
        elif method in ("Network.loadingFinished", "Network.loadingFailed"):
            requests[request_id]["done"] = True
