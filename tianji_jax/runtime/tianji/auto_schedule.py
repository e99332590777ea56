"""The ``auto`` schedule: a balancer that tunes the async runtime's knobs while the run goes.

``auto`` is ``relaxed`` (actors use the newest params, the lag gate drops anything older than the
ceiling K = ``max_policy_lag``) plus a controller that, every ``period`` learner updates, reads
how long each side waited since its previous decision and moves one knob one step:

- on-policy (:class:`~tianji_jax.buffers.queues.TrajectoryQueue`): the **admission window** W in
  ``1..K`` (an actor starts a rollout only while at most W rollouts are waiting, admitted or being
  learned from, so a consumed rollout's lag is at most about W) and with it the **queue limit**
  ``max(2, W + 1)`` trajectories (the rate limiter's room, never the binding rule below W);
- replay (:class:`~tianji_jax.buffers.queues.ReplayIngress`): the **samples-per-insert band** half-width
  in ``[m, replay_ratio_tolerance * m]`` items, ``m = B + spi * c`` the narrowest band that
  cannot deadlock (docs/runtime.md, "The lag contract").

The rule, with ``a`` and ``l`` the actors' and the learner's wait fractions over the period:

1. ``l > HIGH`` and ``a > HIGH`` (both sides waited: the knob is what holds them apart): widen
   one step (W + 1, band x 1.5), up to the ceiling.
2. ``l < LOW`` and ``a > HIGH`` (the learner never waited; the actors wait anyway): narrow one
   step (W - 1 down to 1, band / 1.5 down to ``m``): less staleness (a tighter replay ratio) for
   the same throughput.
3. Rollouts were dropped by the lag gate during the period (on-policy): narrow one step
   (admitted rollouts finishing out of order went stale).

The lag bound itself is never relaxed: the gate at the ceiling K stays, so every consumed sample's
lag is ``<= K`` whatever the controller does; it only chooses how much of that room to use. The
knobs in force are reported in every metrics row (``lag_window``, ``queue_limit``, ``spi_band``).
No math here; thresholds are wall-clock fractions, so decisions depend on timing (a run with
``auto`` is not reproducible; record its schedule for that).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

__all__ = ["AutoBalancer", "HIGH", "LOW", "PERIOD"]

HIGH = 0.05
"""Wait fraction above which a side counts as waiting."""
LOW = 0.01
"""Wait fraction below which the learner counts as never waiting."""
PERIOD = 4
"""Learner updates (per learner group) between two decisions."""


@dataclass
class _GroupState:
    updates: int
    time: float
    actor_wait_s: float
    learner_wait_s: float
    dropped: int


class AutoBalancer:
    """The controller of the ``auto`` schedule (see the module docstring).

    Args:
        ceiling: K, the user's ``max_policy_lag`` (>= 1): the largest admission window.
        band_max_factor: replay: the band may widen up to this many times its smallest
            deadlock-free half-width (``replay_ratio_tolerance``, >= 1); None for on-policy.
        num_actors: actor threads feeding each learner group (actor wait seconds are summed over
            them, so the fraction divides by this).
        period: learner updates between decisions.
        clock: seconds, monotonic; must be the clock the telemetry's spans use (``time.perf_counter``,
            as :class:`~tianji_jax.runtime.tianji.async_runtime.Telemetry` does), since open spans are read up
            to its ``now``; tests inject a scripted one together with a telemetry fed on that clock.

    Attributes:
        decisions: ``(group, update, knob, old, new, actor_wait_frac, learner_wait_frac)`` of every
            change, in order (what docs/concepts/schedules.md explains; the rows carry the knobs).

    Raises:
        ValueError: ``ceiling < 1``, ``band_max_factor < 1``, ``num_actors < 1`` or ``period < 1``.
    """

    def __init__(self, ceiling: int, band_max_factor: float | None = None, num_actors: int = 1,
                 period: int = PERIOD, clock: Callable[[], float] = time.perf_counter):
        if ceiling < 1 or num_actors < 1 or period < 1 or (band_max_factor is not None and band_max_factor < 1):
            raise ValueError(f"AutoBalancer: need ceiling >= 1, num_actors >= 1, period >= 1 and band_max_factor "
                             f">= 1; got {ceiling}, {num_actors}, {period}, {band_max_factor}")
        self.ceiling, self.band_max_factor = int(ceiling), band_max_factor
        self.num_actors, self.period, self.clock = int(num_actors), int(period), clock
        self.decisions: list[tuple] = []
        self._state: dict[int, _GroupState] = {}
        self._lock = threading.Lock()

    def start(self, buffers: list) -> None:
        """Set every group's buffer to the first knob values (window 1: the least staleness; the
        band at its narrowest) before the threads start."""
        for buf in buffers:
            if self.band_max_factor is None:
                buf.set_window(1)
            else:
                buf.set_band(buf.band_min)

    def after_update(self, group: int, buffer: Any, telemetry: Any) -> None:
        """Called by ``group``'s learner thread after each of its updates: every ``period`` updates,
        decide from the waits since the previous decision (``telemetry``: the runner's
        :class:`~tianji_jax.runtime.tianji.async_runtime.Telemetry`, summed over groups) and apply the change
        to ``buffer``."""
        with self._lock:
            now = self.clock()
            if group not in self._state:  # the first update (compilation, start-up waits): a baseline only
                waits = telemetry.read(now)
                self._state[group] = _GroupState(0, now, waits["actor_wait_s"], waits["learner_wait_s"],
                                                 buffer.dropped_stale)
                return
            st = self._state[group]
            st.updates += 1
            if st.updates % self.period:
                return
            waits = telemetry.read(now)
            dt = max(now - st.time, 1e-9)
            a = (waits["actor_wait_s"] - st.actor_wait_s) / (dt * self.num_actors)
            lw = (waits["learner_wait_s"] - st.learner_wait_s) / dt
            dropped = buffer.dropped_stale - st.dropped
            st.time, st.actor_wait_s, st.learner_wait_s, st.dropped = (
                now, waits["actor_wait_s"], waits["learner_wait_s"], buffer.dropped_stale)
            step = self.decide(a, lw, dropped > 0 and self.band_max_factor is None)
            if step:
                self._apply(group, st.updates, buffer, step, a, lw)

    @staticmethod
    def decide(actor_wait_frac: float, learner_wait_frac: float, dropped: bool) -> int:
        """+1 (widen), -1 (narrow) or 0 from one period's wait fractions and whether the gate
        dropped rollouts (see the module docstring's rule)."""
        if dropped:
            return -1
        if learner_wait_frac > HIGH and actor_wait_frac > HIGH:
            return 1
        if learner_wait_frac < LOW and actor_wait_frac > HIGH:
            return -1
        return 0

    def _apply(self, group: int, update: int, buffer: Any, step: int, a: float, lw: float) -> None:
        if self.band_max_factor is None:
            old = buffer.admit_window
            new = min(self.ceiling, max(1, old + step))
            if new != old:
                buffer.set_window(new)
                self.decisions.append((group, update, "lag_window", old, new, a, lw))
            return
        old = buffer.band
        lo, hi = buffer.band_min, buffer.band_min * self.band_max_factor
        new = min(hi, max(lo, old * 1.5 if step > 0 else old / 1.5))
        if new != old:
            buffer.set_band(new)
            self.decisions.append((group, update, "spi_band", old, new, a, lw))
