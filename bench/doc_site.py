"""Case (e) of bench/compare.py: a real documentation site, Debian's ``python3.11-doc``.

The HTML under /usr/share/doc/python3.11/html is served by Python's own ``http.server`` (the
handler and threading server of ``python3 -m http.server --bind 127.0.3.1 PORT --directory D``),
wrapped only to write one access-log line per request in the bench kit's format
(``end_epoch service_s server_ip status bytes request_uri``). Beside the log it writes a state
file and a manifest shaped like the kit's universe ones (seeds, hosts, port, no robots.txt, the
reachable pages), so the kit's own runners and scorer (``run_scrapy.sh --state``,
``measure.py --state``, ``universe.evaluate``) measure a crawl of it unchanged.

Ground truth: the HTML pages reachable from ``/index.html`` by ``<a href>`` links inside the site,
found by walking the files on disk (``reachable_pages``).

Serve by hand: ``python3 bench/doc_site.py serve --bind 127.0.3.1 --port 0 --log /tmp/doc.log``
(prints one JSON line with the port once it listens).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from html.parser import HTMLParser
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import IO, Any
from urllib.parse import unquote, urldefrag, urljoin, urlsplit

from crawl_universe import SHARED

DOC_ROOT = Path("/usr/share/doc/python3.11/html")
DOC_HOST = "127.0.3.1"  # the universe uses 127.0.1.x and 127.0.9.x
DOC_PACKAGE = "python3.11-doc"


class _Links(HTMLParser):
    """The ``href`` of every ``<a>`` in a page."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.hrefs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self.hrefs.extend(value for name, value in attrs if name == "href" and value is not None)


def page_file(root: Path, url: str) -> Path:
    """The file http.server answers ``url`` with (a directory's ``index.html``)."""
    path = unquote(urlsplit(url).path)
    return root / (path.lstrip("/") + ("index.html" if path.endswith("/") else ""))


def reachable_pages(root: Path, base: str, normalize: Callable[[str], str]) -> tuple[list[str], dict[str, int]]:
    """The canonical URLs of the HTML pages reachable from ``base/index.html`` by in-site ``<a href>``.

    Args:
        root: the served directory.
        base: ``http://host:port`` of the server.
        normalize: the kit's ``universe.normalize_url``, the scorer's canonical form.

    Returns the sorted URLs and counts: HTML files on disk, in-site links to pages in the reachable
    pages, linked pages missing on disk (Debian leaves out ``whatsnew/changelog.html``).
    """
    seed = normalize(f"{base}/index.html")
    seen, todo, missing = {seed}, [seed], set()
    links = 0
    while todo:
        url = todo.pop()
        parser = _Links()
        parser.feed(page_file(root, url).read_text(encoding="utf-8", errors="replace"))
        for href in parser.hrefs:
            target = normalize(urldefrag(urljoin(url, href.strip()))[0])
            if not target.startswith(f"{base}/"):
                continue  # another site, mailto:, javascript:
            file = page_file(root, target)
            if file.suffix != ".html":
                continue  # a stylesheet, an image, an archive: not a page
            links += 1
            if not file.is_file():
                missing.add(target)
            elif target not in seen:
                seen.add(target)
                todo.append(target)
    html_files = sum(1 for _ in root.rglob("*.html"))
    return sorted(seen), {"html_files": html_files, "links_in_site": links, "missing_pages": len(missing)}


def unavailable(root: Path = DOC_ROOT) -> str | None:
    """Why the site cannot be served (the package is not installed), or None."""
    return None if (root / "index.html").is_file() else f"no {root}/index.html: apt-get install -y {DOC_PACKAGE}"


def start_doc_site(work: Path, state: Path, root: Path = DOC_ROOT) -> subprocess.Popen[bytes]:
    """Serve ``root`` on a free port of DOC_HOST; write the kit-style manifest and state file.

    Raises:
        SystemExit: the server did not start.
    """
    sys.path.insert(0, str(SHARED))
    from universe import normalize_url  # the kit's canonical form, which its scorer applies to the log

    log = work / "doc-access.log"
    log.touch()
    command = ["python3", __file__, "serve", "--bind", DOC_HOST, "--port", "0", "--directory", str(root)]
    with open(work / "doc-serve.err", "wb") as err:
        server = subprocess.Popen([*command, "--log", str(log)], stdout=subprocess.PIPE, stderr=err)
    assert server.stdout is not None
    line = server.stdout.readline()  # the server's ready line, once it listens
    if not line:
        server.wait(5)
        raise SystemExit(f"doc site server exited: {(work / 'doc-serve.err').read_text()[-2000:]}")
    port = json.loads(line)["port"]
    base = f"http://{DOC_HOST}:{port}"
    pages, counts = reachable_pages(root, base, normalize_url)
    manifest = {
        "seeds": [f"{base}/index.html"], "hosts": [DOC_HOST], "port": port,
        "robots": {DOC_HOST: {"text": None, "crawl_delay": None}},  # http.server answers 404: all allowed
        "reachable_pages": pages, "js_only_pages": [], "counts": counts,
    }  # fmt: skip
    (work / "doc-manifest.json").write_text(json.dumps(manifest))
    state.write_text(json.dumps({
        "pid": server.pid, "engine": "http.server", "tag": DOC_PACKAGE, "latency_ms": 0.0, "jitter_ms": 0.0,
        "port": port, "manifest": str(work / "doc-manifest.json"), "log": str(log), "log_start_offset": 0,
    }))  # fmt: skip
    return server


def site_row(state: Path) -> dict[str, Any]:
    """The JSON line describing the site: HTML files on disk, pages reachable (the recall denominator)."""
    manifest = json.loads(Path(json.loads(state.read_text())["manifest"]).read_text())
    counts = manifest["counts"]
    reachable = len(manifest["reachable_pages"])
    note = (f"{DOC_PACKAGE} served by http.server: {counts['html_files']} HTML files, {reachable} reachable from "
            f"/index.html by <a href>, {counts['missing_pages']} linked page(s) missing")  # fmt: skip
    return {"case": "e", "tool": "site", "site": DOC_PACKAGE, "note": note, "root": str(DOC_ROOT),
            "reachable_pages": reachable, **counts}  # fmt: skip


class _LoggingHandler(SimpleHTTPRequestHandler):
    """http.server's file handler, logging ``end service ip status bytes uri`` instead of to stderr."""

    log_file: IO[str]
    log_lock = threading.Lock()

    def parse_request(self) -> bool:
        self._started = time.time()
        return super().parse_request()

    def send_response(self, code: int, message: str | None = None) -> None:
        self._status = code
        super().send_response(code, message)

    def send_header(self, keyword: str, value: str) -> None:
        if keyword.lower() == "content-length":
            self._bytes = int(value)
        super().send_header(keyword, value)

    def handle_one_request(self) -> None:
        self._status, self._bytes, self._started = 0, 0, time.time()
        super().handle_one_request()
        if self._status:
            end = time.time()
            line = f"{end:.3f} {end - self._started:.3f} {self.server.server_address[0]} {self._status} "
            with self.log_lock:
                self.log_file.write(f"{line}{self._bytes} {self.path}\n")

    def log_message(self, format: str, *args: Any) -> None:
        pass


class _Server(ThreadingHTTPServer):
    """``python3 -m http.server``'s server with a listen backlog of 128 instead of 5: with 16 and more
    connections opened at once (HTTP/1.0, one per request) the kernel dropped SYNs from a backlog of
    5 (TcpExtListenOverflows), and each drop costs the crawler a 1 s SYN retransmit."""

    request_queue_size = 128


def serve(bind: str, port: int, directory: str, log_path: str) -> None:
    """Serve ``directory`` like ``python3 -m http.server`` until SIGTERM, logging every request."""
    with open(log_path, "a", buffering=1) as log:  # line-buffered: the scorer reads it right after a run

        class Handler(_LoggingHandler):
            log_file = log

            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, directory=directory, **kwargs)

        with _Server((bind, port), Handler) as httpd:
            print(json.dumps({"ready": True, "port": httpd.server_address[1]}), flush=True)
            httpd.serve_forever()


def main() -> int:
    """``serve``: run the logging http.server."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("serve", help="serve a directory with http.server, logging in the kit's format")
    run.add_argument("--bind", default=DOC_HOST)
    run.add_argument("--port", type=int, default=0, help="0: a free port (printed)")
    run.add_argument("--directory", default=str(DOC_ROOT))
    run.add_argument("--log", required=True)
    args = parser.parse_args()
    serve(args.bind, args.port, args.directory, args.log)
    return 0


if __name__ == "__main__":
    sys.exit(main())
