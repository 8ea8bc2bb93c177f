"""Certificates for Redis over TLS in tests, made at test time with trustme (no files in the repo).

One CA signs one certificate for ``127.0.0.1`` and ``localhost``, usable both as a server's
certificate and as a client's (trustme sets both ``serverAuth`` and ``clientAuth``): the Redis
servers and Sentinels present it, and replicas, Sentinels and vcrawl present it to servers that
ask for client certificates (``tls-auth-clients yes``, Redis' default).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import trustme

__all__ = ["TlsFiles", "make_tls_files"]


@dataclass(frozen=True)
class TlsFiles:
    """Paths of the CA certificate and of the one certificate with its key."""

    ca: Path
    cert: Path
    key: Path

    def server_args(self) -> list[str]:
        """``redis-server`` arguments that load these files (the port options are the caller's)."""
        return ["--tls-cert-file", str(self.cert), "--tls-key-file", str(self.key), "--tls-ca-cert-file", str(self.ca)]

    def client_options(self) -> dict[str, str]:
        """redis-py's keywords for a verified TLS client that presents the certificate."""
        return {"ssl_ca_certs": str(self.ca), "ssl_certfile": str(self.cert), "ssl_keyfile": str(self.key)}


def make_tls_files(directory: Path) -> TlsFiles:
    """Write a fresh CA and a certificate for 127.0.0.1 in ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    files = TlsFiles(directory / "ca.pem", directory / "redis.pem", directory / "redis.key")
    ca.cert_pem.write_to_path(str(files.ca))
    cert.cert_chain_pems[0].write_to_path(str(files.cert))
    cert.private_key_pem.write_to_path(str(files.key))
    return files
