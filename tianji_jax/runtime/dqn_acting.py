"""What a DQN actor computes besides its Q-network: exact n-step transitions across rollout
chunks (:func:`window_transitions`, shared by gymnax actors, host actors and the Ray worker) and
each env's exploration epsilon (:func:`actor_epsilons`: the linear schedule of Mnih et al. 2015 or
Ape-X's fixed per-env epsilons, Horgan et al. 2018). Pure functions; re-exported by
:mod:`tianji_jax.runtime.dqn_parts`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from tianji_jax.algos import dqn
from tianji_jax.config import DQNConfig

__all__ = ["FRAME_KEYS", "HISTORY_KEYS", "window_transitions", "actor_epsilons"]


FRAME_KEYS = ("obs", "final_frame", "action", "reward", "terminated", "truncated", "policy_version", "start")
"""Keys of a host actor's frame chunk (:meth:`DQNParts.insert_frames`)."""


HISTORY_KEYS = ("obs", "action", "reward", "terminated", "truncated", "final_obs", "policy_version", "valid")
"""Keys of an n-step window (:attr:`DQNActorState.history`, the ``steps`` of :func:`window_transitions`)."""


def window_transitions(history: dict, steps: dict, gamma: float, n: int, gap: jax.Array | None = None
                       ) -> tuple[dqn.Transition, jax.Array, jax.Array, dict]:
    """Exact n-step transitions across rollout chunks: prepend the last ``H = n - 1`` steps of the
    previous chunk to the new ``T`` steps and build the transitions that start at the window's
    oldest ``T`` steps (each sees ``n`` future steps or its episode end), keeping the newest ``H``
    steps for the next chunk. Every step is inserted exactly once, ``H`` steps late; chunk
    boundaries neither lose nor duplicate transitions. Pure; jit it.

    Args:
        history: dict with keys :data:`HISTORY_KEYS`, leaves ``(H, N, ...)``: ``obs`` /
            ``final_obs`` (observation dtype, never cast), ``action`` / ``policy_version``
            (int32), ``reward`` (float32), ``terminated`` / ``truncated`` / ``valid`` (bool; a
            slot not filled yet has ``valid=False``).
        steps: the same keys, leaves ``(T, N, ...)``: the chunk's consecutive steps of each env
            (column ``e`` continues column ``e`` of ``history``), ``final_obs[t]`` the true
            successor of step ``t``.
        gamma: discount in [0, 1].
        n: static int ``>= 1``.
        gap: optional ``(N,)`` bool: env ``e``'s stream has a gap between ``history`` and
            ``steps`` (steps dropped in between). Its history windows then end at the last
            history step, which is treated as a truncation: those transitions bootstrap from its
            true successor ``final_obs`` with ``discount = gamma^k`` over the ``k < n`` steps they
            saw (a valid k-step target), or 0 if they terminated; episode statistics are unaffected.

    Returns:
        ``(items, item_version, mask, new_history)``: ``items`` a
        :class:`~tianji_jax.algos.dqn.Transition` with leaves ``(T * N, ...)`` (time-major
        flattening); ``item_version`` ``(T * N,)`` int32, the version each transition's first
        step was acted with; ``mask`` ``(T * N,)`` bool (False for unfilled slots);
        ``new_history`` leaves ``(H, N, ...)``.
    """
    t = steps["reward"].shape[0]
    h = history["reward"].shape[0]
    if h and gap is not None:
        cut = history["truncated"].at[h - 1].set(history["truncated"][h - 1] | gap)
        history = {**history, "truncated": cut}
    window = {k: (jnp.concatenate([history[k], steps[k]], axis=0) if h else steps[k]) for k in HISTORY_KEYS}
    trans = dqn.n_step_transitions(window["obs"], window["action"], window["reward"], window["terminated"],
                                   window["truncated"], window["final_obs"], gamma, n)
    n_envs = steps["reward"].shape[1]
    flat = lambda x: x[:t].reshape((t * n_envs, *x.shape[2:]))  # noqa: E731 - starts 0..T-1 of the window
    new_history = {k: v[t:] for k, v in window.items()}  # the last H steps
    return jax.tree.map(flat, trans), flat(window["policy_version"]), flat(window["valid"]), new_history


def actor_epsilons(config: DQNConfig, env_steps: int, actor_id: int) -> np.ndarray:
    """``(num_envs,)`` float32 exploration epsilons of actor ``actor_id``'s envs (async runtime).

    ``epsilon_schedule='linear'``: every env gets ``epsilon_start + (epsilon_end - epsilon_start) *
    min(1, env_steps / epsilon_decay_steps)`` (Mnih et al. 2015), ``env_steps`` counting the env
    steps of all actors together. ``'apex'``: fixed Ape-X epsilons (Horgan et al. 2018, sec. 4)
    ``eps_i = apex_epsilon^(1 + apex_alpha * i / (N - 1))`` with ``i = actor_id * num_envs + e``
    over ``N = num_actors * num_envs`` envs (``N = 1``: ``apex_epsilon``); ``env_steps`` is unused.

    Raises:
        ValueError: ``actor_id`` outside ``[0, num_actors)``.
    """
    if not 0 <= actor_id < config.num_actors:
        raise ValueError(f"actor_id={actor_id} must be in [0, num_actors={config.num_actors})")
    n = config.num_envs
    if config.epsilon_schedule == "apex":
        eps = dqn.apex_epsilons(config.num_actors * n, config.apex_epsilon, config.apex_alpha)
        return np.asarray(eps, np.float32)[actor_id * n:(actor_id + 1) * n]
    frac = min(1.0, max(0.0, env_steps / config.epsilon_decay_steps))
    eps = config.epsilon_start + (config.epsilon_end - config.epsilon_start) * frac
    return np.full((n,), eps, np.float32)
