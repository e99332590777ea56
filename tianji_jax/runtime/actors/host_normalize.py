"""Observation normalisation and reward scaling for host envs (envpool, gymnasium), in numpy.

The acting side of CleanRL's ``ppo_continuous_action`` (gym's ``NormalizeObservation`` and
``NormalizeReward``) and of SB3's ``VecNormalize``, for the async runtime's host actors, with
their statistics shared by every actor of a run:

* each actor folds every observation its env returns into running mean/variance statistics
  *before* acting on it (the same rule as the gymnax path, :meth:`OnPolicyAgent.rollout`), acts on
  ``clip((obs - mean) / sqrt(var + 1e-8), -10, 10)`` and stores that (float32) in its trajectory,
  an action mask's entries raw (the rule of every path:
  :func:`~tianji_jax.algos.normalization.normalize_observation`);
* with reward scaling it keeps each env's discounted return ``R <- gamma * R + r`` (valid steps
  only, zeroed at an episode's end), folds it into running statistics of the return, and stores
  ``clip(r / sqrt(var_R + 1e-8), -10, 10)``;
* every statistic an actor folds in since its last trajectory also goes into a *delta* that
  travels with that trajectory (:meth:`HostNormalizer.take_delta`); the runtime merges each delta
  into the run's statistics as the trajectory is produced (:class:`SharedStatistics`, the
  parallel mean/variance merge of Chan et al. 1979), and the learner publishes them with each
  params version; an actor starting a rollout continues from the published statistics
  (:meth:`HostNormalizer.sync`). So with several actor threads or Ray actor processes all act
  with one set of statistics, merged over every observation produced (also those of a
  trajectory the lag gate later drops: the env returned them).
* with several learner processes (``num_processes > 1``, ``jax.distributed``) each process merges
  its own actors' deltas into a *pending* delta; right after every (lockstep) update every process
  gathers every process's pending delta (:meth:`SharedStatistics.exchange`, a collective that
  moves the float64 values bit for bit) and merges them into the run's statistics in process
  order, so every process publishes the same statistics with the same version.

The statistics are float64 here (numpy) and float32 as :class:`RunningMeanStd` on the device
(checkpoints, evaluation). Evaluation reads them frozen.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from flax import struct

from tianji_jax.algos.normalization import CLIP, RunningMeanStd, normalize_observation
from tianji_jax.envs.host_common import HostStep

__all__ = ["MeanStd", "HostNormalizer", "SharedStatistics", "HostNormStats"]

_EPS = 1e-8
_PRIOR_COUNT = 1e-4  # as RunningMeanStd.create: mean 0, variance 1, a tiny count


@dataclass
class MeanStd:
    """Running mean ``(*shape)``, variance ``(*shape)`` (float64) and count (float, >= 0).

    :meth:`prior` is the statistics a run starts from (mean 0, variance 1, count 1e-4, as
    :meth:`RunningMeanStd.create`); :meth:`empty` (count 0) is the neutral element of :meth:`merge`.
    """

    mean: np.ndarray
    var: np.ndarray
    count: float

    @classmethod
    def prior(cls, shape: tuple[int, ...]) -> "MeanStd":
        """Mean 0, variance 1, count 1e-4, of ``shape``."""
        return cls(np.zeros(shape, np.float64), np.ones(shape, np.float64), _PRIOR_COUNT)

    @classmethod
    def empty(cls, shape: tuple[int, ...]) -> "MeanStd":
        """No samples (count 0): merging it changes nothing."""
        return cls(np.zeros(shape, np.float64), np.zeros(shape, np.float64), 0.0)

    def merge(self, other: "MeanStd") -> "MeanStd":
        """The statistics of both sample sets (Chan et al. 1979, parallel variance), a new object."""
        if other.count == 0:
            return MeanStd(self.mean.copy(), self.var.copy(), self.count)
        if self.count == 0:
            return MeanStd(other.mean.copy(), other.var.copy(), other.count)
        tot = self.count + other.count
        delta = other.mean - self.mean
        mean = self.mean + delta * (other.count / tot)
        m2 = self.var * self.count + other.var * other.count + delta**2 * (self.count * other.count / tot)
        return MeanStd(mean, m2 / tot, tot)

    @classmethod
    def of_rows(cls, x: np.ndarray, mask: np.ndarray) -> "MeanStd":
        """The statistics of the rows of ``x`` ``(B, *shape)`` where ``mask`` ``(B,)`` bool is True
        (:meth:`empty` when none is)."""
        x, mask = np.asarray(x), np.asarray(mask, bool)
        out = cls.empty(tuple(x.shape[1:]))
        out.update(x[mask])
        return out

    def update(self, x: np.ndarray) -> None:
        """Fold in a batch ``x`` shaped ``(B, *shape)`` (any numeric dtype), in place."""
        if len(x) == 0:
            return
        x = np.asarray(x, np.float64)
        merged = self.merge(MeanStd(x.mean(axis=0), x.var(axis=0), float(len(x))))
        self.mean, self.var, self.count = merged.mean, merged.var, merged.count

    def normalize(self, x: np.ndarray, raw_tail: int = 0) -> np.ndarray:
        """:func:`~tianji_jax.algos.normalization.normalize_observation` of ``x`` ``(..., *shape)``
        (computed in float64) as float32: ``clip((x - mean) / sqrt(var + 1e-8), -10, 10)``, the last
        ``raw_tail`` entries (an env's action mask) passed through unchanged.

        Raises:
            ValueError: ``raw_tail`` out of ``[0, x.shape[-1]]``."""
        return normalize_observation(np.asarray(x, np.float64), self.mean, self.var, raw_tail).astype(np.float32)

    def to_running(self) -> RunningMeanStd:
        """The float32 device form (:class:`RunningMeanStd`)."""
        import jax.numpy as jnp

        return RunningMeanStd(jnp.asarray(self.mean, jnp.float32), jnp.asarray(self.var, jnp.float32),
                              jnp.asarray(self.count, jnp.float32))

    @classmethod
    def from_running(cls, rms: RunningMeanStd) -> "MeanStd":
        """From the device form (float32 values widened to float64)."""
        import jax

        mean, var, count = jax.device_get((rms.mean, rms.var, rms.count))
        return cls(np.asarray(mean, np.float64), np.asarray(var, np.float64), float(count))

    def copy(self) -> "MeanStd":
        """An independent copy."""
        return MeanStd(self.mean.copy(), self.var.copy(), self.count)


@struct.dataclass
class HostNormStats:
    """The statistics of a host-env run as a checkpoint holds them (the ``actor`` field of its
    :class:`~tianji_jax.runtime.anakin.OnPolicyTrainState`; host envs keep no other actor state).

    Attributes:
        obs_rms: observation statistics, :class:`RunningMeanStd` of the observation's shape (float32).
        return_rms: statistics of the discounted return, scalar :class:`RunningMeanStd` (float32).
    """

    obs_rms: RunningMeanStd
    return_rms: RunningMeanStd

    @property
    def reward_scaler(self) -> None:
        """None: each env's discounted return lives on its actor only (its episode is lost on resume)."""
        return None


class SharedStatistics:
    """The run's statistics: each produced trajectory's delta is merged in (:meth:`add`, from any
    thread) and the learner publishes a copy with each params version (:meth:`published`).

    Args:
        obs_shape: one observation's shape.
        restored: a :class:`HostNormStats` from a checkpoint to continue from (None: the prior).
        gather: several processes: ``f(values (K,) float64) -> (num_processes, K) float64``, every
            process's values in process order (a collective,
            :func:`~tianji_jax.runtime.layouts.collectives.make_process_gather`); deltas then wait in
            :attr:`pending` until :meth:`exchange`. None: one process (deltas merge at once).

    Attributes:
        obs, ret: :class:`MeanStd` of observations and of discounted returns.
        pending: with ``gather``, ``{"obs", "ret"}``: this process's deltas since the last exchange.
        merged_steps: per actor id, the observations whose statistics were merged (tests compare
            with a reference over the same observations).
    """

    def __init__(self, obs_shape: tuple[int, ...], restored: Any = None, gather: Any = None):
        if restored is None:
            self.obs, self.ret = MeanStd.prior(obs_shape), MeanStd.prior(())
        else:
            self.obs, self.ret = MeanStd.from_running(restored.obs_rms), MeanStd.from_running(restored.return_rms)
        self.obs_shape, self._gather = tuple(obs_shape), gather
        self.pending = {"obs": MeanStd.empty(self.obs_shape), "ret": MeanStd.empty(())}
        self.merged_steps: dict[int, int] = {}
        self._lock = threading.Lock()

    def add(self, delta: dict, actor_id: int) -> None:
        """Merge one trajectory's ``delta`` (:meth:`HostNormalizer.take_delta`) from actor ``actor_id``
        (into :attr:`pending` with several processes)."""
        with self._lock:
            if self._gather is None:
                self.obs = self.obs.merge(delta["obs"])
                self.ret = self.ret.merge(delta["ret"])
            else:
                self.pending = {k: self.pending[k].merge(delta[k]) for k in ("obs", "ret")}
            self.merged_steps[actor_id] = self.merged_steps.get(actor_id, 0) + int(round(delta["obs"].count))

    def exchange(self) -> None:
        """Several processes: merge every process's :attr:`pending` delta into the run's statistics,
        in process order (the same arithmetic on every process, so the same result everywhere), and
        start new pending deltas. A collective: every process calls it at the same point of the
        run (right after each update). Nothing to do with one process."""
        if self._gather is None:
            return
        with self._lock:
            mine, self.pending = self.pending, {"obs": MeanStd.empty(self.obs_shape), "ret": MeanStd.empty(())}
        size = int(np.prod(self.obs_shape, dtype=np.int64))
        rows = self._gather(np.concatenate([[mine["obs"].count], mine["obs"].mean.ravel(), mine["obs"].var.ravel(),
                                            [mine["ret"].count, float(mine["ret"].mean), float(mine["ret"].var)]]))
        with self._lock:
            for row in rows:
                mean, var = row[1:1 + size], row[1 + size:1 + 2 * size]
                self.obs = self.obs.merge(MeanStd(mean.reshape(self.obs_shape).copy(),
                                                  var.reshape(self.obs_shape).copy(), float(row[0])))
                self.ret = self.ret.merge(MeanStd(np.asarray(row[-2]), np.asarray(row[-1]), float(row[-3])))

    def published(self) -> dict:
        """``{"obs": MeanStd, "ret": MeanStd}``, copies (what actors continue from)."""
        with self._lock:
            return {"obs": self.obs.copy(), "ret": self.ret.copy()}

    def state(self) -> Any:
        """The :class:`HostNormStats` of the current statistics (float32, for checkpoints and evaluation)."""
        return self.as_state(self.published())

    @staticmethod
    def as_state(published: dict) -> Any:
        """The :class:`HostNormStats` (float32) of ``published`` (:meth:`published`)."""
        return HostNormStats(published["obs"].to_running(), published["ret"].to_running())


class HostNormalizer:
    """One host actor's normalisation: wraps each :class:`HostStep` its env returns.

    Args:
        num_envs: ``N``, the actor's envs (ids ``0 .. N-1``).
        obs_shape: one observation's shape.
        gamma: discount of the return whose std scales rewards.
        normalize_observations: normalise ``obs`` / ``final_obs`` (then float32).
        scale_rewards: scale ``reward``.
        raw_tail: the observation's last ``raw_tail`` entries pass through raw (the env's action
            mask: :meth:`for_config` passes the spec's ``action_mask_size``).

    Attributes:
        obs, ret: the :class:`MeanStd` the actor acts with (the published ones plus what it folded
            in since).
        returns: ``(N,)`` float64 discounted return of each env's episode in progress.
    """

    def __init__(self, num_envs: int, obs_shape: tuple[int, ...], gamma: float, normalize_observations: bool,
                 scale_rewards: bool, raw_tail: int = 0):
        self.normalize_observations, self.scale_rewards, self.gamma = normalize_observations, scale_rewards, gamma
        self.raw_tail = int(raw_tail)
        self.obs_shape = tuple(obs_shape)
        self.obs, self.ret = MeanStd.prior(self.obs_shape), MeanStd.prior(())
        self._delta_obs, self._delta_ret = MeanStd.empty(self.obs_shape), MeanStd.empty(())
        self.returns = np.zeros(num_envs, np.float64)

    @classmethod
    def for_config(cls, config: Any) -> "HostNormalizer | None":
        """The normaliser ``config`` asks for (``normalize_observations`` / ``scale_rewards``), or None;
        its env's action mask (``env_spec.action_mask_size`` trailing entries) passes through raw."""
        norm, scale = bool(getattr(config, "normalize_observations", False)), bool(getattr(config, "scale_rewards", False))
        if not (norm or scale):
            return None
        spec = config.env_spec
        return cls(config.num_envs, spec.observation_space.shape, config.gamma, norm, scale, spec.action_mask_size)

    def __call__(self, step: HostStep) -> HostStep:
        """``step`` with normalised ``obs``/``final_obs`` (float32) and scaled ``reward``, after folding
        its observations (every row) and its rows' discounted returns (valid rows) into the statistics."""
        changes: dict[str, Any] = {}
        if self.normalize_observations:
            self.obs.update(step.obs)
            self._delta_obs.update(step.obs)
            obs = self.obs.normalize(step.obs, self.raw_tail)
            changes["obs"] = obs
            changes["final_obs"] = obs if step.final_obs is step.obs else self.obs.normalize(step.final_obs,
                                                                                             self.raw_tail)
        if self.scale_rewards:
            rows = np.flatnonzero(step.valid)
            ids = step.env_id[rows]
            returns = self.returns[ids] * self.gamma + step.reward[rows]
            self.ret.update(returns)
            self._delta_ret.update(returns)
            done = step.terminated[rows] | step.truncated[rows]
            self.returns[ids] = np.where(done, 0.0, returns)
            reward = np.zeros_like(step.reward, np.float32)
            reward[rows] = np.clip(step.reward[rows] / np.sqrt(self.ret.var + _EPS), -CLIP, CLIP)
            changes["reward"] = reward
        return replace(step, **changes)

    def take_delta(self) -> dict:
        """``{"obs": MeanStd, "ret": MeanStd}``: what was folded in since the last call (sent with a
        trajectory); starts a new delta."""
        out = {"obs": self._delta_obs, "ret": self._delta_ret}
        self._delta_obs, self._delta_ret = MeanStd.empty(self.obs_shape), MeanStd.empty(())
        return out

    def sync(self, published: dict) -> None:
        """Continue from the run's statistics ``published`` (:meth:`SharedStatistics.published`):
        the actor's own statistics since its last trajectory are folded in again on top."""
        self.obs = published["obs"].merge(self._delta_obs)
        self.ret = published["ret"].merge(self._delta_ret)
