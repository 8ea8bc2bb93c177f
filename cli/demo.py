"""The bundled demo site, served on loopback for ``vcrawl demo``."""

from __future__ import annotations

import functools
import ipaddress
import logging
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

from vcrawl.jobs import JobSpec, new_job_id

__all__ = ["DemoSite", "demo_job"]

logger = logging.getLogger(__name__)

_PRODUCT_FIELDS = {
    "name": "h1.name",
    "sku": {"css": "div.product", "attr": "data-sku"},
    "price": "span.amount",
    "currency": "xpath://span[@class='currency']/text()",
    "stock": "p.stock",
    "tags": {"css": "ul.tags li", "all": True},
}


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("demo site: " + format, *args)


class DemoSite:
    """Serve the bundled pages at ``http://127.0.0.1:<free port>/`` in a thread."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self._root = Path(__file__).parent / "demo_site"
        handler = functools.partial(_QuietHandler, directory=str(self._root))
        self._server = ThreadingHTTPServer((host, port), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="demo-site", daemon=True)

    @property
    def url(self) -> str:
        """The site's base URL, ending with a slash."""
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/"

    @property
    def network(self) -> str:
        """The site's address as a one-address network (``127.0.0.1/32``): all the demo may fetch."""
        return _network_of(self.url)

    def __enter__(self) -> DemoSite:
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


def demo_job(base_url: str) -> JobSpec:
    """The demo crawl: start at the index, follow links, extract product fields."""
    return JobSpec.from_dict(
        {
            "id": new_job_id().replace("job-", "demo-"),
            "seeds": [base_url],
            "max_depth": 3,
            "politeness": {"min_interval_s": 0.05, "jitter": 0.5},  # our own loopback site
            "rules": [{"pattern": r"/products/", "analyzer": "fields", "fields": _PRODUCT_FIELDS}],
            "allowed_networks": [_network_of(base_url)],
        }
    )


def _network_of(url: str) -> str:
    """The one-address network of a URL's literal IP host.

    >>> _network_of("http://127.0.0.1:8000/")
    '127.0.0.1/32'
    """
    return str(ipaddress.ip_network(urlsplit(url).hostname or ""))
