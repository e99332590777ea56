"""Anakin mode: act, env step, GAE and PPO update fused into one compiled loop on one device.

``make_train(config)`` returns a :class:`PPOAnakin` whose ``init(key)`` builds a train state and
whose call runs a compiled chunk of ``U`` updates: ``state -> (state, metrics)`` with every metric
shaped ``(U,)``. Both are pure, so ``jax.vmap`` over seeds works on them (Hessel et al. 2021,
"Podracer architectures for scalable RL", the Anakin pattern).
"""

from __future__ import annotations

import threading
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from tianji_jax.algos import distributions
from tianji_jax.algos.normalization import RewardScaler, RunningMeanStd
from tianji_jax.algos.ppo import PPOBatch, gae, make_optimizer, ppo_update
from tianji_jax.config import PPOConfig
from tianji_jax.envs.gymnax_env import GymnaxVecEnv, VecEnvState
from tianji_jax.networks import ActorCritic

__all__ = ["PPOTrainState", "PPOAnakin", "make_train", "make_network"]


@struct.dataclass
class PPOTrainState:
    """Everything a PPO run needs to continue (one seed; vmapped runs add a leading axis).

    Attributes:
        params: ActorCritic params.
        opt_state: optax state (holds the step count that positions the lr schedule).
        env_state: :class:`~tianji_jax.envs.gymnax_env.VecEnvState` of the N training envs.
        obs: ``(N, *obs_shape)`` current raw observations.
        key: PRNG key of the run.
        obs_rms: running observation statistics (updated only if observation normalisation is on).
        reward_scaler: discounted-return statistics (updated only if reward scaling is on).
        update_count: int32 scalar, updates done; equals the policy version in Anakin mode.
    """

    params: Any
    opt_state: Any
    env_state: VecEnvState
    obs: jax.Array
    key: jax.Array
    obs_rms: RunningMeanStd
    reward_scaler: RewardScaler
    update_count: jax.Array


def make_network(config: PPOConfig) -> ActorCritic:
    """The ActorCritic for ``config``'s env (categorical for Discrete, Gaussian for Box)."""
    spec = config.env_spec
    continuous = spec.action_kind == "continuous"
    action_dim = spec.action_space.shape[0] if continuous else spec.action_space.n
    return ActorCritic(action_dim=action_dim, continuous=continuous,
                       hidden_sizes=tuple(config.hidden_sizes), activation=config.activation)


class PPOAnakin:
    """Compiled Anakin PPO for one config. Build it with :func:`make_train`.

    Attributes:
        config: the :class:`PPOConfig`.
        updates_per_chunk: ``U``, updates per call.
        init: jitted ``key -> PPOTrainState``.
        chunk: jitted ``PPOTrainState -> (PPOTrainState, metrics)``; metrics is a dict of ``(U,)``
            arrays: ``episode_return_sum``, ``episode_length_sum`` (float32) and ``episode_count``
            (int32) over the episodes that ended during each update's rollout, and the loss
            metrics of :func:`~tianji_jax.algos.ppo.ppo_loss` plus ``grad_norm``.
    """

    def __init__(self, config: PPOConfig, updates_per_chunk: int):
        if isinstance(updates_per_chunk, bool) or not isinstance(updates_per_chunk, int) or updates_per_chunk < 1:
            raise ValueError(f"updates_per_chunk must be an int >= 1, got {updates_per_chunk!r}")
        self.config = config
        self.updates_per_chunk = updates_per_chunk
        spec = config.env_spec
        self.continuous = spec.action_kind == "continuous"
        self.env = GymnaxVecEnv(spec, config.num_envs)
        self.network = make_network(config)
        self.tx = make_optimizer(
            config.learning_rate, config.max_grad_norm,
            config.num_updates if config.anneal_lr else None,
            config.update_epochs * config.num_minibatches)
        if self.continuous:
            self._low = jnp.asarray(spec.action_space.low, jnp.float32)
            self._high = jnp.asarray(spec.action_space.high, jnp.float32)
        self.init = jax.jit(self._init)
        self.chunk = jax.jit(self._chunk)

    def __call__(self, state: PPOTrainState) -> tuple[PPOTrainState, dict[str, jax.Array]]:
        """Run one compiled chunk of ``U`` updates (same as ``self.chunk``)."""
        return self.chunk(state)

    # -- pure pieces ------------------------------------------------------------------------------
    def apply(self, params: Any, obs: jax.Array):
        """Network forward: ``obs (B, *obs_shape)`` -> ``(actor_out, value (B,))``."""
        return self.network.apply(params, obs)

    def env_action(self, action: jax.Array) -> jax.Array:
        """The action sent to the env: clipped to the Box bounds for continuous actions."""
        return jnp.clip(action, self._low, self._high) if self.continuous else action

    def _init(self, key: jax.Array) -> PPOTrainState:
        cfg = self.config
        key, k_net, k_env = jax.random.split(key, 3)
        env_state, obs = self.env.reset(k_env)
        params = self.network.init(k_net, obs)
        return PPOTrainState(
            params=params,
            opt_state=self.tx.init(params),
            env_state=env_state,
            obs=obs,
            key=key,
            obs_rms=RunningMeanStd.create(self.env.observation_space.shape),
            reward_scaler=RewardScaler.create(cfg.num_envs),
            update_count=jnp.zeros((), jnp.int32),
        )

    def _rollout(self, state: PPOTrainState):
        cfg = self.config

        def step(carry, _):
            env_state, obs, key, obs_rms, scaler = carry
            key, k_act, k_env = jax.random.split(key, 3)
            if cfg.normalize_observations:
                obs_rms = obs_rms.update(obs)
                obs_in = obs_rms.normalize(obs)
            else:
                obs_in = obs
            actor_out, value = self.apply(state.params, obs_in)
            action = distributions.sample(k_act, actor_out, self.continuous)
            log_prob = distributions.log_prob(actor_out, action, self.continuous)
            env_state, ts = self.env.step(k_env, env_state, self.env_action(action))
            reward = ts.reward
            if cfg.scale_rewards:
                scaler, reward = scaler.scale(reward, ts.done, cfg.gamma)
            final_obs = obs_rms.normalize(ts.final_obs) if cfg.normalize_observations else ts.final_obs
            transition = {
                "obs": obs_in, "action": action, "log_prob": log_prob, "value": value, "reward": reward,
                "terminated": ts.terminated, "truncated": ts.truncated, "final_obs": final_obs,
                "episode_return": ts.episode_return, "episode_length": ts.episode_length, "done": ts.done,
            }
            return (env_state, ts.obs, key, obs_rms, scaler), transition

        carry = (state.env_state, state.obs, state.key, state.obs_rms, state.reward_scaler)
        (env_state, obs, key, obs_rms, scaler), traj = jax.lax.scan(step, carry, None, length=cfg.num_steps)
        return state.replace(env_state=env_state, obs=obs, key=key, obs_rms=obs_rms, reward_scaler=scaler), traj

    def _update(self, state: PPOTrainState, _):
        cfg = self.config
        state, traj = self._rollout(state)
        last_obs = state.obs_rms.normalize(state.obs) if cfg.normalize_observations else state.obs
        _, last_value = self.apply(state.params, last_obs)
        t, n = cfg.num_steps, cfg.num_envs
        flat_final = traj["final_obs"].reshape((t * n, *traj["final_obs"].shape[2:]))
        _, final_values = self.apply(state.params, flat_final)
        advantages, returns = gae(traj["reward"], traj["value"], last_value, final_values.reshape((t, n)),
                                  traj["terminated"], traj["truncated"], cfg.gamma, cfg.gae_lambda)
        flat = lambda x: x.reshape((t * n, *x.shape[2:]))  # noqa: E731
        batch = PPOBatch(obs=flat(traj["obs"]), actions=flat(traj["action"]), log_probs=flat(traj["log_prob"]),
                         values=flat(traj["value"]), advantages=flat(advantages), returns=flat(returns))
        key, k_update = jax.random.split(state.key)
        params, opt_state, loss_metrics = ppo_update(
            k_update, state.params, state.opt_state, batch, apply_fn=self.apply, tx=self.tx,
            update_epochs=cfg.update_epochs, num_minibatches=cfg.num_minibatches,
            loss_kwargs=dict(continuous=self.continuous, clip_eps=cfg.clip_eps, vf_coef=cfg.vf_coef,
                             ent_coef=cfg.ent_coef, clip_value_loss=cfg.clip_value_loss,
                             normalize_advantages=cfg.normalize_advantages))
        metrics = {
            "episode_return_sum": jnp.sum(traj["episode_return"]),
            "episode_length_sum": jnp.sum(traj["episode_length"]).astype(jnp.float32),
            "episode_count": jnp.sum(traj["done"]).astype(jnp.int32),
            **loss_metrics,
        }
        state = state.replace(params=params, opt_state=opt_state, key=key, update_count=state.update_count + 1)
        return state, metrics

    def _chunk(self, state: PPOTrainState):
        return jax.lax.scan(self._update, state, None, length=self.updates_per_chunk)


_CACHE: dict[tuple[PPOConfig, int], PPOAnakin] = {}
_CACHE_LOCK = threading.Lock()


def compile_key(config: PPOConfig) -> PPOConfig:
    """``config`` with the fields that do not change compiled code (``seed``, ``stop_at_return``)
    set to their defaults: equal keys share compiled functions."""
    return config.replace(seed=0, stop_at_return=None)


def make_train(config: PPOConfig, updates_per_chunk: int | None = None) -> PPOAnakin:
    """Build (or fetch from the per-process cache) the compiled Anakin PPO for ``config``.

    Args:
        config: a validated :class:`PPOConfig` (gymnax env).
        updates_per_chunk: updates ``U`` per compiled call; default ``config.updates_per_chunk``.

    Returns:
        A :class:`PPOAnakin` (its ``config`` has ``seed=0``: the seed enters through ``init``'s key);
        ``trainer.init(key)`` gives the state, ``trainer(state)`` runs ``U``
        updates. Configs equal up to ``seed`` and ``stop_at_return`` share one
        object, so a second run in a process (any seed) compiles nothing.

    Raises:
        ValueError: ``updates_per_chunk < 1``.
        TypeError: ``config`` is not a :class:`PPOConfig`.

    Example::

        trainer = make_train(PPOConfig(), updates_per_chunk=3)
        states = jax.vmap(trainer.init)(jax.random.split(jax.random.key(0), 4))
        states, metrics = jax.vmap(trainer.chunk)(states)   # metrics: (4, 3) arrays
    """
    if not isinstance(config, PPOConfig):
        raise TypeError(f"config must be a PPOConfig, got {type(config).__name__}")
    u = config.updates_per_chunk if updates_per_chunk is None else updates_per_chunk
    key = (compile_key(config), u)
    with _CACHE_LOCK:
        if key not in _CACHE:
            _CACHE[key] = PPOAnakin(key[0], u)
        return _CACHE[key]


def host_metrics(metrics: dict[str, Any]) -> dict[str, np.ndarray]:
    """Move a chunk's metrics to host numpy arrays (one device-to-host transfer)."""
    return {k: np.asarray(v) for k, v in jax.device_get(metrics).items()}
