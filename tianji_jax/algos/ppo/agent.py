"""PPO's agent (:class:`PPOAgent`): its network, acting step and learner update, on the shared
on-policy actor (:class:`~tianji_jax.algos.on_policy.OnPolicyAgent`).

Anakin fuses the rollout and the update in one compiled loop; the async runtime runs them on
different devices and threads. Both use these same functions, so the ``sync`` schedule
reproduces Anakin exactly.
"""

from __future__ import annotations

from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from tianji_jax.algos import distributions
from tianji_jax.algos.on_policy import LearnerState, OnPolicyAgent, episode_metrics
from tianji_jax.algos.ppo.config import PPOConfig
from tianji_jax.algos.ppo.math import PPOBatch, gae, make_optimizer, ppo_update, vtrace
from tianji_jax.nets.networks import ActorCritic, check_network, resolve_torso
from tianji_jax.nets.recurrent import RecurrentActorCritic

__all__ = ["PPOAgent", "make_network"]


def make_network(config: PPOConfig) -> ActorCritic | RecurrentActorCritic:
    """The ActorCritic for ``config``'s env (categorical for Discrete, a factored categorical with
    ``sum(nvec)`` logits for MultiDiscrete, Gaussian for Box), its torso
    chosen from the observation's layout and size (``config.torso``, :func:`~tianji_jax.nets.networks.resolve_torso`);
    with ``config.recurrent`` ``'lstm'`` / ``'gru'`` the :class:`~tianji_jax.nets.recurrent.RecurrentActorCritic`
    of that torso and a core of ``config.rnn_hidden_size`` units.

    Raises:
        ValueError: the network's parameters would hold a zero-size array for this observation
            shape (:func:`~tianji_jax.nets.networks.check_network`).
    """
    spec = config.env_spec
    continuous = spec.action_kind == "continuous"
    action_dim = (spec.action_space.shape[0] if continuous else spec.action_space.num_logits
                  if spec.action_kind == "multi_discrete" else spec.action_space.n)
    shape = tuple(spec.observation_shape)
    network = ActorCritic(action_dim=action_dim, continuous=continuous, hidden_sizes=tuple(config.hidden_sizes),
                          activation=config.activation, torso=resolve_torso(config.torso, shape), obs_shape=shape,
                          log_std_init=config.log_std_init)
    check_network(network, shape, spec.observation_space.dtype)  # the recurrent network's torso is the same
    if config.recurrent != "none":
        return RecurrentActorCritic(action_dim=action_dim, continuous=continuous, hidden_sizes=tuple(config.hidden_sizes),
                                    activation=config.activation, torso=network.torso, obs_shape=shape,
                                    cell=config.recurrent, rnn_hidden_size=config.rnn_hidden_size,
                                    log_std_init=config.log_std_init)
    return network


class PPOAgent(OnPolicyAgent):
    """Pure PPO actor and learner functions for one config (not jitted here; callers jit).

    Acting samples the categorical / factored categorical (MultiDiscrete: actions int32 ``(B,
    len(nvec))``, log-probs summed over the factors) / Gaussian policy (``log_prob`` and ``value`` of the
    trajectory are the behaviour policy's); :meth:`learn` is one PPO update (Schulman et al.
    2017) with GAE (Schulman et al. 2016) or V-trace (Espeholt et al. 2018). With ``config.recurrent``
    (``'lstm'`` / ``'gru'``) the network is recurrent: the actor carries its state, and each minibatch
    is a set of whole env columns re-run through the core from the rollout's initial carry
    (CleanRL's ``ppo_atari_lstm``, PureJaxRL's ``ppo_rnn``).

    Raises:
        ValueError: the network cannot take this env's observations (see :func:`make_network`).
    """

    ROW_METRICS: ClassVar[tuple[str, ...]] = ("policy_loss", "value_loss", "entropy", "approx_kl",
                                              "clip_fraction", "grad_norm")

    def __init__(self, config: PPOConfig):
        super().__init__(config)
        self.network = make_network(config)
        self.tx = make_optimizer(
            config.learning_rate, config.max_grad_norm,
            config.num_updates if config.anneal_lr else None,
            config.update_epochs * config.num_minibatches)

    def apply(self, params: Any, obs: jax.Array):
        """Network forward: ``obs (B, *obs_shape)`` -> ``(actor_out, value (B,))`` (feed-forward only);
        with an env's action mask the forbidden actions' logits are
        :data:`~tianji_jax.envs.suites.MASKED` (sampling, the ratio, entropy and the mode follow).

        Raises:
            TypeError: the network is recurrent (use :meth:`apply_step`)."""
        if self.recurrent:
            raise TypeError("a recurrent network needs its carry: use apply_step(params, carry, obs, reset)")
        actor_out, value = self.network.apply(params, obs)
        return self._masked(actor_out, obs), value  # an env's action mask: masked logits

    def policy_step(self, params: Any, carry: Any, obs: jax.Array, reset: jax.Array, key: jax.Array,
                    version: jax.Array):
        """Sample the recurrent policy: ``(carry, env_action, action, log_prob (B,), value (B,))`` as
        :meth:`policy`, after one :meth:`apply_step`."""
        carry, actor_out, value = self.apply_step(params, carry, obs, reset)
        action = distributions.sample(key, actor_out, self.continuous, self.nvec)
        log_prob = distributions.log_prob(actor_out, action, self.continuous, self.nvec)
        return carry, self.env_action(action), action, log_prob, value

    def policy(self, params: Any, obs: jax.Array, key: jax.Array, version: jax.Array):
        """Sample the policy: ``(env_action, action, log_prob (B,), value (B,))``; ``env_action``
        is ``action`` clipped to the Box bounds (continuous), the learner's ratio uses ``action``;
        ``version`` is unused."""
        actor_out, value = self.apply(params, obs)
        action = distributions.sample(key, actor_out, self.continuous, self.nvec)
        log_prob = distributions.log_prob(actor_out, action, self.continuous, self.nvec)
        return self.env_action(action), action, log_prob, value

    def greedy(self, params: Any, obs: jax.Array) -> jax.Array:
        """Deterministic env action for evaluation on host envs: argmax (Discrete), per-factor argmax
        (MultiDiscrete) or the clipped Gaussian mean (Box) for raw ``obs (B, *obs_shape)``."""
        actor_out, _ = self.apply(params, jnp.asarray(obs, jnp.float32))
        return self.env_action(distributions.mode(actor_out, self.continuous, self.nvec))

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
        A recurrent network's update is :meth:`_learn_recurrent`: the same estimators on V
        recomputed through the core, minibatches of whole env columns (of this replica's columns
        under ``axis_name``, with the same key folding, global statistics and averaging).
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
        if self.recurrent:
            return self._learn_recurrent(learner, traj, axis_name)
        cfg = self.config
        t, n = traj["reward"].shape
        flat = lambda x: x.reshape((t * n, *x.shape[2:]))  # noqa: E731
        actor_out, values = self.apply(learner.params, flat(traj["obs"]))
        _, last_value = self.apply(learner.params, traj["last_obs"])
        _, final_values = self.apply(learner.params, flat(traj["final_obs"]))
        values = values.reshape((t, n))
        if cfg.advantage_estimator == "vtrace":  # off-policy correction of stale samples (IMPALA)
            log_rhos = (distributions.log_prob(actor_out, flat(traj["action"]), self.continuous, self.nvec)
                        - flat(traj["log_prob"]))
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
            loss_kwargs=dict(continuous=self.continuous, nvec=self.nvec, clip_eps=cfg.clip_eps,
                             vf_coef=cfg.vf_coef, ent_coef=cfg.ent_coef, clip_value_loss=cfg.clip_value_loss,
                             normalize_advantages=cfg.normalize_advantages),
            axis_name=axis_name)
        metrics = episode_metrics(traj, learner.version, axis_name)
        metrics.update(loss_metrics)  # already averaged (skips: already global) over the axis by ppo_update
        return LearnerState(params, opt_state, key, learner.version + 1), metrics

    def _learn_recurrent(self, learner: LearnerState, traj: dict, axis_name: str | None = None
                         ) -> tuple[LearnerState, dict[str, jax.Array]]:
        """:meth:`learn` for a recurrent network (one learner, or a replica of data-parallel ones
        under ``axis_name``).

        V is recomputed as in the feed-forward case, here by re-running the trajectory through the
        core from ``hidden_init`` with the stored ``reset`` flags: ``V(s_t)`` from each step,
        ``last_value`` one step further (on ``last_obs``, reset where the last step ended an
        episode), and V of each ``final_obs`` one step on from the carry after its step (no reset:
        the true next observation of the same episode; used where ``truncated``). The PPO update
        then runs on the env-major batch: leaves ``(N, T, ...)`` and the initial carry ``(N, H)``,
        so :func:`~tianji_jax.algos.ppo.ppo_update`'s permutation and minibatches of
        ``N / num_minibatches`` rows are whole env columns, each re-run from its initial carry.
        """
        cfg = self.config
        t, n = traj["reward"].shape
        params = learner.params
        carries, actor_out, values = self.apply_sequence(params, traj["hidden_init"], traj["obs"], traj["reset"])
        _, _, last_value = self.apply_step(params, jax.tree.map(lambda c: c[-1], carries), traj["last_obs"],
                                           traj["done"][-1])
        flat = lambda x: x.reshape((t * n, *x.shape[2:]))  # noqa: E731
        _, _, final_values = self.apply_step(params, jax.tree.map(flat, carries), flat(traj["final_obs"]),
                                             jnp.zeros((t * n,), bool))
        final_values = final_values.reshape((t, n))
        if cfg.advantage_estimator == "vtrace":
            log_rhos = distributions.log_prob(actor_out, traj["action"], self.continuous, self.nvec) - traj["log_prob"]
            advantages, returns = vtrace(traj["reward"], values, last_value, final_values, traj["terminated"],
                                         traj["truncated"], log_rhos, cfg.gamma, cfg.gae_lambda)
        else:
            advantages, returns = gae(traj["reward"], values, last_value, final_values, traj["terminated"],
                                      traj["truncated"], cfg.gamma, cfg.gae_lambda)
        env_major = lambda x: jnp.swapaxes(x, 0, 1)  # noqa: E731  (T, N, ...) <-> (N, T, ...)
        b = cfg.burn_in_steps  # the loss covers steps b..T-1 of each column (static)
        loss_steps = lambda x: env_major(x)[:, b:] if b else env_major(x)  # noqa: E731
        batch = PPOBatch(obs={"obs": env_major(traj["obs"]), "reset": env_major(traj["reset"]),
                              "hidden": traj["hidden_init"]},
                         actions=loss_steps(traj["action"]), log_probs=loss_steps(traj["log_prob"]),
                         values=loss_steps(values), advantages=loss_steps(advantages), returns=loss_steps(returns))

        def apply_columns(p: Any, columns: dict) -> tuple[Any, jax.Array]:
            # env-major columns (n, T, ...) from their initial carries -> outputs (n, T - b, ...)
            hidden, obs, reset = columns["hidden"], env_major(columns["obs"]), env_major(columns["reset"])
            if b:  # burn-in: the first b steps only carry the state forward (current params, no gradient)
                carries, _, _ = self.apply_sequence(jax.lax.stop_gradient(p), hidden, obs[:b], reset[:b])
                hidden = jax.lax.stop_gradient(jax.tree.map(lambda c: c[-1], carries))
                obs, reset = obs[b:], reset[b:]
            _, out, value = self.apply_sequence(p, hidden, obs, reset)
            out = (env_major(out[0]), out[1]) if self.continuous else env_major(out)
            return out, env_major(value)

        key, k_update = jax.random.split(learner.key)
        if axis_name is not None:
            k_update = jax.random.fold_in(k_update, jax.lax.axis_index(axis_name))
        params, opt_state, loss_metrics = ppo_update(
            k_update, params, learner.opt_state, batch, apply_fn=apply_columns, tx=self.tx,
            update_epochs=cfg.update_epochs, num_minibatches=cfg.num_minibatches,
            loss_kwargs=dict(continuous=self.continuous, nvec=self.nvec, clip_eps=cfg.clip_eps,
                             vf_coef=cfg.vf_coef, ent_coef=cfg.ent_coef, clip_value_loss=cfg.clip_value_loss,
                             normalize_advantages=cfg.normalize_advantages),
            axis_name=axis_name)
        metrics = episode_metrics(traj, learner.version, axis_name)
        metrics.update(loss_metrics)
        return LearnerState(params, opt_state, key, learner.version + 1), metrics
