"""The DQN family (DQN, Double DQN, dueling heads, prioritised replay, n-step targets): its math
and its run configuration.

- :mod:`tianji_jax.algos.dqn.math`: n-step transitions and targets, max / double-Q bootstrap
  values, the TD loss, target-network updates and the epsilon schedules, as pure functions over
  pytrees; re-exported here (``from tianji_jax.algos.dqn import td_loss``).
- :mod:`tianji_jax.algos.dqn.config`: :class:`~tianji_jax.algos.dqn.config.DQNConfig`, also
  importable as :class:`tianji_jax.config.DQNConfig`.

The agent built on them (epsilon-greedy acting, the learner block) is :mod:`tianji_jax.algos.dqn.agent`.
"""

from tianji_jax.algos.dqn.math import *  # noqa: F401,F403 - the math, re-exported
from tianji_jax.algos.dqn.math import __all__  # noqa: F401
