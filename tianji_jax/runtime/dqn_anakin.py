"""Anakin DQN: act, insert into replay and learn fused into one compiled loop on one device.

``make_dqn_train(config)`` returns a :class:`DQNAnakin` whose ``init(key)`` builds a
:class:`DQNTrainState` (replay buffer included) and whose ``chunk(state)`` runs ``U`` iterations
of act -> insert -> learn, donating the state so XLA updates the replay storage in place. Both are
pure, so ``jax.vmap`` over seeds works (Hessel et al. 2021, "Podracer architectures", Anakin).
Algorithm: DQN (Mnih et al. 2015) with Double-Q targets (van Hasselt et al. 2016), dueling heads
(Wang et al. 2016), prioritised replay (Schaul et al. 2016) and n-step targets as configured.
"""

from __future__ import annotations

import threading
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from tianji_jax.caches import register
from tianji_jax import replay
from tianji_jax.config import DQNConfig
from tianji_jax.config_base import not_compiled
from tianji_jax.runtime.dqn_parts import DQNActorState, DQNLearnerState, DQNParts

__all__ = ["DQNTrainState", "DQNAnakin", "make_dqn_train", "dqn_compile_key"]

_LEARN_METRICS = ("td_loss", "q_mean", "grad_norm", "policy_lag_mean", "policy_lag_max", "nonfinite_skips")
_INT_METRICS = ("policy_lag_max", "nonfinite_skips")


@struct.dataclass
class DQNTrainState:
    """Everything an Anakin DQN run needs to continue (one seed; vmapped runs add a leading axis).

    Attributes:
        actor: :class:`~tianji_jax.runtime.dqn_parts.DQNActorState` (envs, observations, n-step
            window, actor key, env steps taken).
        learner: :class:`~tianji_jax.runtime.dqn_parts.DQNLearnerState` (online and target
            params, optimizer state, learner key, policy version, gradient steps).
        replay: :class:`~tianji_jax.replay.ReplayState`, the device-resident buffer.
    """

    actor: DQNActorState
    learner: DQNLearnerState
    replay: replay.ReplayState

    @property
    def params(self) -> Any:
        """The online Q-network params."""
        return self.learner.params

    @property
    def obs_rms(self) -> None:
        """None: DQN does not normalise observations (kept for the host loop's common interface)."""
        return None

    @property
    def env_steps(self) -> jax.Array:
        """int32 env steps taken."""
        return self.actor.env_steps

    @property
    def update_count(self) -> jax.Array:
        """int32 policy version (learner blocks run)."""
        return self.learner.version


class DQNAnakin(DQNParts):
    """Compiled Anakin DQN for one config. Build it with :func:`make_dqn_train`.

    Args:
        config: a :class:`DQNConfig`.
        iterations_per_chunk: ``U >= 1``, iterations per compiled call.

    Attributes:
        config: the config.
        iterations_per_chunk: ``U``.
        init: jitted ``key -> DQNTrainState``.
        chunk: jitted ``DQNTrainState -> (DQNTrainState, metrics)`` with the state donated (the old
            state's buffers are deleted); ``metrics`` is a dict of ``(U,)`` arrays, one entry per
            iteration: ``episode_return_sum``, ``episode_length_sum`` (float32), ``episode_count``
            (int32) of the episodes that ended in the iteration's rollout, ``epsilon`` (float32,
            at its first step), ``acting_version`` (int32, the version the actor acted with, logged
            by the actor), ``env_steps`` (int32 after the iteration), ``learned`` (bool: a
            learner block ran), ``gradient_steps`` (int32 updates in the iteration: 0 or
            ``updates_per_step``), ``replay_size`` (int32), and the learner's ``td_loss``,
            ``q_mean``, ``grad_norm``, ``policy_lag_mean``, ``policy_lag_max``, ``nonfinite_skips`` (0 where
            it did not learn).

    Raises:
        ValueError: ``iterations_per_chunk < 1``.
        TypeError: ``config`` is not a :class:`DQNConfig`.
    """

    def __init__(self, config: DQNConfig, iterations_per_chunk: int):
        if (isinstance(iterations_per_chunk, bool) or not isinstance(iterations_per_chunk, int)
                or iterations_per_chunk < 1):
            raise ValueError(f"iterations_per_chunk must be an int >= 1, got {iterations_per_chunk!r}")
        super().__init__(config)
        self.iterations_per_chunk = iterations_per_chunk
        self.init = jax.jit(self._init)
        self.chunk = jax.jit(self._chunk, donate_argnums=0)

    def __call__(self, state: DQNTrainState) -> tuple[DQNTrainState, dict[str, jax.Array]]:
        """Run one compiled chunk of ``U`` iterations (same as ``self.chunk``; donates ``state``)."""
        return self.chunk(state)

    def _init(self, key: jax.Array) -> DQNTrainState:
        k_actor, k_learner = self.split_init_key(key)
        return DQNTrainState(self.init_actor(k_actor), self.init_learner(k_learner), self.init_replay())

    def _iteration(self, state: DQNTrainState, _):
        cfg = self.config
        learner = state.learner
        actor, items, item_version, mask, stats = self.rollout(learner.params, learner.version, state.actor)
        rs = self.insert(state.replay, items, item_version, mask)
        learn_now = actor.env_steps > cfg.learning_starts

        def do_learn(operand):
            lrn, rs_ = operand
            lrn, rs_, m = self.learn(lrn, rs_, actor.env_steps)
            return lrn, rs_, m

        def skip(operand):
            lrn, rs_ = operand
            zeros = {k: jnp.zeros((), jnp.int32 if k in _INT_METRICS else jnp.float32) for k in _LEARN_METRICS}
            return lrn, rs_, zeros

        learner, rs, learn_metrics = jax.lax.cond(learn_now, do_learn, skip, (learner, rs))
        metrics = {
            **stats,
            **learn_metrics,
            "acting_version": state.learner.version,
            "env_steps": actor.env_steps,
            "learned": learn_now,
            "gradient_steps": jnp.where(learn_now, cfg.updates_per_step, 0).astype(jnp.int32),
            "replay_size": rs.size,
        }
        return DQNTrainState(actor, learner, rs), metrics

    def _chunk(self, state: DQNTrainState):
        return jax.lax.scan(self._iteration, state, None, length=self.iterations_per_chunk)


_CACHE: dict[tuple[DQNConfig, int], DQNAnakin] = register({})
_CACHE_LOCK = threading.Lock()


def dqn_compile_key(config: DQNConfig) -> DQNConfig:
    """``config`` with the fields that do not change compiled code (the ``run``, ``tianji`` and
    ``layout`` field groups: :func:`~tianji_jax.config_base.not_compiled`) set to their defaults:
    equal keys share compiled functions. Host envs
    keep ``runtime='async'`` (the only runtime they allow). Per-actor epsilons are passed to the
    compiled rollout by async actors, so ``num_actors`` does not enter the key."""
    runtime = "async" if config.env_spec.on_host else "anakin"
    return config.replace(runtime=runtime, **not_compiled(config))


def make_dqn_train(config: DQNConfig, iterations_per_chunk: int | None = None) -> DQNAnakin:
    """Build (or fetch from the per-process cache) the compiled Anakin DQN for ``config``.

    Args:
        config: a validated :class:`DQNConfig` (gymnax env, Discrete actions).
        iterations_per_chunk: iterations ``U`` per compiled call; default ``config.iterations_per_chunk``.

    Returns:
        A :class:`DQNAnakin` (its ``config`` has ``seed=0``: the seed enters through ``init``'s
        key). Configs equal up to ``seed`` and ``stop_at_return`` share one object, so a second
        run in a process compiles nothing.

    Raises:
        ValueError: ``iterations_per_chunk < 1``, or ``config.runtime`` is not ``'anakin'`` (the
            async runtime's actors and learner run through :func:`tianji_jax.train`).
        TypeError: ``config`` is not a :class:`DQNConfig`.

    Example::

        trainer = make_dqn_train(DQNConfig(), iterations_per_chunk=100)
        states = jax.vmap(trainer.init)(jax.random.split(jax.random.key(0), 4))
        states, metrics = jax.jit(jax.vmap(trainer.chunk))(states)   # metrics: (4, 100) arrays
    """
    if isinstance(config, DQNConfig) and config.runtime != "anakin":
        raise ValueError(f"make_dqn_train builds the Anakin runtime only; got runtime={config.runtime!r}. Allowed: "
                         "runtime='anakin', or run the async runtime with tianji_jax.train(config)")
    return shared_dqn_train(config, iterations_per_chunk)


def shared_dqn_train(config: DQNConfig, iterations_per_chunk: int | None = None) -> DQNAnakin:
    """:func:`make_dqn_train` for a config of any ``runtime``: the async runtime shares the Anakin
    trainer's network, learner and replay initialisation and greedy policy (``tianji_jax.train``
    builds them here).

    Raises:
        ValueError / TypeError: as :func:`make_dqn_train`, the runtime aside.
    """
    if not isinstance(config, DQNConfig):
        raise TypeError(f"config must be a DQNConfig, got {type(config).__name__}")
    u = config.iterations_per_chunk if iterations_per_chunk is None else iterations_per_chunk
    key = (dqn_compile_key(config), u)
    with _CACHE_LOCK:
        if key not in _CACHE:
            _CACHE[key] = DQNAnakin(key[0], u)
        return _CACHE[key]
