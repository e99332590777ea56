"""What every replay algorithm's config shares (:class:`ReplayConfig`): the run, the iteration and
replay sizes, the replay ratio, the optimizer, n-step targets, the network widths, evaluation,
the TianJi runtime and the learner layout, with their checks and derived sizes.

A replay algorithm (the DQN family, SAC) subclasses it with its own hyper-parameters and checks
(:meth:`ReplayConfig._check_fields`, :meth:`ReplayConfig._check_env`); a subclass may redeclare a
shared field to give it its own default. Imports nothing from :mod:`tianji_jax.runtime`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal

import tyro

from tianji_jax.algos.config_base import (AgentConfig, check_bool, check_float, check_int, _check_shared, _check_torso,
                                    _describe_env_layer, plain_numbers, fields_in, layout, run, tianji)
from tianji_jax.algos import capabilities
from tianji_jax.algos.config_checks import (_check_async_only, _check_distributed, _check_host_fields, _check_ray,
                                     _check_replay_layout)
from tianji_jax.envs.registry import EnvSpec, resolve_env

__all__ = ["ReplayConfig"]

_RUNTIMES = ("anakin", "async")


@dataclass(frozen=True)
class ReplayConfig(AgentConfig):
    """The fields and checks every replay algorithm's config shares (not registered itself).

    One **iteration** = the actor steps its ``num_envs`` envs ``num_steps`` times with the
    behaviour policy (``num_envs * num_steps`` env steps, inserted into replay as n-step
    transitions), then, once more than ``learning_starts`` env steps have been taken, the learner
    runs a block of ``updates_per_step`` gradient steps and publishes its params (policy version
    += 1). ``updates_per_step = num_envs * num_steps * replay_ratio`` must be a whole number, so
    the replay ratio (gradient updates per env step) holds exactly, with no credit accumulator.
    With ``runtime='async'`` actor threads produce such iterations concurrently with the learner
    (the rate limiter holds the replay ratio); on host envs (envpool, gymnasium) each actor steps
    its envs on the host and acts on the actor device (:mod:`tianji_jax.runtime.actors.replay_host`).

    All step counts are env steps (one transition of one environment) unless the field says
    "gradient updates". Derived quantities are properties: ``iteration_env_steps``,
    ``updates_per_step``, ``num_iterations``, ``env_steps``, ``learning_iterations``,
    ``iterations_per_chunk``, ``num_gradient_steps``, ``replay_bytes``.

    Raises:
        ValueError: a value outside its allowed range (the message names the field, the value and
            what is allowed), a runtime other than ``"anakin"`` / ``"async"``, a host env
            (envpool, gymnasium) with ``runtime="anakin"``, an unsupported (runtime, actors,
            learners, env) cell, a replay ratio that does not give a whole number of gradient
            updates per iteration, or ``learning_starts`` too small to fill one batch.
        TypeError: a scalar of the wrong type.
        MemoryError: the replay buffer (``replay_bytes``) would not fit in the default device's
            free memory (checked with :func:`tianji_jax.buffers.replay.check_fits` before anything is
            allocated).
    """

    ALGO: ClassVar[str] = ""
    """The registered name (the capability table's ``algo``)."""

    env: Annotated[Any, tyro.conf.arg(constructor=str, metavar="STR",
                                       help_behavior_hint="(default: gymnax:CartPole-v1)")] = "gymnax:CartPole-v1"
    """Environment (the algorithm names the action spaces it takes): ``"gymnax:<id>"`` (or a bare gymnax id),
    ``"envpool:<id>"`` or ``"gymnasium:<id>"`` (host envs, runtime='async' only), or a gymnax-style
    environment object; ids may end in ``|``-separated wrappers (see PPOConfig.env)."""
    seed: int = run(0)
    """Seed of the run's PRNG key; in [0, 2**32)."""
    total_env_steps: int = 500_000
    """Training budget in env steps (rounded down to a whole number of iterations)."""
    num_envs: int = 10
    """Number of parallel training environments N."""
    num_steps: int = 1
    """Rollout length T per iteration: env steps per env between two learner blocks."""
    buffer_capacity: int = 10_000
    """Replay capacity C in transitions (circular FIFO); in [1, 2**30] (the prioritised sum-tree's int32
    heap indices)."""
    learning_starts: int = 10_000
    """Learner blocks run only in iterations that end with more than this many env steps taken."""
    batch_size: int = 128
    """Transitions per gradient update."""
    replay_ratio: float = 0.1
    """Gradient updates per env step; ``num_envs * num_steps * replay_ratio`` must be a whole number >= 1."""
    learning_rate: float = 2.5e-4
    """Adam step size."""
    max_grad_norm: float = 10.0
    """Global-norm gradient clipping threshold, > 0."""
    gamma: float = 0.99
    """Discount factor, in [0, 1]."""
    n_step: int = 3
    """Steps of the n-step return (1 = one-step TD target)."""
    normalize_observations: bool = False
    """Normalise observations by a running mean/std (clipped to [-10, 10]), as Stable-Baselines3's
    VecNormalize does for replay algorithms: replay stores raw observations; the statistics fold in
    every observation as it is inserted into replay (learner side, so several actors need no merge)
    and are published with the params; actors act on observations normalised with the published
    statistics, and sampled ``obs`` / ``next_obs`` are normalised with the current ones. Every env
    backend, runtime and learner layout in one process (learner groups share one set); not with a
    frame replay (envpool Atari). An action mask's entries pass through raw."""
    hidden_sizes: tuple[int, ...] = (120, 84)
    """Hidden layer widths of the MLP (each network of the algorithm)."""
    activation: Literal["tanh", "relu"] = "relu"
    """Hidden activation."""
    torso: Annotated[Any, tyro.conf.arg(constructor=str, metavar="STR",
                                         help_behavior_hint="(default: auto)")] = "auto"
    """The network's torso: 'auto', 'mlp', 'nature_cnn', 'small_cnn' or a user torso
    'package.module:factory' (see PPOConfig.torso); the algorithm's heads sit on its features."""
    eval_every_env_steps: int = 25_000
    """Evaluate every this many env steps (rounded to whole iterations); also the logging interval."""
    eval_episodes: int = 10
    """Episodes per evaluation with the deterministic policy (DQN: greedy); 0 disables evaluation."""
    stop_at_return: float | None = run(None)
    """Stop early once ``eval_return_mean`` reaches this value (needs ``eval_episodes > 0``)."""
    runtime: Literal["anakin", "async"] = "anakin"
    """'anakin': acting and learning fused on one device; 'async': actor threads on one device
    feed the learner's replay buffer on another through a rate limiter (TianJi mode)."""
    max_policy_lag: int = tianji(4)
    """Async: the lag gate at insert: a rollout acted with params more than this many versions
    behind the learner when it reaches the replay buffer is dropped (docs/runtime.md, "The lag contract")."""
    schedule: Literal["sync", "relaxed", "auto"] = tianji("relaxed")
    """Async: 'relaxed' (actors act with the newest params whenever the rate limiter admits a
    chunk; the TianJi mode), 'auto' (relaxed, with the samples-per-insert band tuned online within
    replay_ratio_tolerance: tianji_jax/runtime/tianji/auto_schedule.py) or 'sync' (one actor; chunk k is
    acted with the params published after the learner processed chunk k-1, exactly as an Anakin
    iteration: lag 0, bit-reproducible; max_policy_lag is then unused)."""
    replay_ratio_tolerance: float = tianji(1.0)
    """Async: how far the replay ratio may stray, as the rate limiter's band half-width in multiples
    (>= 1) of the narrowest band that cannot deadlock (one block's samples + one chunk's inserts'
    worth of samples); 1 is the tightest. 'relaxed' uses this band; 'auto' moves within [1, this]."""
    num_actors: int = tianji(1)
    """Async: actor threads, each with its own num_envs envs."""
    stall_timeout_s: float = tianji(60.0)
    """Async: stop with an error when the learner gets no fresh data this long (seconds; 300 s more
    until the other side's first result, which includes its compilation)."""
    max_nonfinite_updates: int = run(5)
    """Consecutive updates with a skipped gradient step (a non-finite loss or gradient: the step
    is not applied and is counted in ``nonfinite_skips``) that stop the run with an error, >= 1."""
    actor_backend: Literal["threads", "ray"] = layout("threads")
    """Async: where actors run. 'threads': actor threads in this process; 'ray': remote actor
    processes on Ray Core (any node of a Ray cluster), each with its own num_envs envs (host envs,
    or device envs stepped on its CPU through GymnaxHostVecEnv) and a
    CPU copy of the acting network, building its n-step transitions (or Atari frame chunks) itself and
    feeding this learner's replay through the same lag gate at insert and rate limiter (needs
    ``pip install tianji-jax[ray]``). Schedules such as DQN's linear epsilon read the run's env
    steps as of each chunk's request."""
    ray_address: str | None = layout(None)
    """actor_backend='ray': the cluster to join ('auto' or 'HOST:PORT'); None reuses this
    process's Ray connection or starts a private local instance on 127.0.0.1."""
    ray_max_restarts: int = layout(3)
    """actor_backend='ray': times Ray restarts each dead actor (its lost chunk is counted in
    ``lost_chunks``); one more death stops the run with an error."""
    num_learner_devices: int = layout(1)
    """Data-parallel learner replicas L (async: the last L devices, the actors keep the first;
    Anakin: the first L devices, each stepping num_envs / L of the run's envs). The
    replay is sharded by env over them (each holds buffer_capacity / L transitions of num_envs / L
    env columns of every actor, with its own priorities); every gradient update each replica
    samples batch_size / L items from its shard and the gradients are averaged. L must divide
    num_envs, batch_size and buffer_capacity. Not with frame replay (envpool Atari) yet."""
    num_learner_groups: int = layout(1)
    """Async: independent learner groups G (TianJi's parallel learners). Each group is one learner
    device with its own replay of buffer_capacity / G transitions, rate limiter, optimizer state
    and policy version, fed by num_actors / G of the actors (actor i feeds group i % G and acts
    with that group's params); each starts learning after learning_starts / G of its own env
    steps, and every sync_every blocks of their own the groups average their online and target
    params. The run's learner blocks (learning_iterations) are split evenly over the groups. Not
    combined with num_learner_devices > 1, frame replay (Atari) or resume yet."""
    sync_every: int = layout(1)
    """Learner groups: each group's learner blocks between param averagings (and always at its
    last block). Needs ``num_learner_groups > 1``."""
    num_processes: int = layout(1)
    """Async, multi-host (jax.distributed): processes in the job P. Each runs this config's actors
    (num_actors x num_envs envs) and holds 1/P of the replay (its own env columns, sharded over its
    num_learner_devices); every gradient update samples batch_size / P items on each process and
    averages the gradients over all processes. An iteration counts every process's env steps
    (P x num_envs x num_steps), as do total_env_steps, learning_starts, buffer_capacity and
    updates_per_step. P x num_learner_devices must divide batch_size and buffer_capacity."""
    process_id: int = layout(0)
    """This process's index in 0..num_processes-1 (SLURM: $SLURM_PROCID)."""
    coordinator: str | None = layout(None)
    """'HOST:PORT' of process 0's coordination service (needed when num_processes > 1)."""
    heartbeat_timeout_s: int = layout(60)
    """Multi-host: a process silent this long is declared dead and every survivor exits non-zero;
    a collective learner block that makes no progress for this long + stall_timeout_s + 30 s also
    ends the process."""
    env_batch_size: int | None = layout(None)
    """envpool only (async runtime): envs per received batch; below ``num_envs`` envpool runs in async
    mode (the actor acts on whichever envs finished first). None: sync mode (all envs every step)."""
    def __post_init__(self) -> None:
        plain_numbers(self)
        check_int("seed", self.seed, minimum=0, maximum=2**32 - 1)
        for name in ("total_env_steps", "num_envs", "num_steps", "buffer_capacity", "batch_size", "n_step",
                     "eval_every_env_steps"):
            check_int(name, getattr(self, name), minimum=1)
        check_int("total_env_steps", self.total_env_steps, maximum=2**31 - 1)  # int32 step counters
        # the prioritised sum-tree indexes its heap nodes in int32 (tianji_jax.buffers.sum_tree.MAX_CAPACITY)
        check_int("buffer_capacity", self.buffer_capacity, maximum=2**30)
        check_int("learning_starts", self.learning_starts, minimum=0)
        check_int("eval_episodes", self.eval_episodes, minimum=0)
        check_int("max_nonfinite_updates", self.max_nonfinite_updates, minimum=1)
        check_bool("normalize_observations", self.normalize_observations)
        check_float("replay_ratio", self.replay_ratio, low=0.0, low_open=True)
        _check_shared(self)
        self._check_fields()
        # the env first: an action space the algorithm cannot take is refused before budget rules
        spec = resolve_env(self.env)  # raises ValueError for unknown ids / unsupported spaces
        if isinstance(self.env, str) and ":" not in self.env:
            object.__setattr__(self, "env", f"{spec.backend}:{self.env}")
        capabilities.check_action_space(self.ALGO, self, spec)  # MultiDiscrete: PPO only
        check_int("max_policy_lag", self.max_policy_lag, minimum=0)
        check_int("num_actors", self.num_actors, minimum=1)
        check_float("stall_timeout_s", self.stall_timeout_s, low=0.0, low_open=True)
        if self.runtime not in _RUNTIMES:
            raise ValueError(f"runtime must be one of {_RUNTIMES}, got {self.runtime!r}")
        if self.schedule not in ("sync", "relaxed", "auto"):
            raise ValueError(f"schedule must be one of ('sync', 'relaxed', 'auto'), got {self.schedule!r}")
        check_float("replay_ratio_tolerance", self.replay_ratio_tolerance, low=1.0)
        if self.schedule == "sync" and self.replay_ratio_tolerance != 1.0:
            raise ValueError(f"replay_ratio_tolerance={self.replay_ratio_tolerance} applies to schedules 'relaxed' and "
                             "'auto' (under 'sync' the limiter only reports); allowed: 1.0 (default) with 'sync'")
        check_int("num_learner_groups", self.num_learner_groups, minimum=1)
        groups = self.num_learner_groups
        if self.runtime == "async" and self.schedule == "sync" and self.num_actors != groups:
            raise ValueError(f"num_actors must be {groups} (one per learner group) for schedule 'sync', got "
                             f"{self.num_actors}; use schedule 'relaxed' for several actors")
        self._check_target()
        check_int("num_processes", self.num_processes, minimum=1)
        procs = "num_processes * " if self.num_processes > 1 else ""
        # replay ratio: a whole number of gradient updates per iteration
        per_iter = self.global_iteration_env_steps * self.replay_ratio
        u = round(per_iter)
        if u < 1 or abs(per_iter - u) > 1e-9 * max(1.0, per_iter):
            raise ValueError(
                f"replay_ratio={self.replay_ratio} must make {procs}num_envs * num_steps * replay_ratio = "
                f"{self.global_iteration_env_steps} * {self.replay_ratio} = {per_iter:.6g} a whole number >= 1 "
                f"(gradient updates per iteration); allowed values: k / {self.global_iteration_env_steps} for ints "
                "k >= 1")
        object.__setattr__(self, "_updates_per_step", int(u))
        if self.total_env_steps < self.global_iteration_env_steps:
            raise ValueError(f"total_env_steps={self.total_env_steps} must be >= {procs}num_envs * num_steps = "
                             f"{self.global_iteration_env_steps} (one iteration)")
        # the buffer must hold one batch when learning starts (n-step transitions lag n - 1 steps)
        lag_items = (self.n_step - 1) * self.num_envs
        need = self.batch_size + lag_items
        if self.learning_starts < need:
            raise ValueError(
                f"learning_starts={self.learning_starts} must be >= batch_size + (n_step - 1) * num_envs = "
                f"{self.batch_size} + {lag_items} = {need}, so replay holds a batch when learning starts")
        if self.buffer_capacity < self.batch_size:
            raise ValueError(f"buffer_capacity={self.buffer_capacity} must be >= batch_size={self.batch_size}")
        if self.learning_iterations == 0:
            raise ValueError(
                f"learning_starts={self.learning_starts} leaves no gradient update within total_env_steps="
                f"{self.total_env_steps} ({self.num_iterations} iterations of {self.iteration_env_steps} env steps); "
                f"allowed: learning_starts < {self.num_iterations * self.iteration_env_steps}")
        self._check_action_space(spec)
        if self.actor_backend not in ("threads", "ray"):
            raise ValueError(f"actor_backend must be one of ('threads', 'ray'), got {self.actor_backend!r}")
        check_int("num_learner_devices", self.num_learner_devices, minimum=1)
        capabilities.check(self.ALGO, self, spec.backend)  # the (runtime, actors, learners, env) cell
        _check_host_fields(self, spec)
        _check_ray(self, spec)
        _check_async_only(self, fields_in(self, "tianji"))
        object.__setattr__(self, "_env_spec", spec)
        frames = self._check_env(spec)
        _check_torso(self, tuple(spec.observation_shape))
        object.__setattr__(self, "_frame_replay", frames)
        self._check_normalize(frames)
        _check_distributed(self)
        _check_replay_layout(self, frames)
        self._check_head()
        from tianji_jax.buffers import replay  # noqa: PLC0415 - jax-heavy, only once the fields are valid

        try:
            replay.check_fits(self.replay_bytes)  # MemoryError before anything is allocated
        except MemoryError as err:
            raise MemoryError(f"buffer_capacity={self.buffer_capacity}: {err}") from None

    def _check_normalize(self, frames: bool) -> None:
        """``normalize_observations`` keeps one set of statistics, updated where observations enter
        replay (every learner group's inserts fold into the same set; several processes exchange
        theirs at every learner block): not with a frame replay (it stores uint8 frames once)."""
        if not self.normalize_observations:
            return
        if frames:
            raise ValueError(f"normalize_observations=True is not supported with env {self.env!r}: its replay "
                             "stores each uint8 frame once (the Atari frame replay), not observations to normalise; "
                             "allowed: normalize_observations=False")

    # ---- hooks of a subclass (each raises ValueError / TypeError naming the field) ---------------
    def _check_fields(self) -> None:
        """The algorithm's own scalar fields (before the env is resolved)."""

    def _check_target(self) -> None:
        """The algorithm's target-network fields (after the runtime fields)."""

    def _check_action_space(self, spec: EnvSpec) -> None:
        """The action spaces the algorithm takes (right after the env is resolved)."""

    def _check_env(self, spec: EnvSpec) -> bool:
        """Env-dependent rules of the algorithm; returns whether the replay stores frames once
        (DQN's envpool Atari frame replay). Default: no frame replay."""
        return False

    def _check_head(self) -> None:
        """The algorithm's network-head fields (after the learner layout)."""

    def derived_extra(self) -> dict[str, Any]:
        """Derived quantities of the algorithm written to ``config.json`` beside the shared ones."""
        return {}

    # ---- derived quantities -------------------------------------------------------------------
    @property
    def env_spec(self) -> EnvSpec:
        """The resolved environment (backend, id, env object, params, spaces)."""
        return self._env_spec  # type: ignore[attr-defined]

    @property
    def frame_replay(self) -> bool:
        """Replay stores frames once (:mod:`tianji_jax.buffers.frame_replay`; DQN on envpool Atari games).
        Otherwise whole ``obs`` / ``next_obs`` per transition (:mod:`tianji_jax.buffers.replay`)."""
        return self._frame_replay  # type: ignore[attr-defined]

    @property
    def iteration_env_steps(self) -> int:
        """Env steps per iteration: ``num_envs * num_steps``."""
        return self.num_envs * self.num_steps

    @property
    def global_iteration_env_steps(self) -> int:
        """Env steps per iteration over all processes: ``num_processes * num_envs * num_steps``
        (:attr:`iteration_env_steps` on one host)."""
        return self.num_processes * self.iteration_env_steps

    @property
    def updates_per_step(self) -> int:
        """Gradient updates in one learner block (one per iteration once learning started):
        ``num_processes * num_envs * num_steps * replay_ratio``, exact."""
        return self._updates_per_step  # type: ignore[attr-defined]

    @property
    def num_iterations(self) -> int:
        """Iterations in the run: ``total_env_steps // global_iteration_env_steps``."""
        return self.total_env_steps // self.global_iteration_env_steps

    @property
    def env_steps(self) -> int:
        """Env steps that will actually be taken (all processes): ``num_iterations * global_iteration_env_steps``."""
        return self.num_iterations * self.global_iteration_env_steps

    @property
    def learning_iterations(self) -> int:
        """Iterations that run a learner block: those ending with more than ``learning_starts`` env
        steps (all processes)."""
        first = self.learning_starts // self.global_iteration_env_steps + 1  # 1-based index of the first one
        return max(0, self.num_iterations - first + 1)

    @property
    def num_gradient_steps(self) -> int:
        """Gradient updates in the whole run: ``learning_iterations * updates_per_step``."""
        return self.learning_iterations * self.updates_per_step

    @property
    def iterations_per_chunk(self) -> int:
        """Iterations fused into one compiled chunk (async: learner blocks per row):
        ``max(1, eval_every_env_steps // global_iteration_env_steps)``, at most ``num_iterations``."""
        return min(self.num_iterations, max(1, self.eval_every_env_steps // self.global_iteration_env_steps))

    @property
    def replay_bytes(self) -> int:
        """Bytes the replay buffer allocates (:attr:`stacked_replay_bytes`; DQN's frame replay overrides it)."""
        return self.stacked_replay_bytes

    @property
    def stacked_replay_bytes(self) -> int:
        """Bytes of :mod:`tianji_jax.buffers.replay` holding ``buffer_capacity`` whole n-step transitions
        (:func:`tianji_jax.buffers.replay.replay_bytes`: obs and next obs in the observation dtype, the
        action (int32, or float32 ``(A,)`` for a Box), reward, discount)."""
        import jax  # noqa: PLC0415
        import numpy as np  # noqa: PLC0415

        from tianji_jax.buffers import replay  # noqa: PLC0415

        spec = self.env_spec
        obs = jax.ShapeDtypeStruct(spec.observation_shape,
                                   jax.dtypes.canonicalize_dtype(np.dtype(spec.observation_space.dtype)))
        action = (jax.ShapeDtypeStruct(tuple(spec.action_space.shape), np.float32)
                  if spec.action_kind == "continuous" else jax.ShapeDtypeStruct((), np.int32))
        item = {"obs": obs, "next_obs": obs, "action": action,
                "reward": jax.ShapeDtypeStruct((), np.float32), "discount": jax.ShapeDtypeStruct((), np.float32)}
        return replay.replay_bytes(item, self.buffer_capacity)

    def _describe_iterations(self) -> str:
        procs = f"num_processes={self.num_processes} x " if self.num_processes > 1 else ""
        return (f"{self.num_iterations} iterations x {self.global_iteration_env_steps} env "
                f"steps ({procs}num_envs={self.num_envs} x num_steps={self.num_steps}) = {self.env_steps} env steps; "
                f"after {self.learning_starts} env steps, {self.updates_per_step} gradient update(s) of batch "
                f"{self.batch_size} per iteration (replay ratio {self.replay_ratio}) = {self.num_gradient_steps} "
                f"gradient updates" + _describe_env_layer(
                    self, "raw in replay, folded in as they enter it, normalised when acted on and when sampled"))

    def _describe_runtime(self, policy: str = "deterministic") -> str:
        return (
            f"; chunks of {self.iterations_per_chunk} iterations"
            + (f"; evaluation of {self.eval_episodes} {policy} episodes after each chunk"
               if self.eval_episodes else "")
            + ("; async runtime, schedule sync (one actor per learner group, lag 0, the Anakin iteration order)"
               if self.runtime == "async" and self.schedule == "sync" else
               f"; async runtime, schedule {self.schedule}, {self.num_actors} actor(s), lag gate at insert "
               f"K={self.max_policy_lag}, replay ratio held by the rate limiter, which also sets the exact env steps "
               f"(the same to within its band, {self.replay_ratio_tolerance:g}x the narrowest"
               + (", tuned online from there" if self.schedule == "auto" else "") + ")"
               if self.runtime == "async" else "; Anakin runtime")
            + (f"; actors on Ray ({self.ray_address or 'local instance'}, max_restarts {self.ray_max_restarts})"
               if self.actor_backend == "ray" else "")
            + (f"; {self.num_learner_groups} learner groups (replay of {self.buffer_capacity // self.num_learner_groups} "
               f"transitions and {self.learning_iterations // self.num_learner_groups} learner blocks each), params "
               f"averaged every {self.sync_every} blocks" if self.num_learner_groups > 1 else "")
            + (f"; {self.num_learner_devices} data-parallel learners, the replay sharded by env over them "
               f"({self.buffer_capacity // self.num_learner_devices} transitions and "
               f"{self.batch_size // self.num_learner_devices} samples per update each)"
               if self.num_learner_devices > 1 else "")
            + (f"; {self.num_processes} processes (this is process {self.process_id}, coordinator {self.coordinator}), "
               f"each with its own actors and 1/{self.num_processes} of the replay, gradients averaged over all "
               "processes' learners" if self.num_processes > 1 else "")
        )
