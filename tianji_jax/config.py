"""Frozen, validated run configurations: the public face of every config class.

A config is validated once, in ``__post_init__``, before any environment is stepped or any
function is compiled. Every bad value raises ``ValueError`` (or ``TypeError`` for a value of the
wrong type) naming the field, the value given and what is allowed.

The algorithm configs live with their algorithm (:mod:`tianji_jax.algos.ppo.config`,
:mod:`tianji_jax.algos.dqn.config`, ...), the checkpointing settings with the checkpoints
(:mod:`tianji_jax.checkpoint.config`), and loading a config back from a run directory with the
algorithm registry (:mod:`tianji_jax.algos.config_file`); all are re-exported here.
"""

from tianji_jax.algos.config_file import UntrustedCodeError, code_named_in, config_from_dict, load_config
from tianji_jax.algos.dqn.config import DQNConfig
from tianji_jax.algos.ppo.config import PPOConfig
from tianji_jax.algos.pqn.config import PQNConfig
from tianji_jax.algos.sac.config import SACConfig
from tianji_jax.checkpoint.config import CheckpointConfig

__all__ = ["PPOConfig", "PQNConfig", "DQNConfig", "SACConfig", "CheckpointConfig", "UntrustedCodeError",
           "code_named_in", "config_from_dict", "load_config"]
