"""The HdfsCLI side of the WebHDFS backend: its HTTP session, the Kerberos client, file status, the upload sink.

Package-internal: the backend builds its clients and streams its uploads with these.
"""

from __future__ import annotations

import io
from typing import Any

import hdfs
import requests

from vcrawl.errors import ConfigError

__all__ = ["ChunkSink", "file_status", "kerberos_client_class", "session"]


class ChunkSink(io.RawIOBase):
    """The raw end of an upload: hands each chunk to HdfsCLI's writer thread and counts the bytes."""

    def __init__(self, writer: Any) -> None:
        super().__init__()
        self._writer = writer
        self._position = 0

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        if self.closed:
            raise ValueError("write to a closed HDFS upload")
        chunk = bytes(data)  # a copy: BufferedWriter reuses the memory it passes in
        self._writer.write(chunk)
        self._position += len(chunk)
        return len(chunk)

    def tell(self) -> int:
        # AsyncWriter.tell() always says 0; WARC offsets need the real position.
        return self._position


def session() -> requests.Session:
    """Return a new HTTP session for one client: no proxies, and a 5xx answer raises requests.HTTPError."""
    http = requests.Session()
    http.trust_env = False  # NameNode and DataNode traffic never goes through HTTP(S)_PROXY
    http.hooks["response"].append(_raise_for_server_error)
    return http


def kerberos_client_class() -> Any:
    """Return HdfsCLI's KerberosClient.

    Raises:
        ConfigError: requests-kerberos is not installed.
    """
    try:
        from hdfs.ext.kerberos import KerberosClient  # imports requests_kerberos
    except ImportError as e:
        raise ConfigError(
            "VCRAWL_HDFS_KERBEROS=true needs the requests-kerberos package (pip install 'hdfs[kerberos]')"
        ) from e
    return KerberosClient


def file_status(client: hdfs.Client, path: str) -> dict[str, Any] | None:
    """Return the FileStatus of `path`, or None if nothing is there (any other error answer raises)."""
    # Not status(strict=False): that turns every error answer (access denied, safe mode) into "absent".
    try:
        return client.status(path)
    except hdfs.HdfsError as e:
        if e.exception == "FileNotFoundException":
            return None
        raise


def _raise_for_server_error(response: requests.Response, *args: Any, **kwargs: Any) -> None:
    """Raise requests.HTTPError for a 5xx answer (a requests response hook).

    HdfsCLI turns every non-2xx answer into an HdfsError without the status code; a 5xx from a
    NameNode or DataNode (overloaded, restarting, disk full) must stay recognisable as transient.
    """
    if response.status_code >= 500:
        _ = response.content  # read the body so the connection goes back to the pool
        raise requests.HTTPError(f"HTTP {response.status_code}", response=response)
