"""TianJi-style learner groups: independent learners whose params are averaged every few updates.

Each group is a learner with its own optimizer state, its own policy version (its number of
publications), its own actors and its own lag-bounded queue; a sample's policy lag is measured
against the group whose params produced it. Every ``sync_every`` updates of its own, each group
waits at :meth:`ParamAverager.average` until all groups arrive, and all continue from the mean
of their params (periodic model averaging, as in TianJi's parameter synchronisation between
learners, and local SGD: Stich 2019, "Local SGD converges fast and communicates little").
Optimizer states stay per group. This is its own knob, separate from the per-step gradient
averaging of data-parallel learner devices (``num_learner_devices``).

No math beyond the mean: plumbing (a condition variable with timeouts and a stop event).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import jax

from tianji_jax.runtime.tianji.async_runtime import StallError

__all__ = ["ParamAverager", "is_sync_point", "tree_mean"]


def tree_mean(trees: list) -> Any:
    """The leafwise mean of equally structured pytrees, summed in list order (deterministic);
    each leaf keeps its dtype."""
    return jax.tree.map(lambda *xs: (sum(xs[1:], xs[0]) / len(xs)).astype(xs[0].dtype), *trees)


def is_sync_point(version: int, sync_every: int, num_updates: int) -> bool:
    """Whether a group publishing ``version`` (its own update count, >= 1) averages first:
    every ``sync_every`` updates, and always at its last update ``num_updates`` (so a run ends
    with one set of params)."""
    return version % sync_every == 0 or version == num_updates


class ParamAverager:
    """A reusable rendezvous of ``num_groups`` learner threads that averages their params.

    Args:
        num_groups: groups G (>= 2).
        devices: per group, the device its learner lives on (the mean is computed on
            ``devices[0]``, summing in group order, so every group receives the same bits, and
            placed back on each group's device).
        timeout_s: seconds a group waits for the others before :class:`StallError`.
        stop: the run's stop event; a set event ends a wait with ``None``.

    Raises:
        ValueError: ``num_groups < 2``, ``len(devices) != num_groups`` or ``timeout_s <= 0``.
    """

    def __init__(self, num_groups: int, devices: list, timeout_s: float, stop: threading.Event):
        if isinstance(num_groups, bool) or not isinstance(num_groups, int) or num_groups < 2:
            raise ValueError(f"num_groups must be an int >= 2, got {num_groups!r}")
        if len(devices) != num_groups:
            raise ValueError(f"devices: need one per group ({num_groups}), got {len(devices)}")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.num_groups, self.devices, self.timeout_s, self.stop = num_groups, list(devices), float(timeout_s), stop
        self._cond = threading.Condition()
        self._deposits: dict[int, Any] = {}
        self._round = 0  # completed averaging rounds
        self._result: Any = None
        self.rounds_done = 0
        self.wait_s = [0.0] * num_groups  # seconds each group waited for the others (telemetry)

    def average(self, group: int, params: Any, version: int) -> Any | None:
        """Deposit ``group``'s ``params`` (at its version ``version``; every group must arrive
        with the same version), wait for all groups, and return the mean on this group's device.

        Returns:
            The averaged params (same pytree, shapes and dtypes), or ``None`` when ``stop`` was
            set while waiting (the run is ending; the caller keeps its own params).

        Raises:
            StallError: the other groups did not all arrive within ``timeout_s`` (names them).
            ValueError: ``group`` out of range, deposited twice in a round, or groups arriving
                with different versions.
        """
        if not 0 <= group < self.num_groups:
            raise ValueError(f"group must be in 0..{self.num_groups - 1}, got {group}")
        t0 = time.perf_counter()
        deadline = time.monotonic() + self.timeout_s
        with self._cond:
            if group in self._deposits:
                raise ValueError(f"group {group} deposited twice in averaging round {self._round}")
            versions = {v for _, v in self._deposits.values()}
            if versions and versions != {version}:
                raise ValueError(f"learner groups must average at the same version: group {group} at {version}, "
                                 f"others at {sorted(versions)}")
            self._deposits[group] = (params, version)
            my_round = self._round
            if len(self._deposits) == self.num_groups:
                first = self.devices[0]
                trees = [jax.device_put(self._deposits[g][0], first) for g in range(self.num_groups)]
                self._result = tree_mean(trees)
                self._deposits.clear()
                self._round += 1
                self.rounds_done = self._round
                self._cond.notify_all()
            while self._round == my_round:
                if self.stop.is_set():
                    self._deposits.pop(group, None)
                    return None
                left = deadline - time.monotonic()
                if left <= 0:
                    missing = sorted(set(range(self.num_groups)) - set(self._deposits))
                    self._deposits.pop(group, None)
                    raise StallError(f"learner group {group} waited {self.timeout_s:g} s at version {version} for "
                                     f"learner group(s) {missing} to average params (sync_every)")
                self._cond.wait(min(left, 0.1))
            result = self._result
        self.wait_s[group] += time.perf_counter() - t0
        return jax.block_until_ready(jax.device_put(result, self.devices[group]))

