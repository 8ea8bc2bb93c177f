"""How a page's character encoding is determined: the HTML Standard's steps (13.2.3), as browsers run them.

1. A byte order mark (UTF-8, UTF-16LE, UTF-16BE) wins, and is not part of the text.
2. Then the Content-Type header's ``charset`` (an unknown label is ignored).
3. Then the *prescan* of the first 1,024 bytes (13.2.3.2): comments are skipped, ``<meta charset>``
   and ``<meta http-equiv=content-type content=...>`` are read with the standard's attribute rules,
   a declaration naming no known encoding is skipped and the scan goes on; UTF-16 declared means
   UTF-8 and x-user-defined windows-1252. An ``<?xml ... encoding="...">`` declaration counts when
   no ``<meta>`` does.
4. Then a ``<meta>`` further on, as the parser would meet it and "change the encoding": Chromium
   keeps looking while the page is still in its ``<head>`` (only ``<meta>``, ``<link>``, ``<script>``,
   ``<style>``, ``<title>``, ``<base>``, ``<noscript>``, ``<object>``, comments and text so far),
   skipping what ``<script>``, ``<style>``, ``<title>``, ``<textarea>`` and the like hold. vcrawl
   does the same within the first 64 KiB (``LATE_META_BYTES``).
5. Otherwise the fallback: UTF-8 if the page has non-ASCII bytes and they are valid UTF-8 (a cut
   last character allowed), else windows-1252 (what browsers use for an undeclared page in
   English-language locales, and ASCII reads the same either way).
"""

from __future__ import annotations

import logging
import re
from typing import NamedTuple

from analyzers.encoding import UTF_8, UTF_16, WINDOWS_1252, X_USER_DEFINED, decode, get_encoding

__all__ = ["LATE_META_BYTES", "PRESCAN_BYTES", "Sniffed", "decode_html", "prescan", "sniff"]

logger = logging.getLogger(__name__)

PRESCAN_BYTES = 1024  # HTML Standard: "user agents are encouraged to only prescan the first 1024 bytes"
LATE_META_BYTES = 64 * 1024  # how far a <meta> in the <head> is still looked for (Chromium: no limit)

_BOMS = ((b"\xef\xbb\xbf", UTF_8), (b"\xfe\xff", "UTF-16BE"), (b"\xff\xfe", "UTF-16LE"))
_WS = b"\t\n\f\r "
# "Get an attribute", HTML Standard 13.2.3.2, as one match at the position: skip whitespace and "/";
# then ">" (no more attributes) or a name and, after "=", a quoted, empty (before ">") or unquoted value.
# No match means the bytes ran out mid-attribute, which ends the prescan.
_NAME_AND_VALUE = (
    rb"(?P<name>[^\t\n\f\r />][^\t\n\f\r />=]*)(?:[\t\n\f\r ]*(?=[^\t\n\f\r =])"
    rb"|[\t\n\f\r ]*=[\t\n\f\r ]*(?:\"(?P<dq>[^\"]*)\"|'(?P<sq>[^']*)'|(?=>)"
    rb"|(?P<uq>[^\t\n\f\r >\"'][^\t\n\f\r >]*)(?=[\t\n\f\r >])))"
)
_ATTRIBUTE = re.compile(rb"[\t\n\f\r /]*(?:(?P<end>>)|" + _NAME_AND_VALUE + rb")")
# The rest of a tag whose attributes do not matter, in one match: each attribute as above, taken
# whole (atomic), then ">". No match means the bytes ran out first.
_TAG_REST = re.compile(rb"(?>[\t\n\f\r /]*" + re.sub(rb"\(\?P<\w+>", b"(?:", _NAME_AND_VALUE) + rb")*+[\t\n\f\r /]*>")
_META = re.compile(rb"<meta[\t\n\f\r /]", re.IGNORECASE)
_TAG_NAME_END = re.compile(rb"[\t\n\f\r >]")
_TAG_NAME = re.compile(rb"</?([A-Za-z][^\t\n\f\r />]*)")
_VALUE_END = re.compile(rb"[\t\n\f\r ;]")
_CONTROLS = bytes(range(0x21))  # "get an XML encoding" skips every byte up to 0x20
_CONTENT_TYPE_PARAM = re.compile(r';[\t\n\r ]*([^;=]*)(?:=("(?:[^"\\]|\\.)*"?|[^;]*))?')
# Elements whose content the tokenizer reads as text (Chromium's meta-charset scan skips it too).
_RAW_TEXT = frozenset({b"script", b"style", b"title", b"textarea", b"xmp", b"iframe", b"noembed", b"noframes"})
# Chromium (HTMLMetaCharsetParser): these tags leave the page in its <head>; any other ends it.
_HEAD_TAGS = frozenset({b"script", b"noscript", b"style", b"link", b"meta", b"object", b"title", b"base"})
_HEAD_START_TAGS = frozenset({b"html", b"head"})


class Sniffed(NamedTuple):
    """The encoding found for a page, what decided it, and how many byte-order-mark bytes to skip."""

    encoding: str
    source: str  # "bom", "header", "meta", "xml", "late-meta" or "fallback"
    bom_length: int = 0


class _OutOfBytes(Exception):
    """The prescan's end condition: the bytes ran out mid-construct."""


def decode_html(body: bytes, content_type: str | None, url: str = "") -> tuple[str, str]:
    """Return (WHATWG encoding name, text) for an HTML page as a browser decodes it."""
    sniffed = _sniff_declared(body, content_type)
    if sniffed is None:  # decoding is the fallback's test: one pass over the body
        encoding, text = _fallback(body)
        logger.debug("%s: decoded as %s (fallback: no declaration)", url, encoding)
        return encoding, text
    logger.debug("%s: decoded as %s (%s)", url, sniffed.encoding, sniffed.source)
    return sniffed.encoding, decode(body[sniffed.bom_length :], sniffed.encoding)


def sniff(body: bytes, content_type: str | None = None) -> Sniffed:
    """Determine the encoding of an HTML page's ``body`` served with ``content_type`` (steps 1 to 5 above).

    >>> sniff(b"<meta charset=koi><p>x"), sniff(b"\\xff\\xfe<\\x00", "text/html; charset=utf-8")
    (Sniffed(encoding='KOI8-R', source='meta', bom_length=0), Sniffed(encoding='UTF-16LE', source='bom', bom_length=2))
    """
    sniffed = _sniff_declared(body, content_type)
    return sniffed if sniffed is not None else Sniffed(_fallback(body)[0], "fallback")


def _sniff_declared(body: bytes, content_type: str | None) -> Sniffed | None:
    for bom, encoding in _BOMS:
        if body.startswith(bom):
            return Sniffed(encoding, "bom", len(bom))
    label = _charset_param(content_type)
    if label is not None and (encoding := get_encoding(label)) is not None:
        return Sniffed(encoding, "header")
    head = body[:PRESCAN_BYTES]
    if (encoding := _prescan_meta(head)) is not None:
        return Sniffed(encoding, "meta")
    if (encoding := _xml_encoding(head)) is not None:
        return Sniffed(encoding, "xml")
    if (encoding := _late_meta(body[:LATE_META_BYTES])) is not None:
        return Sniffed(encoding, "late-meta")
    return None


def prescan(head: bytes) -> str | None:
    """The HTML Standard's "prescan a byte stream to determine its encoding" over ``head``, all of it.

    >>> prescan(b'<meta charset="bogus"><meta charset=x-cp1251>'), prescan(b"<meta charset=utf-16>")
    ('windows-1251', 'UTF-8')
    """
    found = _prescan_meta(head)
    return found if found is not None else _xml_encoding(head)


def _charset_param(content_type: str | None) -> str | None:
    """The first non-empty ``charset`` parameter of a Content-Type value (MIME Sniffing's parameter rules)."""
    if content_type is None or ";" not in content_type:
        return None
    for match in _CONTENT_TYPE_PARAM.finditer(content_type, content_type.index(";")):
        name, value = match.group(1).lower(), match.group(2)
        if name != "charset" or not value:
            continue
        if value.startswith('"'):
            value = re.sub(r"\\(.)", r"\1", value[1:].removesuffix('"') if len(value) > 1 else "")
        else:
            value = value.rstrip("\t\n\r ")
        if value:
            return value
    return None


def _prescan_meta(data: bytes) -> str | None:
    # The two UTF-16 XML declarations ("<?x" in either byte order) come first.
    if data.startswith(b"<\x00?\x00x\x00"):
        return "UTF-16LE"
    if data.startswith(b"\x00<\x00?\x00x"):
        return "UTF-16BE"
    position = 0
    try:
        while (position := data.find(b"<", position)) >= 0:
            position, encoding = _prescan_step(data, position)
            if encoding is not None:
                return encoding
    except _OutOfBytes:
        pass
    return None


def _prescan_step(data: bytes, at: int) -> tuple[int, str | None]:
    """Read the construct at ``data[at] == "<"``: the position after it, and the encoding a <meta> gives."""
    if data.startswith(b"<!--", at):
        return _after(data, b"-->", at + 2), None
    if _META.match(data, at):
        attributes, end = _attributes(data, at + 5)
        return end + 1, _meta_encoding(attributes)
    second = data[at + 1 : at + 2]
    if second.isalpha() or (second == b"/" and data[at + 2 : at + 3].isalpha()):
        name_end = _TAG_NAME_END.search(data, at + 1)
        if name_end is None:
            raise _OutOfBytes
        return _skip_tag(data, name_end.start()), None
    if second in (b"!", b"/", b"?"):
        return _after(data, b">", at + 1), None
    return at + 1, None


def _after(data: bytes, marker: bytes, start: int) -> int:
    end = data.find(marker, start)
    if end < 0:
        raise _OutOfBytes
    return end + len(marker)


def _skip_tag(data: bytes, position: int) -> int:
    """The position after the ">" that ends the tag whose attributes start at ``position``."""
    rest = _TAG_REST.match(data, position)
    if rest is None:
        raise _OutOfBytes
    return rest.end()


def _attributes(data: bytes, position: int) -> tuple[list[tuple[bytes, bytes]], int]:
    """Every attribute from ``position`` to the tag's ">": (lower-cased name/value pairs, position of ">")."""
    found = []
    while True:
        match = _ATTRIBUTE.match(data, position)
        if match is None:
            raise _OutOfBytes
        if match["end"] is not None:
            return found, match.start("end")
        value = match["dq"] if match["dq"] is not None else match["sq"] if match["sq"] is not None else match["uq"]
        found.append((match["name"].lower(), (value or b"").lower()))
        position = match.end()


def _meta_encoding(attributes: list[tuple[bytes, bytes]]) -> str | None:
    """The encoding a <meta>'s attributes declare, as the prescan's "processing" step has it."""
    seen: set[bytes] = set()
    got_pragma, need_pragma, charset = False, None, None
    for name, value in attributes:
        if name in seen:  # only an attribute's first occurrence counts
            continue
        seen.add(name)
        if name == b"http-equiv":
            got_pragma = got_pragma or value == b"content-type"
        elif name == b"content":
            if charset is None and (found := _charset_from_content(value)) is not None:
                charset, need_pragma = found, True
        elif name == b"charset":
            charset, need_pragma = get_encoding(value.decode("latin-1")), False
    if need_pragma is None or (need_pragma and not got_pragma) or charset is None:
        return None
    if charset in UTF_16:
        return UTF_8
    return WINDOWS_1252 if charset == X_USER_DEFINED else charset


def _charset_from_content(content: bytes) -> str | None:
    """HTML Standard, "extracting a character encoding from a meta element" (``content`` is lower-cased)."""
    position = 0
    while (found := content.find(b"charset", position)) >= 0:
        position = _skip_whitespace(content, found + 7)
        if content[position : position + 1] != b"=":
            continue  # "charset" not followed by "=": look further on
        position = _skip_whitespace(content, position + 1)
        quote = content[position : position + 1]
        if not quote:
            return None
        if quote in (b'"', b"'"):
            end = content.find(quote, position + 1)
            return None if end < 0 else get_encoding(content[position + 1 : end].decode("latin-1"))
        value = _VALUE_END.search(content, position)
        return get_encoding(content[position : value.start() if value else len(content)].decode("latin-1"))
    return None


def _skip_whitespace(data: bytes, position: int, whitespace: bytes = _WS) -> int:
    while data[position : position + 1] and data[position] in whitespace:
        position += 1
    return position


def _xml_encoding(data: bytes) -> str | None:
    """HTML Standard, "get an XML encoding": the encoding of a leading ``<?xml ... encoding="...">``."""
    if not data.startswith(b"<?xml") or (end := data.find(b">")) < 0:
        return None
    declaration = data[:end]
    if (found := declaration.find(b"encoding")) < 0:
        return None
    position = _skip_whitespace(declaration, found + 8, _CONTROLS)
    if declaration[position : position + 1] != b"=":
        return None
    position = _skip_whitespace(declaration, position + 1, _CONTROLS)
    quote = declaration[position : position + 1]
    if quote not in (b'"', b"'") or (close := declaration.find(quote, position + 1)) < 0:
        return None
    label = declaration[position + 1 : close]
    if any(byte <= 0x20 for byte in label):
        return None
    encoding = get_encoding(label.decode("latin-1"))
    return UTF_8 if encoding in UTF_16 else encoding


def _late_meta(data: bytes) -> str | None:
    """A <meta> declaring an encoding while the page is still in its <head>, as Chromium looks for one."""
    position, in_head = 0, True
    try:
        while (position := data.find(b"<", position)) >= 0:
            if not in_head and position >= PRESCAN_BYTES:
                return None
            if data.startswith(b"<!--", position):
                position = _after(data, b"-->", position + 2)
                continue
            tag = _TAG_NAME.match(data, position)
            if tag is None:
                second = data[position + 1 : position + 2]
                position = _after(data, b">", position + 1) if second in (b"!", b"/", b"?") else position + 1
                continue
            name, is_end = tag.group(1).lower(), data[position + 1] == 0x2F
            if name == b"meta" and not is_end:
                attributes, position = _attributes(data, tag.end())
                if (encoding := _meta_encoding(attributes)) is not None:
                    return encoding
                position += 1
            else:
                position = _skip_tag(data, tag.end())
            if not is_end and name in _RAW_TEXT:
                closing = re.compile(rb"</" + re.escape(name) + rb"[\t\n\f\r />]", re.IGNORECASE)
                if (end_tag := closing.search(data, position)) is None:
                    return None
                position = end_tag.start()
            if name not in _HEAD_TAGS and (is_end or name not in _HEAD_START_TAGS):
                in_head = False
            if not is_end and name == b"plaintext":
                return None
    except _OutOfBytes:
        pass
    return None


def _fallback(body: bytes) -> tuple[str, str]:
    """UTF-8 for non-ASCII bytes that are valid UTF-8 (the last character may be cut), else windows-1252."""
    if body.isascii():
        return WINDOWS_1252, body.decode("ascii")
    try:
        return UTF_8, body.decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.reason == "unexpected end of data":  # a body cut mid-character is still UTF-8
            return UTF_8, body.decode("utf-8", "replace")
    return WINDOWS_1252, decode(body, WINDOWS_1252)
