"""Which ``hdfs://`` locations the WebHDFS backend accepts: the data root, the NameNode allow list, confinement.

Package-internal: the backend's configuration and every storage call check locations here.
Paths are taken literally (no percent-decoding) and host names as written, never resolved.
"""

from __future__ import annotations

import posixpath
import unicodedata
from urllib.parse import SplitResult, urlsplit

from storage.webhdfs.failures import refuse
from vcrawl.errors import ConfigError

__all__ = ["confine", "control_character", "parse_allowed", "parse_root"]

_NAME_MAX = 255  # bytes per path component (dfs.namenode.fs-limits.max-component-length)


def confine(location: str, root: str, root_path: str, allowed_namenodes: frozenset[str]) -> tuple[str, str]:
    """Return (namenode, normalized path) of `location`, checked to lie inside `root` (whose path is `root_path`).

    Raises:
        StorageRefused: see ``WebHdfsBackend.resolve``.
    """
    if "\x00" in location:
        raise refuse(location, "contains a NUL byte")
    if (bad := control_character(location)) is not None:
        raise refuse(location, f"contains the control character U+{ord(bad):04X}")
    try:
        location.encode("utf-8")
    except UnicodeEncodeError:
        raise refuse(location, "contains characters that cannot be a file name") from None
    parts = urlsplit(location)
    if parts.scheme.lower() != "hdfs":
        raise refuse(location, "is not an hdfs:// URL")
    if "?" in location or "#" in location:
        raise refuse(location, "has a query or fragment; hdfs:// locations are plain paths")
    if "@" in parts.netloc:
        raise refuse(location, "names a user (user@host); the HDFS user comes from VCRAWL_HDFS_USER")
    try:
        namenode = _namenode(parts)
    except ValueError as e:
        raise refuse(location, str(e)) from None
    if namenode not in allowed_namenodes:
        allowed = ", ".join(sorted(allowed_namenodes))
        raise refuse(location, f"NameNode {namenode} is not allowed; allowed: {allowed}")
    raw = parts.path
    if problem := _path_problem(raw):
        raise refuse(location, problem)
    path = posixpath.normpath("/" + raw.lstrip("/"))
    if path == root_path:
        raise refuse(location, "is the storage root itself, not a file in it")
    if not path.startswith(root_path + "/"):
        raise refuse(location, f"escapes the storage root {root}")
    if any(len(part.encode("utf-8")) > _NAME_MAX for part in path.split("/")):
        raise refuse(location, f"has a path component longer than {_NAME_MAX} bytes")
    return namenode, path


def parse_root(root: str) -> tuple[str, str]:
    """Return (namenode, normalized absolute path) of the data root URL.

    Raises:
        ConfigError: naming ``VCRAWL_DATA``.
    """
    parts = urlsplit(root)
    if parts.scheme.lower() != "hdfs" or "@" in parts.netloc or parts.query or parts.fragment:
        raise ConfigError(f"VCRAWL_DATA={root!r} must be hdfs://host:port/dir (no user, query or fragment)")
    try:
        namenode = _namenode(parts)
    except ValueError as e:
        raise ConfigError(f"VCRAWL_DATA={root!r}: {e}") from None
    if control_character(root) is not None:
        raise ConfigError(f"VCRAWL_DATA={root!r} contains control characters")
    path = posixpath.normpath("/" + parts.path.lstrip("/"))
    if path == "/":
        raise ConfigError(f"VCRAWL_DATA={root!r} must name a directory below the HDFS root /")
    if problem := _path_problem(parts.path.rstrip("/")):
        raise ConfigError(f"VCRAWL_DATA={root!r}: the root path {problem}")
    return namenode, path


def parse_allowed(entry: str) -> str:
    """Return the ``host:port`` of one ``VCRAWL_HDFS_NAMENODES`` entry.

    Raises:
        ConfigError: naming the entry.
    """
    parts = urlsplit("//" + entry.strip())
    try:
        if parts.path or parts.query or parts.fragment or "@" in parts.netloc:
            raise ValueError("extra parts")
        return _namenode(parts)
    except ValueError:
        raise ConfigError(f"VCRAWL_HDFS_NAMENODES entry {entry!r} is not host:port (the WebHDFS HTTP port)") from None


def control_character(text: str) -> str | None:
    """Return the first control character in `text`, or None."""
    return next((char for char in text if unicodedata.category(char) == "Cc"), None)


def _namenode(parts: SplitResult) -> str:
    """Return ``host:port`` (``[v6]:port``) of a split URL.

    Raises:
        ValueError: no host, no port, or a bad port.
    """
    host = parts.hostname
    try:
        port = parts.port
    except ValueError:
        raise ValueError(f"has a bad port in {parts.netloc!r}") from None
    if not host:
        raise ValueError("names no NameNode host")
    if port is None:
        raise ValueError(f"names no port for {host}; give the NameNode's WebHDFS HTTP port (9870 on Hadoop 3)")
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _path_problem(raw: str) -> str | None:
    """Return why the raw URL path cannot name a file, or None."""
    if not raw.startswith("/"):
        return "has no absolute path"
    if "%" in raw:
        return "contains '%'; percent-encoded hdfs:// paths are not supported"
    if ":" in raw:
        return "contains ':', which HDFS does not allow in names"
    if raw.endswith("/"):
        return "ends in '/' (a directory, not a file)"
    if (name := raw.rsplit("/", 1)[1]) in (".", ".."):
        return f"ends in {name!r} (a directory, not a file)"
    return None
