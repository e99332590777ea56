"""PQN (Gallici et al. 2024, "Simplifying Deep Temporal Difference Learning"): its math, config
and agent.

- :mod:`tianji_jax.algos.pqn.math`: Q(lambda) returns, the TD loss, one update (epochs of
  minibatches through the non-finite guard) and epsilon-greedy exploration, as pure functions
  over pytrees; re-exported here (``from tianji_jax.algos.pqn import q_lambda_returns``).

- :mod:`tianji_jax.algos.pqn.config`: :class:`~tianji_jax.algos.pqn.config.PQNConfig`, also
  importable as :class:`tianji_jax.PQNConfig`.
- :mod:`tianji_jax.algos.pqn.agent`: :class:`~tianji_jax.algos.pqn.agent.PQNAgent`, the acting
  step and learner update every runtime runs.

The network is :class:`tianji_jax.nets.networks.QNetwork` with ``layer_norm=True``.
"""

from tianji_jax.algos.pqn.math import (PQNBatch, epsilon_at, epsilon_greedy, pqn_loss, pqn_update,
                                       q_lambda_returns)

__all__ = ["q_lambda_returns", "PQNBatch", "pqn_loss", "pqn_update", "epsilon_at", "epsilon_greedy"]
