"""The fetch step's one request: sent with an identity (User-Agent, Referer, proxy) drawn from the pool,
by the page type's fetcher, its outcome counted for the proxy it went through."""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass, replace

from engine.answer_times import ANSWER_TIMES
from engine.api_pages import api_headers
from engine.fetch_step.context import FetchContext, FetchItem, PageTypeFetchers
from engine.node_meter import NodeMeter
from fetchers import BUILTIN_FETCHERS, Fetcher, FetchRequest, FetchResult, fetch_through, proxy_counter
from vcrawl.errors import DownloadFailed, FetchFailed, UnknownComponent

__all__ = ["metered", "page_request", "send"]

logger = logging.getLogger(__name__)


def page_request(ctx: FetchContext, item: FetchItem) -> FetchRequest:
    """The request for ``item``'s URL: a fresh identity, its rule's browser steps, its conditional headers."""
    services, policy, rule = ctx.services, ctx.policy, item.rule
    return FetchRequest(
        url=item.entry.url,
        user_agent=services.identities.user_agent(),
        referer=services.identities.referer(),
        proxy=_draw_proxy(ctx),
        js_function=rule.js_function,
        wait_for=rule.wait_for,
        actions=rule.actions or (),
        conditional=item.known.conditional_headers() if item.known is not None else {},
        networks=policy.networks or None,
        headers=api_headers(rule, services.api_auth) if rule.page_type == "api" else {},
        follow_redirects=policy.follow_redirects,
        # A sitemap cut short on its last attempt is read as far as it came (engine.sitemaps).
        keep_cut_body=bool(item.entry.sitemap) and item.entry.attempt >= policy.retry.retries,
    )


def send(ctx: FetchContext, page_type: str, request: FetchRequest, counts: Counter[str]) -> FetchResult:
    """Fetch with the page type's fetcher. Through a proxy, every page type's outcome is counted for
    the proxy and goes on the cluster's proxy bench, and a proxy's fault is raised as FetchFailed.

    Raises:
        FetchFailed: as the fetcher does, and a proxy's fault.
        DownloadFailed: as the fetcher does, and ``<page_type>_failed`` for a plug-in's bug.
    """
    services = ctx.services
    fetcher: Fetcher = services.fetcher  # api pages: plain HTTP, the static fetcher's guard and limits
    if page_type not in ("static", "api"):
        assert services.fetchers is not None, "a fetch context for other page types has a fetcher registry"
        fetcher = _RegistryFetcher(services.fetchers, page_type)
    started, result = time.monotonic(), None
    try:
        if request.proxy is None:
            answer_s = None
            try:
                result = fetcher.fetch(request)
                answer_s = result.answer_s  # the server's time alone, when the fetcher could tell it
                return result
            finally:  # a timeout too: the process's threads waited that long
                ANSWER_TIMES.add(time.monotonic() - started if answer_s is None else answer_s)
        try:
            result = fetch_through(fetcher, request, services.proxies)
        except (FetchFailed, DownloadFailed) as exc:
            counts[proxy_counter(request.proxy, exc.reason)] += 1
            raise
        counts[proxy_counter(request.proxy, None)] += 1
        return result
    finally:  # a request that failed took its time too
        metered(services.meter, request.url, result, time.monotonic() - started)


def metered(meter: NodeMeter | None, url: str, result: FetchResult | None, seconds: float) -> None:
    """Count one request on the process's wire meter (``engine.node_meter``), answered or not."""
    if meter is not None:
        meter.request(url, len(result.body) if result is not None else 0, seconds,
                      result.redirects if result is not None else 0)  # fmt: skip


def _draw_proxy(ctx: FetchContext) -> str | None:
    """A proxy for one request: through the proxy bench when there is one (with the harvested proxies,
    for a pool that takes them), else blindly from the pool."""
    identities, bench = ctx.services.identities, ctx.services.proxies
    if bench is None:
        return identities.proxy()
    return bench.draw(identities.proxies, harvested=identities.harvested)


@dataclass(frozen=True)
class _RegistryFetcher:
    """A page type's fetcher from the registry, held to the fetch step's rules.

    A plug-in's unexpected exception (from its factory or its fetch) fails that page, counted as
    ``<page_type>_failed``, instead of aborting the whole batch; a plug-in that followed a redirect
    although the request said not to has it handed back as one, so admission still sees the target.
    """

    registry: PageTypeFetchers
    page_type: str

    def fetch(self, request: FetchRequest) -> FetchResult:
        """Fetch ``request`` with the page type's fetcher.

        Raises:
            FetchFailed: as the fetcher does.
            DownloadFailed: as the fetcher does, and ``<page_type>_failed`` for a plug-in's bug.
        """
        if self.page_type in BUILTIN_FETCHERS:
            return self.registry.get(self.page_type).fetch(request)
        try:
            result = self.registry.get(self.page_type).fetch(request)
        except (FetchFailed, DownloadFailed, UnknownComponent):
            raise
        # Third-party code can raise anything; this is where it enters the fetch step.
        except Exception as exc:
            logger.warning("page type %s failed on %s: %r", self.page_type, request.url, exc)
            raise DownloadFailed(request.url, f"{self.page_type}_failed") from exc
        if request.follow_redirects or result.final_url == request.url:
            return result
        logger.warning("page type %s followed %s to %s: handed back as a redirect", self.page_type, request.url,
                       result.final_url)  # fmt: skip
        return replace(result, final_url=request.url, status=302, headers={"location": result.final_url}, body=b"")
