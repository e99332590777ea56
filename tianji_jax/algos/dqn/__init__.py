"""The DQN family (DQN, Double DQN, dueling heads, prioritised replay, n-step targets): its math
and its run configuration.

- :mod:`tianji_jax.algos.dqn.math`: n-step transitions and targets, max / double-Q bootstrap
  values, the TD loss, target-network updates and the epsilon schedules, as pure functions over
  pytrees; re-exported here (``from tianji_jax.algos.dqn import td_loss``).
- :mod:`tianji_jax.algos.dqn.config`: :class:`~tianji_jax.algos.dqn.config.DQNConfig`, also
  importable as :class:`tianji_jax.config.DQNConfig`.

The actor rollout and learner update built on them are in :mod:`tianji_jax.runtime.dqn_parts`.
"""

from tianji_jax.algos.dqn.math import (
    NStepReturns,
    Transition,
    apex_epsilons,
    double_q_target,
    gather_time,
    linear_epsilon,
    max_q_target,
    n_step_returns,
    n_step_targets,
    n_step_transitions,
    periodic_hard_update,
    polyak_update,
    td_loss,
)

__all__ = [
    "NStepReturns",
    "Transition",
    "n_step_returns",
    "gather_time",
    "n_step_transitions",
    "n_step_targets",
    "max_q_target",
    "double_q_target",
    "td_loss",
    "polyak_update",
    "periodic_hard_update",
    "linear_epsilon",
    "apex_epsilons",
]
