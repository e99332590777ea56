"""SAC's agent (:class:`SACAgent`): its actor and twin critics, squashed-Gaussian acting and the
learner's block of ``updates_per_step`` soft actor-critic updates sampled from replay, on the
shared replay actor (:class:`~tianji_jax.algos.replay_agent.ReplayAgent`: the n-step rollout,
replay plumbing).

One gradient update (Haarnoja et al. 2018, "Soft Actor-Critic", Algorithm 1; the temperature of
"Soft Actor-Critic Algorithms and Applications", 2018, sec. 5), on a uniformly sampled batch:

1. **critics**: the soft target ``r + discount * (min(Q1', Q2')(s', a') - alpha * log pi(a'|s'))``
   with ``a' ~ pi(.|s')`` and the target critics, the sum of both critics' squared errors, one
   Adam step;
2. **actor**: ``alpha * log pi(a|s) - min(Q1, Q2)(s, a)`` with ``a ~ pi(.|s)`` reparameterised,
   against the critics just updated, one Adam step;
3. **temperature** (``autotune``): ``-log_alpha * (log pi(a|s) + target_entropy)``, one Adam step;
4. **targets**: Polyak ``tau`` towards the updated critics.

A non-finite loss or gradient in any of the three skips the whole update, the target step
included (nothing but the PRNG key and the counters changes), as for every replay algorithm
(:meth:`~tianji_jax.algos.replay_agent.ReplayAgent.learn`, :mod:`tianji_jax.algos.guard`).
"""

from __future__ import annotations

from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import optax

from tianji_jax.algos import dqn
from tianji_jax.algos import guard
from tianji_jax.algos.replay_agent import ReplayAgent, ReplayLearnerState
from tianji_jax.algos.sac.config import SACConfig
from tianji_jax.algos.sac.math import (actor_loss, critic_loss, soft_q_target, squashed_gaussian_mode,
                                       squashed_gaussian_sample, temperature_loss)
from tianji_jax.algos.sac.networks import make_sac_networks
from tianji_jax.nets.networks import check_network

__all__ = ["SACAgent"]


def _zero_loss(log_alpha: jax.Array) -> jax.Array:
    """The loss of a fixed temperature: 0 (float32 scalar), so its gradient is 0."""
    return jnp.zeros((), jnp.float32)


class SACAgent(ReplayAgent):
    """Pure SAC actor and learner functions for one config (not jitted here; callers jit).

    Params (:attr:`ReplayLearnerState.params`) are a dict ``{"actor", "critic", "log_alpha"}``
    (``log_alpha`` a float32 scalar); ``target_params`` are the target critics; ``opt_state`` a
    dict of the three Adam states (each after global-norm clipping at ``max_grad_norm``).

    Exploration: the rollout's per-env exploration parameter is the probability of a uniform
    random action in the Box: 1 until ``learning_starts`` env steps were taken, then 0 (samples of
    the policy).

    Args:
        config: a validated :class:`~tianji_jax.algos.sac.config.SACConfig`.

    Raises:
        TypeError: ``config`` is not a :class:`SACConfig`.
        ValueError: the networks cannot take this env's observations (a zero-size parameter).
    """

    ROW_METRICS: ClassVar[tuple[str, ...]] = ("td_loss", "q_mean", "policy_loss", "entropy", "alpha")
    NUM_ACT_KEYS: ClassVar[int] = 2

    def __init__(self, config: SACConfig):
        if not isinstance(config, SACConfig):
            raise TypeError(f"config must be a SACConfig, got {type(config).__name__}")
        super().__init__(config)
        space = self.spec.action_space
        self.action_dim = int(space.shape[0])
        self.low = jnp.asarray(space.low, jnp.float32).reshape(self.action_dim)
        self.high = jnp.asarray(space.high, jnp.float32).reshape(self.action_dim)
        self.actor, self.critic = make_sac_networks(self.action_dim, tuple(config.hidden_sizes), config.activation,
                                                    config.torso, self.obs_shape)
        check_network(self.actor, self.obs_shape, self.spec.observation_space.dtype)
        self.target_entropy = config.target_entropy_value

        def adam() -> optax.GradientTransformation:
            return optax.chain(optax.clip_by_global_norm(config.max_grad_norm), optax.adam(config.learning_rate))

        self.tx = {"actor": adam(), "critic": adam(), "log_alpha": optax.adam(config.learning_rate)}

    # ---- acting -------------------------------------------------------------------------------
    def _policy(self, actor_params: Any, obs: jax.Array, key: jax.Array) -> tuple[jax.Array, jax.Array]:
        mean, log_std = self.actor.apply(actor_params, obs)
        return squashed_gaussian_sample(key, mean, log_std, self.low, self.high)

    def explore(self, params: Any, obs: jax.Array, keys: tuple[jax.Array, ...], explore: jax.Array) -> jax.Array:
        """Behaviour actions ``(B, A)`` float32 in the Box: with probability ``explore (B,)`` a
        uniform random action, else a sample of the squashed Gaussian; ``keys = (k_policy, k_random)``."""
        k_policy, k_random = keys
        action, _ = self._policy(params["actor"], obs, k_policy)
        u = jax.random.uniform(k_random, (obs.shape[0], self.action_dim + 1))
        uniform = self.low + u[:, :-1] * (self.high - self.low)
        return jnp.where((u[:, -1] < explore)[:, None], uniform, action)

    def env_explore(self, env_steps: jax.Array) -> jax.Array:
        """``(N,)`` float32: 1 (uniform random actions) until ``learning_starts`` env steps, then 0."""
        random = (jnp.asarray(env_steps) < self.config.learning_starts).astype(jnp.float32)
        return jnp.full((self.config.num_envs,), random, jnp.float32)

    def host_explore(self, env_steps: int, actor_id: int, num_actors: int) -> Any:
        """Host actors: :meth:`env_explore` at the run's ``env_steps`` (all actors together)."""
        import numpy as np  # noqa: PLC0415

        return np.full((self.config.num_envs,), float(env_steps < self.config.learning_starts), np.float32)

    def greedy_action(self, params: Any, obs: jax.Array) -> jax.Array:
        """The deterministic evaluation action ``(B, A)``: the squashed mean of the policy."""
        mean, _ = self.actor.apply(params["actor"], obs)
        return squashed_gaussian_mode(mean, self.low, self.high)

    # ---- learner ------------------------------------------------------------------------------
    def init_learner(self, key: jax.Array) -> ReplayLearnerState:
        """Actor and twin-critic params (targets = a copy of the critics), ``log_alpha =
        log(init_alpha)``, the three optimizer states; version 0, no gradient steps."""
        key, k_actor, k_critic = jax.random.split(key, 3)
        obs = jnp.zeros((1, *self.obs_shape), jnp.float32)
        params = {"actor": self.actor.init(k_actor, obs),
                  "critic": self.critic.init(k_critic, obs, jnp.zeros((1, self.action_dim), jnp.float32)),
                  "log_alpha": jnp.asarray(jnp.log(self.config.init_alpha), jnp.float32)}
        opt_state = {k: tx.init(params[k]) for k, tx in self.tx.items()}
        zero = jnp.zeros((), jnp.int32)
        return self.with_statistics(ReplayLearnerState(params, jax.tree.map(jnp.copy, params["critic"]), opt_state,
                                                       key, zero, zero))

    def update(self, learner: ReplayLearnerState, replay_state: Any, env_steps: jax.Array, batch_size: int,
               axis_name: str | None = None) -> tuple[ReplayLearnerState, Any, jax.Array, dict]:
        """One soft actor-critic update (the module docstring) on ``batch_size`` uniformly sampled
        transitions: three unguarded :func:`~tianji_jax.algos.guard.gradient_step` (critics,
        actor, temperature; losses and gradients averaged over ``axis_name`` when given), then
        the Polyak target step. ONE decision covers all of it: ``finite`` is the AND of the
        three steps', and the base class's :meth:`~ReplayAgent.learn` keeps the new params,
        optimizer states and target critics only when it holds.

        Args:
            learner: the learner's state.
            replay_state: the :class:`~tianji_jax.buffers.replay.ReplayState` (at least one item; returned
                unchanged).
            env_steps: int32 scalar, env steps so far (unused: SAC has no schedule).
            batch_size: static int, items sampled (``config.batch_size / num_shards``).
            axis_name: data-parallel learners (inside ``shard_map`` over this axis, each replica
                with its own replay shard): each replica samples from its shard (its key folded
                with its axis index) and the losses and gradients are averaged (``pmean``)
                before identical steps.

        Returns:
            ``(learner, replay_state, finite, metrics)`` as :meth:`ReplayAgent.update`; float32
            metrics ``td_loss`` (the critics' loss), ``q_mean`` (mean of the two critics on the
            sampled pairs), ``policy_loss`` (the actor's), ``entropy`` (``-log pi`` of fresh
            samples), ``alpha`` (before the update), ``grad_norm`` (critics, before clipping),
            ``policy_lag_mean`` and int32 ``policy_lag_max``.
        """
        cfg, lrn, p = self.config, learner, learner.params
        mean = (lambda x: x) if axis_name is None else (lambda x: jax.lax.pmean(x, axis_name))  # noqa: E731
        key, k_sample, k_next, k_pi = jax.random.split(lrn.key, 4)
        if axis_name is not None:  # each replica draws from its own shard
            k_sample = jax.random.fold_in(k_sample, jax.lax.axis_index(axis_name))
        s = self.sample(replay_state, k_sample, batch_size)
        batch = self.normalize_batch(lrn, s.item)  # raw observations in replay, normalised as sampled
        alpha = jnp.exp(p["log_alpha"])
        next_action, next_logp = self._policy(p["actor"], batch.next_obs, k_next)
        nq1, nq2 = self.critic.apply(lrn.target_params, batch.next_obs, next_action)
        target = soft_q_target(batch.reward, batch.discount, nq1, nq2, next_logp, alpha)

        def q_loss(critic):
            q1, q2 = self.critic.apply(critic, batch.obs, batch.action)
            loss, td = critic_loss(q1, q2, target)
            return loss, (td, 0.5 * (q1 + q2))

        steps = {"critic": guard.gradient_step(q_loss, self.tx["critic"], p["critic"], lrn.opt_state["critic"],
                                               axis_name=axis_name, guard=False)}
        critic, (_td, q_sa) = steps["critic"].params, steps["critic"].aux

        def pi_loss(actor):
            action, logp = self._policy(actor, batch.obs, k_pi)
            q1, q2 = self.critic.apply(critic, batch.obs, action)
            return actor_loss(logp, q1, q2, alpha), logp

        steps["actor"] = guard.gradient_step(pi_loss, self.tx["actor"], p["actor"], lrn.opt_state["actor"],
                                             axis_name=axis_name, guard=False)
        logp = steps["actor"].aux
        # a fixed temperature takes an Adam step on a zero gradient (its optimizer state advances)
        t_args = (temperature_loss, logp, self.target_entropy) if cfg.autotune else (_zero_loss,)
        steps["log_alpha"] = guard.gradient_step(t_args[0], self.tx["log_alpha"], p["log_alpha"],
                                                 lrn.opt_state["log_alpha"], *t_args[1:], axis_name=axis_name,
                                                 has_aux=False, guard=False)
        finite = steps["critic"].finite & steps["actor"].finite & steps["log_alpha"].finite  # one decision
        params = {k: s_.params for k, s_ in steps.items()}
        opt_state = {k: s_.opt_state for k, s_ in steps.items()}
        if not cfg.autotune:  # a fixed temperature (Adam on a zero gradient would leave it anyway)
            params["log_alpha"] = p["log_alpha"]
        target_params = dqn.polyak_update(lrn.target_params, params["critic"], cfg.tau)
        lag = lrn.version - s.policy_version
        lag_max = jnp.max(lag) if axis_name is None else jax.lax.pmax(jnp.max(lag), axis_name)
        metrics = {"td_loss": steps["critic"].loss, "q_mean": mean(jnp.mean(q_sa)), "policy_loss": steps["actor"].loss,
                   "entropy": mean(-jnp.mean(logp)), "alpha": alpha, "grad_norm": steps["critic"].grad_norm,
                   "policy_lag_mean": mean(jnp.mean(lag.astype(jnp.float32))), "policy_lag_max": lag_max}
        new = lrn.replace(params=params, target_params=target_params, opt_state=opt_state, key=key,
                          gradient_steps=lrn.gradient_steps + 1)
        return new, replay_state, finite, metrics
