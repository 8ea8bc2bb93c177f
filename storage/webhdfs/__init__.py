"""HDFS storage over WebHDFS (HdfsCLI's client): `WebHdfsBackend` and the router's `webhdfs_factory`.

The only place ``hdfs`` is imported, one module per concern: ``backend`` (the backend: writes by
temp file and rename, reads, listings, retries), ``locations`` (the data root, the NameNode allow
list, confinement of ``hdfs://`` locations), ``failures`` (HdfsCLI and requests errors mapped to
vcrawl's), ``client`` (HTTP sessions, the Kerberos client, file status, the upload sink).
"""

from __future__ import annotations

from storage.webhdfs.backend import WebHdfsBackend, webhdfs_factory

__all__ = ["WebHdfsBackend", "webhdfs_factory"]
