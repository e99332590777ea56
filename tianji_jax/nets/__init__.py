"""Networks (flax): the actor-critic and Q-network heads over a chosen torso (MLP, Nature CNN,
small CNN, or a user's ``"package.module:factory"``; :mod:`~tianji_jax.nets.networks`) and their
recurrent versions with per-step carry resets (:mod:`~tianji_jax.nets.recurrent`)."""

from tianji_jax.nets.networks import (TORSOS, ActorCritic, NatureCNN, QNetwork, SmallCNN, check_network, choose_torso,
                                      resolve_torso, torso_factory, torso_path)
from tianji_jax.nets.recurrent import CELLS, RecurrentActorCritic, RecurrentQNetwork, initial_carry, reset_carry

__all__ = ["ActorCritic", "NatureCNN", "SmallCNN", "QNetwork", "TORSOS", "choose_torso", "check_network",
           "resolve_torso", "torso_factory", "torso_path", "CELLS", "RecurrentActorCritic", "RecurrentQNetwork",
           "initial_carry", "reset_carry"]
