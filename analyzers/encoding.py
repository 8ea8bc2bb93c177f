"""The WHATWG Encoding Standard as pages use it: labels, decoders, and a query's percent-encoding.

Labels are resolved with the ``webencodings`` package (the standard's label table, all 228 labels);
each encoding is then decoded with a Python codec chosen to match the standard's decoder, corrected
where the two differ (measured against the standard's index files):

- ``windows-874`` and ``windows-1250`` to ``windows-1258``: bytes 0x80-0x9F that Windows leaves
  undefined decode to the C1 control of the same value (Python's cp125x refuse them), and
  windows-1255's 0xCA is U+05BA;
- ``KOI8-U`` is KOI8-RU in the standard (0xAE U+045E, 0xBE U+040E);
- ``Shift_JIS`` is Python's cp932, ``EUC-KR`` cp949 (both equal to the standard's indexes),
  ``Big5`` big5hkscs, ``GBK`` and ``gb18030`` gb18030 (0x80 is U+20AC);
- ``EUC-JP`` reads JIS X 0208 through the standard's index (the cp932 one: NEC row 13, U+FF5E
  for 0xA1C1, ...), where Python's euc_jp differs on 463 code points; ``ISO-2022-JP`` gets the
  six changed characters of them (not the NEC rows);
- the double-byte decoders resynchronize after a bad byte as the standard's do (one U+FFFD for a
  lead and a non-ASCII byte, an ASCII byte read again);
- ``x-user-defined`` maps 0x80-0xFF to U+F780-U+F7FF, and ``replacement`` decodes a non-empty
  body to one U+FFFD (the ISO-2022-KR/CN and HZ labels, which could smuggle markup).

Undecodable bytes become U+FFFD. Known gaps: Python's big5hkscs lacks 203 code points of the
standard's Big5 index and its gb18030 maps 20 two-byte codes to the Private Use Area.
"""

from __future__ import annotations

import codecs
import functools
import re
from urllib.parse import quote

import webencodings

__all__ = ["UTF_8", "WINDOWS_1252", "decode", "get_encoding", "get_output_encoding", "percent_encode_query"]

UTF_8 = "UTF-8"
WINDOWS_1252 = "windows-1252"
REPLACEMENT = "replacement"
X_USER_DEFINED = "x-user-defined"
UTF_16 = ("UTF-16LE", "UTF-16BE")

# WHATWG name -> the Python codec that decodes (and encodes) it best.
_CODECS = {
    "UTF-8": "utf-8",
    "IBM866": "cp866",
    "ISO-8859-2": "iso8859-2",
    "ISO-8859-3": "iso8859-3",
    "ISO-8859-4": "iso8859-4",
    "ISO-8859-5": "iso8859-5",
    "ISO-8859-6": "iso8859-6",
    "ISO-8859-7": "iso8859-7",
    "ISO-8859-8": "iso8859-8",
    "ISO-8859-8-I": "iso8859-8",  # the same bytes; only the text direction differs
    "ISO-8859-10": "iso8859-10",
    "ISO-8859-13": "iso8859-13",
    "ISO-8859-14": "iso8859-14",
    "ISO-8859-15": "iso8859-15",
    "ISO-8859-16": "iso8859-16",
    "KOI8-R": "koi8-r",
    "KOI8-U": "koi8-u",
    "macintosh": "mac-roman",
    "windows-874": "cp874",
    **{f"windows-{n}": f"cp{n}" for n in range(1250, 1259)},
    "x-mac-cyrillic": "mac-cyrillic",
    "GBK": "gb18030",  # the standard's GBK decoder is its gb18030 decoder
    "gb18030": "gb18030",
    "Big5": "big5hkscs",
    "EUC-JP": "euc-jp",
    "ISO-2022-JP": "iso2022-jp-ext",  # with JIS X 0201 katakana (ESC ( I), as the standard
    "Shift_JIS": "cp932",
    "EUC-KR": "cp949",
    "UTF-16BE": "utf-16-be",
    "UTF-16LE": "utf-16-le",
}
# The GBK encoder never writes gb18030's four-byte sequences.
_ENCODER_CODECS = {**_CODECS, "GBK": "gbk"}
_NAMES = {name.lower(): name for name in (*_CODECS, REPLACEMENT, X_USER_DEFINED)}
# Single-byte encodings whose standard index differs from Python's codec beyond undefined C1 bytes.
_SINGLE_BYTE_FIXES = {"windows-1255": {0xCA: "\u05ba"}, "KOI8-U": {0xAE: "\u045e", 0xBE: "\u040e"}}
_X_USER_DEFINED_TABLE = "".join(chr(byte if byte < 0x80 else 0xF700 + byte) for byte in range(256))
# JIS X 0208 as Python's euc_jp reads it -> as the standard's index (checked code point by code point).
_JIS0208_FIXES = str.maketrans(
    {0x301C: 0xFF5E, 0x2016: 0x2225, 0x2212: 0xFF0D, 0xA2: 0xFFE0, 0xA3: 0xFFE1, 0xAC: 0xFFE2}
)
# The lead bytes of the standard's double-byte decoders.
_LEAD_BYTES = {
    "Shift_JIS": frozenset([*range(0x81, 0xA0), *range(0xE0, 0xFD)]),
    "EUC-JP": frozenset([0x8E, 0x8F, *range(0xA1, 0xFF)]),
    "EUC-KR": frozenset(range(0x81, 0xFF)),
    "Big5": frozenset(range(0x81, 0xFF)),
}
_PYTHON_TO_NAME = {"cp932": "Shift_JIS", "euc_jp": "EUC-JP", "cp949": "EUC-KR", "big5hkscs": "Big5"}
# cp932 reads 0xA0 and 0xFD-0xFF as Microsoft's private-use characters; the standard has no such bytes.
_SHIFT_JIS_FIXES = str.maketrans(dict.fromkeys(range(0xF8F0, 0xF8F4), 0xFFFD))
_EUC_JP_TILDE = (b"\x8f\xa2\xb7", b"\xa1\xc1")  # JIS X 0212's tilde is U+FF5E in the standard, "~" in Python
# Decoding a declared label must give these characters back unchanged. This refuses codecs that are
# not ASCII-compatible text encodings (base64, rot13, unicode_escape, punycode, idna, UTF-7, ...):
# they raise, or re-spell markup the way UTF-7 does (\x3c and \u003c decode to <).
_PROBE = '<a href="x">\\x3c\\u003c&+-</a>'
_NOT_ASCII_COMPATIBLE = frozenset({*UTF_16, REPLACEMENT})
# URL Standard: the special-query percent-encode set, less the C0 controls and non-ASCII (always
# encoded): what stays as it is. "%" stays, so existing escapes are kept.
_QUERY_SAFE = "".join(chr(c) for c in range(0x21, 0x7F) if chr(c) not in "\"#<>'")
_SURROGATES = re.compile("[\ud800-\udfff]")


@functools.lru_cache(maxsize=512)  # pages repeat a handful of labels
def get_encoding(label: str) -> str | None:
    """Return the WHATWG name of the encoding ``label`` names ("get an encoding"), None if unknown.

    >>> get_encoding(" Latin1 "), get_encoding("x-cp1251"), get_encoding("koi"), get_encoding("utf-7")
    ('windows-1252', 'windows-1251', 'KOI8-R', None)
    """
    encoding = webencodings.lookup(label)
    return None if encoding is None else _NAMES[encoding.name]


def get_output_encoding(encoding: str) -> str:
    """Return the encoding a URL's query is written in for a document in ``encoding`` (URL Standard).

    >>> get_output_encoding("UTF-16LE"), get_output_encoding("replacement"), get_output_encoding("Shift_JIS")
    ('UTF-8', 'UTF-8', 'Shift_JIS')
    """
    return UTF_8 if encoding in _NOT_ASCII_COMPATIBLE else encoding


def decode(body: bytes, encoding: str) -> str:
    """Decode ``body`` (no byte order mark) with the WHATWG ``encoding``; bad bytes become U+FFFD.

    >>> decode(b"caf\\xe9 \\x81", "windows-1252"), decode(b"\\x80\\xff", "x-user-defined")
    ('café \\x81', '\\uf780\\uf7ff')
    """
    if encoding == UTF_8:  # most pages
        return body.decode("utf-8", "replace")
    if encoding == REPLACEMENT:
        return "\ufffd" if body else ""
    table = _decoding_table(encoding)
    if table is not None:
        return codecs.charmap_decode(body, "replace", table)[0]
    if encoding == "EUC-JP":
        return body.replace(*_EUC_JP_TILDE).decode("euc-jp", "vcrawl-double-byte").translate(_JIS0208_FIXES)
    if encoding in _LEAD_BYTES:
        text = body.decode(_CODECS[encoding], "vcrawl-double-byte")
        return text.translate(_SHIFT_JIS_FIXES) if encoding == "Shift_JIS" else text
    if encoding == "ISO-2022-JP":
        return body.decode(_CODECS[encoding], "replace").translate(_JIS0208_FIXES)
    if encoding in ("GBK", "gb18030"):
        return body.decode("gb18030", "vcrawl-gb18030")
    return body.decode(_CODECS[encoding], "replace")


def percent_encode_query(query: str, encoding: str) -> str:
    """Percent-encode a URL's query as the URL Standard's query state does for a document in ``encoding``.

    Characters are written in the document's output encoding (UTF-8 for UTF-8, UTF-16 and
    replacement documents), then bytes in the special-query percent-encode set (http and https
    URLs) are escaped. A character the encoding cannot write becomes ``%26%23NNNN%3B`` (``&#NNNN;``).
    Plain ASCII and existing ``%XX`` escapes are kept.

    >>> percent_encode_query("?q=Привет", "windows-1251"), percent_encode_query("q=€ 1", "ISO-8859-2")
    ('?q=%CF%F0%E8%E2%E5%F2', 'q=%26%238364%3B%201')
    """
    if query.isascii() and not any(c in query for c in "\"#<>' ") and query.isprintable():
        return query
    query = _SURROGATES.sub("\ufffd", query)  # the URL parser reads scalar values
    output = get_output_encoding(get_encoding(encoding) or UTF_8)
    if output == UTF_8:
        data = query.encode("utf-8")
    elif output == X_USER_DEFINED:
        data = codecs.charmap_encode(query, "vcrawl-url-html", _encoding_map(output))[0]
    else:
        table = _decoding_table(output)
        if table is not None:
            data = codecs.charmap_encode(query, "vcrawl-url-html", _encoding_map(output))[0]
        else:
            data = query.encode(_ENCODER_CODECS[output], "vcrawl-url-html")
    return quote(data, safe=_QUERY_SAFE)


def _is_ascii_compatible(codec: str) -> bool:
    """Return True if the Python ``codec`` decodes ASCII markup, backslashes and all, to itself.

    >>> [_is_ascii_compatible(e) for e in ("cp1252", "shift_jis", "utf-16-le", "unicode_escape", "base64")]
    [True, True, False, False, False]
    """
    try:
        # bytes.decode, unlike codecs.decode, refuses bytes-to-bytes codecs with a LookupError.
        return _PROBE.encode("ascii").decode(codec, "replace") == _PROBE
    except (LookupError, UnicodeError):
        return False


@functools.cache
def _decoding_table(encoding: str) -> str | None:
    """The 256-character charmap of a single-byte encoding that Python's codec gets wrong, else None."""
    if encoding == X_USER_DEFINED:
        return _X_USER_DEFINED_TABLE
    if not encoding.startswith("windows-") and encoding not in _SINGLE_BYTE_FIXES:
        return None
    codec = _CODECS[encoding]
    if not _is_ascii_compatible(codec):  # every table here is single-byte and ASCII-compatible
        raise ValueError(f"{encoding} ({codec}) is not ASCII-compatible")
    chars = []
    for byte in range(256):
        try:
            chars.append(bytes([byte]).decode(codec))
        except UnicodeDecodeError:
            # Encoding Standard indexes: Windows' undefined 0x80-0x9F are the C1 controls; "\ufffe" is undefined.
            chars.append(chr(byte) if 0x80 <= byte < 0xA0 else "\ufffe")
    for byte, char in _SINGLE_BYTE_FIXES.get(encoding, {}).items():
        chars[byte] = char
    return "".join(chars)


@functools.cache
def _encoding_map(encoding: str) -> dict[int, int]:
    table = _decoding_table(encoding)
    assert table is not None
    return codecs.charmap_build(table)  # "\ufffe" entries stay unencodable


@functools.cache
def _jis0208() -> dict[bytes, str]:
    """JIS X 0208 in EUC-JP byte pairs -> the standard's index, through Shift_JIS (cp932 is that index)."""
    table = {}
    for pointer in range(94 * 94):
        lead, trail = divmod(pointer, 188)
        sjis = bytes([lead + (0x81 if lead < 0x1F else 0xC1), trail + (0x40 if trail < 0x3F else 0x41)])
        try:
            table[bytes([0xA1 + pointer // 94, 0xA1 + pointer % 94])] = sjis.decode("cp932")
        except UnicodeDecodeError:
            continue
    return table


def _double_byte_error(exc: UnicodeError) -> tuple[str, int]:
    """Codec error handler: resynchronize as the standard's double-byte decoders do.

    A lead byte and a byte that make no character are one U+FFFD, unless that byte is ASCII: it is
    then read again. EUC-JP also reads JIS X 0208 pairs that Python's euc_jp lacks (NEC, IBM rows).
    """
    assert isinstance(exc, UnicodeDecodeError)
    data, start = exc.object, exc.start
    if exc.encoding == "euc_jp" and (char := _jis0208().get(data[start : start + 2])) is not None:
        return char, start + 2
    if data[start] not in _LEAD_BYTES[_PYTHON_TO_NAME[exc.encoding]]:
        return "\ufffd", start + 1
    trail = start + 1
    if exc.encoding == "euc_jp" and data[start] == 0x8F and data[trail : trail + 1] and 0xA1 <= data[trail] <= 0xFE:
        trail += 1  # JIS X 0212: three bytes
    if trail >= len(data):
        return "\ufffd", len(data)
    return "\ufffd", trail if data[trail] < 0x80 else trail + 1


def _gb18030_error(exc: UnicodeError) -> tuple[str, int]:
    """Codec error handler: the standard's gb18030 decoder (a lone 0x80 is U+20AC; resynchronizing)."""
    assert isinstance(exc, UnicodeDecodeError)
    data, start = exc.object, exc.start
    if data[start] == 0x80:
        return "\u20ac", start + 1
    if not 0x81 <= data[start] <= 0xFE:
        return "\ufffd", start + 1
    shape = data[start + 1 : start + 4]
    if shape[:1].isdigit():  # a four-byte sequence: one U+FFFD if whole (or cut by the end), else the lead only
        whole = len(shape) == 3 and 0x81 <= shape[1] <= 0xFE and shape[2:3].isdigit()
        cut = len(shape) < 3 and start + 1 + len(shape) == len(data) and (len(shape) < 2 or 0x81 <= shape[1] <= 0xFE)
        return "\ufffd", start + 4 if whole else len(data) if cut else start + 1
    if not shape:
        return "\ufffd", len(data)
    return "\ufffd", start + 1 if shape[0] < 0x80 else start + 2


def _url_html_error(exc: UnicodeError) -> tuple[bytes, int]:
    """Codec error handler: the URL Standard writes an unencodable character as ``%26%23NNNN%3B``."""
    assert isinstance(exc, UnicodeEncodeError)
    # Python's gbk lacks the one byte the standard's GBK encoder adds: U+20AC is 0x80.
    euro = b"\x80" if exc.encoding == "gbk" else b"%26%238364%3B"
    return b"".join(
        euro if c == "\u20ac" else b"%%26%%23%d%%3B" % ord(c) for c in exc.object[exc.start : exc.end]
    ), exc.end


codecs.register_error("vcrawl-double-byte", _double_byte_error)
codecs.register_error("vcrawl-gb18030", _gb18030_error)
codecs.register_error("vcrawl-url-html", _url_html_error)
