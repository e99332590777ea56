"""What every on-policy agent shares: its actor and learner states and the actor's half (env
reset, the rollout scan, one-step acting on host envs), written once against the agent's
:meth:`OnPolicyAgent.policy`.

An on-policy agent (PPO's :class:`~tianji_jax.algos.ppo.agent.PPOAgent`, PQN's
:class:`~tianji_jax.algos.pqn.agent.PQNAgent`) subclasses :class:`OnPolicyAgent` and supplies its
network, optimizer, ``policy`` (one acting step), ``apply`` / ``greedy`` (evaluation),
``init_learner`` and ``learn``, and the metrics a row reports (``ROW_METRICS``). Every runtime
(Anakin, the async actors and learners, host actors, Ray workers) composes these same functions,
so the async ``sync`` schedule reproduces Anakin bit for bit for every on-policy algorithm. The
actor and the learner own separate PRNG streams (``ActorState.key``, ``LearnerState.key``).
"""

from __future__ import annotations

from typing import Any, ClassVar

import jax
import jax.numpy as jnp
from flax import struct

from tianji_jax.algos.normalization import RewardScaler, RunningMeanStd
from tianji_jax.envs.gymnax_env import GymnaxVecEnv, VecEnvState
from tianji_jax.envs.suites import masked

__all__ = ["ActorState", "LearnerState", "OnPolicyAgent", "TRAJECTORY_KEYS", "RECURRENT_TRAJECTORY_KEYS"]

TRAJECTORY_KEYS = ("obs", "action", "log_prob", "value", "reward", "terminated", "truncated", "done", "final_obs",
                   "episode_return", "episode_length", "policy_version", "last_obs")
"""The keys of an on-policy trajectory (:meth:`OnPolicyAgent.rollout`; host actors' chunker makes the same)."""

RECURRENT_TRAJECTORY_KEYS = ("hidden_init", "reset")
"""The keys a recurrent agent's trajectory has besides :data:`TRAJECTORY_KEYS` (see :meth:`OnPolicyAgent.rollout`)."""


@struct.dataclass
class ActorState:
    """What an actor owns.

    Attributes:
        env_state: :class:`~tianji_jax.envs.gymnax_env.VecEnvState` of its ``N`` envs.
        obs: ``(N, *obs_shape)`` current raw observations.
        key: the actor's PRNG key (action sampling, env steps).
        obs_rms: running observation statistics (updated only with observation normalisation).
        reward_scaler: discounted-return statistics (updated only with reward scaling).
        hidden: recurrent agents: the core's carry before the next step (leaves float32 ``(N, H)``,
            see :func:`~tianji_jax.nets.recurrent.initial_carry`); None otherwise (no leaves: the state's
            leaf paths are those of a feed-forward agent).
        last_done: recurrent agents: ``(N,)`` bool, the env's last step ended an episode (its carry
            is zeroed before the next step); None otherwise.
    """

    env_state: VecEnvState
    obs: jax.Array
    key: jax.Array
    obs_rms: RunningMeanStd
    reward_scaler: RewardScaler
    hidden: Any = None
    last_done: Any = None


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


class OnPolicyAgent:
    """The actor half of an on-policy agent for one config, written against :meth:`policy`
    (pure functions; callers jit). Subclasses set ``network`` and ``tx`` in ``__init__`` and
    implement :meth:`policy`, :meth:`apply`, :meth:`greedy` and :meth:`learn` (:meth:`init_learner`
    initialises ``network`` and ``tx``).

    Trajectory (``traj``) produced by :meth:`rollout`, a dict with leading axes ``(T, N)``:
    ``obs`` (as the policy saw it), ``action``, ``log_prob`` (behaviour), ``value`` (the agent's
    value estimate at acting time), ``reward`` (scaled if enabled), ``terminated``, ``truncated``,
    ``done`` (bool), ``final_obs`` (the true next observation: before auto-reset where an episode
    ended), ``episode_return`` / ``episode_length`` (of episodes that ended, else 0) and
    ``policy_version`` (int32, the version the actor acted with); plus ``last_obs``
    ``(N, *obs_shape)`` (:data:`TRAJECTORY_KEYS`). A recurrent agent's (``recurrent`` True) also has
    ``hidden_init``, the core's carry at the rollout's start (leaves ``(N, H)``), and ``reset``
    ``(T, N)`` bool, where the carry was zeroed before step ``t`` (the env's previous step ended an
    episode) (:data:`RECURRENT_TRAJECTORY_KEYS`; CleanRL's ``ppo_atari_lstm`` / PureJaxRL's ``ppo_rnn``).

    Attributes:
        config: the algorithm's config (an :class:`~tianji_jax.algos.on_policy_config.OnPolicyConfig`).
        spec: its resolved env.
        continuous: the action space is a Box.
        nvec: a MultiDiscrete action space's sizes (a tuple of ints; the policy is a factored
            categorical, :mod:`~tianji_jax.algos.distributions`), else None.
        env: the gymnax vector env (None for host envs, which live in each host actor).
        recurrent: the config's ``recurrent`` is not ``'none'``: the agent implements
            :meth:`initial_carry`, :meth:`apply_step` and :meth:`policy_step`, and the actor carries
            the core's state (Anakin runtime, gymnax envs).
        ROW_METRICS: learn metrics averaged into a ``metrics.csv`` row (names of
            :data:`~tianji_jax.run.results.METRIC_COLUMNS`).
    """

    ROW_METRICS: ClassVar[tuple[str, ...]] = ()

    def __init__(self, config: Any):
        self.config = config
        spec = config.env_spec
        self.continuous = spec.action_kind == "continuous"
        self.nvec = tuple(spec.action_space.nvec) if spec.action_kind == "multi_discrete" else None
        self.mask_size = spec.action_mask_size  # trailing observation entries that are the action mask
        self.spec = spec
        self.recurrent = getattr(config, "recurrent", "none") != "none"
        self.env = GymnaxVecEnv(spec, config.num_envs) if not spec.on_host else None  # host envs: per actor
        if self.continuous:
            self._low = jnp.asarray(spec.action_space.low, jnp.float32)
            self._high = jnp.asarray(spec.action_space.high, jnp.float32)

    # ---- what a subclass supplies ---------------------------------------------------------------
    def policy(self, params: Any, obs: jax.Array, key: jax.Array, version: jax.Array
               ) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
        """One acting step: ``obs (B, *obs_shape)`` float32 (normalised when enabled), the step's
        action key and the int32 policy ``version`` -> ``(env_action, action, log_prob (B,),
        value (B,))``: ``env_action`` is what the env receives, ``action`` what the learner sees."""
        raise NotImplementedError

    def apply(self, params: Any, obs: jax.Array) -> tuple[jax.Array, jax.Array]:
        """Network forward for evaluation: ``obs (B, *obs_shape)`` -> ``(actor_out, value (B,))``
        where ``distributions.mode(actor_out, continuous, nvec)`` is the deterministic action."""
        raise NotImplementedError

    def greedy(self, params: Any, obs: jax.Array) -> jax.Array:
        """Deterministic env action for evaluation on host envs, for raw ``obs (B, *obs_shape)``."""
        raise NotImplementedError

    def init_learner(self, key: jax.Array) -> LearnerState:
        """Initialise ``self.network``'s params (on a dummy observation ``(1, *obs_shape)``, with a
        zero carry and no reset for a recurrent network) and ``self.tx``'s state; version 0."""
        key, k_net = jax.random.split(key)
        dummy = jnp.zeros((1, *self.spec.observation_space.shape), jnp.float32)
        if self.recurrent:
            params = self.network.init(k_net, self.initial_carry(1), dummy, jnp.zeros((1,), bool))
        else:
            params = self.network.init(k_net, dummy)
        return LearnerState(params, self.tx.init(params), key, jnp.zeros((), jnp.int32))

    def initial_carry(self, batch: int) -> Any:
        """Recurrent agents: the zero carry of ``batch`` envs: ``(c, h)`` (LSTM) or ``h`` (GRU),
        float32 ``(batch, H)`` (:func:`~tianji_jax.nets.recurrent.initial_carry`)."""
        from tianji_jax.nets.recurrent import initial_carry

        return initial_carry(self.config.recurrent, batch, self.config.rnn_hidden_size)

    def apply_step(self, params: Any, carry: Any, obs: jax.Array, reset: jax.Array) -> tuple[Any, Any, jax.Array]:
        """Recurrent agents: one step of ``self.network`` (a
        :class:`~tianji_jax.nets.recurrent.RecurrentActorCritic` or a subclass) ``(carry, obs (B,
        *obs_shape) float32, reset (B,) bool) -> (carry, actor_out, value (B,))``, the carry zeroed
        first where ``reset``; evaluation takes ``distributions.mode(actor_out, continuous, nvec)``. An
        env's action mask masks ``actor_out`` (:func:`~tianji_jax.envs.suites.masked`)."""
        carry, actor_out, value = self.network.apply(params, carry, obs, reset)
        return carry, self._masked(actor_out, obs), value

    def apply_sequence(self, params: Any, carry: Any, obs: jax.Array, reset: jax.Array) -> tuple[Any, Any, jax.Array]:
        """Recurrent agents: ``T`` steps (:meth:`~tianji_jax.nets.recurrent.RecurrentActorCritic.sequence`):
        ``obs (T, B, *obs_shape)``, ``reset (T, B)`` -> ``(carries (T, B, H) leaves, actor_out (T, B,
        ...), value (T, B))``."""
        from tianji_jax.nets.recurrent import RecurrentActorCritic

        carries, actor_out, value = self.network.apply(params, carry, obs, reset, method=RecurrentActorCritic.sequence)
        return carries, self._masked(actor_out, obs), value

    def _masked(self, actor_out: Any, obs: jax.Array) -> Any:
        """Discrete ``actor_out`` (logits or Q-values) with the actions the env's action mask (the
        observation's last :attr:`mask_size` entries) forbids set to
        :data:`~tianji_jax.envs.suites.MASKED`; anything else unchanged."""
        return actor_out if self.continuous or not self.mask_size else masked(actor_out, obs, self.mask_size)

    def policy_step(self, params: Any, carry: Any, obs: jax.Array, reset: jax.Array, key: jax.Array,
                    version: jax.Array) -> tuple[Any, jax.Array, jax.Array, jax.Array, jax.Array]:
        """Recurrent agents' :meth:`policy`: ``(carry, env_action, action, log_prob (B,), value (B,))``
        from the carry, ``obs`` and ``reset`` as in :meth:`apply_step`."""
        raise NotImplementedError

    def learn(self, learner: LearnerState, traj: dict, axis_name: str | None = None
              ) -> tuple[LearnerState, dict[str, jax.Array]]:
        """One update on a trajectory ``(T, N)`` (this replica's env columns under ``axis_name``);
        the version is incremented. Metrics: scalars including ``episode_return_sum``,
        ``episode_length_sum``, ``episode_count``, ``policy_lag_mean``, ``policy_lag_max``,
        ``nonfinite_skips`` and :attr:`ROW_METRICS`, identical on every replica."""
        raise NotImplementedError

    @classmethod
    def row_extra(cls, config: Any, metrics: dict, updates_done: int) -> dict[str, float]:
        """Columns of a ``metrics.csv`` row beyond :attr:`ROW_METRICS` (names of
        :data:`~tianji_jax.run.results.METRIC_COLUMNS`) from the chunk's per-update host ``metrics``
        and the updates done; none by default."""
        return {}

    # ---- shared ---------------------------------------------------------------------------------
    def env_action(self, action: jax.Array) -> jax.Array:
        """The action sent to the env: clipped to the Box bounds for continuous actions."""
        return jnp.clip(action, self._low, self._high) if self.continuous else action

    def act(self, params: Any, obs: jax.Array, key: jax.Array, version: jax.Array) -> tuple[jax.Array, ...]:
        """One policy step for a host actor: raw ``obs (B, *obs_shape)`` (cast to float32) ->
        ``(env_action, action, log_prob (B,), value (B,), next_key)`` (see :meth:`policy`)."""
        key, k_act = jax.random.split(key)
        return (*self.policy(params, obs.astype(jnp.float32), k_act, version), key)

    def act_recurrent(self, params: Any, carry: Any, obs: jax.Array, reset: jax.Array, key: jax.Array,
                      version: jax.Array) -> tuple[Any, ...]:
        """One policy step for a recurrent host actor: the carry of ``obs``'s ``B`` envs (leaves
        float32 ``(B, H)``), raw ``obs (B, *obs_shape)`` (cast to float32) and ``reset (B,)`` bool
        (zero the carry first) -> ``(carry, env_action, action, log_prob (B,), value (B,), next_key)``
        (see :meth:`policy_step`)."""
        key, k_act = jax.random.split(key)
        return (*self.policy_step(params, carry, obs.astype(jnp.float32), reset, k_act, version), key)

    def greedy_step(self, params: Any, carry: Any, obs: jax.Array, reset: jax.Array) -> tuple[Any, jax.Array]:
        """Recurrent agents' deterministic step for host-env evaluation: ``(carry, env_action)``, the
        mode of the policy (clipped to the Box bounds when continuous), as :meth:`apply_step`."""
        from tianji_jax.algos import distributions

        carry, actor_out, _ = self.apply_step(params, carry, obs.astype(jnp.float32), reset)
        return carry, self.env_action(distributions.mode(actor_out, self.continuous, self.nvec))

    def split_init_key(self, key: jax.Array) -> tuple[jax.Array, jax.Array]:
        """``(actor_key, learner_key)`` from a run's seed key."""
        k_actor, k_learner = jax.random.split(key)
        return k_actor, k_learner

    def init_actor(self, key: jax.Array) -> ActorState:
        """Reset the actor's envs; ``key`` becomes its PRNG stream."""
        key, k_env = jax.random.split(key)
        env_state, obs = self.env.reset(k_env)
        n = self.config.num_envs
        recurrent = (self.initial_carry(n), jnp.zeros((n,), bool)) if self.recurrent else (None, None)
        return ActorState(env_state, obs, key, RunningMeanStd.create(self.env.observation_space.shape),
                          RewardScaler.create(n), *recurrent)

    def rollout(self, params: Any, version: jax.Array, actor: ActorState) -> tuple[ActorState, dict]:
        """``T = num_steps`` steps of the actor's ``N`` envs with ``params`` (stamped ``version``).

        Args:
            params: the network params to act with.
            version: int32 scalar, the version of ``params``.
            actor: the actor's state (gymnax envs; host actors use :meth:`act` instead).

        Returns:
            ``(actor, traj)``: the new :class:`ActorState` (observation / reward statistics updated
            when enabled) and the trajectory of the class docstring, leaves ``(T, N, ...)``:
            ``action`` int32 ``(T, N)`` (Discrete), int32 ``(T, N, len(nvec))`` (MultiDiscrete) or
            float32 ``(T, N, A)`` (Box); ``log_prob``, ``value``,
            ``reward``, ``episode_return`` float32, ``episode_length`` / ``policy_version`` int32,
            ``terminated`` / ``truncated`` / ``done`` bool, all ``(T, N)``; ``obs`` / ``final_obs``
            ``(T, N, *obs_shape)`` (float32 when normalised); ``last_obs`` ``(N, *obs_shape)``.
            Recurrent agents add ``hidden_init`` (``actor.hidden``) and ``reset`` ``(T, N)`` bool
            (the ``last_done`` each step started from); their new actor carries the core's state.
        """
        cfg = self.config
        recurrent = self.recurrent

        def step(carry, _):
            (env_state, obs, key, obs_rms, scaler), memory = carry
            key, k_act, k_env = jax.random.split(key, 3)
            if cfg.normalize_observations:
                obs_rms = obs_rms.update(obs)
                obs_in = obs_rms.normalize(obs, self.mask_size)
            else:
                obs_in = obs
            if recurrent:
                hidden, last_done = memory
                hidden, env_action, action, log_prob, value = self.policy_step(params, hidden, obs_in, last_done,
                                                                               k_act, version)
            else:
                env_action, action, log_prob, value = self.policy(params, obs_in, k_act, version)
            env_state, ts = self.env.step(k_env, env_state, env_action)
            reward = ts.reward
            if cfg.scale_rewards:
                scaler, reward = scaler.scale(reward, ts.done, cfg.gamma)
            final_obs = obs_rms.normalize(ts.final_obs, self.mask_size) if cfg.normalize_observations else ts.final_obs
            transition = {
                "obs": obs_in, "action": action, "log_prob": log_prob, "value": value, "reward": reward,
                "terminated": ts.terminated, "truncated": ts.truncated, "done": ts.done, "final_obs": final_obs,
                "episode_return": ts.episode_return, "episode_length": ts.episode_length,
                "policy_version": jnp.full(ts.reward.shape, version, jnp.int32),
            }
            if recurrent:
                transition["reset"] = last_done
                memory = (hidden, ts.done)
            return ((env_state, ts.obs, key, obs_rms, scaler), memory), transition

        memory = (actor.hidden, actor.last_done) if recurrent else None
        carry = ((actor.env_state, actor.obs, actor.key, actor.obs_rms, actor.reward_scaler), memory)
        ((env_state, obs, key, obs_rms, scaler), memory), traj = jax.lax.scan(step, carry, None,
                                                                               length=cfg.num_steps)
        traj["last_obs"] = obs_rms.normalize(obs, self.mask_size) if cfg.normalize_observations else obs
        if recurrent:
            traj["hidden_init"] = actor.hidden
            return ActorState(env_state, obs, key, obs_rms, scaler, *memory), traj
        return ActorState(env_state, obs, key, obs_rms, scaler), traj


def episode_metrics(traj: dict, version: jax.Array, axis_name: str | None = None) -> dict[str, jax.Array]:
    """The per-update metrics every on-policy learner reports from a trajectory ``(T, N)``:
    ``episode_return_sum``, ``episode_length_sum`` (float32), ``episode_count`` (int32, episodes
    whose length is reported: envpool Atari's lost lives are ``done`` but not game ends),
    ``policy_lag_mean`` (float32) / ``policy_lag_max`` (int32) of the learner ``version`` minus the
    stamps; reduced over ``axis_name`` (sums summed, means averaged, maxima maxed)."""
    lag = version - traj["policy_version"]
    metrics = {
        "episode_return_sum": jnp.sum(traj["episode_return"]),
        "episode_length_sum": jnp.sum(traj["episode_length"]).astype(jnp.float32),
        "episode_count": jnp.sum(traj["episode_length"] > 0).astype(jnp.int32),
        "policy_lag_mean": jnp.mean(lag.astype(jnp.float32)),
        "policy_lag_max": jnp.max(lag),
    }
    if axis_name is not None:
        metrics = {k: (jax.lax.pmax(v, axis_name) if k == "policy_lag_max" else
                       jax.lax.pmean(v, axis_name) if k == "policy_lag_mean" else jax.lax.psum(v, axis_name))
                   for k, v in metrics.items()}
    return metrics
