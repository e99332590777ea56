"""SAC, Soft Actor-Critic for Box actions (Haarnoja et al. 2018, "Soft Actor-Critic: Off-Policy
Maximum Entropy Deep RL with a Stochastic Actor"; automatic temperature from Haarnoja et al. 2018,
"Soft Actor-Critic Algorithms and Applications", section 5): its math and networks.

- :mod:`tianji_jax.algos.sac.math`: the tanh-squashed Gaussian (reparameterised sample with its
  log-density, deterministic mode), the soft Q target and the critic, actor and temperature
  losses, as pure functions over arrays; re-exported here.
- :mod:`tianji_jax.algos.sac.networks`: :class:`~tianji_jax.algos.sac.networks.SACActor`,
  :class:`~tianji_jax.algos.sac.networks.TwinQ` and
  :func:`~tianji_jax.algos.sac.networks.make_sac_networks`; re-exported here.

Importing this package imports no runtime module.
"""

from tianji_jax.algos.sac.math import (actor_loss, critic_loss, default_target_entropy, soft_q_target,
                                       squashed_gaussian_mode, squashed_gaussian_sample, temperature_loss)
from tianji_jax.algos.sac.networks import LOG_STD_MAX, LOG_STD_MIN, SACActor, TwinQ, make_sac_networks

__all__ = ["squashed_gaussian_sample", "squashed_gaussian_mode", "soft_q_target", "critic_loss", "actor_loss",
           "temperature_loss", "default_target_entropy", "SACActor", "TwinQ", "make_sac_networks",
           "LOG_STD_MIN", "LOG_STD_MAX"]
