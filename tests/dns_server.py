"""A DNS server for tests: a zone of names with A records, NXDOMAIN for every other name, each query noted.

It listens on UDP port 53 of one address (resolv.conf names no port), e.g. the root end of a
network namespace's link (tests/netns.py, ``Lab.use_nameserver``), so processes in the namespace
resolve through the system resolver and nothing leaves the machine. dnslib serves and parses
(``DNSServer``, one thread); this module only answers and counts.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dnslib import QTYPE, RCODE, RR, A, DNSRecord
from dnslib.server import BaseResolver, DNSLogger, DNSServer

__all__ = ["Query", "TestDns"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Query:
    """One question the server was asked: the name (lower case, no trailing dot), its type, when."""

    name: str
    qtype: str  # "A", "AAAA", ...
    at: float  # time.monotonic()


class _Zone(BaseResolver):  # type: ignore[misc]
    def __init__(self, server: TestDns) -> None:
        self._server = server

    def resolve(self, request: DNSRecord, handler: Any) -> DNSRecord:
        question = request.q
        name = str(question.qname).rstrip(".").lower()
        qtype = QTYPE.get(question.qtype, str(question.qtype))
        self._server._note(Query(name, qtype, time.monotonic()))
        reply = request.reply()
        address = self._server.records.get(name)
        if address is None:
            reply.header.rcode = RCODE.NXDOMAIN
        elif question.qtype == QTYPE.A:
            reply.add_answer(RR(question.qname, QTYPE.A, rdata=A(address), ttl=self._server.record_ttl_s))
        return reply  # a known name asked for another type: NOERROR, no answer (NODATA)


class TestDns:
    """Answer ``records`` (name -> IPv4 address) on ``address``:53/UDP; NXDOMAIN for any other name."""

    __test__ = False  # not a pytest test class

    def __init__(self, address: str, records: Mapping[str, str], record_ttl_s: int = 300) -> None:
        self.records = {name.lower(): ip for name, ip in records.items()}
        self.record_ttl_s = record_ttl_s
        self._lock = threading.Lock()
        self._queries: list[Query] = []
        quiet = DNSLogger("error,truncated", prefix=False, logf=logger.warning)
        self._server = DNSServer(_Zone(self), address=address, port=53, logger=quiet)

    @property
    def queries(self) -> list[Query]:
        """Every query so far, oldest first."""
        with self._lock:
            return list(self._queries)

    def asked(self, name: str, qtype: str = "A") -> list[Query]:
        """The queries for ``name`` of type ``qtype``."""
        return [query for query in self.queries if query.name == name.lower() and query.qtype == qtype]

    def _note(self, query: Query) -> None:
        with self._lock:
            self._queries.append(query)

    def __enter__(self) -> TestDns:
        self._server.start_thread()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.stop()
        self._server.server.server_close()
