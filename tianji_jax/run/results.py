"""What a run produces: the metrics columns (:data:`METRIC_COLUMNS`) and the results of
:func:`~tianji_jax.training.train` (:class:`TrainResult`) and :func:`~tianji_jax.training.load`
(:class:`LoadedRun`). Both are re-exported by :mod:`tianji_jax.training` and the package."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tianji_jax.algos.config_base import AgentConfig
from tianji_jax.runtime.anakin import PPOTrainState

__all__ = ["METRIC_COLUMNS", "TrainResult", "LoadedRun"]

METRIC_COLUMNS = (
    "env_steps", "update", "wall_time_s", "sps", "episode_return_mean", "episode_length_mean", "episodes",
    "eval_return_mean", "eval_return_std", "eval_env_steps", "policy_loss", "value_loss", "entropy", "approx_kl",
    "clip_fraction", "grad_norm", "policy_lag_mean", "policy_lag_max", "production_sps", "consumed_sps", "reuse",
    "spi_observed", "limiter_error", "dropped_stale", "dropped_partial", "lost_chunks", "actor_wait_frac", "learner_wait_frac", "queue_depth",
    "lag_window", "queue_limit", "spi_band", "rollout_s", "inference_s", "env_step_s", "h2d_s", "update_s",
    "epsilon", "replay_ratio_observed", "td_loss", "q_mean", "nonfinite_skips", "alpha",
)
"""Columns of ``metrics.csv``, one row per compiled chunk. ``env_steps`` counts env steps taken so
far; ``wall_time_s`` is seconds since ``train`` started; ``sps`` is env steps per second over the
chunk (async runtime: over the row's interval, or the trailing window of at least
``host_loop.RATE_WINDOW_S`` = 1 s when rows come faster, as are ``production_sps``, ``consumed_sps``
and the wait fractions); ``episode_*`` cover the training episodes that ended during the chunk (empty if none);
``eval_return_*`` are over ``eval_episodes`` deterministic episodes after the chunk (empty if disabled);
``eval_env_steps`` counts the env steps spent in evaluation so far (cumulative over the run's
evaluations: the sum of their episodes' lengths, on separate envs, not part of ``env_steps``; a
resumed run continues from its last row's value; empty if evaluation is disabled);
the loss columns are means over the chunk's gradient steps; ``policy_lag_*`` is the lag of the
consumed samples as the learner computes it (learner version minus the per-step stamps; 0 in Anakin).
Async runtime only (empty in Anakin): ``production_sps`` (env steps inserted by actors per second),
``consumed_sps`` (env steps consumed by the learner per second, epoch reuse counted), ``reuse``
(``update_epochs``), ``spi_observed`` (samples / inserts of the rate limiter), ``limiter_error``
(``I*spi - S`` in env steps), ``dropped_stale`` (env steps dropped by the lag gate, cumulative), ``dropped_partial`` (host
envs: env steps an actor dropped before insertion because a rollout started with newer params —
transitions left over from uneven resets and actions in flight — cumulative; 0 for gymnax),
``lost_chunks`` (rollouts of remote Ray actors lost when their process died, never inserted;
cumulative; 0 with actor threads),
``actor_wait_frac`` / ``learner_wait_frac`` (share of the chunk's wall time spent waiting),
``queue_depth`` (trajectories waiting), the knobs in force at the row (learner group 0's; moved
by ``schedule='auto'``, constant otherwise): on-policy ``lag_window`` (admission window: rollouts
that may be ahead of a new one, in versions) and ``queue_limit`` (trajectories the rate limiter
lets wait), replay ``spi_band`` (the samples-per-insert band's half-width, in sampled items; the
other data path's knobs are empty), and per-phase seconds within the chunk (summed over
actors) ``rollout_s`` (inference + env step), for host envs split into ``inference_s`` (policy on
the actor device, actions back to the host) and ``env_step_s`` (envpool/gymnasium step and
trajectory assembly; both empty for gymnax actors, whose rollout is one fused program),
``h2d_s`` (transfers between devices; with Ray actors also each rollout's round trip beyond the
actor's own rollout time: task dispatch and the object store, the first one's including the actor
process's start-up), ``update_s``.
DQN only (empty for PPO): ``epsilon`` (exploration epsilon of the chunk's last iteration, the mean
over envs and actors: per-env epsilons differ with ``epsilon_schedule='apex'``),
``replay_ratio_observed`` (gradient updates / env steps within the chunk: ``replay_ratio`` once
learning has started, 0 before ``learning_starts``), ``td_loss`` (DQN's loss: mean TD loss of the
chunk's gradient updates; DQN leaves ``policy_loss``/``value_loss``/``entropy``/``approx_kl``/
``clip_fraction`` empty), ``q_mean`` (mean online ``Q(s, a)`` of the sampled transitions); for DQN
``update`` is the policy version (learner blocks run), ``grad_norm`` is before clipping and
``policy_lag_*`` is the age in versions of the sampled replay items (many by design).
SAC (a replay algorithm: ``replay_ratio_observed``, ``td_loss`` and ``q_mean`` as for DQN, the
critics' summed squared error and their mean on the sampled pairs): ``policy_loss`` (the actor's
loss ``alpha log pi - min Q``), ``entropy`` (``-log pi`` of fresh policy samples), ``alpha`` (the
entropy temperature; empty for the other algorithms).
Every algorithm: ``nonfinite_skips`` (gradient steps of the chunk skipped because their loss or
gradient was not finite; params and optimizer state were left as they were; after
``max_nonfinite_updates`` consecutive updates with a skip the run stops with an error)."""


@dataclass
class TrainResult:
    """What :func:`~tianji_jax.training.train` returns.

    Attributes:
        config: the config that ran.
        state: the final :class:`~tianji_jax.runtime.anakin.PPOTrainState`
            (:class:`~tianji_jax.runtime.anakin.ReplayTrainState` for a DQN run).
        curve: learning curve, a dict mapping each of :data:`METRIC_COLUMNS` to a ``(rows,)``
            float64 numpy array (NaN where a value is missing).
        run_dir: the run directory, or None.
        stopped_early: True when ``stop_at_return`` was reached.
        already_finished: True when ``resume`` found the run finished: nothing was trained.
    """

    config: AgentConfig
    state: PPOTrainState
    curve: dict[str, np.ndarray] = field(default_factory=dict)
    run_dir: Path | None = None
    stopped_early: bool = False
    already_finished: bool = False

    @property
    def params(self) -> Any:
        """The final network params."""
        return self.state.params


@dataclass
class LoadedRun:
    """What :func:`~tianji_jax.training.load` returns.

    Attributes:
        config: the run's config (from ``config.json``).
        state: the train state of the checkpoint (:class:`~tianji_jax.runtime.anakin.PPOTrainState`
            or :class:`~tianji_jax.runtime.anakin.ReplayTrainState`; a DQN checkpoint saved without
            its replay buffer has an empty one; an async host-env run has ``state.actor = None``).
        step: env steps of the checkpoint.
        meta: the checkpoint's metadata (see :mod:`tianji_jax.checkpoint.core`).
        rows: ``metrics.csv`` rows up to the checkpoint.
    """

    config: AgentConfig
    state: Any
    step: int
    meta: dict
    rows: list[dict[str, float]]

    @property
    def params(self) -> Any:
        """The network params (DQN: the online Q-network)."""
        return self.state.params

    @property
    def obs_rms(self) -> Any:
        """Observation statistics (PPO with a gymnax actor; None otherwise)."""
        return getattr(self.state, "obs_rms", None)

