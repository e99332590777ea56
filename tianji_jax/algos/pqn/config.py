"""The PQN run configuration, :class:`PQNConfig`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from tianji_jax.algos.on_policy_config import OnPolicyConfig
from tianji_jax.algos.config_base import check_bool, check_float
from tianji_jax.envs.registry import EnvSpec

__all__ = ["PQNConfig"]


@dataclass(frozen=True)
class PQNConfig(OnPolicyConfig):
    """Configuration of a PQN run (Gallici et al. 2024, "Simplifying Deep Temporal Difference
    Learning"): a Q-network with LayerNorm trained on-policy from vectorised rollouts with
    Q(lambda) returns and several epochs of minibatches per rollout; no target network, no replay.

    Defaults follow the paper's CartPole settings (purejaxql ``pqn_cartpole``): 32 envs x 64
    steps, 4 epochs x 16 minibatches, Adam 1e-4 without annealing, gradient clipping at 10, an
    MLP of two 128-unit ReLU layers with LayerNorm, epsilon from 1 to 0.05 over the first 20% of
    the env steps, lambda 0.95. The fields every on-policy algorithm shares are
    :class:`~tianji_jax.algos.on_policy_config.OnPolicyConfig`'s; PQN's own follow them.

    Raises:
        ValueError: a value outside its allowed range (the message names the field, the value
            and what is allowed), an action space other than Discrete, or any error of
            :class:`~tianji_jax.algos.on_policy_config.OnPolicyConfig`.
        TypeError: a scalar of the wrong type.
    """

    ALGO: ClassVar[str] = "pqn"

    num_envs: int = 32
    """Number of parallel training environments N."""
    num_steps: int = 64
    """Rollout length T: steps per env per update."""
    update_epochs: int = 4
    """Passes over each rollout batch."""
    num_minibatches: int = 16
    """Minibatches per epoch; must divide ``num_envs * num_steps``."""
    learning_rate: float = 1e-4
    """Adam step size (initial value when annealed)."""
    anneal_lr: bool = False
    """Anneal the learning rate linearly to 0 over all gradient steps."""
    max_grad_norm: float = 10.0
    """Global-norm gradient clipping threshold, > 0."""
    hidden_sizes: tuple[int, ...] = (128, 128)
    """Hidden layer widths of the Q-network's MLP (after the CNN for image observations)."""
    activation: Literal["tanh", "relu"] = "relu"
    """Hidden activation."""
    q_lambda: float = 0.95
    """lambda of the Q(lambda) returns, in [0, 1] (0: one-step targets; 1: Monte Carlo returns
    bootstrapped at the rollout's end)."""
    epsilon_start: float = 1.0
    """Exploration epsilon at the start, in [0, 1]."""
    epsilon_finish: float = 0.05
    """Exploration epsilon after the decay, in [0, epsilon_start]."""
    epsilon_anneal_fraction: float = 0.2
    """Share of ``total_env_steps`` over which epsilon decays linearly, in [0, 1] (0: always
    ``epsilon_finish``)."""
    reward_scale: float = 1.0
    """Rewards are multiplied by this before the returns are formed (> 0; the paper's REW_SCALE)."""
    layer_norm: bool = True
    """LayerNorm after every hidden layer of the Q-network (the paper's stabiliser without a
    target network; False only for ablations)."""

    def _check_fields(self) -> None:
        """PQN's own fields (see :meth:`OnPolicyConfig._check_fields`)."""
        check_float("q_lambda", self.q_lambda, low=0.0, high=1.0)
        check_float("epsilon_start", self.epsilon_start, low=0.0, high=1.0)
        check_float("epsilon_finish", self.epsilon_finish, low=0.0, high=self.epsilon_start)
        check_float("epsilon_anneal_fraction", self.epsilon_anneal_fraction, low=0.0, high=1.0)
        check_float("reward_scale", self.reward_scale, low=0.0, low_open=True)
        check_bool("layer_norm", self.layer_norm)

    def _check_env(self, spec: EnvSpec) -> None:
        """PQN acts epsilon-greedily over a Discrete action space."""
        if spec.action_kind != "discrete":
            raise ValueError(f"env: PQN needs a Discrete action space (epsilon-greedy over Q-values), got "
                             f"{spec.action_space!r}; allowed: Discrete envs (use --algo ppo for continuous actions)")

    @property
    def epsilon_anneal_steps(self) -> int:
        """Env steps over which epsilon decays: ``epsilon_anneal_fraction * total_env_steps``."""
        return int(self.epsilon_anneal_fraction * self.total_env_steps)

    def describe(self) -> str:
        """One paragraph saying what will run: env, network, exploration, sizes, runtime."""
        spec = self.env_spec
        ln = " with LayerNorm" if self.layer_norm else ""
        network = (self._describe_network(f"MLP {list(self.hidden_sizes)} {self.activation}{ln} -> Q head", "Q head")
                   if self.recurrent != "none" else self._describe_network("", "") + ln)
        return (f"PQN on {spec.name} ({spec.backend}; obs {spec.observation_shape} -> {network}, "
                f"action {spec.action_space!r}): "
                f"Q(lambda={self.q_lambda}) returns, epsilon {self.epsilon_start} -> {self.epsilon_finish} over "
                f"{self.epsilon_anneal_steps} env steps; " + self._describe_sizes() + self._describe_runtime())
