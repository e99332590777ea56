"""What every on-policy algorithm's config shares (:class:`OnPolicyConfig`): the run, the rollout
and minibatch sizes, the optimizer, observation/reward normalisation, the network widths,
evaluation, the runtime and the learner layout, with their checks and derived sizes.

An on-policy algorithm (PPO, PQN) subclasses it with its own hyper-parameters and checks
(:meth:`OnPolicyConfig._check_fields`, :meth:`OnPolicyConfig._check_env`); a subclass may
redeclare a shared field to give it its own default. Imports nothing from
:mod:`tianji_jax.runtime`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal

import tyro

from tianji_jax.algos.config_base import (AgentConfig, check_bool, check_float, check_int, _check_shared,
                                    _check_torso, _describe_env_layer, plain_numbers, fields_in, layout, run,
                                    tianji)
from tianji_jax.algos import capabilities
from tianji_jax.algos.config_checks import (_check_async_only, _check_distributed, _check_host_fields, _check_learner_groups,
                                      _check_ray)
from tianji_jax.envs.registry import EnvSpec, resolve_env

__all__ = ["OnPolicyConfig"]


@dataclass(frozen=True)
class OnPolicyConfig(AgentConfig):
    """The fields and checks every on-policy algorithm's config shares (not registered itself).

    All sizes are counts; all step counts are env steps (one transition of one environment).
    Derived quantities are properties: ``batch_size`` (``num_envs * num_steps`` env steps per
    update), ``minibatch_size``, ``num_updates`` (``total_env_steps // batch_size``), ``env_steps``
    (``num_updates * batch_size``, the steps actually taken), ``updates_per_chunk``.

    Raises:
        ValueError: a value outside its allowed range, an unknown env id (with the closest known
            ids), an action space the algorithm cannot handle, an unsupported (runtime, actors,
            learners, env) cell, ``num_envs * num_steps`` not divisible by ``num_minibatches``, or a
            recurrent network (``recurrent`` not ``'none'``) with ``runtime='async'``, a host env, or
            ``num_minibatches`` not dividing ``num_envs``. The message names the field, the value and
            what is allowed.
        TypeError: a scalar of the wrong type (a whole float such as ``1e6`` in an int field
            becomes an int, a list ``hidden_sizes`` a tuple).
    """

    ALGO: ClassVar[str] = ""
    """The registered name (the capability table's ``algo``)."""

    env: Annotated[Any, tyro.conf.arg(constructor=str, metavar="STR",
                                       help_behavior_hint="(default: gymnax:CartPole-v1)")] = "gymnax:CartPole-v1"
    """Environment: ``"gymnax:<id>"`` (or a bare gymnax id), ``"envpool:<id>"`` or
    ``"gymnasium:<id>"`` (host envs, async runtime only), or a gymnax-style environment object
    with ``reset(key, params)``, ``step(key, state, action, params)``, ``default_params``,
    ``observation_space(params)`` and ``action_space(params)``. An id may end in ``|``-separated
    wrappers, on every backend: ``|mask=0,2``, ``|frame_stack=4``, ``|clip_action``; host ids also
    take ``|latency_ms=D`` (a slow simulator)."""
    seed: int = run(0)
    """Seed of the run's PRNG key; in [0, 2**32)."""
    total_env_steps: int = 500_000
    """Training budget in env steps (rounded down to a whole number of updates)."""
    num_envs: int = 8
    """Number of parallel training environments N."""
    num_steps: int = 128
    """Rollout length T: steps per env per update."""
    update_epochs: int = 10
    """Passes over each rollout batch."""
    num_minibatches: int = 4
    """Minibatches per epoch; must divide ``num_envs * num_steps``."""
    learning_rate: float = 2.5e-4
    """Adam step size (initial value when annealed)."""
    anneal_lr: bool = True
    """Anneal the learning rate linearly to 0 over all gradient steps."""
    gamma: float = 0.99
    """Discount factor, in [0, 1]."""
    max_grad_norm: float = 0.5
    """Global-norm gradient clipping threshold, > 0."""
    normalize_observations: bool = False
    """Normalise observations by a running mean/std (clipped to [-10, 10]) kept in the train state.
    Every env backend: gymnax envs in the actor's compiled rollout; envpool/gymnasium envs on the
    async runtime's host actors (threads or Ray), their statistics merged by the learner and
    published with the params, also by every learner group's thread; with num_processes > 1 every
    process's new statistics are exchanged after each update, so all processes act with the same."""
    scale_rewards: bool = False
    """Divide rewards by the running std of the discounted return (kept in the train state); the
    same backends as ``normalize_observations``."""
    hidden_sizes: tuple[int, ...] = (64, 64)
    """Hidden layer widths of the separate actor and critic MLPs."""
    activation: Literal["tanh", "relu"] = "tanh"
    """Hidden activation."""
    torso: Annotated[Any, tyro.conf.arg(constructor=str, metavar="STR",
                                         help_behavior_hint="(default: auto)")] = "auto"
    """The network's torso: 'auto' (from the observation: Nature CNN for Atari frame stacks, a small
    CNN for MinAtar-like images, else the MLP of hidden_sizes), 'mlp', 'nature_cnn', 'small_cnn', or
    a user torso 'package.module:factory' whose factory() returns a flax nn.Module mapping
    observations (B, *obs_shape) to features (B, F) (the algorithm's heads sit on them; from Python
    the factory itself is accepted too, and config.json stores its import path)."""
    recurrent: Literal["none", "lstm", "gru"] = "none"
    """The network's recurrent core between the torso and the heads: 'none' (feed-forward), 'lstm'
    (Hochreiter & Schmidhuber 1997) or 'gru' (Cho et al. 2014), of rnn_hidden_size units. Its state is
    carried by the actor, zeroed where an episode ended and stored at each rollout's start; the learner
    re-runs whole env columns from it (minibatches split the env axis: num_minibatches must divide
    num_envs, and each data-parallel replica's columns). PPO and PQN; Anakin and the async runtime
    (device or host actors, threads or Ray, data-parallel learners, learner groups); not with
    num_processes > 1 or tj.sweep yet."""
    rnn_hidden_size: int = 128
    """Units H of the recurrent core (used when recurrent is not 'none'), >= 1."""
    eval_every_env_steps: int = 25_000
    """Evaluate every this many env steps (rounded to whole updates); also the logging interval."""
    eval_episodes: int = 10
    """Episodes per evaluation with the deterministic policy; 0 disables evaluation."""
    stop_at_return: float | None = run(None)
    """Stop early once ``eval_return_mean`` reaches this value (needs ``eval_episodes > 0``)."""
    runtime: Literal["anakin", "async"] = "anakin"
    """'anakin': acting and learning fused on one device; 'async': actor threads and a learner on
    different devices, decoupled through the lag-bounded trajectory queue (TianJi mode)."""
    schedule: Literal["sync", "one_step", "relaxed", "auto"] = tianji("relaxed")
    """Async schedule: 'sync' (lag 0, reproducible), 'one_step' (rollout k+1 uses params k),
    'relaxed' (nobody waits unless the queue is full; lag bounded by max_policy_lag), 'auto'
    (relaxed, with the admission window and queue limit tuned online within the ceiling
    max_policy_lag from both sides' waits: tianji_jax/runtime/tianji/auto_schedule.py)."""
    max_policy_lag: int | None = tianji(None)
    """Hard bound K on the policy lag of consumed samples; default 0 (sync), 1 (one_step), 2 (relaxed),
    4 (auto: the ceiling of its window). With admission control the queue also caps it: one actor
    sees lag <= min(K, queue_batches)."""
    num_actors: int = tianji(1)
    """Async actor threads, each with its own num_envs envs ('sync'/'one_step' need 1)."""
    queue_batches: int = tianji(2)
    """Trajectories that may wait between actors and learner (>= 2: the rate limiter's deadlock rule)."""
    stall_timeout_s: float = tianji(60.0)
    """Async: stop with an error when the learner gets no fresh data, or an actor no params, this long
    (seconds; 300 s more until the other side's first result, which includes its compilation)."""
    record_schedule: bool = tianji(False)
    """Async 'relaxed': write ``RUN_DIR/schedule.jsonl``, which rollout each learner update consumed
    (actor, its rollout number, the policy version it acted with) and which the lag gate dropped,
    so that ``replay_schedule`` can re-run the interleaving exactly (capabilities: where it applies)."""
    replay_schedule: str | None = tianji(None)
    """Async 'relaxed': a ``schedule.jsonl`` to re-run: actors act the recorded policy versions and
    the learner consumes the recorded rollouts in order, so the same config gives bit-identical
    params on the same machine; the run ends after the schedule's last update."""
    max_nonfinite_updates: int = run(5)
    """Consecutive updates with a skipped gradient step (a non-finite loss or gradient: the step
    is not applied and is counted in ``nonfinite_skips``) that stop the run with an error, >= 1."""
    env_batch_size: int | None = layout(None)
    """envpool only: envs per received batch; below ``num_envs`` envpool runs in async mode (the
    actor acts on whichever envs finished first). None: sync mode (all envs every step)."""
    num_learner_devices: int = layout(1)
    """Data-parallel learner replicas L. Async: the last L devices (the actors keep the first);
    each replica gets ``num_envs / L`` env columns of every trajectory; gradients are averaged,
    advantage statistics are global. Anakin: the first L devices; the run's envs are sharded over
    them (each device steps ``num_envs / L`` envs) and the same data-parallel update runs, so an
    Anakin run computes what the async ``sync`` schedule with L learner devices computes."""
    num_learner_groups: int = layout(1)
    """Async: independent learner groups G (TianJi's parallel learners). Each group is one learner
    device with its own optimizer state, policy version and lag-bounded queue, fed by
    ``num_actors / G`` of the actors (actor i feeds group i % G, and acts with that group's
    params, so policy lag is measured against the group that produced the params); every
    ``sync_every`` updates of their own the groups average their params. ``num_updates`` counts
    all groups' updates (each group runs ``num_updates / G`` with its own learning-rate
    schedule). Not combined with ``num_learner_devices > 1`` (per-step gradient averaging inside
    a group), multi-host runs or resume yet."""
    sync_every: int = layout(1)
    """Learner groups: each group's updates between param averagings (and always at its last
    update, so a run ends with one set of params). Needs ``num_learner_groups > 1``."""
    num_processes: int = layout(1)
    """Async, multi-host (jax.distributed): processes in the job. Each runs this config's actors and
    contributes one trajectory of num_envs x num_steps steps to every global update (global batch
    num_processes x num_envs x num_steps; total_env_steps counts all processes' steps)."""
    process_id: int = layout(0)
    """This process's index in 0..num_processes-1 (SLURM: $SLURM_PROCID)."""
    coordinator: str | None = layout(None)
    """'HOST:PORT' of process 0's coordination service (needed when num_processes > 1)."""
    heartbeat_timeout_s: int = layout(60)
    """Multi-host: a process silent this long is declared dead and every survivor exits non-zero;
    a collective update that makes no progress for this long + 30 s also ends the process."""
    actor_backend: Literal["threads", "ray"] = layout("threads")
    """Async: where actors run. 'threads': actor threads in this process; 'ray': remote actor
    processes on Ray Core (any node of a Ray cluster; TianJi's actor/learner role split), each
    with its own num_envs envs (host envs, or device envs stepped on its CPU through
    GymnaxHostVecEnv) and a CPU policy copy, feeding this learner through the same admission,
    lag gate and rate limiter (needs ``pip install tianji-jax[ray]``)."""
    ray_address: str | None = layout(None)
    """actor_backend='ray': the cluster to join ('auto' or 'HOST:PORT'); None reuses this
    process's Ray connection or starts a private local instance on 127.0.0.1."""
    ray_max_restarts: int = layout(3)
    """actor_backend='ray': times Ray restarts each dead actor (its lost rollout is counted in
    ``lost_chunks``); one more death stops the run with an error."""


    def __post_init__(self) -> None:
        plain_numbers(self)
        check_int("seed", self.seed, minimum=0, maximum=2**32 - 1)
        for name in ("total_env_steps", "num_envs", "num_steps", "update_epochs", "num_minibatches",
                     "eval_every_env_steps"):
            check_int(name, getattr(self, name), minimum=1)
        check_int("total_env_steps", self.total_env_steps, maximum=2**31 - 1)  # int32 step counters
        check_int("eval_episodes", self.eval_episodes, minimum=0)
        check_int("max_nonfinite_updates", self.max_nonfinite_updates, minimum=1)
        for name in ("anneal_lr", "normalize_observations", "scale_rewards", "record_schedule"):
            check_bool(name, getattr(self, name))
        _check_shared(self)
        if self.runtime not in ("anakin", "async"):
            raise ValueError(f"runtime must be one of ('anakin', 'async'), got {self.runtime!r}")
        if self.schedule not in ("sync", "one_step", "relaxed", "auto"):
            raise ValueError(f"schedule must be one of ('sync', 'one_step', 'relaxed', 'auto'), got {self.schedule!r}")
        check_int("num_actors", self.num_actors, minimum=1)
        check_int("queue_batches", self.queue_batches, minimum=2)
        check_float("stall_timeout_s", self.stall_timeout_s, low=0.0, low_open=True)
        if self.max_policy_lag is not None:
            check_int("max_policy_lag", self.max_policy_lag, minimum=0)
        lag = self.policy_lag_bound
        if self.schedule == "sync" and lag != 0:
            raise ValueError(f"max_policy_lag must be 0 for schedule 'sync', got {lag}")
        if self.schedule in ("one_step", "auto") and lag < 1:
            raise ValueError(f"max_policy_lag must be >= 1 for schedule {self.schedule!r}, got {lag}")
        if self.schedule == "auto" and self.queue_batches != 2:
            raise ValueError(f"queue_batches={self.queue_batches} is set by schedule 'auto' (max(2, window + 1)); "
                             "allowed: queue_batches=2 (default), or another schedule")
        check_int("num_learner_groups", self.num_learner_groups, minimum=1)
        check_int("sync_every", self.sync_every, minimum=1)
        groups = self.num_learner_groups
        if self.runtime == "async" and self.schedule in ("sync", "one_step") and self.num_actors != groups:
            raise ValueError(f"num_actors must be {groups} (one per learner group) for schedule {self.schedule!r}, "
                             f"got {self.num_actors}; use schedule 'relaxed' for several actors per group")
        _check_recurrent(self)  # first: its minibatch rule (whole env columns) is the narrower one
        if self.batch_size % self.num_minibatches != 0:
            raise ValueError(
                f"num_minibatches={self.num_minibatches} must divide num_envs * num_steps = "
                f"{self.num_envs} * {self.num_steps} = {self.batch_size}; allowed values: "
                f"{_divisors(self.batch_size)}")
        self._check_fields()
        if self.total_env_steps < self.batch_size:
            raise ValueError(
                f"total_env_steps={self.total_env_steps} must be >= num_envs * num_steps = "
                f"{self.batch_size} (one update)")
        spec = resolve_env(self.env)  # raises ValueError for unknown ids / unsupported spaces
        if isinstance(self.env, str) and ":" not in self.env:
            object.__setattr__(self, "env", f"{spec.backend}:{self.env}")  # one spelling per env
        capabilities.check_action_space(self.ALGO, self, spec)  # MultiDiscrete: PPO only
        self._check_env(spec)
        _check_torso(self, tuple(spec.observation_shape))
        check_int("num_learner_devices", self.num_learner_devices, minimum=1)
        check_int("num_processes", self.num_processes, minimum=1)
        if self.actor_backend not in ("threads", "ray"):
            raise ValueError(f"actor_backend must be one of ('threads', 'ray'), got {self.actor_backend!r}")
        capabilities.check(self.ALGO, self, spec.backend)  # the (runtime, actors, learners, env) cell
        _check_host_fields(self, spec)
        if self.num_learner_devices > 1:
            ld = self.num_learner_devices
            if self.num_envs % ld or (self.batch_size // ld) % self.num_minibatches:
                raise ValueError(
                    f"num_learner_devices={ld} must divide num_envs={self.num_envs} (each replica takes whole env "
                    f"columns) and leave a shard of {self.batch_size}/{ld} steps divisible by "
                    f"num_minibatches={self.num_minibatches}; allowed values: "
                    f"{[d for d in range(1, self.num_envs + 1) if self.num_envs % d == 0 and (self.batch_size // d) % self.num_minibatches == 0]}")
        _check_distributed(self)
        _check_ray(self, spec)
        _check_learner_groups(self)
        _check_async_only(self, fields_in(self, "tianji"))
        capabilities.check_schedule_log(self, spec.backend)
        object.__setattr__(self, "_env_spec", spec)

    def _check_fields(self) -> None:
        """The algorithm's own field checks (after the shared scalar and batch checks).

        Raises:
            ValueError / TypeError: naming the field, the value and what is allowed."""

    def _check_env(self, spec: EnvSpec) -> None:
        """The algorithm's check of the resolved env (e.g. the action spaces it handles).

        Raises:
            ValueError: naming the env's space and what is allowed."""

    # ---- derived quantities -------------------------------------------------------------------
    @property
    def env_spec(self) -> EnvSpec:
        """The resolved environment (backend, id, env object, params, spaces)."""
        return self._env_spec  # type: ignore[attr-defined]

    @property
    def policy_lag_bound(self) -> int:
        """K: ``max_policy_lag``, or the schedule's default (sync 0, one_step 1, relaxed 2, auto 4)."""
        if self.max_policy_lag is not None:
            return self.max_policy_lag
        return {"sync": 0, "one_step": 1, "relaxed": 2, "auto": 4}.get(self.schedule, 0)

    @property
    def batch_size(self) -> int:
        """Env steps per update and process: ``num_envs * num_steps`` (one trajectory)."""
        return self.num_envs * self.num_steps

    @property
    def global_batch_size(self) -> int:
        """Env steps per update over all processes: ``num_processes * batch_size``."""
        return self.num_processes * self.batch_size

    @property
    def minibatch_size(self) -> int:
        """Transitions per minibatch: ``batch_size // num_minibatches``."""
        return self.batch_size // self.num_minibatches

    @property
    def num_updates(self) -> int:
        """Number of updates (rollout + epochs): ``total_env_steps // global_batch_size``,
        rounded down to a multiple of ``num_learner_groups`` (all groups' updates together)."""
        groups = self.num_learner_groups
        return self.total_env_steps // self.global_batch_size // groups * groups

    @property
    def updates_per_group(self) -> int:
        """Updates each learner group runs: ``num_updates // num_learner_groups`` (all of them
        with one group)."""
        return self.num_updates // self.num_learner_groups

    @property
    def env_steps(self) -> int:
        """Env steps that will actually be taken (all processes): ``num_updates * global_batch_size``."""
        return self.num_updates * self.global_batch_size

    @property
    def num_gradient_steps(self) -> int:
        """Optimizer steps in the whole run: ``num_updates * update_epochs * num_minibatches``."""
        return self.num_updates * self.update_epochs * self.num_minibatches

    @property
    def updates_per_chunk(self) -> int:
        """Updates fused into one compiled chunk: ``max(1, eval_every_env_steps // batch_size)``,
        at most ``num_updates``."""
        return min(self.num_updates, max(1, self.eval_every_env_steps // self.global_batch_size))

    def _describe_sizes(self) -> str:
        """The sizes part of ``describe()``: updates, batch, minibatches, chunks, evaluation."""
        return (f"{self.num_updates} updates x "
                f"{self.batch_size} env steps (num_envs={self.num_envs} x num_steps={self.num_steps}) = "
                f"{self.env_steps} env steps; {self.update_epochs} epochs x {self.num_minibatches} "
                f"minibatches of {self.minibatch_size} = {self.num_gradient_steps} gradient steps; "
                f"chunks of {self.updates_per_chunk} updates"
                + (f"; evaluation of {self.eval_episodes} episodes after each chunk" if self.eval_episodes else ""))

    def _describe_network(self, mlp_heads: str, linear_heads: str) -> str:
        """The network as ``describe()`` states it: the torso text when feed-forward; with a
        recurrent core, torso -> core -> heads as :class:`~tianji_jax.nets.recurrent.RecurrentActorCritic`
        / ``RecurrentQNetwork`` build them: an MLP torso is a one-layer embedding there and the MLP
        of ``hidden_sizes`` follows the core (``mlp_heads``, also after a small CNN); a Nature CNN
        or a user torso feeds ``linear_heads``."""
        from tianji_jax.algos.config_base import torso_text
        from tianji_jax.nets.networks import resolve_torso, torso_path

        if self.recurrent == "none":
            return torso_text(self)
        torso = resolve_torso(self.torso, tuple(self.env_spec.observation_shape))
        auto = " (auto)" if self.torso == "auto" else ""
        first = (f"user torso {torso_path(torso)}" if callable(torso) else f"Nature CNN torso{auto}"
                 if torso == "nature_cnn" else f"small CNN (16 3x3 filters) torso{auto}" if torso == "small_cnn"
                 else f"Dense({self.hidden_sizes[0]}) {self.activation} embedding{auto}")
        heads = mlp_heads if not callable(torso) and torso in ("mlp", "small_cnn") else linear_heads
        return f"{first} -> {self.recurrent.upper()}({self.rnn_hidden_size}) -> {heads}"

    def _describe_runtime(self) -> str:
        """The runtime part of ``describe()``: Anakin or the async runtime, Ray, groups, processes."""
        return (_describe_env_layer(self, "folded in before they are acted on, stored normalised")
                + (f"; async runtime, schedule {self.schedule}, {self.num_actors} actor(s), max_policy_lag "
                 f"{self.policy_lag_bound}" if self.runtime == "async" else "; Anakin runtime")
                + (f"; actors on Ray ({self.ray_address or 'local instance'}, max_restarts {self.ray_max_restarts})"
                   if self.actor_backend == "ray" else "")
                + (f"; {self.num_learner_devices} data-parallel learners, each taking "
                   f"{self.num_envs // self.num_learner_devices} env columns"
                   + (" (and stepping them: the envs sharded over the devices)" if self.runtime == "anakin" else "")
                   if self.num_learner_devices > 1 else "")
                + (f"; {self.num_learner_groups} learner groups of {self.updates_per_group} updates each, params "
                   f"averaged every {self.sync_every} updates" if self.num_learner_groups > 1 else "")
                + ("; recording the schedule to RUN_DIR/schedule.jsonl" if self.record_schedule else "")
                + (f"; replaying the schedule {self.replay_schedule}" if self.replay_schedule else "")
                + (f"; {self.num_processes} processes (this is process {self.process_id}, coordinator "
                   f"{self.coordinator}), each contributing {self.batch_size} env steps to every update of "
                   f"{self.global_batch_size}" if self.num_processes > 1 else ""))


_RECURRENT = ("none", "lstm", "gru")


def _check_recurrent(config: OnPolicyConfig) -> None:
    """``recurrent`` and ``rnn_hidden_size``, and what a recurrent run needs for now: one process
    (Anakin, or the async runtime's device or host actors, whose trajectories carry the core's
    state at their first step) and ``num_minibatches`` dividing ``num_envs`` (recurrent
    minibatches are whole env columns).

    Raises:
        ValueError / TypeError: one line naming the field, the value and what is allowed.
    """
    if config.recurrent not in _RECURRENT:
        raise ValueError(f"recurrent must be one of {_RECURRENT}, got {config.recurrent!r}")
    check_int("rnn_hidden_size", config.rnn_hidden_size, minimum=1)
    if config.recurrent == "none":
        return
    if getattr(config, "num_processes", 1) > 1:
        raise ValueError(f"recurrent={config.recurrent!r} is not supported with num_processes={config.num_processes} "
                         "yet (the global trajectory does not carry the recurrent state); allowed: num_processes=1")
    if config.num_envs % config.num_minibatches:
        raise ValueError(f"num_minibatches={config.num_minibatches} must divide num_envs={config.num_envs} with "
                         f"recurrent={config.recurrent!r} (each minibatch is whole env columns); allowed values: "
                         f"{_divisors(config.num_envs)}")
    ld = getattr(config, "num_learner_devices", 1)
    if isinstance(ld, int) and ld > 1 and config.num_envs % ld == 0 and (config.num_envs // ld) % config.num_minibatches:
        cols = config.num_envs // ld
        raise ValueError(f"num_minibatches={config.num_minibatches} must divide the {cols} env columns of each of the "
                         f"num_learner_devices={ld} replicas (num_envs={config.num_envs} / {ld}) with "
                         f"recurrent={config.recurrent!r} (each minibatch is whole env columns); allowed values: "
                         f"{_divisors(cols)}")


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(math.isqrt(n)) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))
