"""Deterministic-policy evaluation on separate gymnax envs.

Each of ``M`` evaluation envs plays exactly one episode with the deterministic policy (argmax for
Discrete, per-factor argmax for MultiDiscrete, the Gaussian mean for Box) inside one compiled ``while_loop`` that stops when every
episode has ended or after ``max_steps_in_episode`` steps. A recurrent policy
(:func:`make_recurrent_evaluate`) carries its core's state through the loop, zeroed per env after
the step that ended its episode.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from tianji_jax.caches import register
from tianji_jax.algos import distributions
from tianji_jax.algos.normalization import RunningMeanStd
from tianji_jax.envs.gymnax_env import GymnaxVecEnv
from tianji_jax.envs.registry import EnvSpec

__all__ = ["make_evaluate", "make_policy_evaluate", "make_recurrent_evaluate", "EvalResult"]


class EvalResult(dict):
    """``{"returns": (M,) float64, "lengths": (M,) int64}`` plus ``mean``/``std`` properties."""

    @property
    def mean(self) -> float:
        """Mean episodic return over the ``M`` episodes (Python float)."""
        return float(np.mean(self["returns"]))

    @property
    def std(self) -> float:
        """Population std (``ddof=0``) of the episodic returns (Python float)."""
        return float(np.std(self["returns"]))


_CACHE: dict[Any, Callable] = register({})
_LOCK = threading.Lock()


def _cached(kind: str | None, key: Any, build: Callable[[], Callable]) -> Callable:
    """The compiled function cached under ``(kind, key)`` (under ``key`` itself when ``kind`` is None),
    built by ``build()`` on a miss; ``key`` None: always ``build()``, nothing cached. Two threads that
    miss together both build, and both get the first one stored."""
    if key is None:
        return build()
    full_key = key if kind is None else (kind, key)
    with _LOCK:
        if full_key in _CACHE:
            return _CACHE[full_key]
    fn = build()
    with _LOCK:
        return _CACHE.setdefault(full_key, fn)


def _mode_action(spec: EnvSpec, continuous: bool) -> Callable[[Any], jax.Array]:
    """``action_of(actor_out)``: the deterministic action
    (:func:`~tianji_jax.algos.distributions.mode`), clipped to the Box bounds of ``spec`` when
    ``continuous`` (the Gaussian mean), else the argmax (per factor for a MultiDiscrete ``spec``)."""
    if not continuous:
        nvec = tuple(spec.action_space.nvec) if spec.action_kind == "multi_discrete" else None
        return lambda actor_out: distributions.mode(actor_out, False, nvec)
    low = jnp.asarray(spec.action_space.low, jnp.float32)
    high = jnp.asarray(spec.action_space.high, jnp.float32)
    return lambda actor_out: jnp.clip(distributions.mode(actor_out, True), low, high)


def make_evaluate(spec: EnvSpec, apply_fn: Callable, continuous: bool, num_episodes: int,
                  normalize_observations: bool, cache_key: Any = None) -> Callable:
    """Build a jitted ``evaluate(params, obs_rms, key) -> (returns (M,) float32, lengths (M,) int32)``
    (undiscounted episodic returns; lengths in env steps) with the deterministic policy
    (:func:`~tianji_jax.algos.distributions.mode`), as :func:`make_policy_evaluate`.

    Args:
        spec: the resolved gymnax env.
        apply_fn: ``apply_fn(params, obs) -> (actor_out, value)``.
        continuous: Gaussian policy (actions clipped to the Box bounds) if True, else categorical.
        num_episodes: ``M >= 1`` episodes, one per evaluation env.
        normalize_observations: normalise with ``obs_rms`` (frozen: it is read, never updated).
        cache_key: hashable key; equal keys return the same compiled function.

    Raises:
        ValueError: ``num_episodes < 1`` or an env without ``max_steps_in_episode``.
    """
    if num_episodes < 1:
        raise ValueError(f"num_episodes must be >= 1, got {num_episodes}")

    def build() -> Callable:
        action_of = _mode_action(spec, continuous)

        def act(params_and_rms: tuple[Any, RunningMeanStd], obs: jax.Array) -> jax.Array:
            params, obs_rms = params_and_rms
            obs_in = obs_rms.normalize(obs, spec.action_mask_size) if normalize_observations else obs
            actor_out, _ = apply_fn(params, obs_in)
            return action_of(actor_out)

        episodes = make_policy_evaluate(spec, act, num_episodes)  # the same episode loop as DQN's

        @jax.jit
        def evaluate(params: Any, obs_rms: RunningMeanStd, key: jax.Array):
            return episodes((params, obs_rms), key)

        return evaluate

    return _cached(None, cache_key, build)


def make_policy_evaluate(spec: EnvSpec, act_fn: Callable, num_episodes: int, cache_key: Any = None) -> Callable:
    """Build a jitted ``evaluate(params, key) -> (returns (M,) float32, lengths (M,) int32)`` for
    any deterministic policy ``act_fn(params, obs (M, *obs_shape)) -> actions (M, ...)``.

    Same protocol as :func:`make_evaluate`: each of ``M`` separate envs plays exactly one episode
    inside one compiled ``while_loop`` that stops when all have ended or after
    ``max_steps_in_episode`` steps. Used for DQN's greedy policy (``argmax_a Q``, Mnih et al. 2015).

    Args:
        spec: the resolved gymnax env.
        act_fn: deterministic policy, traceable.
        num_episodes: ``M >= 1``.
        cache_key: hashable key; equal keys return the same compiled function.

    Raises:
        ValueError: ``num_episodes < 1`` or an env without ``max_steps_in_episode``.
    """
    if num_episodes < 1:
        raise ValueError(f"num_episodes must be >= 1, got {num_episodes}")
    return _cached("policy", cache_key, lambda: jax.jit(_episode_loop(
        spec, lambda params, obs, memory, reset: (act_fn(params, obs), memory), num_episodes, None)))


def _episode_loop(spec: EnvSpec, act_fn: Callable, num_episodes: int, memory: Any) -> Callable:
    """``evaluate(params, key) -> (returns (M,) float32, lengths (M,) int32)``, not jitted: ``M`` envs
    play one episode each with ``act_fn(params, obs, memory, reset) -> (actions, memory)``;
    ``memory`` (a pytree; None for a stateless policy) starts as given and ``reset (M,)`` bool is
    True where the env's previous step ended an episode (all False at the start)."""
    if num_episodes < 1:
        raise ValueError(f"num_episodes must be >= 1, got {num_episodes}")
    env = GymnaxVecEnv(spec, num_episodes)
    max_steps = spec.max_episode_steps

    def evaluate(params: Any, key: jax.Array):
        key, k_reset = jax.random.split(key)
        env_state, obs = env.reset(k_reset)

        def cond(carry):
            *_, finished, _, _, t = carry[0]
            return (~jnp.all(finished)) & (t < max_steps)  # at most max_steps_in_episode steps

        def body(carry):
            (env_state, obs, key, finished, returns, lengths, t), (mem, reset) = carry
            key, k_step = jax.random.split(key)
            action, mem = act_fn(params, obs, mem, reset)
            env_state, ts = env.step(k_step, env_state, action)
            returns = jnp.where(finished, returns, returns + ts.reward)
            lengths = jnp.where(finished, lengths, lengths + 1)
            return (env_state, ts.obs, key, finished | ts.done, returns, lengths, t + 1), (mem, ts.done)

        carry = (env_state, obs, key, jnp.zeros((num_episodes,), bool), jnp.zeros((num_episodes,), jnp.float32),
                 jnp.zeros((num_episodes,), jnp.int32), jnp.zeros((), jnp.int32))
        (_, _, _, _, returns, lengths, _), _ = jax.lax.while_loop(
            cond, body, (carry, (memory, jnp.zeros((num_episodes,), bool))))
        return returns, lengths

    return evaluate


def make_recurrent_evaluate(spec: EnvSpec, step_fn: Callable, initial_carry: Callable, continuous: bool,
                            num_episodes: int, normalize_observations: bool, cache_key: Any = None) -> Callable:
    """:func:`make_evaluate` for a recurrent policy: a jitted ``evaluate(params, obs_rms, key) ->
    (returns (M,) float32, lengths (M,) int32)`` whose deterministic policy carries the core's state
    through each episode (from ``initial_carry(M)``), zeroed for an env after the step that ended its
    episode (each env plays one episode, so this matters only for what follows it).

    Args:
        spec: the resolved gymnax env.
        step_fn: ``step_fn(params, carry, obs (M, *obs_shape) float32, reset (M,) bool) -> (carry,
            actor_out, value)`` (e.g. :meth:`~tianji_jax.algos.on_policy.OnPolicyAgent.apply_step`).
        initial_carry: ``initial_carry(M)`` -> the zero carry of ``M`` envs.
        continuous: Gaussian policy (the mean, clipped to the Box bounds) if True, else the argmax.
        num_episodes: ``M >= 1`` episodes, one per evaluation env.
        normalize_observations: normalise with ``obs_rms`` (frozen: read, never updated).
        cache_key: hashable key; equal keys return the same compiled function.

    Raises:
        ValueError: ``num_episodes < 1`` or an env without ``max_steps_in_episode``.
    """
    if num_episodes < 1:
        raise ValueError(f"num_episodes must be >= 1, got {num_episodes}")

    def build() -> Callable:
        action_of = _mode_action(spec, continuous)

        def act(params_and_rms: tuple[Any, RunningMeanStd], obs: jax.Array, carry: Any, reset: jax.Array):
            params, obs_rms = params_and_rms
            obs_in = (obs_rms.normalize(obs, spec.action_mask_size) if normalize_observations
                      else obs.astype(jnp.float32))
            carry, actor_out, _ = step_fn(params, carry, obs_in, reset)
            return action_of(actor_out), carry

        episodes = _episode_loop(spec, act, num_episodes, initial_carry(num_episodes))

        @jax.jit
        def evaluate(params: Any, obs_rms: RunningMeanStd, key: jax.Array):
            return episodes((params, obs_rms), key)

        return evaluate

    return _cached("recurrent", cache_key, build)
