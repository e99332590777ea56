"""PQN's agent (:class:`PQNAgent`): a LayerNorm Q-network acting epsilon-greedily on the shared
on-policy actor (:class:`~tianji_jax.algos.on_policy.OnPolicyAgent`) and learning from each
rollout with Q(lambda) returns (Gallici et al. 2024, "Simplifying Deep Temporal Difference
Learning", Algorithm 1): no target network, no replay.

Registered as ``"pqn"`` with this class alone: Anakin, the async runtime (device and host
actors, Ray actor processes, data-parallel learners, learner groups, several processes),
evaluation, checkpoints and resume are the generic on-policy ones.
"""

from __future__ import annotations

from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from tianji_jax.algos.on_policy import LearnerState, OnPolicyAgent, episode_metrics
from tianji_jax.algos.ppo.math import make_optimizer
from tianji_jax.algos.pqn.config import PQNConfig
from tianji_jax.algos.pqn.math import PQNBatch, epsilon_at, epsilon_greedy, pqn_update, q_lambda_returns
from tianji_jax.envs.suites import action_mask, masked
from tianji_jax.nets.networks import QNetwork, check_network, resolve_torso
from tianji_jax.nets.recurrent import RecurrentQNetwork

__all__ = ["PQNAgent", "make_pqn_network"]


def make_pqn_network(config: PQNConfig) -> QNetwork | RecurrentQNetwork:
    """The Q-network for ``config``'s env: torso chosen from the observation's layout and size
    (``config.torso``, :func:`~tianji_jax.nets.networks.resolve_torso`), LayerNorm after every hidden layer when
    ``config.layer_norm``, a linear head of ``A`` Q-values; with ``config.recurrent`` ``'lstm'`` /
    ``'gru'`` the :class:`~tianji_jax.nets.recurrent.RecurrentQNetwork` of that torso and a core of
    ``config.rnn_hidden_size`` units.

    Raises:
        ValueError: the network's parameters would hold a zero-size array for this observation
            shape (:func:`~tianji_jax.nets.networks.check_network`).
    """
    spec = config.env_spec
    shape = tuple(spec.observation_shape)
    network = QNetwork(action_dim=spec.action_space.n, hidden_sizes=tuple(config.hidden_sizes),
                       activation=config.activation, torso=resolve_torso(config.torso, shape), obs_shape=shape,
                       layer_norm=config.layer_norm)
    check_network(network, shape, spec.observation_space.dtype)
    if config.recurrent != "none":
        return RecurrentQNetwork(action_dim=spec.action_space.n, hidden_sizes=tuple(config.hidden_sizes),
                                 activation=config.activation, torso=network.torso, obs_shape=shape,
                                 cell=config.recurrent, rnn_hidden_size=config.rnn_hidden_size,
                                 layer_norm=config.layer_norm)
    return network


class PQNAgent(OnPolicyAgent):
    """Pure PQN actor and learner functions for one config (not jitted here; callers jit).

    Acting: epsilon-greedy in ``Q(obs)`` with epsilon decaying linearly in the env steps of the
    acting params' version (``version * global_batch_size``); the trajectory's ``log_prob`` is the
    behaviour probability of the action taken and ``value`` is ``max_a Q(obs, a)`` at acting time.
    Learning: :meth:`learn`. With ``config.recurrent`` the Q-network is recurrent: the actor
    carries the core's state as recurrent PPO's does, and the learner re-runs whole env columns
    from each trajectory's stored state (:meth:`_learn_recurrent`).

    Raises:
        ValueError: the network cannot take this env's observations (see :func:`make_pqn_network`).
    """

    ROW_METRICS: ClassVar[tuple[str, ...]] = ("td_loss", "q_mean", "grad_norm")

    def __init__(self, config: PQNConfig):
        super().__init__(config)
        self.network = make_pqn_network(config)
        self.tx = make_optimizer(config.learning_rate, config.max_grad_norm,
                                 config.num_updates if config.anneal_lr else None,
                                 config.update_epochs * config.num_minibatches)

    def q_values(self, params: Any, obs: jax.Array) -> jax.Array:
        """``obs (B, *obs_shape)`` -> ``Q (B, A)`` float32; actions an env's action mask forbids get
        :data:`~tianji_jax.envs.suites.MASKED` (so greedy, the bootstrap max and the value are masked)."""
        return masked(self.network.apply(params, obs), obs, self.mask_size)

    def epsilon(self, version: jax.Array) -> jax.Array:
        """float32 exploration epsilon of params ``version``: linear in the env steps
        ``version * global_batch_size`` from ``epsilon_start`` to ``epsilon_finish`` over
        ``epsilon_anneal_steps``."""
        cfg = self.config
        steps = jnp.asarray(version, jnp.int32) * cfg.global_batch_size
        return epsilon_at(steps, cfg.epsilon_start, cfg.epsilon_finish, cfg.epsilon_anneal_steps)

    def apply(self, params: Any, obs: jax.Array) -> tuple[jax.Array, jax.Array]:
        """For evaluation: ``(Q (B, A), max_a Q (B,))``; the deterministic action is the argmax."""
        q = self.q_values(params, obs)
        return q, jnp.max(q, axis=-1)

    def policy(self, params: Any, obs: jax.Array, key: jax.Array, version: jax.Array):
        """Epsilon-greedy step: ``(action, action, log_prob (B,), max_a Q (B,))``."""
        q = self.q_values(params, obs)
        action, log_prob = epsilon_greedy(key, q, self.epsilon(version), action_mask(obs, self.mask_size))
        return action, action, log_prob, jnp.max(q, axis=-1)

    def policy_step(self, params: Any, carry: Any, obs: jax.Array, reset: jax.Array, key: jax.Array,
                    version: jax.Array):
        """Recurrent epsilon-greedy step: ``(carry, action, action, log_prob (B,), max_a Q (B,))``
        after one :meth:`apply_step` (Q-values in place of the logits)."""
        carry, q, _ = self.apply_step(params, carry, obs, reset)  # q masked with an action mask
        action, log_prob = epsilon_greedy(key, q, self.epsilon(version), action_mask(obs, self.mask_size))
        return carry, action, action, log_prob, jnp.max(q, axis=-1)

    def greedy(self, params: Any, obs: jax.Array) -> jax.Array:
        """Greedy env action ``argmax_a Q(obs, a)`` (int32 ``(B,)``) for raw ``obs``."""
        return jnp.argmax(self.q_values(params, jnp.asarray(obs, jnp.float32)), axis=-1).astype(jnp.int32)

    def learn(self, learner: LearnerState, traj: dict, axis_name: str | None = None
              ) -> tuple[LearnerState, dict[str, jax.Array]]:
        """One PQN update on a trajectory ``(T, N)``; the version is incremented.

        ``max_a Q(s'_t, a)`` of every true next observation (``final_obs``: the observation before
        auto-reset where an episode ended) is computed with the learner's current params, so
        stale rollouts (lag > 0) get targets of the current network; the Q(lambda) returns
        (:func:`~tianji_jax.algos.pqn.q_lambda_returns`, rewards times ``reward_scale``) are the
        regression targets of ``update_epochs`` x ``num_minibatches`` steps
        (:func:`~tianji_jax.algos.pqn.pqn_update`). Under ``axis_name`` (data-parallel learners)
        ``traj`` is this replica's env columns: returns run per column, gradients and metrics are
        averaged, each replica permutes its shard with its own key.

        Returns:
            ``(learner, metrics)``: version + 1, and scalars ``episode_return_sum``,
            ``episode_length_sum``, ``episode_count``, ``policy_lag_mean``, ``policy_lag_max``,
            ``td_loss``, ``q_mean``, ``grad_norm``, ``nonfinite_skips``.
        """
        if self.recurrent:
            return self._learn_recurrent(learner, traj, axis_name)
        cfg = self.config
        t, n = traj["reward"].shape
        flat = lambda x: x.reshape((t * n, *x.shape[2:]))  # noqa: E731
        next_q = jnp.max(self.q_values(learner.params, flat(traj["final_obs"])), axis=-1).reshape((t, n))
        targets = q_lambda_returns(traj["reward"] * cfg.reward_scale, jax.lax.stop_gradient(next_q),
                                   traj["terminated"], traj["truncated"], cfg.gamma, cfg.q_lambda)
        batch = PQNBatch(obs=flat(traj["obs"]), actions=flat(traj["action"]).astype(jnp.int32),
                         targets=flat(targets))
        key, k_update = jax.random.split(learner.key)
        if axis_name is not None:
            k_update = jax.random.fold_in(k_update, jax.lax.axis_index(axis_name))
        params, opt_state, loss_metrics = pqn_update(
            k_update, learner.params, learner.opt_state, batch, apply_fn=self.q_values, tx=self.tx,
            update_epochs=cfg.update_epochs, num_minibatches=cfg.num_minibatches, axis_name=axis_name)
        metrics = episode_metrics(traj, learner.version, axis_name)
        metrics.update(loss_metrics)
        return LearnerState(params, opt_state, key, learner.version + 1), metrics

    def _learn_recurrent(self, learner: LearnerState, traj: dict, axis_name: str | None = None
                         ) -> tuple[LearnerState, dict[str, jax.Array]]:
        """:meth:`learn` for a recurrent Q-network (Gallici et al. 2024's recurrent PQN, as
        PureJaxQL's ``pqn_rnn``): ``max_a Q`` of each ``final_obs`` is one core step on from the
        carry after its step (no reset: the true next observation of the same episode), computed
        by re-running the trajectory from ``hidden_init`` with the stored ``reset`` flags and the
        learner's current params; the Q(lambda) targets are then regressed on env-major
        minibatches of whole env columns (leaves ``(N, T, ...)``), each re-run from its stored
        initial carry. Under ``axis_name``: this replica's columns, key folded with the axis
        index, gradients and metrics averaged."""
        cfg = self.config
        t, n = traj["reward"].shape
        params = learner.params
        carries, _, _ = self.apply_sequence(params, traj["hidden_init"], traj["obs"], traj["reset"])
        flat = lambda x: x.reshape((t * n, *x.shape[2:]))  # noqa: E731
        _, _, next_q = self.apply_step(params, jax.tree.map(flat, carries), flat(traj["final_obs"]),
                                       jnp.zeros((t * n,), bool))
        targets = q_lambda_returns(traj["reward"] * cfg.reward_scale, jax.lax.stop_gradient(next_q.reshape((t, n))),
                                   traj["terminated"], traj["truncated"], cfg.gamma, cfg.q_lambda)
        env_major = lambda x: jnp.swapaxes(x, 0, 1)  # noqa: E731  (T, N, ...) <-> (N, T, ...)
        batch = PQNBatch(obs={"obs": env_major(traj["obs"]), "reset": env_major(traj["reset"]),
                              "hidden": traj["hidden_init"]},
                         actions=env_major(traj["action"]).astype(jnp.int32), targets=env_major(targets))

        def q_columns(p: Any, columns: dict) -> jax.Array:
            # env-major columns (n, T, ...) from their initial carries -> Q (n, T, A)
            _, q, _ = self.apply_sequence(p, columns["hidden"], env_major(columns["obs"]), env_major(columns["reset"]))
            return env_major(q)

        key, k_update = jax.random.split(learner.key)
        if axis_name is not None:
            k_update = jax.random.fold_in(k_update, jax.lax.axis_index(axis_name))
        params, opt_state, loss_metrics = pqn_update(
            k_update, params, learner.opt_state, batch, apply_fn=q_columns, tx=self.tx,
            update_epochs=cfg.update_epochs, num_minibatches=cfg.num_minibatches, axis_name=axis_name)
        metrics = episode_metrics(traj, learner.version, axis_name)
        metrics.update(loss_metrics)
        return LearnerState(params, opt_state, key, learner.version + 1), metrics

    @classmethod
    def row_extra(cls, config: PQNConfig, metrics: dict, updates_done: int) -> dict[str, float]:
        """The ``epsilon`` column: epsilon of the chunk's last acting version."""
        steps = max(updates_done - 1, 0) * config.global_batch_size
        anneal = config.epsilon_anneal_steps
        frac = min(steps / anneal, 1.0) if anneal > 0 else 1.0
        return {"epsilon": float(np.float32(config.epsilon_start + frac * (config.epsilon_finish
                                                                           - config.epsilon_start)))}
