"""ParamStore: one latest-wins, versioned parameter slot shared by the learner and the actors."""

from __future__ import annotations

import threading
import time
from typing import Any

__all__ = ["ParamStore"]


class ParamStore:
    """Holds the newest ``(params, version)``. Publishing never blocks on readers; readers can wait
    for a minimum version with a timeout and a stop event.

    Args:
        params: initial params (version ``version``).
        version: initial policy version (int, number of publications so far).
    """

    def __init__(self, params: Any, version: int = 0):
        self._cond = threading.Condition()
        self._params = params
        self._version = int(version)

    @property
    def version(self) -> int:
        """The newest published version."""
        with self._cond:
            return self._version

    def publish(self, params: Any, version: int) -> None:
        """Replace the slot with ``params`` stamped ``version`` (must not go backwards).

        Raises:
            ValueError: ``version`` is lower than the current one.
        """
        with self._cond:
            if version < self._version:
                raise ValueError(f"version must not decrease: publishing {version} after {self._version}")
            self._params, self._version = params, int(version)
            self._cond.notify_all()

    def latest(self) -> tuple[Any, int]:
        """``(params, version)`` without waiting."""
        with self._cond:
            return self._params, self._version

    def wait_for(self, min_version: int, timeout_s: float, stop: threading.Event) -> tuple[Any, int] | None:
        """Wait until ``version >= min_version`` and return ``(params, version)``; ``None`` after
        ``timeout_s`` seconds or when ``stop`` is set.

        Waits in slices of at most 0.1 s so a set stop event is seen promptly.
        """
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._version < min_version:
                left = deadline - time.monotonic()
                if left <= 0 or stop.is_set():
                    return None
                self._cond.wait(min(left, 0.1))
            return self._params, self._version
