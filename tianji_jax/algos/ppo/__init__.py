"""PPO (Schulman et al. 2017): its math and its run configuration.

- :mod:`tianji_jax.algos.ppo.math`: GAE, V-trace, the clipped-surrogate loss, the optimizer and
  one update, as pure functions over pytrees; re-exported here
  (``from tianji_jax.algos.ppo import gae``).
- :mod:`tianji_jax.algos.ppo.config`: :class:`~tianji_jax.algos.ppo.config.PPOConfig`, also
  importable as :class:`tianji_jax.config.PPOConfig`.

The actor rollout and learner update built on them are in :mod:`tianji_jax.runtime.ppo_parts`.
"""

from tianji_jax.algos.ppo.math import PPOBatch, gae, make_optimizer, ppo_loss, ppo_update, vtrace

__all__ = ["gae", "vtrace", "PPOBatch", "ppo_loss", "ppo_update", "make_optimizer"]
