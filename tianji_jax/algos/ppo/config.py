"""The PPO run configuration, :class:`PPOConfig` (also importable from :mod:`tianji_jax.config`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from tianji_jax.algos.on_policy_config import OnPolicyConfig
from tianji_jax.algos.config_base import check_bool, check_float, check_int
from tianji_jax.envs.registry import EnvSpec

__all__ = ["PPOConfig"]


@dataclass(frozen=True)
class PPOConfig(OnPolicyConfig):
    """Configuration of a PPO run (Schulman et al. 2017, "Proximal Policy Optimization Algorithms").

    Defaults follow the tuned CartPole settings of CleanRL/PureJaxRL (``ppo.py``), with 8 envs.
    All sizes are counts; all step counts are env steps (one transition of one environment).
    The fields every on-policy algorithm shares (rollout sizes, optimizer, normalisation, network
    widths, evaluation, runtime, learner layout) are :class:`~tianji_jax.algos.on_policy_config.OnPolicyConfig`'s;
    PPO's own follow them.

    Derived quantities (what will actually run) are exposed as properties: ``batch_size``
    (``num_envs * num_steps`` env steps per update), ``minibatch_size``, ``num_updates``
    (``total_env_steps // batch_size``), ``env_steps`` (``num_updates * batch_size``, the steps
    actually taken), ``updates_per_chunk`` and ``describe()``.

    Raises:
        ValueError: a value outside its allowed range, an unknown env id (with the closest known
            ids), an action space PPO cannot handle, or ``num_envs * num_steps`` not divisible by
            ``num_minibatches``. The message names the field, the value and what is allowed.
        TypeError: a scalar of the wrong type (e.g. ``num_envs=1.5``; a whole float such as ``1e6``
            in an int field becomes an int, a list ``hidden_sizes`` a tuple); a malformed
            ``hidden_sizes`` raises ValueError.
    """

    ALGO: ClassVar[str] = "ppo"

    update_epochs: int = 10
    """Passes over each rollout batch (10, as Stable-Baselines3: the default job then reaches a training
    return of 475 on CartPole-v1 in 8 of 8 seeds within 500k env steps, 4 epochs in 6 of 8)."""
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
    normalize_advantages: bool = True
    """Normalise advantages to zero mean, unit std within each minibatch."""
    log_std_init: float = 0.0
    """Box action spaces: the initial value of the Gaussian policy's state-independent log standard
    deviation (0: CleanRL's, a std of 1; Stable-Baselines3's ``log_std_init``, e.g. -2 in
    rl-baselines3-zoo's MuJoCo settings), in [-20, 2]; Discrete and MultiDiscrete envs take only 0."""
    burn_in_steps: int = 0
    """Recurrent PPO: the first this many steps of every rollout column only warm up the core's state
    for the loss (no loss terms, no gradient through them; R2D2's burn-in, Kapturowski et al. 2019).
    The state stored at a rollout's start was computed by the acting policy, up to max_policy_lag
    versions older under relaxed schedules; the learner re-runs each column from it with its current
    params. 0 (default): every step is in the loss. In [0, num_steps); needs recurrent != 'none'."""

    def _check_fields(self) -> None:
        """PPO's own fields (see :meth:`OnPolicyConfig._check_fields`)."""
        check_float("gae_lambda", self.gae_lambda, low=0.0, high=1.0)
        if self.advantage_estimator not in ("gae", "vtrace"):
            raise ValueError(f"advantage_estimator must be one of ('gae', 'vtrace'), got {self.advantage_estimator!r}")
        check_float("clip_eps", self.clip_eps, low=0.0, low_open=True)
        check_float("vf_coef", self.vf_coef, low=0.0)
        check_float("ent_coef", self.ent_coef, low=0.0)
        for name in ("clip_value_loss", "normalize_advantages"):
            check_bool(name, getattr(self, name))
        check_float("log_std_init", self.log_std_init, low=-20.0, high=2.0)
        check_int("burn_in_steps", self.burn_in_steps, minimum=0)
        if self.burn_in_steps and self.recurrent == "none":
            raise ValueError(f"burn_in_steps={self.burn_in_steps} needs a recurrent core (recurrent 'lstm' or 'gru', "
                             "got 'none'); allowed with recurrent='none': 0")
        if self.burn_in_steps >= self.num_steps:
            raise ValueError(f"burn_in_steps={self.burn_in_steps} must be below num_steps={self.num_steps} (the steps "
                             f"after it are the loss's); allowed values: 0..{self.num_steps - 1}")
        if self.normalize_advantages and self.batch_size // self.num_minibatches < 2:
            raise ValueError(
                f"num_minibatches={self.num_minibatches} leaves minibatches of {self.batch_size // self.num_minibatches} "
                "step, whose normalised advantage is always 0 (no policy gradient); with normalize_advantages "
                f"allowed values are at most {self.batch_size // 2}")

    def _check_env(self, spec: EnvSpec) -> None:
        """PPO handles Discrete, MultiDiscrete (a factored categorical) and 1-D Box action spaces."""
        if spec.action_kind not in ("discrete", "multi_discrete", "continuous"):
            raise ValueError(f"env: PPO handles Discrete, MultiDiscrete and 1-D Box action spaces, got "
                             f"{spec.action_space!r}")
        if self.log_std_init != 0.0 and spec.action_kind != "continuous":
            raise ValueError(f"log_std_init={self.log_std_init} sets a Gaussian policy's initial log std (Box actions); "
                             f"env {spec.name!r} has {spec.action_space!r}, a categorical policy; allowed: 0.0")

    def describe(self) -> str:
        """One paragraph saying what will run: env, updates, batch and minibatch sizes, env steps."""
        spec = self.env_spec
        return (f"PPO on {spec.name} ({spec.backend}; obs {spec.observation_shape} -> "
                f"{self._describe_network(f'actor and critic MLPs {list(self.hidden_sizes)} {self.activation}', 'linear heads')}, "
                f"action {spec.action_space!r}): " + self._describe_sizes()
                + (f"; burn-in of {self.burn_in_steps} steps per column" if self.burn_in_steps else "")
                + self._describe_runtime())
