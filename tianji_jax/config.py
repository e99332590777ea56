"""Frozen, validated run configurations.

A config is validated once, in ``__post_init__``, before any environment is stepped or any
function is compiled. Every bad value raises ``ValueError`` (or ``TypeError`` for a value of the
wrong type) naming the field, the value given and what is allowed.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import tyro

from tianji_jax.envs.registry import EnvSpec, resolve_env

__all__ = ["PPOConfig"]

_ACTIVATIONS = ("tanh", "relu")


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


@dataclass(frozen=True)
class PPOConfig:
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
    """Environment: ``"gymnax:<id>"`` (or a bare gymnax id), or a gymnax-style environment object
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
    update_epochs: int = 4
    """Passes over each rollout batch."""
    num_minibatches: int = 4
    """Minibatches per epoch; must divide ``num_envs * num_steps``."""
    learning_rate: float = 2.5e-4
    """Adam step size (initial value when annealed)."""
    anneal_lr: bool = True
    """Anneal the learning rate linearly to 0 over all gradient steps."""
    gamma: float = 0.99
    """Discount factor, in [0, 1]."""
    gae_lambda: float = 0.95
    """GAE lambda (Schulman et al. 2016), in [0, 1]."""
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
    """Hard bound K on the policy lag of consumed samples; default 0 (sync), 1 (one_step), 2 (relaxed)."""
    num_actors: int = 1
    """Async actor threads, each with its own num_envs envs ('sync'/'one_step' need 1)."""
    queue_batches: int = 2
    """Trajectories that may wait between actors and learner (>= 2: the rate limiter's deadlock rule)."""
    stall_timeout_s: float = 60.0
    """Async: stop with an error when the learner gets no fresh data, or an actor no params, this long."""

    def __post_init__(self) -> None:
        _check_int("seed", self.seed, minimum=0, maximum=2**32 - 1)
        for name in ("total_env_steps", "num_envs", "num_steps", "update_epochs", "num_minibatches",
                     "eval_every_env_steps"):
            _check_int(name, getattr(self, name), minimum=1)
        _check_int("eval_episodes", self.eval_episodes, minimum=0)
        _check_float("learning_rate", self.learning_rate, low=0.0, low_open=True)
        _check_float("gamma", self.gamma, low=0.0, high=1.0)
        _check_float("gae_lambda", self.gae_lambda, low=0.0, high=1.0)
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
        if self.runtime == "async" and self.schedule in ("sync", "one_step") and self.num_actors != 1:
            raise ValueError(f"num_actors must be 1 for schedule {self.schedule!r}, got {self.num_actors}; "
                             "use schedule 'relaxed' for several actors")
        if self.batch_size % self.num_minibatches != 0:
            raise ValueError(
                f"num_minibatches={self.num_minibatches} must divide num_envs * num_steps = "
                f"{self.num_envs} * {self.num_steps} = {self.batch_size}; allowed values: "
                f"{_divisors(self.batch_size)}")
        if self.total_env_steps < self.batch_size:
            raise ValueError(
                f"total_env_steps={self.total_env_steps} must be >= num_envs * num_steps = "
                f"{self.batch_size} (one update)")
        spec = resolve_env(self.env)  # raises ValueError for unknown ids / unsupported spaces
        if isinstance(self.env, str) and ":" not in self.env:
            object.__setattr__(self, "env", f"{spec.backend}:{self.env}")  # one spelling per env
        if spec.action_kind not in ("discrete", "continuous"):
            raise ValueError(f"env: PPO handles Discrete and 1-D Box action spaces, got {spec.action_space!r}")
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
        """Env steps per update: ``num_envs * num_steps``."""
        return self.num_envs * self.num_steps

    @property
    def minibatch_size(self) -> int:
        """Transitions per minibatch: ``batch_size // num_minibatches``."""
        return self.batch_size // self.num_minibatches

    @property
    def num_updates(self) -> int:
        """Number of PPO updates (rollout + epochs): ``total_env_steps // batch_size``."""
        return self.total_env_steps // self.batch_size

    @property
    def env_steps(self) -> int:
        """Env steps that will actually be taken: ``num_updates * batch_size``."""
        return self.num_updates * self.batch_size

    @property
    def num_gradient_steps(self) -> int:
        """Optimizer steps in the whole run: ``num_updates * update_epochs * num_minibatches``."""
        return self.num_updates * self.update_epochs * self.num_minibatches

    @property
    def updates_per_chunk(self) -> int:
        """Updates fused into one compiled chunk: ``max(1, eval_every_env_steps // batch_size)``,
        at most ``num_updates``."""
        return min(self.num_updates, max(1, self.eval_every_env_steps // self.batch_size))

    def replace(self, **changes: Any) -> "PPOConfig":
        """A copy with ``changes`` applied, validated again."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly dict of the fields (an env object is written as its class name)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        if not isinstance(out["env"], str):
            out["env"] = f"object:{type(out['env']).__module__}.{type(out['env']).__qualname__}"
        out["hidden_sizes"] = list(out["hidden_sizes"])
        return out

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
        )


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(math.isqrt(n)) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))
