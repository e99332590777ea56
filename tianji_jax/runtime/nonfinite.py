"""Host side of the non-finite guard: stop a run whose updates keep being skipped.

Every gradient step with a non-finite loss or gradient is skipped on the device
(:mod:`tianji_jax.algos.guard`) and counted in the per-update metric ``nonfinite_skips``. The
host loop of every runtime hands each row's per-update counts to one :class:`NonFiniteMonitor`,
which tracks the number of *consecutive updates* (learner iterations / policy versions) that
skipped at least one gradient step; once it reaches ``max_nonfinite_updates`` the run stops with a
:class:`NonFiniteError` naming the updates, the non-finite quantities of the row and the last
checkpoint saved before the streak began (whose params are finite: skipped steps never change
them).
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

__all__ = ["NonFiniteError", "NonFiniteMonitor"]


class NonFiniteError(FloatingPointError):
    """Training stopped: too many consecutive updates had a non-finite loss or gradient."""


class NonFiniteMonitor:
    """Counts consecutive updates with skipped (non-finite) gradient steps across rows.

    Args:
        limit: ``max_nonfinite_updates`` (>= 1): consecutive updates with a skipped step that stop
            the run.
        last_checkpoint: ``last_checkpoint(env_steps) -> str | None``, the newest checkpoint saved
            at or before ``env_steps`` (None: none), for the error message.
    """

    def __init__(self, limit: int, last_checkpoint: Callable[[int], str | None] = lambda _s: None):
        self.limit = int(limit)
        self.last_checkpoint = last_checkpoint
        self.streak = 0  # consecutive updates with a skip, up to the last observed update
        self.streak_start_env_steps = 0
        self.prev_env_steps = 0
        self.prev_update = 0

    def observe(self, skips: np.ndarray, row: dict[str, float]) -> None:
        """Account one row's updates.

        Args:
            skips: ``(U,)`` int, the skipped gradient steps of each of the row's ``U`` updates in
                order (iterations that did not learn count 0).
            row: the row (``env_steps``, ``update`` and the loss metrics, which name the
                non-finite quantity).

        Raises:
            NonFiniteError: the streak reached ``limit``.
        """
        skips = np.asarray(skips).reshape(-1)
        env_steps = int(row["env_steps"])
        per_update = (env_steps - self.prev_env_steps) / max(len(skips), 1)
        for i, s in enumerate(skips):
            if s > 0:
                if self.streak == 0:
                    self.streak_start_env_steps = int(self.prev_env_steps + i * per_update)
                    self.streak_start_update = self.prev_update + i + 1
                self.streak += 1
            else:
                self.streak = 0
        self.prev_env_steps, self.prev_update = env_steps, self.prev_update + len(skips)
        if self.streak >= self.limit:
            bad = [f"{k}={v}" for k, v in row.items() if isinstance(v, float) and not math.isfinite(v)
                   and not k.startswith("eval_") and not k.startswith("episode_")]
            ckpt = self.last_checkpoint(self.streak_start_env_steps)
            raise NonFiniteError(
                f"training stopped: {self.streak} consecutive updates (from update {self.streak_start_update}, "
                f"env step {self.streak_start_env_steps}) had a non-finite loss or gradient "
                f"({', '.join(bad) or 'nonfinite_skips=' + str(int(skips.sum()))}); their steps were skipped, the "
                f"params are the last finite ones; last checkpoint before update {self.streak_start_update}: {ckpt or 'none'} "
                f"(max_nonfinite_updates={self.limit}; lower learning_rate or check rewards/observations)")
