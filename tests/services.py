"""A server a test starts and stops (a RabbitMQ node or cluster, a Spark master and worker): ``with``
starts it, stopping whatever part of it started when the start fails, and stops it after."""

from __future__ import annotations

from types import TracebackType
from typing import Self

__all__ = ["Service"]


class Service:
    """Subclasses give ``start`` and ``stop`` (``stop`` safe to call after a start that failed midway)."""

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.stop()
