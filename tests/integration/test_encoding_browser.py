"""Fields vcrawl extracts from pages in every encoding equal the text headless Chromium shows.

Each page is served by a local site, fetched by the static fetcher and read by the ``fields``
analyzer, and loaded in real Chromium (scripts off: the comparison is of decoding, and the
html5lib pages call alert()); the same elements' texts are compared.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service

from analyzers import Page
from analyzers import fields as fields_analyzer
from fetchers import FetchRequest, StaticFetcher, make_session
from fetchers.base import FetchLimits
from tests.conftest import LOOPBACK_POLICY
from tests.site import TestSite
from tests.unit.test_encoding import read_dat
from vcrawl.payloads import FieldRule

pytestmark = pytest.mark.browser

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
FLAGS = (
    "--headless=new --no-sandbox --disable-gpu --disable-dev-shm-usage --disable-background-networking "
    "--disable-extensions --disable-sync --disable-default-apps --no-first-run --disable-component-update"
).split()
RULES = {
    "title": FieldRule(css="title"),
    "paragraphs": FieldRule(css="p", all=True),
    "description": FieldRule(css='meta[name="description"]', attr="content"),
    "scripts": FieldRule(css="script", all=True),
}
# The same elements in Chromium's DOM; whitespace is normalized in Python, as the analyzer does.
BROWSER_FIELDS = """
const description = document.querySelector('meta[name="description"]');
const title = document.querySelector("title");
return {
  encoding: document.characterSet,
  title: title ? title.textContent : null,
  paragraphs: Array.from(document.querySelectorAll("p"), (p) => p.textContent),
  description: description ? description.getAttribute("content") : null,
  scripts: Array.from(document.scripts, (s) => s.text),
};
"""
HTML5LIB_FILES = ("tests1.dat", "tests2.dat", "test-yahoo-jp.dat")
# html5lib cases where Chromium's encoding departs from the standard's prescan (which html5lib and
# vcrawl follow): Chromium reads no <meta> inside <script> or <style> text. Their bytes are ASCII,
# so the text is the same; only the encodings are not compared.
CHROMIUM_SKIPS_RAW_TEXT = {"tests1.dat:54", "tests1.dat:55", "tests1.dat:56"}

# 0xA1C1 is U+FF5E in the standard (U+301C in Python's euc_jp), 0xADA1 a NEC character euc_jp lacks.
JAPANESE = (
    "<title>日本語</title><p>営業時間 10時".encode("euc-jp") + b"\xa1\xc1" + "18時 ".encode("euc-jp") + b"\xad\xa1</p>"
)
# The issue's pages and the standard's rules around them: (path, Content-Type, body).
ISSUE_PAGES = [
    ("/undeclared-1252", "text/html", "<title>Größe</title><p>Größe: 42 \u2013 „groß“ ‰ Œuvre</p>".encode("cp1252")),
    (
        "/meta-1251",
        "text/html",
        '<meta charset="windows-1251"><title>Привет</title><p>Привет, мир</p>'.encode("cp1251"),
    ),
    ("/meta-x-cp1251", "text/html", "<meta charset=x-cp1251><p>Съешь же ещё этих булок</p>".encode("cp1251")),
    ("/meta-koi", "text/html", "<meta charset='koi'><p>Привет из KOI8-R</p>".encode("koi8-r")),
    (
        "/meta-x-euc-jp",
        "text/html",
        b'<meta http-equiv="Content-Type" content="text/html; charset=x-euc-jp">' + JAPANESE,
    ),
    ("/header-over-meta", "text/html; charset=windows-1251", "<meta charset=koi8-r><p>Привет</p>".encode("cp1251")),
    ("/bom-over-header", "text/html; charset=windows-1251", "\ufeff<meta charset=koi8-r><p>Grüße</p>".encode()),
    ("/header-x-user-defined", "text/html; charset=x-user-defined", b"<p>caf\xe9 \x80\xff</p>"),
    ("/meta-x-user-defined", "text/html", b"<meta charset=x-user-defined><p>caf\xe9 \x80\xff</p>"),
    ("/header-replacement", "text/html; charset=iso-2022-kr", b"<p>hidden</p>"),
    ("/late-meta", "text/html", b"<!--" + b"x" * 4096 + b"-->\n<meta charset=windows-1251><p>\xcf\xf0\xe8\xe2</p>"),
    ("/bogus-then-1251", "text/html", b'<meta charset="bogus"><meta charset="windows-1251"><p>\xcf\xf0\xe8</p>'),
    ("/content-without-pragma", "text/html", b'<meta content="text/html; charset=windows-1251"><p>Gr\xf6\xdfe</p>'),
    ("/shift-jis", "text/html; charset=Shift_JIS", "<p>①日本語\uff5eｶﾀｶﾅ</p>".encode("cp932")),
    ("/1252-c1", "text/html; charset=windows-1252", b"<p>\x80\x81\x8d\x9d\x9f</p>"),
    ("/gbk", "text/html; charset=gb2312", b"<p>\x80\xb0\xa1</p>"),
    ("/koi8-u", "text/html; charset=koi8-u", b"<p>\xae\xbe\xa4</p>"),
]
# Undeclared pages where vcrawl departs from Chromium on purpose (docs/task-graph.md, "How pages are
# decoded"): Chromium never guesses UTF-8 for a web page (so shows mojibake), and guesses legacy
# encodings from letter frequencies, which vcrawl does not (windows-1252).
DIVERGENT_PAGES = [
    ("/undeclared-utf-8", "<title>Größe</title><p>Größe: 42 \u2013 „groß“</p>".encode()),
    ("/undeclared-1251", "<p>Привет, как дела? Это страница на русском языке без объявления.</p>".encode("cp1251")),
]


@pytest.fixture(scope="module")
def encoding_site() -> Iterator[TestSite]:
    with TestSite() as site:
        for name in HTML5LIB_FILES:
            for index, (data, _) in enumerate(read_dat(name)):
                site.add_page(f"/html5lib/{name}/{index}", data, Content_Type="text/html")
        for path, content_type, body in ISSUE_PAGES:
            site.add_page(path, body, Content_Type=content_type)
        for path, body in DIVERGENT_PAGES:
            site.add_page(path, body, Content_Type="text/html")
        yield site


@pytest.fixture(scope="module")
def chromium() -> Iterator[webdriver.Chrome]:
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not os.access(p, os.X_OK)]
    if missing:
        if os.environ.get("CI") == "true":
            pytest.fail(f"headless Chromium is required in CI; missing: {missing}")
        pytest.skip(f"no browser here ({missing}); `apt-get install chromium chromium-driver`")
    options = Options()
    options.binary_location = CHROMIUM
    for flag in FLAGS:
        options.add_argument(flag)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SE_OFFLINE", "true")  # Selenium Manager must never download a driver
        driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        driver.set_page_load_timeout(10)
        driver.execute_cdp_cmd("Emulation.setScriptExecutionDisabled", {"value": True})
        yield driver
    finally:
        driver.quit()


def in_chromium(driver: webdriver.Chrome, url: str) -> dict[str, Any]:
    driver.get(url)
    found = driver.execute_script(BROWSER_FIELDS)
    normalize = lambda text: " ".join(text.split())  # noqa: E731 -- the analyzer's own normalization
    return {
        "encoding": found["encoding"],
        "title": None if found["title"] is None else normalize(found["title"]),
        "paragraphs": [normalize(text) for text in found["paragraphs"]],
        "description": None if found["description"] is None else found["description"].strip(),
        "scripts": [normalize(text) for text in found["scripts"]],
    }


def in_vcrawl(url: str) -> dict[str, Any]:
    fetcher = StaticFetcher(make_session(), FetchLimits(), policy=LOOPBACK_POLICY)
    result = fetcher.fetch(FetchRequest(url=url, user_agent="vcrawl-test/1"))
    page = Page(result.final_url, result.body, result.content_type)
    return {"encoding": page.encoding, **fields_analyzer.analyze(page, RULES)["fields"]}


def html5lib_ids() -> list[str]:
    return [f"{name}:{index}" for name in HTML5LIB_FILES for index in range(len(read_dat(name)))]


@pytest.mark.parametrize("case", html5lib_ids())
def test_html5lib_pages_read_as_in_chromium(encoding_site: TestSite, chromium: webdriver.Chrome, case: str) -> None:
    url = encoding_site.url("/html5lib/" + case.replace(":", "/"))
    browser, ours = in_chromium(chromium, url), in_vcrawl(url)
    if case in CHROMIUM_SKIPS_RAW_TEXT:
        browser.pop("encoding"), ours.pop("encoding")
    else:
        browser["encoding"], ours["encoding"] = browser["encoding"].lower(), ours["encoding"].lower()
    assert ours == browser


@pytest.mark.parametrize("path", [path for path, _, _ in ISSUE_PAGES])
def test_issue_pages_read_as_in_chromium(encoding_site: TestSite, chromium: webdriver.Chrome, path: str) -> None:
    url = encoding_site.url(path)
    browser, ours = in_chromium(chromium, url), in_vcrawl(url)
    assert ours["paragraphs"] or path == "/header-replacement"  # replacement: the page is one U+FFFD
    assert ours == browser


def test_undeclared_pages_where_vcrawl_departs_from_chromium(
    encoding_site: TestSite, chromium: webdriver.Chrome
) -> None:
    utf8 = encoding_site.url("/undeclared-utf-8")
    assert in_vcrawl(utf8)["paragraphs"] == ["Größe: 42 \u2013 „groß“"]
    assert in_chromium(chromium, utf8)["paragraphs"] == ["GrÃ¶ÃŸe: 42 â€\u201c â€žgroÃŸâ€œ"]
    cyrillic = encoding_site.url("/undeclared-1251")
    assert in_vcrawl(cyrillic)["encoding"] == "windows-1252"
    assert in_chromium(chromium, cyrillic)["encoding"] == "windows-1251"
