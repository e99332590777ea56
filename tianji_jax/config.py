"""Frozen, validated run configurations.

A config is validated once, in ``__post_init__``, before any environment is stepped or any
function is compiled. Every bad value raises ``ValueError`` (or ``TypeError`` for a value of the
wrong type) naming the field, the value given and what is allowed.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Self

import tyro

from tianji_jax.envs.registry import ATARI_DEFAULTS, EnvSpec, resolve_env

__all__ = ["PPOConfig"]

_ACTIVATIONS = ("tanh", "relu")


def _plain_numbers(config: Any) -> None:
    """Replace numpy scalars in ``config``'s fields by Python ints/floats/bools (so ``np.int64(8)``
    from a sweep is accepted and the config stays JSON-able and hashable the same way)."""
    import numpy as np

    for f in dataclasses.fields(config):
        v = getattr(config, f.name)
        if isinstance(v, np.bool_):
            object.__setattr__(config, f.name, bool(v))
        elif isinstance(v, np.integer):
            object.__setattr__(config, f.name, int(v))
        elif isinstance(v, np.floating):
            object.__setattr__(config, f.name, float(v))


def _check_int(name: str, value: Any, *, minimum: int | None = None, maximum: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {value}")


def _check_float(
    name: str,
    value: Any,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {value!r} ({type(value).__name__})")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    if low is not None and (value < low or (low_open and value == low)):
        bound = f"> {low}" if low_open else f">= {low}"
        interval = f"in {'(' if low_open else '['}{low}, {high}]" if high is not None else bound
        raise ValueError(f"{name} must be {interval}, got {value}")
    if high is not None and value > high:
        interval = f"in {'(' if low_open else '['}{low}, {high}]" if low is not None else f"<= {high}"
        raise ValueError(f"{name} must be {interval}, got {value}")


def _check_bool(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool (True/False), got {value!r}")


def _check_distributed(config: Any) -> None:
    """The multi-host fields of a :class:`PPOConfig` (clear errors naming the field)."""
    _check_int("num_processes", config.num_processes, minimum=1)
    _check_int("process_id", config.process_id, minimum=0, maximum=config.num_processes - 1)
    _check_int("heartbeat_timeout_s", config.heartbeat_timeout_s, minimum=1)
    if config.num_processes == 1:
        if config.coordinator is not None:
            raise ValueError(f"coordinator={config.coordinator!r} needs num_processes > 1")
        return
    if config.runtime != "async":
        raise ValueError(f"num_processes={config.num_processes} needs runtime='async' (multi-host learners are "
                         f"the async runtime's); got runtime={config.runtime!r}")
    if config.coordinator is None:
        raise ValueError(f"num_processes={config.num_processes} needs coordinator='HOST:PORT' (process 0's address)")
    from tianji_jax.runtime.distributed import check_coordinator

    check_coordinator(config.coordinator)
    if config.stop_at_return is not None:
        raise ValueError("stop_at_return is not supported with num_processes > 1 yet (every process must run the "
                         "same number of updates); got stop_at_return="
                         f"{config.stop_at_return}")
    if config.total_env_steps < config.global_batch_size:
        raise ValueError(f"total_env_steps={config.total_env_steps} must be >= num_processes * num_envs * num_steps "
                         f"= {config.global_batch_size} (one global update)")


def _check_ray(config: Any, spec: EnvSpec) -> None:
    """The Ray actor fields of a :class:`PPOConfig` (clear errors naming the field)."""
    _check_int("ray_max_restarts", config.ray_max_restarts, minimum=0)
    if config.actor_backend not in ("threads", "ray"):
        raise ValueError(f"actor_backend must be one of ('threads', 'ray'), got {config.actor_backend!r}")
    if config.actor_backend == "threads":
        if config.ray_address is not None:
            raise ValueError(f"ray_address={config.ray_address!r} needs actor_backend='ray'")
        return
    if not spec.on_host:
        raise ValueError(f"actor_backend='ray' runs host envs (envpool:/gymnasium:) on remote actors; env "
                         f"{config.env!r} is a gymnax env (allowed with actor_backend='threads')")
    if config.num_processes > 1:
        raise ValueError(f"actor_backend='ray' with num_processes={config.num_processes} is not supported; "
                         "use one learner process (num_processes=1) with Ray actors")
    if config.ray_address is not None and (not isinstance(config.ray_address, str) or not config.ray_address):
        raise ValueError(f"ray_address must be None, 'auto' or 'HOST:PORT', got {config.ray_address!r}")
    import importlib.util

    if importlib.util.find_spec("ray") is None:
        raise ImportError("actor_backend='ray' needs Ray: pip install 'tianji-jax[ray]'")


def _check_async_only(config: Any, names: tuple[str, ...]) -> None:
    """Async-runtime fields must keep their defaults under ``runtime='anakin'`` (a value there
    would be silently ignored)."""
    if config.runtime != "anakin":
        return
    defaults = {f.name: f.default for f in dataclasses.fields(config)}
    for name in names:
        value = getattr(config, name)
        if value != defaults[name]:
            raise ValueError(f"{name}={value!r} only applies to runtime='async' (actor threads, the lag-bounded queue); "
                             f"got runtime='anakin'. Allowed: runtime='async', or {name}={defaults[name]!r} (default)")


def _check_learner_groups(config: Any) -> None:
    """The learner-group fields of a :class:`PPOConfig` (after the fields they depend on)."""
    groups = config.num_learner_groups
    if groups == 1:
        if config.sync_every != 1:
            raise ValueError(f"sync_every={config.sync_every} needs num_learner_groups > 1 (it is the number of "
                             "updates between the groups' param averagings); got num_learner_groups=1")
        return
    if config.runtime != "async":
        raise ValueError(f"num_learner_groups={groups} needs runtime='async'; got runtime={config.runtime!r}")
    for name, value, allowed in (("num_learner_devices", config.num_learner_devices, 1),
                                 ("num_processes", config.num_processes, 1)):
        if value != allowed:
            raise ValueError(f"num_learner_groups={groups} is not supported with {name}={value} yet; allowed: "
                             f"{name}={allowed} (each group is one learner device in one process)")
    if config.actor_backend != "threads":
        raise ValueError(f"num_learner_groups={groups} is not supported with actor_backend={config.actor_backend!r} "
                         "yet; allowed: actor_backend='threads'")
    if config.num_actors % groups:
        raise ValueError(f"num_actors={config.num_actors} must be a multiple of num_learner_groups={groups} (the "
                         f"actors split evenly over the groups); allowed: {[groups * k for k in range(1, 5)]}, ...")
    if config.total_env_steps // config.global_batch_size < groups:
        raise ValueError(f"total_env_steps={config.total_env_steps} must be >= num_learner_groups * num_envs * "
                         f"num_steps = {groups * config.batch_size} (one update per learner group)")


def _check_host_fields(config: Any, spec: EnvSpec) -> None:
    """Rules for host env backends (envpool, gymnasium), shared by the configs."""
    batch = getattr(config, "env_batch_size", None)
    if batch is not None:
        _check_int("env_batch_size", batch, minimum=1, maximum=config.num_envs)
        if spec.backend != "envpool":
            raise ValueError(f"env_batch_size={batch}: only the envpool backend has an async mode; "
                             f"env {config.env!r} needs env_batch_size=None")
    if not spec.on_host:
        return
    if config.runtime != "async":
        raise ValueError(f"runtime={config.runtime!r}: env {config.env!r} runs on the host ({spec.backend}), "
                         "which only the async runtime drives; allowed: runtime='async' (Anakin needs gymnax)")
    for name in ("normalize_observations", "scale_rewards"):
        if getattr(config, name, False):
            raise ValueError(f"{name}=True is not supported yet with host env backends ({spec.backend}); "
                             f"allowed: False (gymnax envs support it)")


class _AgentConfig:
    """What PPOConfig and DQNConfig share besides validation: ``replace`` and ``to_dict``."""

    def replace(self, **changes: Any) -> Self:
        """A copy with ``changes`` applied, validated again.

        Raises:
            ValueError / TypeError: as the constructor (a changed field out of range or of the
                wrong type, or an unknown field name: TypeError).
        """
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly dict of the fields (an env object is written as its class name)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        if not isinstance(out["env"], str):
            out["env"] = f"object:{type(out['env']).__module__}.{type(out['env']).__qualname__}"
        out["hidden_sizes"] = list(out["hidden_sizes"])
        return out


@dataclass(frozen=True)
class PPOConfig(_AgentConfig):
    """Configuration of a PPO run (Schulman et al. 2017, "Proximal Policy Optimization Algorithms").

    Defaults follow the tuned CartPole settings of CleanRL/PureJaxRL (``ppo.py``), with 8 envs.
    All sizes are counts; all step counts are env steps (one transition of one environment).

    Derived quantities (what will actually run) are exposed as properties: ``batch_size``
    (``num_envs * num_steps`` env steps per update), ``minibatch_size``, ``num_updates``
    (``total_env_steps // batch_size``), ``env_steps`` (``num_updates * batch_size``, the steps
    actually taken), ``updates_per_chunk`` and ``describe()``.

    Raises:
        ValueError: a value outside its allowed range, an unknown env id (with the closest known
            ids), an action space PPO cannot handle, or ``num_envs * num_steps`` not divisible by
            ``num_minibatches``. The message names the field, the value and what is allowed.
        TypeError: a scalar of the wrong type (e.g. a float for ``num_envs``); a malformed
            ``hidden_sizes`` raises ValueError.
    """

    env: Annotated[Any, tyro.conf.arg(constructor=str, metavar="STR",
                                       help_behavior_hint="(default: gymnax:CartPole-v1)")] = "gymnax:CartPole-v1"
    """Environment: ``"gymnax:<id>"`` (or a bare gymnax id), ``"envpool:<id>"`` or
    ``"gymnasium:<id>"`` (host envs, async runtime only), or a gymnax-style environment object
    with ``reset(key, params)``, ``step(key, state, action, params)``, ``default_params``,
    ``observation_space(params)`` and ``action_space(params)``."""
    seed: int = 0
    """Seed of the run's PRNG key; in [0, 2**32)."""
    total_env_steps: int = 500_000
    """Training budget in env steps (rounded down to a whole number of updates)."""
    num_envs: int = 8
    """Number of parallel training environments N."""
    num_steps: int = 128
    """Rollout length T: steps per env per update."""
    update_epochs: int = 10
    """Passes over each rollout batch (10, as Stable-Baselines3: the default job then reaches a training
    return of 475 on CartPole-v1 in 8 of 8 seeds within 500k env steps, 4 epochs in 6 of 8)."""
    num_minibatches: int = 4
    """Minibatches per epoch; must divide ``num_envs * num_steps``."""
    learning_rate: float = 2.5e-4
    """Adam step size (initial value when annealed)."""
    anneal_lr: bool = True
    """Anneal the learning rate linearly to 0 over all gradient steps."""
    gamma: float = 0.99
    """Discount factor, in [0, 1]."""
    gae_lambda: float = 0.95
    """GAE lambda (Schulman et al. 2016), in [0, 1]; with V-trace, the lambda of its traces."""
    advantage_estimator: Literal["gae", "vtrace"] = "gae"
    """'gae', or 'vtrace' (Espeholt et al. 2018, rho_bar = c_bar = 1): advantages and value targets
    corrected by the ratio of the learner's policy to the behaviour policy, for stale samples."""
    clip_eps: float = 0.2
    """Clipping range of the surrogate objective, > 0."""
    clip_value_loss: bool = False
    """Clip the value loss around the old value estimate by ``clip_eps``."""
    vf_coef: float = 0.5
    """Weight of the value loss, >= 0."""
    ent_coef: float = 0.01
    """Weight of the entropy bonus, >= 0."""
    max_grad_norm: float = 0.5
    """Global-norm gradient clipping threshold, > 0."""
    normalize_advantages: bool = True
    """Normalise advantages to zero mean, unit std within each minibatch."""
    normalize_observations: bool = False
    """Normalise observations by running mean/std kept in the train state."""
    scale_rewards: bool = False
    """Divide rewards by the running std of the discounted return (kept in the train state)."""
    hidden_sizes: tuple[int, ...] = (64, 64)
    """Hidden layer widths of the separate actor and critic MLPs."""
    activation: Literal["tanh", "relu"] = "tanh"
    """Hidden activation."""
    eval_every_env_steps: int = 25_000
    """Evaluate every this many env steps (rounded to whole updates); also the logging interval."""
    eval_episodes: int = 10
    """Episodes per evaluation with the deterministic policy; 0 disables evaluation."""
    stop_at_return: float | None = None
    """Stop early once ``eval_return_mean`` reaches this value (needs ``eval_episodes > 0``)."""
    runtime: Literal["anakin", "async"] = "anakin"
    """'anakin': acting and learning fused on one device; 'async': actor threads and a learner on
    different devices, decoupled through the lag-bounded trajectory queue (TianJi mode)."""
    schedule: Literal["sync", "one_step", "relaxed"] = "relaxed"
    """Async schedule: 'sync' (lag 0, reproducible), 'one_step' (rollout k+1 uses params k),
    'relaxed' (nobody waits unless the queue is full; lag bounded by max_policy_lag)."""
    max_policy_lag: int | None = None
    """Hard bound K on the policy lag of consumed samples; default 0 (sync), 1 (one_step), 2 (relaxed).
    With admission control the queue also caps it: one actor sees lag <= min(K, queue_batches)."""
    num_actors: int = 1
    """Async actor threads, each with its own num_envs envs ('sync'/'one_step' need 1)."""
    queue_batches: int = 2
    """Trajectories that may wait between actors and learner (>= 2: the rate limiter's deadlock rule)."""
    stall_timeout_s: float = 60.0
    """Async: stop with an error when the learner gets no fresh data, or an actor no params, this long."""
    env_batch_size: int | None = None
    """envpool only: envs per received batch; below ``num_envs`` envpool runs in async mode (the
    actor acts on whichever envs finished first). None: sync mode (all envs every step)."""
    num_learner_devices: int = 1
    """Async: data-parallel learner replicas (the last ``num_learner_devices`` devices; the actors
    keep the first). Each replica gets ``num_envs / num_learner_devices`` env columns of every
    trajectory; gradients are averaged, advantage statistics are global."""
    num_learner_groups: int = 1
    """Async: independent learner groups G (TianJi's parallel learners). Each group is one learner
    device with its own optimizer state, policy version and lag-bounded queue, fed by
    ``num_actors / G`` of the actors (actor i feeds group i % G, and acts with that group's
    params, so policy lag is measured against the group that produced the params); every
    ``sync_every`` updates of their own the groups average their params. ``num_updates`` counts
    all groups' updates (each group runs ``num_updates / G`` with its own learning-rate
    schedule). Not combined with ``num_learner_devices > 1`` (per-step gradient averaging inside
    a group), multi-host runs, Ray actors or resume yet."""
    sync_every: int = 1
    """Learner groups: each group's updates between param averagings (and always at its last
    update, so a run ends with one set of params). Needs ``num_learner_groups > 1``."""
    num_processes: int = 1
    """Async, multi-host (jax.distributed): processes in the job. Each runs this config's actors and
    contributes one trajectory of num_envs x num_steps steps to every global update (global batch
    num_processes x num_envs x num_steps; total_env_steps counts all processes' steps)."""
    process_id: int = 0
    """This process's index in 0..num_processes-1 (SLURM: $SLURM_PROCID)."""
    coordinator: str | None = None
    """'HOST:PORT' of process 0's coordination service (needed when num_processes > 1)."""
    heartbeat_timeout_s: int = 60
    """Multi-host: a process silent this long is declared dead and every survivor exits non-zero;
    a collective update that makes no progress for this long + 30 s also ends the process."""
    actor_backend: Literal["threads", "ray"] = "threads"
    """Async, host envs: where actors run. 'threads': actor threads in this process; 'ray': remote
    actor processes on Ray Core (any node of a Ray cluster; TianJi's actor/learner role split),
    each with its own num_envs envs and a CPU policy copy, feeding this learner through the same
    admission, lag gate and rate limiter (needs ``pip install tianji-jax[ray]``)."""
    ray_address: str | None = None
    """actor_backend='ray': the cluster to join ('auto' or 'HOST:PORT'); None reuses this
    process's Ray connection or starts a private local instance on 127.0.0.1."""
    ray_max_restarts: int = 3
    """actor_backend='ray': times Ray restarts each dead actor (its lost rollout is counted in
    ``lost_chunks``); one more death stops the run with an error."""

    def __post_init__(self) -> None:
        _plain_numbers(self)
        _check_int("seed", self.seed, minimum=0, maximum=2**32 - 1)
        for name in ("total_env_steps", "num_envs", "num_steps", "update_epochs", "num_minibatches",
                     "eval_every_env_steps"):
            _check_int(name, getattr(self, name), minimum=1)
        _check_int("total_env_steps", self.total_env_steps, maximum=2**31 - 1)  # int32 step counters
        _check_int("eval_episodes", self.eval_episodes, minimum=0)
        _check_float("learning_rate", self.learning_rate, low=0.0, low_open=True)
        _check_float("gamma", self.gamma, low=0.0, high=1.0)
        _check_float("gae_lambda", self.gae_lambda, low=0.0, high=1.0)
        if self.advantage_estimator not in ("gae", "vtrace"):
            raise ValueError(f"advantage_estimator must be one of ('gae', 'vtrace'), got {self.advantage_estimator!r}")
        _check_float("clip_eps", self.clip_eps, low=0.0, low_open=True)
        _check_float("vf_coef", self.vf_coef, low=0.0)
        _check_float("ent_coef", self.ent_coef, low=0.0)
        _check_float("max_grad_norm", self.max_grad_norm, low=0.0, low_open=True)
        for name in ("anneal_lr", "clip_value_loss", "normalize_advantages", "normalize_observations",
                     "scale_rewards"):
            _check_bool(name, getattr(self, name))
        if (not isinstance(self.hidden_sizes, tuple) or len(self.hidden_sizes) == 0
                or any(isinstance(h, bool) or not isinstance(h, int) or h < 1 for h in self.hidden_sizes)):
            raise ValueError(
                f"hidden_sizes must be a non-empty tuple of positive ints, got {self.hidden_sizes!r}")
        if self.activation not in _ACTIVATIONS:
            raise ValueError(f"activation must be one of {_ACTIVATIONS}, got {self.activation!r}")
        if self.stop_at_return is not None:
            _check_float("stop_at_return", self.stop_at_return)
            if self.eval_episodes == 0:
                raise ValueError("stop_at_return needs evaluation: eval_episodes must be >= 1, got 0")
        if self.runtime not in ("anakin", "async"):
            raise ValueError(f"runtime must be one of ('anakin', 'async'), got {self.runtime!r}")
        if self.schedule not in ("sync", "one_step", "relaxed"):
            raise ValueError(f"schedule must be one of ('sync', 'one_step', 'relaxed'), got {self.schedule!r}")
        _check_int("num_actors", self.num_actors, minimum=1)
        _check_int("queue_batches", self.queue_batches, minimum=2)
        _check_float("stall_timeout_s", self.stall_timeout_s, low=0.0, low_open=True)
        if self.max_policy_lag is not None:
            _check_int("max_policy_lag", self.max_policy_lag, minimum=0)
        lag = self.policy_lag_bound
        if self.schedule == "sync" and lag != 0:
            raise ValueError(f"max_policy_lag must be 0 for schedule 'sync', got {lag}")
        if self.schedule == "one_step" and lag < 1:
            raise ValueError(f"max_policy_lag must be >= 1 for schedule 'one_step', got {lag}")
        _check_int("num_learner_groups", self.num_learner_groups, minimum=1)
        _check_int("sync_every", self.sync_every, minimum=1)
        groups = self.num_learner_groups
        if self.runtime == "async" and self.schedule in ("sync", "one_step") and self.num_actors != groups:
            raise ValueError(f"num_actors must be {groups} (one per learner group) for schedule {self.schedule!r}, "
                             f"got {self.num_actors}; use schedule 'relaxed' for several actors per group")
        if self.batch_size % self.num_minibatches != 0:
            raise ValueError(
                f"num_minibatches={self.num_minibatches} must divide num_envs * num_steps = "
                f"{self.num_envs} * {self.num_steps} = {self.batch_size}; allowed values: "
                f"{_divisors(self.batch_size)}")
        if self.normalize_advantages and self.batch_size // self.num_minibatches < 2:
            raise ValueError(
                f"num_minibatches={self.num_minibatches} leaves minibatches of {self.batch_size // self.num_minibatches} "
                "step, whose normalised advantage is always 0 (no policy gradient); with normalize_advantages "
                f"allowed values are at most {self.batch_size // 2}")
        if self.total_env_steps < self.batch_size:
            raise ValueError(
                f"total_env_steps={self.total_env_steps} must be >= num_envs * num_steps = "
                f"{self.batch_size} (one update)")
        spec = resolve_env(self.env)  # raises ValueError for unknown ids / unsupported spaces
        if isinstance(self.env, str) and ":" not in self.env:
            object.__setattr__(self, "env", f"{spec.backend}:{self.env}")  # one spelling per env
        if spec.action_kind not in ("discrete", "continuous"):
            raise ValueError(f"env: PPO handles Discrete and 1-D Box action spaces, got {spec.action_space!r}")
        _check_host_fields(self, spec)
        _check_int("num_learner_devices", self.num_learner_devices, minimum=1)
        if self.num_learner_devices > 1:
            ld = self.num_learner_devices
            if self.runtime != "async":
                raise ValueError(f"num_learner_devices={ld} needs runtime='async' (Anakin runs on one device); "
                                 f"got runtime={self.runtime!r}")
            if self.num_envs % ld or (self.batch_size // ld) % self.num_minibatches:
                raise ValueError(
                    f"num_learner_devices={ld} must divide num_envs={self.num_envs} (each replica takes whole env "
                    f"columns) and leave a shard of {self.batch_size}/{ld} steps divisible by "
                    f"num_minibatches={self.num_minibatches}; allowed values: "
                    f"{[d for d in range(1, self.num_envs + 1) if self.num_envs % d == 0 and (self.batch_size // d) % self.num_minibatches == 0]}")
        _check_distributed(self)
        _check_ray(self, spec)
        _check_learner_groups(self)
        _check_async_only(self, ("schedule", "max_policy_lag", "num_actors", "queue_batches", "stall_timeout_s"))
        object.__setattr__(self, "_env_spec", spec)

    # ---- derived quantities -------------------------------------------------------------------
    @property
    def env_spec(self) -> EnvSpec:
        """The resolved environment (backend, id, env object, params, spaces)."""
        return self._env_spec  # type: ignore[attr-defined]

    @property
    def policy_lag_bound(self) -> int:
        """K: ``max_policy_lag``, or the schedule's default (sync 0, one_step 1, relaxed 2)."""
        if self.max_policy_lag is not None:
            return self.max_policy_lag
        return {"sync": 0, "one_step": 1, "relaxed": 2}.get(self.schedule, 0)

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
        """Number of PPO updates (rollout + epochs): ``total_env_steps // global_batch_size``,
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

    def describe(self) -> str:
        """One paragraph saying what will run: env, updates, batch and minibatch sizes, env steps."""
        spec = self.env_spec
        return (
            f"PPO on {spec.name} ({spec.backend}; obs {spec.observation_shape}, "
            f"action {spec.action_space!r}): {self.num_updates} updates x "
            f"{self.batch_size} env steps (num_envs={self.num_envs} x num_steps={self.num_steps}) = "
            f"{self.env_steps} env steps; {self.update_epochs} epochs x {self.num_minibatches} "
            f"minibatches of {self.minibatch_size} = {self.num_gradient_steps} gradient steps; "
            f"chunks of {self.updates_per_chunk} updates"
            + (f"; evaluation of {self.eval_episodes} episodes after each chunk" if self.eval_episodes else "")
            + (f"; async runtime, schedule {self.schedule}, {self.num_actors} actor(s), max_policy_lag "
               f"{self.policy_lag_bound}" if self.runtime == "async" else "; Anakin runtime")
            + (f"; actors on Ray ({self.ray_address or 'local instance'}, max_restarts {self.ray_max_restarts})"
               if self.actor_backend == "ray" else "")
            + (f"; {self.num_learner_groups} learner groups of {self.updates_per_group} updates each, params "
               f"averaged every {self.sync_every} updates" if self.num_learner_groups > 1 else "")
            + (f"; {self.num_processes} processes (this is process {self.process_id}, coordinator "
               f"{self.coordinator}), each contributing {self.batch_size} env steps to every update of "
               f"{self.global_batch_size}" if self.num_processes > 1 else "")
        )


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(math.isqrt(n)) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


# ================================================================================================
# DQN
# ================================================================================================
_DQN_RUNTIMES = ("anakin", "async")
_ATARI_FIELD_DEFAULTS = ATARI_DEFAULTS  # the DQNConfig fields' defaults are the env layer's
_EPSILON_SCHEDULES = ("linear", "apex")


@dataclass(frozen=True)
class DQNConfig(_AgentConfig):
    """Configuration of a DQN-family run on Discrete actions.

    The family: DQN (Mnih et al. 2015, "Human-level control through deep reinforcement
    learning"), Double DQN (van Hasselt et al. 2016, ``double_q``), dueling heads (Wang et al.
    2016, "Dueling Network Architectures for Deep RL", ``dueling``), proportional prioritised
    replay (Schaul et al. 2016, "Prioritized Experience Replay", ``prioritized``) and n-step
    targets (Hessel et al. 2018, "Rainbow", ``n_step``).

    Defaults: CartPole-v1 settings of CleanRL's ``dqn.py`` / PureJaxRL's DQN (10 envs, 10k buffer,
    batch 128, learning starts at 10k env steps, one gradient step per 10 env steps, lr 2.5e-4,
    epsilon 1 -> 0.05 over half the run, MLP 120-84 relu, squared TD loss), plus Double DQN and
    3-step targets, with which the default job reaches an evaluation return of 475 within 500k env
    steps (``tests/test_dqn_learning.py``; measured on seeds 0-3: 200k-250k env steps, against
    300k-400k for CleanRL's one-step DQN). The Huber loss (``huber_delta=1``, Mnih et al.'s error
    clipping) diverged on CartPole with these settings (Q-values growing past 1e5), so it is opt-in.

    One **iteration** = the actor steps its ``num_envs`` envs ``num_steps`` times with
    epsilon-greedy actions (``num_envs * num_steps`` env steps, inserted into replay as n-step
    transitions), then, once more than ``learning_starts`` env steps have been taken, the learner
    runs a block of ``updates_per_step`` gradient steps and publishes its params (policy version
    += 1). ``updates_per_step = num_envs * num_steps * replay_ratio`` must be a whole number, so
    the replay ratio (gradient updates per env step) holds exactly, with no credit accumulator.
    With ``runtime='async'`` actor threads produce such iterations concurrently with the learner
    (the rate limiter holds the replay ratio); on host envs (envpool, gymnasium) each actor steps
    its envs on the host and acts with the Q-network on the actor device
    (:mod:`tianji_jax.runtime.dqn_host`).

    All step counts are env steps (one transition of one environment) unless the field says
    "gradient updates". Derived quantities are properties: ``iteration_env_steps``,
    ``updates_per_step``, ``num_iterations``, ``env_steps``, ``iterations_per_chunk``,
    ``num_gradient_steps``, ``epsilon_decay_steps``, ``replay_bytes``, plus ``describe()``.

    Raises:
        ValueError: a value outside its allowed range (the message names the field, the value and
            what is allowed), a non-Discrete action space, a runtime other than ``"anakin"`` /
            ``"async"``, a host env (envpool, gymnasium) with ``runtime="anakin"`` (host envs run
            on the async runtime only), ``epsilon_end > epsilon_start``, an unknown
            ``epsilon_schedule``, both or neither of ``target_update_period``
            and ``tau``, a replay ratio that does not give a whole number of gradient updates per
            iteration, or ``learning_starts`` too small to fill one batch.
        TypeError: a scalar of the wrong type.
        MemoryError: the replay buffer (``replay_bytes``) would not fit in the default device's
            free memory (checked with :func:`tianji_jax.replay.check_fits` before anything is
            allocated).
    """

    env: Annotated[Any, tyro.conf.arg(constructor=str, metavar="STR",
                                       help_behavior_hint="(default: gymnax:CartPole-v1)")] = "gymnax:CartPole-v1"
    """Environment with a Discrete action space: ``"gymnax:<id>"`` (or a bare gymnax id),
    ``"envpool:<id>"`` or ``"gymnasium:<id>"`` (host envs, runtime='async' only), or a gymnax-style
    environment object (see PPOConfig.env)."""
    seed: int = 0
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
    double_q: bool = True
    """Double DQN target (van Hasselt et al. 2016): the online net picks the argmax, the target net evaluates it."""
    dueling: bool = False
    """Dueling head (Wang et al. 2016): Q = V + A - mean(A)."""
    huber_delta: float | None = None
    """Huber threshold of the TD loss (Mnih et al.'s error clipping, 1.0); None for the squared loss (CleanRL)."""
    target_update_period: int | None = 50
    """Hard target update: copy the online params every this many gradient updates. Set it to None to use tau."""
    tau: float | None = None
    """Polyak target update after every gradient update, in (0, 1]; needs target_update_period None."""
    epsilon_start: float = 1.0
    """Exploration epsilon at env step 0, in [0, 1]."""
    epsilon_end: float = 0.05
    """Final exploration epsilon, in [0, 1]."""
    epsilon_decay_fraction: float = 0.5
    """Fraction of the env steps over which epsilon decays linearly from start to end, in [0, 1]."""
    epsilon_schedule: Literal["linear", "apex"] = "linear"
    """'linear': every env uses epsilon_start -> epsilon_end over epsilon_decay_fraction of the run
    (Mnih et al. 2015). 'apex': fixed per-env epsilons of Ape-X (Horgan et al. 2018, sec. 4),
    eps_i = apex_epsilon^(1 + apex_alpha * i / (N - 1)), where i counts envs across all actors
    (env e of actor a is i = a * num_envs + e) and N = num_actors * num_envs (one env: apex_epsilon);
    epsilon_start/end/decay_fraction are then unused."""
    apex_epsilon: float = 0.4
    """Ape-X base epsilon (the paper's 0.4), in [0, 1]; used by epsilon_schedule='apex'."""
    apex_alpha: float = 7.0
    """Ape-X exponent spread alpha (the paper's 7), >= 0; used by epsilon_schedule='apex'."""
    prioritized: bool = False
    """Proportional prioritised replay (Schaul et al. 2016) with importance weights."""
    per_alpha: float = 0.6
    """Priority exponent alpha, >= 0."""
    per_beta_start: float = 0.4
    """Importance-sampling exponent beta at step 0, in [0, 1]; annealed linearly to 1 over the run."""
    hidden_sizes: tuple[int, ...] = (120, 84)
    """Hidden layer widths of the Q-network MLP."""
    activation: Literal["tanh", "relu"] = "relu"
    """Hidden activation."""
    eval_every_env_steps: int = 25_000
    """Evaluate every this many env steps (rounded to whole iterations); also the logging interval."""
    eval_episodes: int = 10
    """Episodes per evaluation with the greedy policy; 0 disables evaluation."""
    stop_at_return: float | None = None
    """Stop early once ``eval_return_mean`` reaches this value (needs ``eval_episodes > 0``)."""
    runtime: Literal["anakin", "async"] = "anakin"
    """'anakin': acting and learning fused on one device; 'async': actor threads on one device
    feed the learner's replay buffer on another through a rate limiter (TianJi mode)."""
    max_policy_lag: int = 4
    """Async: the lag gate at insert: a rollout acted with params more than this many versions
    behind the learner when it reaches the replay buffer is dropped (design.md section 4.2)."""
    schedule: Literal["sync", "relaxed"] = "relaxed"
    """Async: 'relaxed' (actors act with the newest params whenever the rate limiter admits a
    chunk; the TianJi mode) or 'sync' (one actor; chunk k is acted with the params published after
    the learner processed chunk k-1, exactly as an Anakin iteration: lag 0, bit-reproducible;
    max_policy_lag is then unused)."""
    num_actors: int = 1
    """Async: actor threads, each with its own num_envs envs."""
    stall_timeout_s: float = 60.0
    """Async: stop with an error when the learner gets no fresh data this long."""
    env_batch_size: int | None = None
    """envpool only (async runtime): envs per received batch; below ``num_envs`` envpool runs in async
    mode (the actor acts on whichever envs finished first). None: sync mode (all envs every step)."""
    episodic_life: bool = True
    """envpool Atari only: a lost life ends the episode for learning (terminal, no bootstrap; the
    frame stack carries on); episode statistics still count whole games and evaluation always plays
    whole games. The stack of 4 84x84 grey frames, frame skip 4, up to 30 no-op starts and fire
    reset are envpool's defaults (fixed)."""
    reward_clip: bool = True
    """envpool Atari only: train on rewards clipped to their sign (statistics and evaluation use the raw score)."""
    repeat_action_probability: float = 0.0
    """envpool Atari only: sticky actions, in [0, 1]; 0 as CleanRL and Mnih et al. 2015, 0.25 as
    Machado et al. 2018 recommend. Applies to training and evaluation envs."""

    @classmethod
    def atari(cls, env: str = "envpool:Pong-v5", **overrides: Any) -> "DQNConfig":
        """A DQN config for an envpool Atari game with the settings of CleanRL's ``dqn_atari.py``
        (itself Mnih et al. 2015's, with Adam): Nature CNN (chosen for image observations), 10M env
        steps, 1M-transition frame-deduplicated replay, batch 32, learning starts at 80k env steps,
        one gradient update per 4 env steps, lr 1e-4, one-step DQN with the squared TD loss, hard
        target copy every 250 gradient updates (1000 env steps), epsilon 1 -> 0.01 over the first
        10% of the run; 8 envs per actor (CleanRL: 1), async runtime. ``overrides`` replace any field.

        Raises:
            ValueError / TypeError / MemoryError: as the constructor.
        """
        fields = dict(env=env, runtime="async", total_env_steps=10_000_000, num_envs=8, num_steps=1,
                      buffer_capacity=1_000_000, learning_starts=80_000, batch_size=32, replay_ratio=0.25,
                      learning_rate=1e-4, n_step=1, double_q=False, huber_delta=None, target_update_period=250,
                      epsilon_start=1.0, epsilon_end=0.01, epsilon_decay_fraction=0.1,
                      eval_every_env_steps=250_000, eval_episodes=10)
        return cls(**{**fields, **overrides})

    def __post_init__(self) -> None:
        _plain_numbers(self)
        _check_int("seed", self.seed, minimum=0, maximum=2**32 - 1)
        for name in ("total_env_steps", "num_envs", "num_steps", "buffer_capacity", "batch_size", "n_step",
                     "eval_every_env_steps"):
            _check_int(name, getattr(self, name), minimum=1)
        _check_int("total_env_steps", self.total_env_steps, maximum=2**31 - 1)  # int32 step counters
        # the prioritised sum-tree indexes its heap nodes in int32 (tianji_jax.sum_tree.MAX_CAPACITY)
        _check_int("buffer_capacity", self.buffer_capacity, maximum=2**30)
        _check_int("learning_starts", self.learning_starts, minimum=0)
        _check_int("eval_episodes", self.eval_episodes, minimum=0)
        _check_float("replay_ratio", self.replay_ratio, low=0.0, low_open=True)
        _check_float("learning_rate", self.learning_rate, low=0.0, low_open=True)
        _check_float("max_grad_norm", self.max_grad_norm, low=0.0, low_open=True)
        _check_float("gamma", self.gamma, low=0.0, high=1.0)
        for name in ("epsilon_start", "epsilon_end", "epsilon_decay_fraction", "per_beta_start"):
            _check_float(name, getattr(self, name), low=0.0, high=1.0)
        if self.epsilon_end > self.epsilon_start:
            raise ValueError(f"epsilon_end={self.epsilon_end} must be <= epsilon_start={self.epsilon_start} "
                             "(epsilon decays from start to end)")
        if self.epsilon_schedule not in _EPSILON_SCHEDULES:
            raise ValueError(f"epsilon_schedule must be one of {_EPSILON_SCHEDULES}, got {self.epsilon_schedule!r}")
        _check_float("apex_epsilon", self.apex_epsilon, low=0.0, high=1.0)
        _check_float("apex_alpha", self.apex_alpha, low=0.0)
        _check_float("per_alpha", self.per_alpha, low=0.0)
        if self.huber_delta is not None:
            _check_float("huber_delta", self.huber_delta, low=0.0, low_open=True)
        for name in ("double_q", "dueling", "prioritized"):
            _check_bool(name, getattr(self, name))
        if (not isinstance(self.hidden_sizes, tuple) or len(self.hidden_sizes) == 0
                or any(isinstance(h, bool) or not isinstance(h, int) or h < 1 for h in self.hidden_sizes)):
            raise ValueError(
                f"hidden_sizes must be a non-empty tuple of positive ints, got {self.hidden_sizes!r}")
        if self.activation not in _ACTIVATIONS:
            raise ValueError(f"activation must be one of {_ACTIVATIONS}, got {self.activation!r}")
        if self.stop_at_return is not None:
            _check_float("stop_at_return", self.stop_at_return)
            if self.eval_episodes == 0:
                raise ValueError("stop_at_return needs evaluation: eval_episodes must be >= 1, got 0")
        _check_int("max_policy_lag", self.max_policy_lag, minimum=0)
        _check_int("num_actors", self.num_actors, minimum=1)
        _check_float("stall_timeout_s", self.stall_timeout_s, low=0.0, low_open=True)
        if self.runtime not in _DQN_RUNTIMES:
            raise ValueError(f"runtime must be one of {_DQN_RUNTIMES}, got {self.runtime!r}")
        if self.schedule not in ("sync", "relaxed"):
            raise ValueError(f"schedule must be one of ('sync', 'relaxed'), got {self.schedule!r}")
        if self.runtime == "async" and self.schedule == "sync" and self.num_actors != 1:
            raise ValueError(f"num_actors must be 1 for schedule 'sync', got {self.num_actors}; "
                             "use schedule 'relaxed' for several actors")
        # target network: exactly one of the two rules
        if self.tau is not None:
            _check_float("tau", self.tau, low=0.0, high=1.0, low_open=True)
        if (self.target_update_period is None) == (self.tau is None):
            raise ValueError(
                "set exactly one of target_update_period (hard copy every K gradient updates) and tau "
                f"(Polyak update every gradient update); got target_update_period={self.target_update_period!r}, "
                f"tau={self.tau!r} (on the command line: --tau 0.005 --target-update-period None)")
        if self.target_update_period is not None:
            _check_int("target_update_period", self.target_update_period, minimum=1)
        if self.tau is not None:
            _check_float("tau", self.tau, low=0.0, high=1.0, low_open=True)
        # replay ratio: a whole number of gradient updates per iteration
        per_iter = self.iteration_env_steps * self.replay_ratio
        u = round(per_iter)
        if u < 1 or abs(per_iter - u) > 1e-9 * max(1.0, per_iter):
            raise ValueError(
                f"replay_ratio={self.replay_ratio} must make num_envs * num_steps * replay_ratio = "
                f"{self.num_envs} * {self.num_steps} * {self.replay_ratio} = {per_iter:.6g} a whole number >= 1 "
                f"(gradient updates per iteration); allowed values: k / {self.iteration_env_steps} for ints k >= 1")
        object.__setattr__(self, "_updates_per_step", int(u))
        if self.total_env_steps < self.iteration_env_steps:
            raise ValueError(f"total_env_steps={self.total_env_steps} must be >= num_envs * num_steps = "
                             f"{self.iteration_env_steps} (one iteration)")
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
        spec = resolve_env(self.env)  # raises ValueError for unknown ids / unsupported spaces
        if isinstance(self.env, str) and ":" not in self.env:
            object.__setattr__(self, "env", f"{spec.backend}:{self.env}")
        if spec.action_kind != "discrete":
            raise ValueError(f"env: DQN needs a Discrete action space, got {spec.action_space!r}")
        _check_host_fields(self, spec)  # host envs (envpool, gymnasium) need runtime='async'
        _check_async_only(self, ("schedule", "max_policy_lag", "num_actors", "stall_timeout_s"))
        object.__setattr__(self, "_env_spec", spec)
        for name in ("episodic_life", "reward_clip"):
            _check_bool(name, getattr(self, name))
        _check_float("repeat_action_probability", self.repeat_action_probability, low=0.0, high=1.0)
        atari = spec.is_atari
        if not atari:
            changed = {k: v for k, v in self._atari_fields().items() if v != _ATARI_FIELD_DEFAULTS[k]}
            if changed:
                raise ValueError(f"{', '.join(f'{k}={v!r}' for k, v in changed.items())}: Atari settings apply to "
                                 f"envpool Atari games only; env {self.env!r} needs the defaults {_ATARI_FIELD_DEFAULTS}")
        shape = tuple(spec.observation_shape)
        frames = atari and len(shape) == 3 and str(spec.observation_space.dtype) == "uint8"
        object.__setattr__(self, "_frame_replay", frames)
        if frames:
            writers = self.num_actors * self.num_envs
            need = writers * (shape[0] + self.n_step)
            if self.buffer_capacity < need:
                raise ValueError(
                    f"buffer_capacity={self.buffer_capacity} must be >= num_actors * num_envs * (frame stack + n_step) "
                    f"= {writers} * ({shape[0]} + {self.n_step}) = {need}: the frame replay keeps one ring of "
                    "buffer_capacity / (num_actors * num_envs) frames per env, which must hold a whole transition")
        from tianji_jax import replay  # noqa: PLC0415 - jax-heavy, only once the fields are valid

        try:
            replay.check_fits(self.replay_bytes)  # MemoryError before anything is allocated
        except MemoryError as err:
            raise MemoryError(f"buffer_capacity={self.buffer_capacity}: {err}") from None

    # ---- derived quantities -------------------------------------------------------------------
    @property
    def env_spec(self) -> EnvSpec:
        """The resolved environment (backend, id, env object, params, spaces)."""
        return self._env_spec  # type: ignore[attr-defined]

    @property
    def iteration_env_steps(self) -> int:
        """Env steps per iteration: ``num_envs * num_steps``."""
        return self.num_envs * self.num_steps

    @property
    def updates_per_step(self) -> int:
        """Gradient updates in one learner block (one per iteration once learning started):
        ``num_envs * num_steps * replay_ratio``, exact."""
        return self._updates_per_step  # type: ignore[attr-defined]

    @property
    def num_iterations(self) -> int:
        """Iterations in the run: ``total_env_steps // iteration_env_steps``."""
        return self.total_env_steps // self.iteration_env_steps

    @property
    def env_steps(self) -> int:
        """Env steps that will actually be taken: ``num_iterations * iteration_env_steps``."""
        return self.num_iterations * self.iteration_env_steps

    @property
    def learning_iterations(self) -> int:
        """Iterations that run a learner block: those ending with more than ``learning_starts`` env steps."""
        first = self.learning_starts // self.iteration_env_steps + 1  # 1-based index of the first one
        return max(0, self.num_iterations - first + 1)

    @property
    def num_gradient_steps(self) -> int:
        """Gradient updates in the whole run: ``learning_iterations * updates_per_step``."""
        return self.learning_iterations * self.updates_per_step

    @property
    def iterations_per_chunk(self) -> int:
        """Iterations fused into one compiled chunk: ``max(1, eval_every_env_steps // iteration_env_steps)``,
        at most ``num_iterations``."""
        return min(self.num_iterations, max(1, self.eval_every_env_steps // self.iteration_env_steps))

    @property
    def epsilon_decay_steps(self) -> int:
        """Env steps over which epsilon decays: ``max(1, round(epsilon_decay_fraction * env_steps))``."""
        return max(1, round(self.epsilon_decay_fraction * self.env_steps))

    def _atari_fields(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in _ATARI_FIELD_DEFAULTS}

    @property
    def atari_settings(self) -> dict[str, Any] | None:
        """envpool settings of an Atari game (``episodic_life``, ``reward_clip``,
        ``repeat_action_probability``; see :data:`tianji_jax.envs.registry.ATARI_DEFAULTS`), None
        for other envs."""
        return self._atari_fields() if self.env_spec.is_atari else None

    @property
    def frame_replay(self) -> bool:
        """Replay stores frames once (:mod:`tianji_jax.frame_replay`): envpool Atari games, whose
        observations are stacks of uint8 frames. Otherwise whole ``obs`` / ``next_obs`` per
        transition (:mod:`tianji_jax.replay`)."""
        return self._frame_replay  # type: ignore[attr-defined]

    @property
    def replay_bytes(self) -> int:
        """Bytes the replay buffer allocates: :func:`tianji_jax.frame_replay.frame_replay_bytes`
        (one ring per env of all actors) when :attr:`frame_replay`, else :attr:`stacked_replay_bytes`."""
        if self.frame_replay:
            from tianji_jax import frame_replay  # noqa: PLC0415

            shape = tuple(self.env_spec.observation_shape)
            return frame_replay.frame_replay_bytes(self.num_actors * self.num_envs, self.buffer_capacity, shape[1:],
                                                   self.env_spec.observation_space.dtype)
        return self.stacked_replay_bytes

    @property
    def stacked_replay_bytes(self) -> int:
        """Bytes of :mod:`tianji_jax.replay` holding ``buffer_capacity`` whole n-step transitions
        (:func:`tianji_jax.replay.replay_bytes`: obs and next obs in the observation dtype, action,
        reward, discount); for Atari, the naive footprint the frame replay avoids."""
        import jax  # noqa: PLC0415
        import numpy as np  # noqa: PLC0415

        from tianji_jax import replay  # noqa: PLC0415

        spec = self.env_spec
        obs = jax.ShapeDtypeStruct(spec.observation_shape,
                                   jax.dtypes.canonicalize_dtype(np.dtype(spec.observation_space.dtype)))
        item = {"obs": obs, "next_obs": obs, "action": jax.ShapeDtypeStruct((), np.int32),
                "reward": jax.ShapeDtypeStruct((), np.float32), "discount": jax.ShapeDtypeStruct((), np.float32)}
        return replay.replay_bytes(item, self.buffer_capacity)

    def _describe_replay(self) -> str:
        if not self.frame_replay:
            return f"{self.replay_bytes / 2**20:.1f} MiB"
        a = self.atari_settings
        return (f"frames stored once: {self.replay_bytes / 2**30:.2f} GiB, against "
                f"{self.stacked_replay_bytes / 2**30:.2f} GiB for obs/next_obs stacks; Atari: episodic_life="
                f"{a['episodic_life']}, reward_clip={a['reward_clip']}, repeat_action_probability="
                f"{a['repeat_action_probability']}")

    def describe(self) -> str:
        """One paragraph saying what will run: env, iterations, replay ratio, buffer (and its
        footprint in memory), target updates."""
        spec = self.env_spec
        variant = "Double DQN" if self.double_q else "DQN"
        if self.dueling:
            variant = f"dueling {variant}"
        target = (f"hard target copy every {self.target_update_period} gradient updates"
                  if self.target_update_period is not None else f"Polyak target update tau={self.tau}")
        explore = (f"epsilon {self.epsilon_start} -> {self.epsilon_end} over {self.epsilon_decay_steps} env steps"
                   if self.epsilon_schedule == "linear" else
                   f"Ape-X epsilons {self.apex_epsilon}^(1 + {self.apex_alpha} i/(N-1)) over the "
                   f"N = {self.num_actors * self.num_envs} envs of all actors")
        return (
            f"{variant} ({self.n_step}-step) on {spec.name} ({spec.backend}; obs {spec.observation_shape}, "
            f"action {spec.action_space!r}): {self.num_iterations} iterations x {self.iteration_env_steps} env "
            f"steps (num_envs={self.num_envs} x num_steps={self.num_steps}) = {self.env_steps} env steps; "
            f"after {self.learning_starts} env steps, {self.updates_per_step} gradient update(s) of batch "
            f"{self.batch_size} per iteration (replay ratio {self.replay_ratio}) = {self.num_gradient_steps} "
            f"gradient updates; {'prioritised' if self.prioritized else 'uniform'} replay of "
            f"{self.buffer_capacity} transitions ({self._describe_replay()}); {target}; {explore}; chunks of "
            f"{self.iterations_per_chunk} iterations"
            + (f"; evaluation of {self.eval_episodes} greedy episodes after each chunk" if self.eval_episodes else "")
            + ("; async runtime, schedule sync (one actor, lag 0, the Anakin iteration order)"
               if self.runtime == "async" and self.schedule == "sync" else
               f"; async runtime, {self.num_actors} actor(s), lag gate at insert K={self.max_policy_lag}, "
               "replay ratio held by the rate limiter, which also sets the exact env steps (the same to within "
               "its band)" if self.runtime == "async" else "; Anakin runtime")
        )


__all__ += ["DQNConfig"]


# ================================================================================================
# Checkpointing settings and loading a config back from a run directory (issue 5)
# ================================================================================================
@dataclass(frozen=True)
class CheckpointConfig:
    """How :func:`tianji_jax.train` checkpoints a run into ``RUN_DIR/checkpoints/`` (orbax).

    Kept apart from :class:`PPOConfig` / :class:`DQNConfig` because none of it changes what is
    computed: it never enters compile keys and may differ between a run and its resume.

    Raises:
        ValueError / TypeError: a field outside its allowed range (the message names the field).
    """

    checkpoint_every_env_steps: int | None = None
    """Save a checkpoint after the first chunk that reaches each multiple of this many env steps
    (rounded up to whole chunks); None: after every chunk (every ``eval_every_env_steps``). A final
    checkpoint is always saved."""
    keep_checkpoints: int = 2
    """Keep the latest this many checkpoints (>= 1; they are what a resume continues from)."""
    keep_best_checkpoints: int = 1
    """Also keep the best this many by ``eval_return_mean`` (>= 0); never at the expense of the latest."""
    checkpoint_replay: bool = True
    """DQN: save the replay buffer's contents (needed to resume; recorded in the checkpoint's metadata).
    Without it a checkpoint serves evaluation and ``load`` but not ``--resume``."""
    async_checkpointing: bool = True
    """Write checkpoints in a background thread (the host loop only waits for the device-to-host copy)."""

    def __post_init__(self) -> None:
        if self.checkpoint_every_env_steps is not None:
            _check_int("checkpoint_every_env_steps", self.checkpoint_every_env_steps, minimum=1)
        _check_int("keep_checkpoints", self.keep_checkpoints, minimum=1)
        _check_int("keep_best_checkpoints", self.keep_best_checkpoints, minimum=0)
        _check_bool("checkpoint_replay", self.checkpoint_replay)
        _check_bool("async_checkpointing", self.async_checkpointing)

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly dict of the fields."""
        return dataclasses.asdict(self)


_ALGOS = {"ppo": PPOConfig, "dqn": DQNConfig}


def config_from_dict(data: dict[str, Any]) -> "PPOConfig | DQNConfig":
    """Rebuild a config from the dict written to ``config.json`` (``to_dict()`` plus ``"algo"``;
    ``derived`` and ``description`` are ignored).

    Args:
        data: the dict; ``data["algo"]`` is ``"ppo"`` (default when absent) or ``"dqn"``.

    Returns:
        A validated :class:`PPOConfig` or :class:`DQNConfig`.

    Raises:
        ValueError: unknown ``algo``, unknown fields, or an env that was an object (written as
            ``"object:module.Class"``; pass the config yourself for such runs), or any validation error.
        TypeError: ``data`` is not a dict, or a field of the wrong type.
    """
    if not isinstance(data, dict):
        raise TypeError(f"data must be a dict (the contents of config.json), got {type(data).__name__}")
    algo = data.get("algo", "ppo")
    if algo not in _ALGOS:
        raise ValueError(f"algo must be one of {tuple(_ALGOS)}, got {algo!r}")
    cls = _ALGOS[algo]
    names = {f.name for f in dataclasses.fields(cls)}
    fields = {k: v for k, v in data.items() if k not in ("algo", "derived", "description")}
    unknown = sorted(set(fields) - names)
    if unknown:
        raise ValueError(f"config fields {unknown} are not fields of {cls.__name__} (written by another version?)")
    env = fields.get("env")
    if isinstance(env, str) and env.startswith("object:"):
        raise ValueError(f"env={env!r} was an environment object, which config.json cannot hold; "
                         "build the config yourself and pass it (train(config, run_dir=..., resume=True))")
    if isinstance(fields.get("hidden_sizes"), list):
        fields["hidden_sizes"] = tuple(fields["hidden_sizes"])
    return cls(**fields)


def load_config(run_dir: Any) -> "PPOConfig | DQNConfig":
    """The config of the run in ``run_dir`` (from its ``config.json``).

    Raises:
        FileNotFoundError: ``run_dir`` has no ``config.json``.
        ValueError: as :func:`config_from_dict`, or ``config.json`` is not valid JSON.
    """
    import json  # noqa: PLC0415
    from pathlib import Path  # noqa: PLC0415

    path = Path(run_dir) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{str(run_dir)!r} is not a run directory: no config.json in it")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is not valid JSON: {err}") from None
    return config_from_dict(data)


__all__ += ["CheckpointConfig", "config_from_dict", "load_config"]
