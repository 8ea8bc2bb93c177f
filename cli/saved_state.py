"""Where ``vcrawl crawl`` keeps its private Redis in a local storage root, so a job survives Ctrl-C.

``DATA/.vcrawl-redis/`` holds the server's AOF (``appendonlydir/``), its log, and ``lock``: an
exclusive ``flock`` taken by the ``vcrawl`` process and inherited by the redis-server it starts.
The directory is in use while either of them runs, and free the moment both are gone, even
after a SIGKILL (the kernel drops the lock). The lock file also names its holders, for the
message a second run prints.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
from pathlib import Path

__all__ = ["HOME_NAME", "RedisHome"]

HOME_NAME = ".vcrawl-redis"
_AOF_DIR = "appendonlydir"  # Redis 7's default ``appenddirname``
_LOCK = "lock"

logger = logging.getLogger(__name__)


class RedisHome:
    """The private Redis's directory in a storage root, and its lock."""

    def __init__(self, data_dir: str | Path) -> None:
        self.directory = Path(data_dir) / HOME_NAME
        self._fd: int | None = None

    def has_saved_state(self) -> bool:
        """True when a Redis has written its AOF here (there is something to resume)."""
        aof = self.directory / _AOF_DIR
        return aof.is_dir() and any(aof.glob("*.manifest"))

    def try_lock(self) -> bool:
        """Take the lock; False when another vcrawl run (or the redis-server it left) holds it."""
        self.directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.directory / _LOCK, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self._fd = fd
        self.record(pid=os.getpid())
        return True

    @property
    def lock_fd(self) -> int:
        """The locked file's descriptor, for the redis-server to inherit (``pass_fds``)."""
        if self._fd is None:
            raise ValueError("the lock is not held")
        return self._fd

    def record(self, **holder: int) -> None:
        """Write who holds the lock (``pid``, ``redis_pid``, ``port``) into the lock file."""
        fd = self.lock_fd
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(holder, sort_keys=True).encode(), 0)

    def holder(self) -> str:
        """Who holds the lock, as the lock file says (for the refusal message)."""
        try:
            info = json.loads((self.directory / _LOCK).read_text(encoding="utf-8") or "{}")
        except (OSError, ValueError):
            info = {}
        parts = [f"vcrawl pid {info['pid']}" if "pid" in info else "another vcrawl run"]
        if "redis_pid" in info:
            parts.append(f"its redis-server pid {info['redis_pid']} on port {info.get('port', '?')}")
        return ", ".join(parts)

    def unlock(self) -> None:
        """Release the lock (a redis-server that inherited it holds it until it exits)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def discard_state(self) -> None:
        """Delete the saved Redis data (the lock file stays); only while holding the lock."""
        if self._fd is None:
            raise ValueError("discard_state needs the lock")
        for path in self.directory.iterdir():
            if path.name == _LOCK:
                continue
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
        logger.debug("saved Redis state in %s discarded", self.directory)
