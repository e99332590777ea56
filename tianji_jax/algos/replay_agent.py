"""What every replay-path agent shares: its actor and learner states, the actor's half (env
reset, the rollout scan that builds exact n-step transitions across rollout chunks, one-step
acting on host envs) and the replay's plumbing (init, insert, sampling), written once against
the agent's :meth:`ReplayAgent.explore`.

A replay agent (the DQN family's :class:`~tianji_jax.algos.dqn.agent.DQNAgent`, SAC's
:class:`~tianji_jax.algos.sac.agent.SACAgent`) subclasses :class:`ReplayAgent` and supplies its
networks and optimizer, ``explore`` (one behaviour step), ``greedy_action`` (evaluation),
``env_explore`` / ``actor_explore`` (the per-env exploration parameter, e.g. DQN's epsilons),
``init_learner`` and ``update`` (one gradient update sampled from replay; the base class's
``learn`` runs a block of ``updates_per_step`` of them and applies the non-finite guard to each
whole update, target networks included). Every runtime (Anakin, the async actors and learners,
host actors, Ray workers) composes these same functions, so the async ``sync`` schedule
reproduces Anakin bit for bit for every replay algorithm. The actor and the learner own separate PRNG streams
(``ReplayActorState.key``, ``ReplayLearnerState.key``).

n-step windows across iterations: an iteration steps the envs only ``T = num_steps`` times
(often ``T = 1``), fewer than ``n``. The actor therefore keeps the last ``n - 1`` steps of each env
(``ReplayActorState.history``), prepends them to the new ``T`` steps and inserts the ``T`` transitions
that start at the oldest ``T`` steps of that window (:func:`window_transitions`): each of them sees
``n`` future steps (or its episode end), so every transition is an exact n-step one, inserted
once, ``n - 1`` steps late. Window slots not yet filled at the start of the run are masked out
of the insert. Episode boundaries follow ``docs/runtime.md``: a transition that ends in a
truncation bootstraps from the true final observation, one that ends in a termination has
discount 0 (:func:`tianji_jax.algos.dqn.n_step_transitions`).
"""

from __future__ import annotations

from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from tianji_jax.buffers import replay
from tianji_jax.algos import dqn, guard
from tianji_jax.algos.normalization import RunningMeanStd
from tianji_jax.envs.gymnax_env import GymnaxVecEnv, VecEnvState

__all__ = ["ReplayActorState", "ReplayLearnerState", "ActingParams", "ReplayAgent", "HISTORY_KEYS",
           "window_transitions"]

HISTORY_KEYS = ("obs", "action", "reward", "terminated", "truncated", "final_obs", "policy_version", "valid")
"""Keys of an n-step window (:attr:`ReplayActorState.history`, the ``steps`` of :func:`window_transitions`)."""


@struct.dataclass
class ReplayActorState:
    """What a replay actor owns (``N`` envs, window of ``H = n_step - 1`` past steps).

    Attributes:
        env_state: :class:`~tianji_jax.envs.gymnax_env.VecEnvState` of its ``N`` envs.
        obs: ``(N, *obs_shape)`` current observations.
        key: the actor's PRNG key (exploration draws, env steps).
        history: dict of the last ``H`` steps, leaves ``(H, N, ...)``: ``obs``, ``action`` (the
            agent's action dtype), ``reward`` (float32), ``terminated`` / ``truncated`` (bool),
            ``final_obs``, ``policy_version`` (int32, the version that step was acted with) and
            ``valid`` (bool, False until the slot holds a real step). Empty (``H = 0``) for
            one-step targets.
        env_steps: int32 scalar, env steps this actor has taken (drives exploration schedules).
    """

    env_state: VecEnvState
    obs: jax.Array
    key: jax.Array
    history: dict
    env_steps: jax.Array


@struct.dataclass
class ReplayLearnerState:
    """What a replay learner owns.

    Attributes:
        params: the online params (a network's, or a dict of several, e.g. SAC's actor, critics and temperature).
        target_params: target-network params.
        opt_state: optax state.
        key: the learner's PRNG key (replay sampling, the agent's own draws).
        version: int32 scalar policy version = number of learner blocks run (parameter publications).
        gradient_steps: int32 scalar, optimizer steps taken (``version * updates_per_step``).
        obs_rms: with ``normalize_observations``, the
            :class:`~tianji_jax.algos.normalization.RunningMeanStd` of every observation inserted
            into replay so far (float32, the observation's shape); None otherwise.
    """

    params: Any
    target_params: Any
    opt_state: Any
    key: jax.Array
    version: jax.Array
    gradient_steps: jax.Array
    obs_rms: Any = None


@struct.dataclass
class ActingParams:
    """What replay actors act with under ``normalize_observations`` (published by the learner
    with each policy version): the online ``params`` and the observation statistics ``obs_rms``
    (:class:`~tianji_jax.algos.normalization.RunningMeanStd`) the learner had then. Without
    normalisation the actors get the bare params instead."""

    params: Any
    obs_rms: RunningMeanStd


def window_transitions(history: dict, steps: dict, gamma: float, n: int, gap: jax.Array | None = None
                       ) -> tuple[dqn.Transition, jax.Array, jax.Array, dict]:
    """Exact n-step transitions across rollout chunks: prepend the last ``H = n - 1`` steps of the
    previous chunk to the new ``T`` steps and build the transitions that start at the window's
    oldest ``T`` steps (each sees ``n`` future steps or its episode end), keeping the newest ``H``
    steps for the next chunk. Every step is inserted exactly once, ``H`` steps late; chunk
    boundaries neither lose nor duplicate transitions. Pure; jit it.

    Args:
        history: dict with keys :data:`HISTORY_KEYS`, leaves ``(H, N, ...)``: ``obs`` /
            ``final_obs`` (observation dtype, never cast), ``action`` (int32 ``(H, N)`` or
            float32 ``(H, N, A)``), ``policy_version`` (int32), ``reward`` (float32),
            ``terminated`` / ``truncated`` / ``valid`` (bool; a slot not filled yet has ``valid=False``).
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


class ReplayAgent:
    """The actor half and the replay plumbing of a replay agent for one config (pure functions;
    callers jit). Subclasses set ``tx`` and their networks in ``__init__`` and implement
    :meth:`explore`, :meth:`greedy_action`, :meth:`init_learner` and :meth:`update`; they may
    override :meth:`env_explore` / :meth:`actor_explore` (default: a zero exploration parameter).

    Args:
        config: a validated replay config
            (:class:`~tianji_jax.algos.replay_config.ReplayConfig` subclass).

    Attributes:
        config, spec (the resolved env), env (:class:`GymnaxVecEnv` of ``num_envs``; None for a
        host env, whose actors use only the acting and learner halves), obs_shape, obs_dtype,
        history_len ``H = n_step - 1``, action_shape / action_dtype (``()`` int32 for Discrete,
        ``(A,)`` float32 for Box), example_item (one replay item: a
        :class:`~tianji_jax.buffers.transition.Transition` of ``jax.ShapeDtypeStruct``).
        ROW_METRICS: learn metrics averaged over the learner blocks of a ``metrics.csv`` row
            (names of :data:`~tianji_jax.run.results.METRIC_COLUMNS`; ``grad_norm``,
            ``policy_lag_mean`` and ``policy_lag_max`` are reported for every agent).
        NUM_ACT_KEYS: PRNG keys :meth:`explore` takes per step.
        EXPLORE_METRIC: name of the exploration column a row reports from the rollouts'
            exploration parameter (DQN: ``"epsilon"``), or None.
        frame_replay: False (DQN's envpool Atari replay stores frames once; see its agent).
        unroll_updates: False: :meth:`learn` runs its updates in a ``lax.scan``; True: in a
            Python loop (DQN's Nature CNN, slow inside an XLA:CPU loop).
        COUNTERS: the :class:`ReplayLearnerState` fields a skipped update still advances (the
            PRNG key, so that the next update samples a fresh batch, and ``gradient_steps``);
            :meth:`learn` keeps every other field as it was.
    """

    ROW_METRICS: ClassVar[tuple[str, ...]] = ()
    NUM_ACT_KEYS: ClassVar[int] = 1
    EXPLORE_METRIC: ClassVar[str | None] = None
    COUNTERS: ClassVar[tuple[str, ...]] = ("key", "gradient_steps")
    frame_replay: bool = False
    unroll_updates: bool = False

    def __init__(self, config: Any):
        self.config = config
        spec = config.env_spec
        self.spec = spec
        # host envs (envpool, gymnasium) are stepped by host actors (runtime/actors/replay_host.py), not here
        self.env = None if spec.on_host else GymnaxVecEnv(spec, config.num_envs)
        self.history_len = config.n_step - 1
        self.obs_shape = tuple(spec.observation_shape)
        self.obs_dtype = jax.dtypes.canonicalize_dtype(spec.observation_space.dtype)
        self.continuous = spec.action_kind == "continuous"
        self.mask_size = spec.action_mask_size  # trailing observation entries that are the action mask
        self.action_shape = tuple(spec.action_space.shape) if self.continuous else ()
        self.action_dtype = jnp.float32 if self.continuous else jnp.int32
        obs = jax.ShapeDtypeStruct(self.obs_shape, self.obs_dtype)
        self.example_item = dqn.Transition(obs=obs, action=jax.ShapeDtypeStruct(self.action_shape, self.action_dtype),
                                           reward=jax.ShapeDtypeStruct((), jnp.float32),
                                           discount=jax.ShapeDtypeStruct((), jnp.float32), next_obs=obs)

    # ---- what a subclass supplies ---------------------------------------------------------------
    def explore(self, params: Any, obs: jax.Array, keys: tuple[jax.Array, ...], explore: jax.Array) -> jax.Array:
        """Behaviour actions ``(B, *action_shape)`` for ``obs (B, *obs_shape)`` with the step's
        :attr:`NUM_ACT_KEYS` keys and the per-row exploration parameter ``explore (B,)`` float32."""
        raise NotImplementedError

    def greedy_action(self, params: Any, obs: jax.Array) -> jax.Array:
        """The deterministic evaluation action ``(B, *action_shape)`` for ``obs (B, *obs_shape)``."""
        raise NotImplementedError

    def init_learner(self, key: jax.Array) -> ReplayLearnerState:
        """Initialise params, target params and optimizer; version 0, no gradient steps."""
        raise NotImplementedError

    def update(self, learner: ReplayLearnerState, replay_state: Any, env_steps: jax.Array, batch_size: int,
               axis_name: str | None = None) -> tuple[ReplayLearnerState, Any, jax.Array, dict]:
        """One gradient update on ``batch_size`` items sampled from ``replay_state`` (through
        :meth:`sample` or its own sampler, then :meth:`normalize_batch`), NOT guarded here:
        :meth:`learn` keeps its learner state only when it is finite.

        Args:
            learner: the learner's state before the update.
            replay_state: the replay (this replica's shard under ``axis_name``).
            env_steps: int32 scalar, env steps so far (schedules such as PER's beta).
            batch_size: static int, the items this replica samples.
            axis_name: data-parallel learners' mapped axis (losses and gradients averaged over
                it, so ``finite`` is the same on every replica), or None.

        Returns:
            ``(learner, replay_state, finite, metrics)``: the learner state the update computed
            (every field, targets included, its key and ``gradient_steps`` advanced) even when
            not finite; the replay state, which the update itself must leave unchanged where not
            ``finite`` (e.g. no priority update); ``finite`` (bool scalar, the AND of its
            gradient steps' :attr:`~tianji_jax.algos.guard.GradientStep.finite`); float32/int32
            scalar metrics: :attr:`ROW_METRICS`, ``grad_norm``, ``policy_lag_mean`` and
            ``policy_lag_max``.
        """
        raise NotImplementedError

    def learn(self, learner: ReplayLearnerState, replay_state: Any, env_steps: jax.Array,
              axis_name: str | None = None, num_shards: int = 1) -> tuple[ReplayLearnerState, Any, dict]:
        """One learner block of ``updates_per_step`` :meth:`update` calls, then version += 1.

        The non-finite guard of every replay algorithm, in this one place: an update whose
        ``finite`` is False leaves every field of the learner state (params, target params,
        optimizer states, observation statistics) bit-identical to before, except
        :attr:`COUNTERS`, and counts 1 in ``nonfinite_skips`` (:mod:`tianji_jax.algos.guard`).

        Args:
            learner: the learner's state.
            replay_state: the replay (at least one item).
            env_steps: int32 scalar, env steps so far.
            axis_name: data-parallel learners (``num_shards`` replicas under ``shard_map``, each
                with its own replay shard): each replica samples ``batch_size / num_shards``
                items from its shard and gradients are averaged before an identical step.
            num_shards: static int, the replicas under ``axis_name`` (1 without).

        Returns:
            ``(learner, replay_state, metrics)``: scalar metrics averaged over the block's
            updates (``policy_lag_max`` its max, int32 ``nonfinite_skips`` the skipped updates):
            those of :meth:`update`.
        """
        batch_size = self.config.batch_size // num_shards

        def one(carry, _):
            lrn, rs = carry
            new, rs, finite, metrics = self.update(lrn, rs, env_steps, batch_size, axis_name)
            kept = guard.keep_if(finite, new, lrn.replace(**{f: getattr(new, f) for f in self.COUNTERS}))
            return (kept, rs), {**metrics, guard.SKIP_METRIC: guard.skip_count(finite)}

        if self.unroll_updates:
            carry, ms = (learner, replay_state), []
            for _ in range(self.config.updates_per_step):
                carry, mi = one(carry, None)
                ms.append(mi)
            (learner, replay_state), m = carry, jax.tree.map(lambda *xs: jnp.stack(xs), *ms)
        else:
            (learner, replay_state), m = jax.lax.scan(one, (learner, replay_state), None,
                                                      length=self.config.updates_per_step)
        metrics = {k: (jnp.max(v) if k == "policy_lag_max" else jnp.sum(v) if k == guard.SKIP_METRIC else jnp.mean(v))
                   for k, v in m.items()}
        return learner.replace(version=learner.version + 1), replay_state, metrics

    def env_explore(self, env_steps: jax.Array) -> jax.Array:
        """``(N,)`` float32 exploration parameters of one actor's envs after ``env_steps`` env
        steps (traced; the Anakin rollout). Default: zeros (an agent that explores by sampling)."""
        return jnp.zeros((self.config.num_envs,), jnp.float32)

    def actor_explore(self, env_steps: int, actor_id: int, num_actors: int) -> np.ndarray | None:
        """Host side: ``(num_envs,)`` float32 exploration parameters of async actor ``actor_id``
        (of ``num_actors``) after ``env_steps`` env steps of the whole run, or None when the rollout should compute
        :meth:`env_explore` itself step by step (as Anakin does). Default: None."""
        return None

    def host_explore(self, env_steps: int, actor_id: int, num_actors: int) -> np.ndarray:
        """Host actors: ``(num_envs,)`` float32 exploration parameters of actor ``actor_id`` (of
        ``num_actors``) after ``env_steps`` env steps of the whole run. Default: zeros."""
        return np.zeros((self.config.num_envs,), np.float32)

    # ---- observation normalisation (Stable-Baselines3's VecNormalize with a replay buffer) --------
    def with_statistics(self, learner: ReplayLearnerState) -> ReplayLearnerState:
        """``learner`` with fresh observation statistics (:meth:`RunningMeanStd.create` of the
        observation's shape) when the config normalises observations, else unchanged; a
        subclass's :meth:`init_learner` returns its state through it."""
        if not getattr(self.config, "normalize_observations", False):
            return learner
        return learner.replace(obs_rms=RunningMeanStd.create(self.obs_shape))

    def observe(self, learner: ReplayLearnerState, items: dqn.Transition, mask: jax.Array) -> ReplayLearnerState:
        """Fold the observations of a rollout's inserted transitions into ``learner.obs_rms``
        (``items.obs`` ``(T * N, *obs_shape)``, rows where ``mask`` ``(T * N,)`` bool is True; also
        as data-parallel learners take them, split by env into ``(L, T * N / L, ...)``),
        right after they enter replay: every step's observation is counted once, when its
        transition is inserted (``n_step - 1`` steps after it was taken). Unchanged without
        normalisation. Pure; the runtimes call it wherever they insert."""
        if learner.obs_rms is None:
            return learner
        shape = learner.obs_rms.mean.shape  # data-parallel items come split by env: (L, T * N / L, ...)
        obs = jnp.reshape(items.obs, (-1, *shape))
        return learner.replace(obs_rms=learner.obs_rms.update_masked(obs, jnp.reshape(mask, (-1,))))

    def acting_params(self, learner: ReplayLearnerState) -> Any:
        """What actors act with: ``learner.params``, or an :class:`ActingParams` pair of the params
        and the current observation statistics when the config normalises observations."""
        if learner.obs_rms is None:
            return learner.params
        return ActingParams(learner.params, learner.obs_rms)

    def unpack(self, acting: Any, obs: jax.Array) -> tuple[Any, jax.Array]:
        """``(params, obs the network sees)`` from :meth:`acting_params`' value: ``obs`` normalised
        (float32, clipped to [-10, 10]; an action mask's entries raw) with an
        :class:`ActingParams`' statistics, else unchanged."""
        if isinstance(acting, ActingParams):
            return acting.params, acting.obs_rms.normalize(obs, self.mask_size)
        return acting, obs

    def normalize_batch(self, learner: ReplayLearnerState, batch: dqn.Transition) -> dqn.Transition:
        """A sampled batch as the networks see it: ``obs`` and ``next_obs`` normalised with the
        learner's current statistics (float32) when the config normalises observations (replay
        holds raw observations), else unchanged."""
        if learner.obs_rms is None:
            return batch
        norm = learner.obs_rms.normalize
        return batch.replace(obs=norm(batch.obs, self.mask_size), next_obs=norm(batch.next_obs, self.mask_size))

    def act_greedy(self, acting: Any, obs: jax.Array) -> jax.Array:
        """:meth:`greedy_action` with :meth:`acting_params`' value (evaluation)."""
        params, obs = self.unpack(acting, obs)
        return self.greedy_action(params, obs)

    # ---- shared ---------------------------------------------------------------------------------
    def host_act(self, params: Any, obs: jax.Array, key: jax.Array, explore: jax.Array
                 ) -> tuple[jax.Array, jax.Array]:
        """Host actors' policy step: ``(actions (B, *action_shape), new key)`` for ``obs (B, *obs_shape)``
        (any dtype; the network casts) with per-row exploration parameters ``explore (B,)`` float32;
        ``params`` is :meth:`acting_params`' value (normalised observations when it carries statistics)."""
        key, *keys = jax.random.split(key, 1 + self.NUM_ACT_KEYS)
        params, obs = self.unpack(params, obs)
        return self.explore(params, obs, tuple(keys), explore), key

    def split_init_key(self, key: jax.Array) -> tuple[jax.Array, jax.Array]:
        """``(actor_key, learner_key)`` from a run's seed key."""
        k_actor, k_learner = jax.random.split(key)
        return k_actor, k_learner

    def init_actor(self, key: jax.Array) -> ReplayActorState:
        """Reset the actor's envs, empty history window; ``key`` becomes its PRNG stream."""
        key, k_env = jax.random.split(key)
        env_state, obs = self.env.reset(k_env)
        return ReplayActorState(env_state, obs.astype(self.obs_dtype), key, self.init_history(),
                                jnp.zeros((), jnp.int32))

    def init_history(self) -> dict:
        """An empty n-step window (:data:`HISTORY_KEYS`, leaves ``(H, N, ...)``, every slot
        ``valid=False``, ``policy_version=-1``)."""
        h, n = self.history_len, self.config.num_envs
        return {
            "obs": jnp.zeros((h, n, *self.obs_shape), self.obs_dtype),
            "action": jnp.zeros((h, n, *self.action_shape), self.action_dtype),
            "reward": jnp.zeros((h, n), jnp.float32),
            "terminated": jnp.zeros((h, n), bool),
            "truncated": jnp.zeros((h, n), bool),
            "final_obs": jnp.zeros((h, n, *self.obs_shape), self.obs_dtype),
            "policy_version": jnp.full((h, n), -1, jnp.int32),
            "valid": jnp.zeros((h, n), bool),
        }

    def init_replay(self, num_actors: int = 1, check_memory: bool = False, capacity: int | None = None) -> Any:
        """An empty :class:`~tianji_jax.buffers.replay.ReplayState` of ``capacity`` (default
        ``buffer_capacity``) transitions. Traceable unless ``check_memory``, which first checks
        eagerly that it fits in free device memory.

        Raises:
            MemoryError: ``check_memory`` and the buffer would not fit (the message gives the bytes).
        """
        capacity = self.config.buffer_capacity if capacity is None else capacity
        if check_memory:
            replay.check_fits(replay.replay_bytes(self.example_item, capacity))
        return replay.init(self.example_item, capacity, check_memory=False)

    def replay_size(self, replay_state: Any) -> jax.Array:
        """int32 transitions that can be sampled now."""
        return replay_state.size

    def per_beta(self, env_steps: jax.Array) -> jax.Array:
        """float32 importance-sampling exponent of prioritised replay: linear from
        ``per_beta_start`` to 1 over the run's env steps (Schaul et al. 2016, sec. 3.4); 1 for a
        config without ``per_beta_start``."""
        start = getattr(self.config, "per_beta_start", 1.0)
        frac = jnp.clip(jnp.asarray(env_steps, jnp.float32) / self.config.env_steps, 0.0, 1.0)
        return (start + (1.0 - start) * frac).astype(jnp.float32)

    def rollout(self, params: Any, version: jax.Array, actor: ReplayActorState, explore: jax.Array | None = None
                ) -> tuple[ReplayActorState, dqn.Transition, jax.Array, jax.Array, dict[str, jax.Array]]:
        """``T = num_steps`` behaviour steps of the actor's ``N`` envs with ``params``.

        Args:
            params: what to act with (:meth:`acting_params`: the online params, or with
                normalisation an :class:`ActingParams` whose statistics normalise each step's
                observation before the network sees it; replay gets the raw ones).
            version: int32 scalar, the version of ``params``; every step is stamped with it.
            actor: the actor's state.
            explore: ``(N,)`` float32 per-env exploration parameters held for the whole rollout
                (async actors pass :meth:`actor_explore`), or None: :meth:`env_explore` at each
                step's env step count (Anakin).

        Returns:
            ``(actor, items, item_version, mask, stats)``: ``items`` a
            :class:`~tianji_jax.buffers.transition.Transition` with leaves ``(T * N, ...)`` (time-major
            flattening), ``item_version`` ``(T * N,)`` int32 version each transition's first step
            was acted with, ``mask`` ``(T * N,)`` bool (False for window slots not yet filled), and
            ``stats``: ``episode_return_sum`` / ``episode_length_sum`` (float32) and
            ``episode_count`` (int32) of the episodes that ended, plus :attr:`EXPLORE_METRIC`
            (float32, mean over the ``N`` envs at the first step) when the agent names one.
        """
        cfg = self.config
        n_envs = cfg.num_envs

        def step(carry, _):
            env_state, obs, key, env_steps = carry
            key, *keys, k_env = jax.random.split(key, 2 + self.NUM_ACT_KEYS)
            eps = self.env_explore(env_steps) if explore is None else explore
            action = self.explore(*self.unpack(params, obs), tuple(keys), eps)
            env_state, ts = self.env.step(k_env, env_state, action)
            out = {"obs": obs, "action": action, "reward": ts.reward, "terminated": ts.terminated,
                   "truncated": ts.truncated, "final_obs": ts.final_obs.astype(self.obs_dtype),
                   "policy_version": jnp.full((n_envs,), version, jnp.int32), "valid": jnp.ones((n_envs,), bool),
                   "episode_return": ts.episode_return, "episode_length": ts.episode_length, "done": ts.done,
                   "explore": eps}
            return (env_state, ts.obs.astype(self.obs_dtype), key, env_steps + n_envs), out

        carry = (actor.env_state, actor.obs, actor.key, actor.env_steps)
        (env_state, obs, key, env_steps), traj = jax.lax.scan(step, carry, None, length=cfg.num_steps)
        items, item_version, mask, history = window_transitions(
            actor.history, {k: traj[k] for k in actor.history}, cfg.gamma, cfg.n_step)
        stats = {
            "episode_return_sum": jnp.sum(traj["episode_return"]),
            "episode_length_sum": jnp.sum(traj["episode_length"]).astype(jnp.float32),
            "episode_count": jnp.sum(traj["done"]).astype(jnp.int32),
        }
        if self.EXPLORE_METRIC is not None:
            stats[self.EXPLORE_METRIC] = jnp.mean(traj["explore"][0])
        return ReplayActorState(env_state, obs, key, history, env_steps), items, item_version, mask, stats

    def insert(self, replay_state: replay.ReplayState, items: dqn.Transition, item_version: jax.Array,
               mask: jax.Array) -> replay.ReplayState:
        """Add a rollout's transitions to replay (:func:`tianji_jax.buffers.replay.add`), stamped per item.

        ``items`` / ``item_version`` / ``mask`` as :meth:`rollout` returns them: leaves
        ``(T * N, ...)``, ``(T * N,)`` int32 and ``(T * N,)`` bool (False rows are skipped).
        Returns the new :class:`~tianji_jax.buffers.replay.ReplayState`; raises ValueError as
        :func:`tianji_jax.buffers.replay.add` (shapes or dtype kinds that do not match the buffer).
        """
        return replay.add(replay_state, items, item_version, mask)

    def sample(self, replay_state: Any, key: jax.Array, batch_size: int, beta: jax.Array | None = None) -> Any:
        """A batch of ``batch_size`` items: uniform (``beta`` None), or prioritised with
        importance weights of exponent ``beta`` (:func:`tianji_jax.buffers.replay.sample_prioritised`)."""
        if beta is None:
            return replay.sample(replay_state, key, batch_size)
        return replay.sample_prioritised(replay_state, key, batch_size, beta)
