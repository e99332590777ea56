"""A compiled host rollout: the policy and envpool's own XLA step in one jitted loop.

A :class:`~tianji_jax.runtime.actors.host_actor.HostActor` normally runs one jitted policy call per env
step from Python and steps the env between them; on a CPU device that call's fixed cost (dispatch
and tiny-op overhead, 100-150 microseconds even for a 64x64 MLP) caps an actor at a fraction of
what envpool can step. envpool exposes its step as an XLA custom call (``env.xla()``); with it,
:class:`EnvpoolRollout` runs ``n`` steps of "act, step the envs" as one ``lax.fori_loop`` in one
jitted call, and the host only assembles the block into trajectories
(:meth:`~tianji_jax.runtime.actors.chunker.TrajectoryChunker.record_block`).

What the block computes is what the Python loop computes, step for step: the same acting function
and key stream, the same env seeds and actions, and the auto-reset bookkeeping of
:mod:`tianji_jax.envs.host` (a step is valid unless the env's previous step was done; episode
return and length accumulate over valid steps and are reported where an episode for statistics
ends: a game over for Atari, else any done). The only difference is that episode returns
accumulate in float32 here (float64 on the Python path), which matters only for non-integer
rewards summed over very long episodes.

When it applies (:func:`compiled_rollout_unsupported` gives the reason otherwise): an envpool env
in sync mode with no host wrapper, latency or dict observations around it, an action dtype JAX
holds without ``jax_enable_x64`` for every array the step takes or gives (MuJoCo's float64 actions
and observations are excluded: envpool would write float64 into float32 buffers), an
actor device on the CPU (envpool's custom call is registered for the CPU), a feed-forward policy
and no host-side normalisation (the on-policy actors' statistics are updated per step on the host;
replay actors act on the learner's published statistics and are eligible). A replay actor's
exploration parameters (DQN's epsilons) are read once per block, where the Python loop reads them
per step; both read the run's env steps, which advance when a chunk is inserted, so within one
rollout they change only when another actor's chunk arrives meanwhile.

Cost: envpool's custom call names the env instance, so each actor compiles its own block program
once (about 0.6 s for CartPole's MLP policy on a CPU), and the persistent compilation cache
cannot share it across actors, runs or processes.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

__all__ = ["EnvpoolRollout", "compiled_rollout_unsupported"]


def compiled_rollout_unsupported(env: Any, actor_device: Any, act: Callable | None, recurrent: bool,
                                 normalizer: Any) -> str | None:
    """Why ``env`` cannot be stepped by an :class:`EnvpoolRollout`, or None when it can.

    Args:
        env: the actor's host env (after its wrappers).
        actor_device: the JAX device the policy runs on.
        act: the traceable acting function (None when the actor has none, e.g. the replay actor).
        recurrent: the policy carries a core state.
        normalizer: the actor's host statistics (None when it keeps none).
    """
    from tianji_jax.envs.host import EnvpoolVecEnv

    if act is None:
        return "the actor has no traceable acting function"
    if type(env) is not EnvpoolVecEnv:
        return f"the env is a {type(env).__name__} (wrapped or not envpool), not a bare EnvpoolVecEnv"
    if env.is_async:
        return "envpool async mode (env_batch_size < num_envs)"
    if env.obs_keys is not None:
        return "dict observations are flattened on the host"
    if getattr(actor_device, "platform", "cpu") != "cpu":
        return f"the actor device is {actor_device.platform}; envpool's XLA step is used on the CPU only"
    if recurrent:
        return "recurrent policies keep their core state on the host"
    if normalizer is not None:
        return "host normalisation updates its statistics per step on the host"
    spec = env._env.spec  # every array envpool's XLA step reads or writes must exist in JAX as it is
    arrays = [("action", k, v) for k, v in spec.action_array_spec.items()] + \
             [("state", k, v) for k, v in spec.state_array_spec.items()]
    for side, name, arr in arrays:
        dtype = np.dtype(arr.dtype)
        if jax.dtypes.canonicalize_dtype(dtype) != dtype:
            what = "actions" if side == "action" else f"{name!r} arrays"
            return f"envpool takes or gives {dtype.name} {what}, which JAX holds only with jax_enable_x64"
    return None


def _action_dtype(env: Any) -> Any:
    """The dtype envpool's step takes for the action array (checked once by envpool, then trusted)."""
    return env._env._spec._action_spec[-1][0]  # what envpool's own ``_from`` casts numpy actions to


class EnvpoolRollout:
    """``n`` env steps of an envpool sync-mode env and its policy, one jitted call per block.

    Args:
        env: an :class:`~tianji_jax.envs.host.EnvpoolVecEnv` in sync mode, freshly :meth:`reset`
            (see :func:`compiled_rollout_unsupported`).
        first: the :class:`~tianji_jax.envs.host.HostStep` its :meth:`reset` returned.
        act: ``act(params, obs (N, *obs), key, arg) -> (env_action, action, log_prob (N,),
            value (N,), key)``, traceable: an on-policy agent's
            :meth:`~tianji_jax.algos.on_policy.OnPolicyAgent.act` (``arg`` the policy version), or
            a replay agent's :meth:`~tianji_jax.algos.replay_agent.ReplayAgent.host_act` with zero
            log-probs and values (``arg`` the ``(N,)`` exploration parameters, fixed for a block).
        max_steps: ``T``, the most steps one call takes (its output buffers are ``(T, N, ...)``).
        device: the CPU device the block runs on.

    After construction the env belongs to this object: do not step it from Python any more (its
    Python-side bookkeeping is no longer updated).
    """

    def __init__(self, env: Any, first: Any, act: Callable, max_steps: int, device: Any):
        handle, _recv, _send, step = env._env.xla()
        n_envs, t = env.num_envs, int(max_steps)
        action_dtype = _action_dtype(env)
        put = lambda x: jax.device_put(x, device)  # noqa: E731
        self.num_envs, self.max_steps = n_envs, t
        obs = np.asarray(first.obs)
        self._state = tuple(put(x) for x in (
            handle, obs,
            np.asarray(first.terminated | first.truncated, bool),  # the next step is a reset step
            np.zeros(n_envs, np.float32), np.zeros(n_envs, np.int32)))  # episode return and length so far

        def block(params, state, key, arg, n):
            h, obs, expect_reset, ret, length = state
            probe = jax.eval_shape(act, params, obs, key, arg)  # the acting outputs' shapes
            bufs = {
                "obs": jnp.zeros((t, *obs.shape), obs.dtype),
                "action": jnp.zeros((t, *probe[1].shape), probe[1].dtype),
                "log_prob": jnp.zeros((t, n_envs), jnp.float32),
                "value": jnp.zeros((t, n_envs), jnp.float32),
                "reward": jnp.zeros((t, n_envs), jnp.float32),
                "terminated": jnp.zeros((t, n_envs), bool),
                "truncated": jnp.zeros((t, n_envs), bool),
                "final_obs": jnp.zeros((t, *obs.shape), obs.dtype),
                "episode_return": jnp.zeros((t, n_envs), jnp.float32),
                "episode_length": jnp.zeros((t, n_envs), jnp.int32),
                "valid": jnp.zeros((t, n_envs), bool),
            }

            def body(j, carry):
                h, obs, expect_reset, ret, length, key, b = carry
                env_action, action, log_prob, value, key = act(params, obs, key, arg)
                h, (nxt, reward, terminated, truncated, info) = step(h, env_action.astype(action_dtype))
                ids = info["env_id"]  # sync mode returns every env; put each row at its env's index
                order = lambda x: jnp.zeros_like(x).at[ids].set(x)  # noqa: E731
                nxt, reward, terminated, truncated = (order(x) for x in (nxt, reward, terminated, truncated))
                stat_reward = order(info["reward"]) if "reward" in info else reward
                episode_end = (truncated | (order(info["terminated"]) != 0) if "terminated" in info
                               else jnp.ones_like(truncated))
                done = terminated | truncated
                valid = ~expect_reset
                ret = ret + jnp.where(valid, stat_reward, 0.0)
                length = length + valid.astype(jnp.int32)
                end = valid & done & episode_end
                row = {"obs": obs, "action": action, "log_prob": log_prob, "value": value,
                       "reward": reward.astype(jnp.float32), "terminated": terminated, "truncated": truncated,
                       "final_obs": nxt, "episode_return": jnp.where(end, ret, 0.0),
                       "episode_length": jnp.where(end, length, 0), "valid": valid}
                b = {k: b[k].at[j].set(row[k].astype(b[k].dtype)) for k in b}
                ret, length = jnp.where(end, 0.0, ret), jnp.where(end, 0, length)
                return h, nxt, done, ret, length, key, b

            h, obs, expect_reset, ret, length, key, bufs = lax.fori_loop(
                0, n, body, (h, obs, expect_reset, ret, length, key, bufs))
            return (h, obs, expect_reset, ret, length), key, bufs

        self._block = jax.jit(block)

    def __call__(self, params: Any, key: jax.Array, arg: Any, n: int) -> tuple[jax.Array, dict[str, np.ndarray]]:
        """Take ``n`` steps (``1 <= n <= T``) acting with ``params`` and ``act``'s last argument ``arg``.

        Returns:
            ``(key, block)``: the advanced key, and host numpy arrays ``(n, N, ...)``: ``obs`` (acted
            on), ``action``, ``log_prob``, ``value``, ``reward``, ``terminated``, ``truncated``,
            ``final_obs``, ``episode_return``, ``episode_length`` (non-zero where an episode for
            statistics ended) and ``valid`` (False where the step was a reset step: its action was
            ignored and it is no transition).

        Raises:
            ValueError: ``n`` outside ``[1, T]``.
        """
        if not 1 <= n <= self.max_steps:
            raise ValueError(f"n={n}: must be in [1, max_steps={self.max_steps}]")
        self._state, key, bufs = self._block(params, self._state, key, arg, np.int32(n))
        return key, {k: v[:n] for k, v in jax.device_get(bufs).items()}
