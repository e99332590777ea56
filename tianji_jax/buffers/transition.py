"""The n-step transition, the item a DQN-family replay stores: shared by the math that builds it
(:func:`tianji_jax.algos.dqn.n_step_transitions`) and the buffers that store and sample it
(:mod:`tianji_jax.buffers.replay`, :mod:`tianji_jax.buffers.frame_replay`), so neither side imports the other.
"""

from __future__ import annotations

from typing import Any

import jax
from flax import struct

__all__ = ["Transition"]


@struct.dataclass
class Transition:
    """An n-step transition as stored in replay (one item; batches add leading axes).

    Attributes:
        obs: observation pytree at the start step ``t`` (e.g. ``(*obs_shape)``).
        action: int32 action taken at ``t``.
        reward: float32 n-step discounted reward sum ``R_t^(k)``.
        discount: float32 ``gamma^k`` or 0 if the episode terminated within the ``k`` steps.
        next_obs: observation pytree to bootstrap from: the true successor of step ``t + k - 1``
            (the true final observation where the episode was truncated).
    """

    obs: Any
    action: jax.Array
    reward: jax.Array
    discount: jax.Array
    next_obs: Any
