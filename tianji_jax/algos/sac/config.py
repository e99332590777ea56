"""SAC's run configuration, :class:`SACConfig` (also importable from :mod:`tianji_jax.config`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, ClassVar

import tyro

from tianji_jax.algos.replay_config import ReplayConfig
from tianji_jax.algos.config_base import check_bool, check_float, torso_text
from tianji_jax.envs.registry import EnvSpec

__all__ = ["SACConfig"]


@dataclass(frozen=True)
class SACConfig(ReplayConfig):
    """Configuration of a SAC run on a Box action space.

    Soft Actor-Critic (Haarnoja et al. 2018, "Soft Actor-Critic: Off-Policy Maximum Entropy Deep
    RL with a Stochastic Actor"; the learned temperature of "Soft Actor-Critic Algorithms and
    Applications", 2018, sec. 5): twin soft Q-functions with Polyak-averaged targets (clipped
    double Q), a tanh-squashed Gaussian actor whose actions are rescaled to the Box bounds, and,
    with ``autotune``, the temperature ``alpha`` learned towards the target entropy ``-|A|``.

    Iterations, the replay ratio, the runtime and the learner layouts are those of every replay
    algorithm (:class:`~tianji_jax.algos.replay_config.ReplayConfig`). Until ``learning_starts``
    env steps have been taken the actors act uniformly at random in the Box (as CleanRL and
    Stable-Baselines3 do), then with samples of the squashed Gaussian.

    Defaults: Pendulum-v1 (gymnax) settings close to Stable-Baselines3's and CleanRL's SAC (Adam
    3e-4 for the actor, the critics and the temperature, batch 256, tau 0.005, gamma 0.99, MLP
    256-256 relu, one gradient update per env step), with 4 envs and 1000 random warm-up steps;
    ``tests/algos/test_sac.py`` states the budget in which it solves Pendulum.

    Raises:
        ValueError: as :class:`~tianji_jax.algos.replay_config.ReplayConfig`, an action space that
            is not a 1-D Box with finite bounds and ``low < high``, ``tau`` outside (0, 1],
            ``init_alpha <= 0``, a non-finite ``target_entropy`` or one with ``autotune=False``; the message names the field
            and what is allowed.
        TypeError: a scalar of the wrong type.
        MemoryError: the replay buffer would not fit in free device memory.
    """

    ALGO: ClassVar[str] = "sac"

    env: Annotated[Any, tyro.conf.arg(constructor=str, metavar="STR",
                                       help_behavior_hint="(default: gymnax:Pendulum-v1)")] = "gymnax:Pendulum-v1"
    """Environment with a bounded Box action space: ``"gymnax:<id>"`` (or a bare gymnax id),
    ``"envpool:<id>"`` or ``"gymnasium:<id>"`` (host envs, runtime='async' only; e.g. envpool's
    MuJoCo tasks), or a gymnax-style environment object (see PPOConfig.env)."""
    total_env_steps: int = 50_000
    """Training budget in env steps (rounded down to a whole number of iterations)."""
    num_envs: int = 4
    """Number of parallel training environments N."""
    buffer_capacity: int = 100_000
    """Replay capacity C in transitions (circular FIFO); in [1, 2**30]."""
    learning_starts: int = 1_000
    """Uniform random actions, and no learner block, until more than this many env steps were taken."""
    batch_size: int = 256
    """Transitions per gradient update."""
    replay_ratio: float = 1.0
    """Gradient updates per env step; ``num_envs * num_steps * replay_ratio`` must be a whole number >= 1."""
    learning_rate: float = 3e-4
    """Adam step size of the actor, the critics and the temperature."""
    n_step: int = 1
    """Steps of the n-step return (1 = the soft one-step target of the paper)."""
    hidden_sizes: tuple[int, ...] = (256, 256)
    """Hidden layer widths of the actor's and each critic's MLP."""
    eval_every_env_steps: int = 5_000
    """Evaluate every this many env steps (rounded to whole iterations); also the logging interval."""
    tau: float = 0.005
    """Polyak rate of the target critics after every gradient update, in (0, 1]."""
    init_alpha: float = 1.0
    """Initial entropy temperature alpha, > 0 (the fixed temperature when ``autotune`` is False)."""
    autotune: bool = True
    """Learn alpha by minimising ``-log_alpha * (log_prob + target_entropy)`` (Haarnoja et al. 2018b, sec. 5)."""
    target_entropy: float | None = None
    """Target policy entropy of the temperature loss; None: ``-|A|`` (the action dimensions)."""

    def _check_fields(self) -> None:
        check_float("tau", self.tau, low=0.0, high=1.0, low_open=True)
        check_float("init_alpha", self.init_alpha, low=0.0, low_open=True)
        check_bool("autotune", self.autotune)
        if self.target_entropy is not None:
            check_float("target_entropy", self.target_entropy)
            if not self.autotune:
                raise ValueError(f"target_entropy={self.target_entropy} is the learned temperature's target; with "
                                 "autotune=False alpha stays init_alpha. Allowed: target_entropy=None (default) with "
                                 "autotune=False, or autotune=True")

    def _check_action_space(self, spec: EnvSpec) -> None:
        from tianji_jax.envs.spaces import Box  # noqa: PLC0415

        if isinstance(spec.action_space, Box) and len(spec.action_space.shape) != 1:
            raise ValueError(f"env: SAC needs a 1-D Box action space (A,), got shape {spec.action_space.shape}")
        if spec.action_kind != "continuous":
            raise ValueError(f"env: SAC needs a Box (continuous) action space, got {spec.action_space!r}; "
                             "for Discrete actions use algo 'dqn' or 'pqn'")
        import numpy as np  # noqa: PLC0415

        low, high = np.asarray(spec.action_space.low), np.asarray(spec.action_space.high)
        if not (np.all(np.isfinite(low)) and np.all(np.isfinite(high))):
            raise ValueError(f"env: SAC rescales actions to the Box bounds, which must be finite; got low={low}, "
                             f"high={high} (wrap the env so that its Box is bounded)")
        if not np.all(low < high):
            raise ValueError(f"env: SAC needs low < high in every action dimension (an empty range leaves no action "
                             f"to learn), got low={low}, high={high}")

    def derived_extra(self) -> dict[str, Any]:
        """``target_entropy_value`` (the resolved target entropy) for ``config.json``."""
        return {"target_entropy_value": self.target_entropy_value}

    @property
    def action_dim(self) -> int:
        """Action dimensions ``|A|`` of the Box."""
        return int(self.env_spec.action_space.shape[0])

    @property
    def target_entropy_value(self) -> float:
        """The temperature loss's target entropy: ``target_entropy``, or ``-|A|`` when None."""
        return float(-self.action_dim if self.target_entropy is None else self.target_entropy)

    def describe(self) -> str:
        """One paragraph saying what will run: env, iterations, replay ratio, buffer, targets, temperature."""
        spec = self.env_spec
        alpha = (f"temperature learned from {self.init_alpha} towards entropy {self.target_entropy_value:g}"
                 if self.autotune else f"fixed temperature {self.init_alpha}")
        return (f"SAC ({self.n_step}-step) on {spec.name} ({spec.backend}; obs {spec.observation_shape} -> "
                f"{torso_text(self)}, action {spec.action_space!r}): {self._describe_iterations()}; uniform replay "
                f"of {self.buffer_capacity} transitions ({self.replay_bytes / 2**20:.1f} MiB); twin critics with "
                f"Polyak targets tau={self.tau}; {alpha}; uniform random actions for the first "
                f"{self.learning_starts} env steps" + self._describe_runtime())
