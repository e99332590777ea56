"""The DQN family's agent (:class:`DQNAgent`): its Q-network, epsilon-greedy acting and the
learner's block of ``updates_per_step`` gradient updates sampled from replay, on the shared replay
actor (:class:`~tianji_jax.algos.replay_agent.ReplayAgent`: the n-step rollout, replay plumbing).

Anakin fuses acting and learning in one compiled loop; the async runtime runs the same functions
on different devices and threads, so the ``sync`` schedule reproduces Anakin bit for bit.

Sources: Mnih et al. 2015 (DQN: replay, target network, epsilon-greedy, Huber error clipping);
van Hasselt et al. 2016 (Double DQN); Wang et al. 2016 (dueling head, in
:class:`~tianji_jax.nets.networks.QNetwork`); Schaul et al. 2016 (proportional prioritised replay,
importance weights with beta annealed to 1); Hessel et al. 2018 (n-step targets in replay);
Bellemare et al. 2017 (C51) and Dabney et al. 2018 (QR-DQN) in
:mod:`tianji_jax.algos.dqn.distributional`; Horgan et al. 2018 (Ape-X's per-env epsilons).
"""

from __future__ import annotations

from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
import optax

from tianji_jax.buffers import frame_replay, replay
from tianji_jax.algos import dqn
from tianji_jax.algos.dqn.config import DQNConfig
from tianji_jax.algos.dqn.distributional import c51_support, distributional_loss, expected_q
from tianji_jax.algos import guard
from tianji_jax.algos.replay_agent import ReplayActorState, ReplayAgent, ReplayLearnerState
from tianji_jax.envs.suites import masked, random_allowed
from tianji_jax.nets.networks import QNetwork, check_network, resolve_torso

__all__ = ["DQNAgent", "DQNActorState", "DQNLearnerState", "FRAME_KEYS", "actor_epsilons", "make_q_network",
           "make_dqn_optimizer"]

_PER_EPS = 1e-6

DQNActorState = ReplayActorState
"""A DQN actor's state (the replay actor state; the name kept for the public API)."""
DQNLearnerState = ReplayLearnerState
"""The DQN learner's state (the replay learner state; the name kept for the public API)."""

FRAME_KEYS = ("obs", "final_frame", "action", "reward", "terminated", "truncated", "policy_version", "start")
"""Keys of a host actor's frame chunk (:meth:`DQNAgent.insert_frames`)."""


def make_q_network(config: DQNConfig) -> QNetwork:
    """The :class:`~tianji_jax.nets.networks.QNetwork` for ``config``'s env (``A = action_space.n``), its
    torso ``config.torso`` (:func:`~tianji_jax.nets.networks.resolve_torso`; ``auto``: Nature CNN for
    Atari frame stacks, the small CNN for MinAtar-like images, else the MLP of ``hidden_sizes``).

    Raises:
        ValueError: the network's parameters would hold a zero-size array for this observation
            shape (:func:`~tianji_jax.nets.networks.check_network`).
    """
    shape = tuple(config.env_spec.observation_shape)
    network = QNetwork(action_dim=config.env_spec.action_space.n, hidden_sizes=tuple(config.hidden_sizes),
                       activation=config.activation, dueling=config.dueling, torso=resolve_torso(config.torso, shape),
                       obs_shape=shape, num_atoms=config.num_atoms if config.distributional != "none" else 1)
    check_network(network, shape, config.env_spec.observation_space.dtype)
    return network


def make_dqn_optimizer(config: DQNConfig) -> optax.GradientTransformation:
    """Adam (``learning_rate``, eps 1e-8 as CleanRL/PureJaxRL) after global-norm clipping at ``max_grad_norm``."""
    return optax.chain(optax.clip_by_global_norm(config.max_grad_norm), optax.adam(config.learning_rate))


class DQNAgent(ReplayAgent):
    """Pure DQN-family actor and learner functions for one config (not jitted here; callers jit).

    Args:
        config: a validated :class:`~tianji_jax.config.DQNConfig`.

    Attributes:
        network (:class:`QNetwork`), tx (optax), num_actions ``A``, frame_replay (envpool Atari:
        replay stores frames once), support (C51's atoms or None), unroll_updates (True for
        the Nature CNN torso: a block's updates run in a Python loop), plus
        :class:`~tianji_jax.algos.replay_agent.ReplayAgent`'s.

    Raises:
        TypeError: ``config`` is not a :class:`~tianji_jax.config.DQNConfig`.
        ValueError: the network cannot take this env's observations (:func:`make_q_network`).
    """

    ROW_METRICS: ClassVar[tuple[str, ...]] = ("td_loss", "q_mean")
    NUM_ACT_KEYS: ClassVar[int] = 2
    EXPLORE_METRIC: ClassVar[str | None] = "epsilon"

    def __init__(self, config: DQNConfig):
        if not isinstance(config, DQNConfig):
            raise TypeError(f"config must be a DQNConfig, got {type(config).__name__}")
        super().__init__(config)
        self.network = make_q_network(config)
        self.tx = make_dqn_optimizer(config)
        self.num_actions = int(self.spec.action_space.n)
        self.frame_replay = config.frame_replay
        # XLA:CPU runs convolutions inside a while loop (lax.scan, even unroll=True) ~5-15x slower
        # than outside one (jax 0.10, Nature CNN batch 16: 0.35 s against 0.07 s per learner block
        # here), so the CNN's block of a few updates is unrolled in Python
        self.unroll_updates = self.network.torso == "nature_cnn"
        self.support = (c51_support(config.num_atoms, config.v_min, config.v_max)
                        if config.distributional == "c51" else None)

    # ---- network ------------------------------------------------------------------------------
    def apply(self, params: Any, obs: jax.Array) -> jax.Array:
        """Q-values: ``obs (B, *obs_shape)`` -> ``(B, A)`` float32 (a distributional head's mean);
        actions an env's action mask forbids get :data:`~tianji_jax.envs.suites.MASKED`, so the
        greedy action, the double-Q argmax and the bootstrap maximum are masked."""
        out = self.network.apply(params, obs)
        kind = self.config.distributional
        return masked(out if kind == "none" else expected_q(out, kind, self.support), obs, self.mask_size)

    def greedy_action(self, params: Any, obs: jax.Array) -> jax.Array:
        """``(B,)`` int32 ``argmax_a Q(obs, a)`` (ties: lowest index); the evaluation policy."""
        return jnp.argmax(self.apply(params, obs), axis=-1).astype(jnp.int32)

    def explore(self, params: Any, obs: jax.Array, keys: tuple[jax.Array, ...], explore: jax.Array) -> jax.Array:
        """Epsilon-greedy actions ``(B,)`` int32: a uniform random action with probability
        ``explore (B,)`` (the epsilons, or a scalar), else :meth:`greedy_action` (Mnih et al.
        2015); ``keys = (k_explore, k_random)``."""
        k_explore, k_random = keys
        b = obs.shape[0]
        greedy = self.greedy_action(params, obs)
        random_action = random_allowed(k_random, obs, self.mask_size, self.num_actions)  # masked: among allowed
        explore_now = jax.random.uniform(k_explore, (b,)) < explore
        return jnp.where(explore_now, random_action, greedy)

    def epsilon(self, env_steps: jax.Array) -> jax.Array:
        """float32 exploration epsilon after ``env_steps`` env steps: linear from ``epsilon_start``
        to ``epsilon_end`` over ``config.epsilon_decay_steps`` (Mnih et al. 2015), then constant."""
        cfg = self.config
        return dqn.linear_epsilon(env_steps, cfg.epsilon_start, cfg.epsilon_end, cfg.epsilon_decay_steps)

    def env_explore(self, env_steps: jax.Array) -> jax.Array:
        """``(N,)`` float32 epsilons of one actor's ``N = num_envs`` envs after ``env_steps`` env
        steps: :meth:`epsilon` for every env (``epsilon_schedule='linear'``), or Ape-X's fixed
        ``apex_epsilon^(1 + apex_alpha * i / (N - 1))`` (``'apex'``; Horgan et al. 2018, sec. 4) for
        a single actor. Async runs with several actors pass their slice of :func:`actor_epsilons`
        to :meth:`rollout` instead."""
        cfg = self.config
        if cfg.epsilon_schedule == "apex":
            return dqn.apex_epsilons(cfg.num_envs, cfg.apex_epsilon, cfg.apex_alpha)
        return jnp.full((cfg.num_envs,), self.epsilon(env_steps), jnp.float32)

    def actor_explore(self, env_steps: int, actor_id: int, num_actors: int) -> np.ndarray | None:
        """Async actor ``actor_id``'s epsilons: None for the linear schedule (the rollout follows
        the run's env steps step by step, as Anakin), Ape-X's fixed slice otherwise
        (:func:`actor_epsilons`)."""
        if self.config.epsilon_schedule == "linear":
            return None
        return actor_epsilons(self.config, env_steps, actor_id, num_actors)

    def host_explore(self, env_steps: int, actor_id: int, num_actors: int) -> np.ndarray:
        """Host actors' ``(num_envs,)`` float32 epsilons (:func:`actor_epsilons`)."""
        return actor_epsilons(self.config, env_steps, actor_id, num_actors)

    # ---- init ---------------------------------------------------------------------------------
    def init_learner(self, key: jax.Array) -> DQNLearnerState:
        """Initialise online params (target = a copy), optimizer; version 0, no gradient steps."""
        key, k_net = jax.random.split(key)
        params = self.network.init(k_net, jnp.zeros((1, *self.obs_shape), jnp.float32))
        zero = jnp.zeros((), jnp.int32)
        return self.with_statistics(DQNLearnerState(params, jax.tree.map(jnp.copy, params), self.tx.init(params),
                                                    key, zero, zero))

    def init_replay(self, num_actors: int = 1, check_memory: bool = False, capacity: int | None = None) -> Any:
        """An empty replay buffer of ``capacity`` (default ``buffer_capacity``) transitions: a
        :class:`~tianji_jax.buffers.frame_replay.FrameReplayState` with one ring per env of the
        ``num_actors`` actors (env ``actor * num_envs + e``) when ``config.frame_replay``, else a
        :class:`~tianji_jax.buffers.replay.ReplayState`. Traceable (it can live inside a jitted / vmapped
        ``init`` or ``jax.eval_shape``) unless ``check_memory``, which first checks eagerly that it
        fits in free device memory (the config checked it once already).

        Raises:
            MemoryError: ``check_memory`` and the buffer would not fit (the message gives the bytes).
        """
        cfg = self.config
        capacity = cfg.buffer_capacity if capacity is None else capacity
        if self.frame_replay:
            return frame_replay.init(num_actors * cfg.num_envs, capacity, self.obs_shape[1:],
                                     stack=self.obs_shape[0], n_step=cfg.n_step, gamma=cfg.gamma,
                                     prioritised=cfg.prioritized, frame_dtype=self.obs_dtype,
                                     check_memory=check_memory)
        return super().init_replay(num_actors, check_memory, capacity)

    def replay_size(self, replay_state: Any) -> jax.Array:
        """int32 transitions that can be sampled now (``size``; frame replay: ``num_valid``)."""
        return replay_state.num_valid if self.frame_replay else replay_state.size

    def insert_frames(self, replay_state: Any, chunk: dict, env_offset: jax.Array, gap: jax.Array) -> Any:
        """Add a host actor's ``(T, N)`` chunk to the frame replay (:mod:`tianji_jax.buffers.frame_replay`),
        every frame stored once; n-step returns are formed when sampling.

        Per env column and step ``t``, in order: where ``start[t]`` (the stack ``obs[t]`` begins a
        stretch of the env's stream: the first observation after a reset or a lost life, or after
        a gap), the ``S`` frames of ``obs[t]`` as episode-start frames (the oldest restarts the
        stack), so the rebuilt stack equals ``obs[t]`` whatever came before; then the step's
        successor frame ``final_frame[t]`` with its action, reward, flags and version. A stretch
        that ends without ``terminated`` / ``truncated`` (a gap) loses its last ``n`` starts
        (their lookahead is cut), never mixes frames across the gap. Jit with ``donate_argnums=0``.

        Args:
            replay_state: the :class:`~tianji_jax.buffers.frame_replay.FrameReplayState`.
            chunk: :data:`FRAME_KEYS`, leaves ``(T, N, ...)``: ``obs`` ``(T, N, S, H, W)`` the stacks
                acted on; ``final_frame`` ``(T, N, H, W)`` the newest frame of each step's true
                successor; ``action`` / ``policy_version`` int32; ``reward`` float32;
                ``terminated`` / ``truncated`` / ``start`` bool.
            env_offset: int32 scalar, ring of column 0 (``actor_id * num_envs``).
            gap: bool scalar: chunks of this actor were dropped before this one (the lag gate), so
                every column restarts at ``t = 0``.

        Returns:
            the new replay state.
        """
        n, s = self.config.num_envs, self.obs_shape[0]
        env_id = jnp.asarray(env_offset, jnp.int32) + jnp.arange(n, dtype=jnp.int32)
        chunk = {**chunk, "start": chunk["start"].at[0].set(chunk["start"][0] | gap)}
        zeros_i, zeros_f, no = jnp.zeros((n,), jnp.int32), jnp.zeros((n,), jnp.float32), jnp.zeros((n,), bool)

        def write_stacks(rs, x):
            for j in range(s):
                rs = frame_replay.add(rs, x["obs"][:, j], zeros_i, zeros_f, no, no, ~no, x["policy_version"],
                                      stack_reset=jnp.full((n,), j == 0), env_id=env_id, mask=x["start"])
            return rs

        def step(rs, x):
            rs = jax.lax.cond(jnp.any(x["start"]), write_stacks, lambda r, _: r, rs, x)
            rs = frame_replay.add(rs, x["final_frame"], x["action"], x["reward"], x["terminated"], x["truncated"],
                                  no, x["policy_version"], stack_reset=no, env_id=env_id)
            return rs, None

        replay_state, _ = jax.lax.scan(step, replay_state, {k: chunk[k] for k in FRAME_KEYS})
        return replay_state

    # ---- learner ------------------------------------------------------------------------------
    def _loss(self, params: Any, target_params: Any, batch: dqn.Transition, weights: jax.Array):
        cfg = self.config
        if cfg.distributional != "none":  # C51 / QR-DQN: per-item losses are also the new priorities
            out, next_target = self.network.apply(params, batch.obs), self.network.apply(target_params, batch.next_obs)
            select = self.apply(params, batch.next_obs) if cfg.double_q else masked(
                expected_q(next_target, cfg.distributional, self.support), batch.next_obs, self.mask_size)
            per_item = distributional_loss(cfg.distributional, out, next_target, select, batch.action, batch.reward,
                                           batch.discount, self.support)
            w = jnp.ones_like(per_item) if weights is None else jax.lax.stop_gradient(weights)
            q_a = jnp.take_along_axis(expected_q(out, cfg.distributional, self.support), batch.action[:, None], -1)
            return jnp.mean(w * per_item), (jax.lax.stop_gradient(per_item), q_a[:, 0])
        q = self.apply(params, batch.obs)
        q_next_target = self.apply(target_params, batch.next_obs)
        if cfg.double_q:
            boot = dqn.double_q_target(self.apply(params, batch.next_obs), q_next_target)
        else:
            boot = dqn.max_q_target(q_next_target)
        targets = batch.reward + batch.discount * boot
        loss, td = dqn.td_loss(q, batch.action, targets, weights, cfg.huber_delta)
        q_a = jnp.take_along_axis(q, batch.action[:, None], axis=-1)[:, 0]
        return loss, (td, q_a)

    def update(self, learner: DQNLearnerState, replay_state: Any, env_steps: jax.Array, batch_size: int,
               axis_name: str | None = None) -> tuple[DQNLearnerState, Any, jax.Array, dict[str, jax.Array]]:
        """One gradient update (the base class's :meth:`~ReplayAgent.learn` runs a block of
        ``updates_per_step`` of them and keeps each one's learner state only when it is finite).

        Samples ``batch_size`` transitions (uniform, or prioritised with importance weights and
        beta from :meth:`per_beta` at ``env_steps``; from the frame replay when
        ``config.frame_replay``, whose stacks and n-step targets are rebuilt at sampling), computes the n-step target
        ``reward + discount * V(next_obs)`` with the double-Q or max-Q bootstrap from the target
        net, takes one Adam step on the (Huber) TD loss (or C51's / QR-DQN's distributional
        loss), updates the sampled priorities (PER; only when finite) and the target net (hard
        copy every ``target_update_period`` gradient steps, or Polyak).

        Args:
            learner: the learner's state.
            replay_state: the buffer (:meth:`init_replay`'s kind; must hold at least one item; the config guarantees
                ``batch_size`` items once learning starts).
            env_steps: int32 scalar, env steps taken so far (beta annealing only).
            batch_size: static int, items sampled (``config.batch_size / num_shards``).
            axis_name: data-parallel learners (inside ``shard_map`` over this axis, each with its
                own replay shard): the sampling key is folded with the axis index (prioritised
                draws use the shard's own priorities and importance weights), and the loss,
                gradients and metrics are averaged over the axis (``pmean``; the lag's max is
                ``pmax``) before the identical step, so the replicas stay equal and the
                non-finite decision is global. Priorities are updated in each shard from its own
                TD errors.

        Returns:
            ``(learner, replay_state, finite, metrics)`` as :meth:`ReplayAgent.update`; metrics
            are float32 scalars ``td_loss``, ``q_mean`` (mean ``Q(s, a)`` of the sampled actions),
            ``grad_norm`` (before clipping), ``policy_lag_mean`` and int32 ``policy_lag_max``
            (learner version minus the sampled items' stamps).
        """
        cfg = self.config
        beta = self.per_beta(env_steps)
        mean = (lambda x: x) if axis_name is None else (lambda x: jax.lax.pmean(x, axis_name))  # noqa: E731
        lrn, rs = learner, replay_state
        key, k_sample = jax.random.split(lrn.key)
        if axis_name is not None:  # each replica draws from its own shard
            k_sample = jax.random.fold_in(k_sample, jax.lax.axis_index(axis_name))
        if self.frame_replay:
            s = frame_replay.sample(rs, k_sample, batch_size, beta if cfg.prioritized else 0.0)
            batch = s.transition
        elif cfg.prioritized:
            s = replay.sample_prioritised(rs, k_sample, batch_size, beta)
            batch = s.item
        else:
            s = replay.sample(rs, k_sample, batch_size)
            batch = s.item
        batch = self.normalize_batch(lrn, batch)  # raw observations in replay, normalised as sampled
        step = guard.gradient_step(self._loss, self.tx, lrn.params, lrn.opt_state, lrn.target_params, batch,
                                   s.weights if cfg.prioritized else None, axis_name=axis_name, guard=False)
        loss, (td, q_a), params, opt_state = step.loss, step.aux, step.params, step.opt_state
        finite = step.finite  # else: learn keeps the old learner state; no priority update (index -1 is ignored)
        steps = lrn.gradient_steps + 1
        if cfg.target_update_period is not None:
            target = dqn.periodic_hard_update(lrn.target_params, params, steps, cfg.target_update_period)
        else:
            target = dqn.polyak_update(lrn.target_params, params, cfg.tau)
        if cfg.prioritized:
            indices = jnp.where(finite, s.indices, -1)
            if self.frame_replay:
                rs = frame_replay.update_priorities(rs, indices, s.step, td, cfg.per_alpha, _PER_EPS)
            else:
                rs = replay.update_priorities(rs, indices, td, cfg.per_alpha, _PER_EPS,
                                              insert_index=s.insert_index)
        lag = lrn.version - s.policy_version
        lag_max = jnp.max(lag) if axis_name is None else jax.lax.pmax(jnp.max(lag), axis_name)
        metrics = {"td_loss": loss, "q_mean": mean(jnp.mean(q_a)), "grad_norm": step.grad_norm,
                   "policy_lag_mean": mean(jnp.mean(lag.astype(jnp.float32))), "policy_lag_max": lag_max}
        return (lrn.replace(params=params, target_params=target, opt_state=opt_state, key=key, gradient_steps=steps),
                rs, finite, metrics)


def actor_epsilons(config: DQNConfig, env_steps: int, actor_id: int, num_actors: int | None = None) -> np.ndarray:
    """``(num_envs,)`` float32 exploration epsilons of actor ``actor_id``'s envs (async runtime).

    ``epsilon_schedule='linear'``: every env gets ``epsilon_start + (epsilon_end - epsilon_start) *
    min(1, env_steps / epsilon_decay_steps)`` (Mnih et al. 2015), ``env_steps`` counting the env
    steps of all actors together. ``'apex'``: fixed Ape-X epsilons (Horgan et al. 2018, sec. 4)
    ``eps_i = apex_epsilon^(1 + apex_alpha * i / (N - 1))`` with ``i = actor_id * num_envs + e``
    over ``N = num_actors * num_envs`` envs (``N = 1``: ``apex_epsilon``); ``env_steps`` is unused.
    ``num_actors`` defaults to ``config.num_actors`` (pass the run's when ``config`` is a compile key).

    Raises:
        ValueError: ``actor_id`` outside ``[0, num_actors)``.
    """
    num_actors = config.num_actors if num_actors is None else num_actors
    if not 0 <= actor_id < num_actors:
        raise ValueError(f"actor_id={actor_id} must be in [0, num_actors={num_actors})")
    n = config.num_envs
    if config.epsilon_schedule == "apex":
        eps = dqn.apex_epsilons(num_actors * n, config.apex_epsilon, config.apex_alpha)
        return np.asarray(eps, np.float32)[actor_id * n:(actor_id + 1) * n]
    frac = min(1.0, max(0.0, env_steps / config.epsilon_decay_steps))
    eps = config.epsilon_start + (config.epsilon_end - config.epsilon_start) * frac
    return np.full((n,), eps, np.float32)
