"""The two halves of PPO that every runtime composes: the actor's rollout and the learner's update.

Anakin fuses them in one compiled loop; the async runtime runs them on different devices and
threads. Both use these same functions, so the ``sync`` schedule reproduces Anakin exactly.
The actor and the learner own separate PRNG streams (``ActorState.key``, ``LearnerState.key``).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from tianji_jax.algos import distributions
from tianji_jax.algos.normalization import RewardScaler, RunningMeanStd
from tianji_jax.algos.ppo import PPOBatch, gae, make_optimizer, ppo_update, vtrace
from tianji_jax.config import PPOConfig
from tianji_jax.envs.gymnax_env import GymnaxVecEnv, VecEnvState
from tianji_jax.networks import ActorCritic, check_network, choose_torso

__all__ = ["ActorState", "LearnerState", "PPOParts", "make_network"]


@struct.dataclass
class ActorState:
    """What an actor owns.

    Attributes:
        env_state: :class:`~tianji_jax.envs.gymnax_env.VecEnvState` of its ``N`` envs.
        obs: ``(N, *obs_shape)`` current raw observations.
        key: the actor's PRNG key (action sampling, env steps).
        obs_rms: running observation statistics (updated only with observation normalisation).
        reward_scaler: discounted-return statistics (updated only with reward scaling).
    """

    env_state: VecEnvState
    obs: jax.Array
    key: jax.Array
    obs_rms: RunningMeanStd
    reward_scaler: RewardScaler


@struct.dataclass
class LearnerState:
    """What the learner owns.

    Attributes:
        params: ActorCritic params.
        opt_state: optax state (its step count positions the learning-rate schedule).
        key: the learner's PRNG key (minibatch permutations).
        version: int32 scalar policy version = number of parameter publications (one per update).
    """

    params: Any
    opt_state: Any
    key: jax.Array
    version: jax.Array


def make_network(config: PPOConfig) -> ActorCritic:
    """The ActorCritic for ``config``'s env (categorical for Discrete, Gaussian for Box), its torso
    chosen from the observation's layout and size (:func:`~tianji_jax.networks.choose_torso`).

    Raises:
        ValueError: the network's parameters would hold a zero-size array for this observation
            shape (:func:`~tianji_jax.networks.check_network`).
    """
    spec = config.env_spec
    continuous = spec.action_kind == "continuous"
    action_dim = spec.action_space.shape[0] if continuous else spec.action_space.n
    shape = tuple(spec.observation_shape)
    network = ActorCritic(action_dim=action_dim, continuous=continuous, hidden_sizes=tuple(config.hidden_sizes),
                          activation=config.activation, torso=choose_torso(shape), obs_shape=shape)
    check_network(network, shape, spec.observation_space.dtype)
    return network


class PPOParts:
    """Pure PPO actor and learner functions for one config (not jitted here; callers jit).

    Trajectory (``traj``) produced by :meth:`rollout`, a dict with leading axes ``(T, N)``:
    ``obs`` (as the policy saw it), ``action``, ``log_prob`` (behaviour), ``value`` (behaviour),
    ``reward`` (scaled if enabled), ``terminated``, ``truncated``, ``done`` (bool), ``final_obs``,
    ``episode_return`` / ``episode_length`` (of episodes that ended, else 0) and ``policy_version``
    (int32, the version the actor acted with); plus ``last_obs`` ``(N, *obs_shape)``.
    """

    def __init__(self, config: PPOConfig):
        self.config = config
        spec = config.env_spec
        self.continuous = spec.action_kind == "continuous"
        self.spec = spec
        self.env = GymnaxVecEnv(spec, config.num_envs) if not spec.on_host else None  # host envs: per actor
        self.network = make_network(config)
        self.tx = make_optimizer(
            config.learning_rate, config.max_grad_norm,
            config.num_updates if config.anneal_lr else None,
            config.update_epochs * config.num_minibatches)
        if self.continuous:
            self._low = jnp.asarray(spec.action_space.low, jnp.float32)
            self._high = jnp.asarray(spec.action_space.high, jnp.float32)

    def apply(self, params: Any, obs: jax.Array):
        """Network forward: ``obs (B, *obs_shape)`` -> ``(actor_out, value (B,))``."""
        return self.network.apply(params, obs)

    def env_action(self, action: jax.Array) -> jax.Array:
        """The action sent to the env: clipped to the Box bounds for continuous actions."""
        return jnp.clip(action, self._low, self._high) if self.continuous else action

    def act(self, params: Any, obs: jax.Array, key: jax.Array) -> tuple[jax.Array, ...]:
        """One policy step for a host actor: ``obs (B, *obs_shape)`` (raw, cast to float32) ->
        ``(env_action, action, log_prob (B,), value (B,), next_key)``; ``env_action`` is ``action``
        clipped to the Box bounds (continuous) and is what the env receives, ``action`` is what
        the learner's ratio is computed on."""
        key, k_act = jax.random.split(key)
        actor_out, value = self.apply(params, obs.astype(jnp.float32))
        action = distributions.sample(k_act, actor_out, self.continuous)
        log_prob = distributions.log_prob(actor_out, action, self.continuous)
        return self.env_action(action), action, log_prob, value, key

    def greedy(self, params: Any, obs: jax.Array) -> jax.Array:
        """Deterministic env action for evaluation on host envs: argmax (Discrete) or the clipped
        Gaussian mean (Box) for raw ``obs (B, *obs_shape)``."""
        actor_out, _ = self.apply(params, jnp.asarray(obs, jnp.float32))
        return self.env_action(distributions.mode(actor_out, self.continuous))

    def split_init_key(self, key: jax.Array) -> tuple[jax.Array, jax.Array]:
        """``(actor_key, learner_key)`` from a run's seed key."""
        k_actor, k_learner = jax.random.split(key)
        return k_actor, k_learner

    def init_actor(self, key: jax.Array) -> ActorState:
        """Reset the actor's envs; ``key`` becomes its PRNG stream."""
        key, k_env = jax.random.split(key)
        env_state, obs = self.env.reset(k_env)
        return ActorState(env_state, obs, key, RunningMeanStd.create(self.env.observation_space.shape),
                          RewardScaler.create(self.config.num_envs))

    def init_learner(self, key: jax.Array) -> LearnerState:
        """Initialise params and optimizer; version 0."""
        key, k_net = jax.random.split(key)
        dummy = jnp.zeros((1, *self.spec.observation_space.shape), jnp.float32)
        params = self.network.init(k_net, dummy)
        return LearnerState(params, self.tx.init(params), key, jnp.zeros((), jnp.int32))

    def rollout(self, params: Any, version: jax.Array, actor: ActorState) -> tuple[ActorState, dict]:
        """``T = num_steps`` steps of the actor's ``N`` envs with ``params`` (stamped ``version``).

        Args:
            params: ActorCritic params to act with.
            version: int32 scalar, the version of ``params``.
            actor: the actor's state (gymnax envs; host actors use :meth:`act` instead).

        Returns:
            ``(actor, traj)``: the new :class:`ActorState` (observation / reward statistics updated
            when enabled) and the trajectory of the class docstring, leaves ``(T, N, ...)``:
            ``action`` int32 ``(T, N)`` or float32 ``(T, N, A)``; ``log_prob``, ``value``,
            ``reward``, ``episode_return`` float32, ``episode_length`` / ``policy_version`` int32,
            ``terminated`` / ``truncated`` / ``done`` bool, all ``(T, N)``; ``obs`` / ``final_obs``
            ``(T, N, *obs_shape)`` (float32 when normalised); ``last_obs`` ``(N, *obs_shape)``.
        """
        cfg = self.config

        def step(carry, _):
            env_state, obs, key, obs_rms, scaler = carry
            key, k_act, k_env = jax.random.split(key, 3)
            if cfg.normalize_observations:
                obs_rms = obs_rms.update(obs)
                obs_in = obs_rms.normalize(obs)
            else:
                obs_in = obs
            actor_out, value = self.apply(params, obs_in)
            action = distributions.sample(k_act, actor_out, self.continuous)
            log_prob = distributions.log_prob(actor_out, action, self.continuous)
            env_state, ts = self.env.step(k_env, env_state, self.env_action(action))
            reward = ts.reward
            if cfg.scale_rewards:
                scaler, reward = scaler.scale(reward, ts.done, cfg.gamma)
            final_obs = obs_rms.normalize(ts.final_obs) if cfg.normalize_observations else ts.final_obs
            transition = {
                "obs": obs_in, "action": action, "log_prob": log_prob, "value": value, "reward": reward,
                "terminated": ts.terminated, "truncated": ts.truncated, "done": ts.done, "final_obs": final_obs,
                "episode_return": ts.episode_return, "episode_length": ts.episode_length,
                "policy_version": jnp.full(ts.reward.shape, version, jnp.int32),
            }
            return (env_state, ts.obs, key, obs_rms, scaler), transition

        carry = (actor.env_state, actor.obs, actor.key, actor.obs_rms, actor.reward_scaler)
        (env_state, obs, key, obs_rms, scaler), traj = jax.lax.scan(step, carry, None, length=cfg.num_steps)
        traj["last_obs"] = obs_rms.normalize(obs) if cfg.normalize_observations else obs
        return ActorState(env_state, obs, key, obs_rms, scaler), traj

    def learn(self, learner: LearnerState, traj: dict, axis_name: str | None = None
              ) -> tuple[LearnerState, dict[str, jax.Array]]:
        """One PPO update on a trajectory ``(T, N)``; the version is incremented (one publication).

        With ``axis_name`` (data-parallel learners under ``shard_map``), ``traj`` is this replica's
        shard of the env axis ``N`` (GAE runs per env column, so columns never need each other),
        each replica permutes its shard with its own key (the replicated ``LearnerState.key``
        folded with the axis index), advantage statistics are global, gradients are averaged,
        and the metrics are reduced over the axis (sums summed, maxima maxed, means averaged), so
        the returned state and metrics are identical on every replica.

        V is recomputed with the learner's current params before GAE; the ratio uses the stored
        behaviour log-probs, so stale data (lag > 0) is corrected by PPO's clipped ratio. With
        ``advantage_estimator='vtrace'`` the advantages and value targets come from
        :func:`~tianji_jax.algos.ppo.vtrace` (rho_bar = c_bar = 1, traces scaled by ``gae_lambda``)
        with the importance ratios of the learner's current policy over the behaviour policy.
        Metrics (float32/int32 scalars): episode sums and count, ``policy_lag_mean`` /
        ``policy_lag_max`` (learner version minus the stamps, computed here), loss metrics.

        Args:
            learner: the learner's state.
            traj: a :meth:`rollout` trajectory, leaves ``(T, N, ...)`` plus ``last_obs``
                ``(N, *obs_shape)`` (this replica's ``N`` columns with ``axis_name``).
            axis_name: the mapped axis of data-parallel learners, or None.

        Returns:
            ``(learner, metrics)``: the new :class:`LearnerState` (version + 1) and a dict of
            scalars: ``episode_return_sum``, ``episode_length_sum``, ``policy_lag_mean`` (float32),
            ``episode_count``, ``policy_lag_max`` (int32), the :func:`~tianji_jax.algos.ppo.ppo_loss`
            metrics and ``grad_norm``.
        """
        cfg = self.config
        t, n = traj["reward"].shape
        flat = lambda x: x.reshape((t * n, *x.shape[2:]))  # noqa: E731
        actor_out, values = self.apply(learner.params, flat(traj["obs"]))
        _, last_value = self.apply(learner.params, traj["last_obs"])
        _, final_values = self.apply(learner.params, flat(traj["final_obs"]))
        values = values.reshape((t, n))
        if cfg.advantage_estimator == "vtrace":  # off-policy correction of stale samples (IMPALA)
            log_rhos = distributions.log_prob(actor_out, flat(traj["action"]), self.continuous) - flat(traj["log_prob"])
            advantages, returns = vtrace(traj["reward"], values, last_value, final_values.reshape((t, n)),
                                         traj["terminated"], traj["truncated"], log_rhos.reshape((t, n)), cfg.gamma,
                                         cfg.gae_lambda)
        else:
            advantages, returns = gae(traj["reward"], values, last_value, final_values.reshape((t, n)),
                                      traj["terminated"], traj["truncated"], cfg.gamma, cfg.gae_lambda)
        batch = PPOBatch(obs=flat(traj["obs"]), actions=flat(traj["action"]), log_probs=flat(traj["log_prob"]),
                         values=flat(values), advantages=flat(advantages), returns=flat(returns))
        key, k_update = jax.random.split(learner.key)
        if axis_name is not None:
            k_update = jax.random.fold_in(k_update, jax.lax.axis_index(axis_name))
        params, opt_state, loss_metrics = ppo_update(
            k_update, learner.params, learner.opt_state, batch, apply_fn=self.apply, tx=self.tx,
            update_epochs=cfg.update_epochs, num_minibatches=cfg.num_minibatches,
            loss_kwargs=dict(continuous=self.continuous, clip_eps=cfg.clip_eps, vf_coef=cfg.vf_coef,
                             ent_coef=cfg.ent_coef, clip_value_loss=cfg.clip_value_loss,
                             normalize_advantages=cfg.normalize_advantages),
            axis_name=axis_name)
        lag = learner.version - traj["policy_version"]
        metrics = {
            "episode_return_sum": jnp.sum(traj["episode_return"]),
            "episode_length_sum": jnp.sum(traj["episode_length"]).astype(jnp.float32),
            # an episode for statistics ended where its length is reported (envpool Atari: a lost
            # life is ``done`` for learning but not the end of a game)
            "episode_count": jnp.sum(traj["episode_length"] > 0).astype(jnp.int32),
            "policy_lag_mean": jnp.mean(lag.astype(jnp.float32)),
            "policy_lag_max": jnp.max(lag),
        }
        if axis_name is not None:
            metrics = {k: (jax.lax.pmax(v, axis_name) if k == "policy_lag_max" else
                           jax.lax.pmean(v, axis_name) if k == "policy_lag_mean" else jax.lax.psum(v, axis_name))
                       for k, v in metrics.items()}
        metrics.update(loss_metrics)  # already averaged (skips: already global) over the axis by ppo_update
        return LearnerState(params, opt_state, key, learner.version + 1), metrics
