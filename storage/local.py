"""Local filesystem storage: every file confined to one root, written atomically by rename."""

from __future__ import annotations

import errno
import logging
import os
import secrets
import stat
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import BinaryIO

from vcrawl.errors import MissingPage, StorageRefused

__all__ = ["LocalBackend"]

logger = logging.getLogger(__name__)

_NAME_MAX = 255  # bytes per path component (NAME_MAX of ext4, xfs, btrfs, tmpfs)
_TEMP_STEM_MAX = 200  # bytes of the final name kept in the temp name, so the temp name fits _NAME_MAX too
_FILE_MODE = 0o644  # the kernel applies the umask on top, as for any new file
_TEMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW


class LocalBackend:
    """Files under one root directory; a location must resolve (symlinks followed) inside it.

    A write goes to a temp file in the target's directory that is renamed onto the final name,
    so readers see the old file or the whole new one, never a part. Writes are not fsynced by
    default: the rename already gives readers whole files, and a page lost to a power cut is
    just fetched again. ``fsync=True`` flushes the file and its directory before returning.

    Symlinks inside the root are followed for parent directories (confinement is checked on the
    real path) but a final component that is a symlink is always refused, also when it appears
    between `resolve` and the rename. The root is assumed writable by vcrawl only: a local user who
    can change directories inside it while a write runs can still race the checks.
    """

    def __init__(self, root: str | Path, fsync: bool = False) -> None:
        absolute = os.path.abspath(os.fspath(root))
        Path(absolute).mkdir(parents=True, exist_ok=True)
        self.root: str = os.path.realpath(absolute)
        self.fsync = fsync

    def __repr__(self) -> str:
        return f"LocalBackend({self.root!r}, fsync={self.fsync})"

    def resolve(self, location: str) -> str:
        """Return the real absolute path of the file `location` names, checked to lie inside the root.

        Symlinks in the parent directories are followed; the final component is kept, and refused
        if it is a symlink or a directory.

        Raises:
            StorageRefused: NUL bytes, a relative path, a trailing ``/``, the root itself, a path
                outside the root, a final symlink or directory, a component over 255 bytes.
        """
        if "\x00" in location:
            raise _refuse(location, "contains a NUL byte")
        try:
            os.fsencode(location)
        except UnicodeEncodeError:
            raise _refuse(location, "contains characters that cannot be a file name") from None
        if not os.path.isabs(location):
            raise _refuse(location, "is not an absolute path")
        if location.endswith("/"):
            raise _refuse(location, "ends in '/' (a directory, not a file)")
        head, name = os.path.split(location)
        if name in (".", ".."):
            raise _refuse(location, f"ends in {name!r} (a directory, not a file)")
        path = os.path.join(_real_path(head), name)  # the parents are real: only the name can be a link
        if path == self.root:
            raise _refuse(location, "is the storage root itself, not a file in it")
        if not self._is_inside(os.path.dirname(path)):
            raise _refuse(location, f"escapes the storage root {self.root}")
        try:
            mode = os.lstat(path).st_mode
        except OSError:  # nothing there yet (or not reachable: opening it says why)
            mode = 0
        if stat.S_ISLNK(mode):
            target = os.path.realpath(path)
            if target == self.root:
                raise _refuse(location, "is the storage root itself, not a file in it")
            if not self._is_inside(target):
                raise _refuse(location, f"escapes the storage root {self.root}")
            raise _refuse(location, "is a symlink; vcrawl never writes through or replaces symlinks")
        if stat.S_ISDIR(mode):
            raise _refuse(location, "is a directory, not a file")
        encoded = os.fsencode(path)  # one encoding of the path, not one per component
        if len(encoded) > _NAME_MAX and max(map(len, encoded.split(os.sep.encode()))) > _NAME_MAX:
            raise _refuse(location, f"has a path component longer than {_NAME_MAX} bytes")
        return path

    def relative(self, location: str) -> str:
        """Return the real path of `location` relative to the root, ``/``-separated.

        Raises:
            StorageRefused: as `resolve`.
        """
        return os.path.relpath(self.resolve(location), self.root).replace(os.sep, "/")

    @contextmanager
    def open_write(self, location: str) -> Iterator[BinaryIO]:
        """Yield a binary file whose data appears at `location` only when the block exits cleanly.

        Raises:
            StorageRefused: the location is refused, a parent is not a directory, or a symlink
                appeared at the final name or in place of the directory before the rename.
        """
        path = self.resolve(location)
        parent, name = os.path.split(path)
        # Temp file, checks, rename and cleanup all go through this directory fd: the write stays
        # in the directory that was checked even if a path component is swapped meanwhile.
        dir_fd = _open_parent(location, parent)
        try:
            self._check_unchanged(location, parent, name, dir_fd)
            temp = f".{os.fsdecode(os.fsencode(name)[:_TEMP_STEM_MAX])}.{secrets.token_hex(8)}.tmp"
            fd = os.open(temp, _TEMP_FLAGS, _FILE_MODE, dir_fd=dir_fd)
            try:
                try:
                    # closefd=False: the caller may close (or wrap and close) the stream; we own the fd.
                    with os.fdopen(fd, "wb", closefd=False) as stream:
                        yield stream
                    if self.fsync:
                        os.fsync(fd)
                finally:
                    os.close(fd)
                self._check_unchanged(location, parent, name, dir_fd)
                os.replace(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            except BaseException:
                with suppress(FileNotFoundError):
                    os.unlink(temp, dir_fd=dir_fd)
                raise
            if self.fsync:
                os.fsync(dir_fd)  # makes the rename itself durable
        finally:
            os.close(dir_fd)
        logger.debug("stored %s", path)

    def write_bytes(self, location: str, data: bytes) -> int:
        """Store `data` atomically at `location` and return the number of bytes written.

        Raises:
            StorageRefused: the location is refused.
        """
        with self.open_write(location) as stream:
            stream.write(data)
        return len(data)

    def read_bytes(self, location: str, offset: int = 0, length: int | None = None) -> bytes:
        """Return the file at `location`, or ``length`` bytes of it from ``offset``.

        Raises:
            MissingPage: no file is there.
            StorageRefused: the location is refused (including a final symlink).
        """
        path = self.resolve(location)
        try:
            # O_NOFOLLOW: a symlink swapped in after resolve() is refused, never followed.
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except (FileNotFoundError, NotADirectoryError) as e:
            raise MissingPage(location) from e
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise _refuse(location, "is a symlink; vcrawl never reads through symlinks") from e
            raise
        with os.fdopen(fd, "rb") as stream:
            if offset:
                stream.seek(offset)
            return stream.read() if length is None else stream.read(length)

    def exists(self, location: str) -> bool:
        """Return True if a file is stored at `location`.

        Raises:
            StorageRefused: the location is refused.
        """
        return os.path.lexists(self.resolve(location))

    def list_files(self, location: str) -> list[str]:
        """Return the files directly in the directory `location` (resolved locations), sorted.

        A missing directory has no files. Hidden files (temporary writes) are left out.

        Raises:
            StorageRefused: the location is refused.
        """
        real = os.path.realpath(location) if os.path.isabs(location) else ""
        if "\x00" in location or not real or not self._is_inside(real) or real == self.root:
            raise _refuse(location, f"is not a directory inside the storage root {self.root}")
        path = real
        try:
            names = sorted(os.listdir(path))
        except (FileNotFoundError, NotADirectoryError):
            return []
        return [os.path.join(path, n) for n in names if not n.startswith(".") and os.path.isfile(os.path.join(path, n))]

    def list_dirs(self, location: str) -> list[str]:
        """Return the names of the directories directly in the directory `location`, sorted (hidden ones
        left out; none if it is missing).

        Raises:
            StorageRefused: the location is refused.
        """
        real = os.path.realpath(location) if os.path.isabs(location) else ""
        if "\x00" in location or not real or not self._is_inside(real):
            raise _refuse(location, f"is not a directory inside the storage root {self.root}")
        try:
            names = sorted(os.listdir(real))
        except (FileNotFoundError, NotADirectoryError):
            return []
        return [n for n in names if not n.startswith(".") and os.path.isdir(os.path.join(real, n))]

    def _is_inside(self, path: str) -> bool:
        return path == self.root or path.startswith(self.root.rstrip(os.sep) + os.sep)

    def _check_unchanged(self, location: str, parent: str, name: str, dir_fd: int) -> None:
        # resolve() saw real directories; a symlink planted since then must not redirect the write.
        # The kernel's own path of the open directory says where the write goes (one call); without
        # /proc, the directory at the checked path must be the one open, and that path still real.
        if fd_path := _fd_path(dir_fd):
            unchanged = fd_path == parent
        else:
            try:
                unchanged = os.path.samestat(os.stat(parent), os.fstat(dir_fd)) and os.path.realpath(parent) == parent
            except FileNotFoundError:
                unchanged = False
        if not unchanged:
            raise _refuse(location, "its parent directory was replaced while writing")
        try:
            is_link = stat.S_ISLNK(os.lstat(name, dir_fd=dir_fd).st_mode)
        except FileNotFoundError:
            return
        if is_link:
            raise _refuse(location, "became a symlink while writing; vcrawl never replaces symlinks")


def _open_parent(location: str, parent: str) -> int:
    try:
        return os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except FileNotFoundError:
        pass  # a new directory: made below (not first: a mkdir per write costs more than the open)
    except NotADirectoryError as e:
        raise _refuse(location, "a parent component exists and is not a directory") from e
    except OSError as e:
        if e.errno != errno.ELOOP:
            raise
        raise _refuse(location, "its parent directory was replaced while writing") from e
    try:
        Path(parent).mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError) as e:
        raise _refuse(location, "a parent component exists and is not a directory") from e
    try:
        return os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as e:
        if e.errno != errno.ELOOP:
            raise
        raise _refuse(location, "its parent directory was replaced while writing") from e


def _real_path(path: str) -> str:
    """``os.path.realpath(path)``; for an existing directory, asked of the kernel in three calls (the
    path of the directory it opened), not an ``lstat`` per component: a tenth of the CPU."""
    try:
        fd = os.open(path, os.O_PATH | os.O_DIRECTORY)
    except OSError:
        return os.path.realpath(path)  # not there (yet), or not a directory: the resolve checks say which
    try:
        return _fd_path(fd) or os.path.realpath(path)
    finally:
        os.close(fd)


def _fd_path(fd: int) -> str:
    """The real path of the directory open as ``fd`` (Linux's /proc), "" when it cannot be had."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return ""


def _refuse(location: str, problem: str) -> StorageRefused:
    logger.debug("refuse storage location %r: %s", location, problem)
    return StorageRefused(location, problem)
