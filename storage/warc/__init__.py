"""WARC/1.1 archives of fetched pages, gzip per record, with a CDXJ index next to every file.

A `WarcWriter` (one per worker process, shared by its threads) appends records to a local spool
file; when the file passes its size limit, or on `roll()` / `close()`, the finished file is
copied into the store with ``Storage.open_write`` (so local disk and HDFS alike, and readers
never see a partial file), its index ``<file>.cdxj`` is written next to it, and the spool is
deleted. Every record is its own gzip member, so `read_response` reads one capture back with a
single ranged read of ``length`` bytes at ``offset``, without scanning the file.

One module per concern: ``capture`` (the records of a capture), ``index`` (the CDXJ line, the
``.cdxj`` file and `lookup`), ``spool`` (the local file before it ships, and `recover_spools`),
``writer`` (rolling files and shipping them), ``stage`` (a fetch batch's captures held aside),
``reader`` (`read_response`).
"""

from __future__ import annotations

from storage.warc.capture import SERVER_NOT_MODIFIED, URL_ID_HEADER
from storage.warc.index import REVISIT_MIME, CdxEntry, lookup
from storage.warc.reader import read_response
from storage.warc.spool import recover_spools
from storage.warc.stage import WarcStage
from storage.warc.writer import WarcWriter

__all__ = [
    "REVISIT_MIME",
    "SERVER_NOT_MODIFIED",
    "URL_ID_HEADER",
    "CdxEntry",
    "WarcStage",
    "WarcWriter",
    "lookup",
    "read_response",
    "recover_spools",
]
