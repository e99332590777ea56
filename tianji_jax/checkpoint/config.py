"""The checkpointing settings of a run (:class:`CheckpointConfig`: how often, how many kept, the
replay included or not, asynchronous writes), validated once when built."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from tianji_jax.algos.config_base import check_bool, check_int, plain_numbers

__all__ = ["CheckpointConfig"]


@dataclass(frozen=True)
class CheckpointConfig:
    """How :func:`tianji_jax.train` checkpoints a run into ``RUN_DIR/checkpoints/`` (orbax).

    Kept apart from the algorithm configs (:class:`~tianji_jax.config.PPOConfig`, ...) because none of it changes what is
    computed: it never enters compile keys and may differ between a run and its resume.

    Raises:
        ValueError / TypeError: a field outside its allowed range (the message names the field).
    """

    checkpoint_every_env_steps: int | None = None
    """Save a checkpoint after the first chunk that reaches each multiple of this many env steps
    (rounded up to whole chunks); None: after every chunk (every ``eval_every_env_steps``). A final
    checkpoint is always saved."""
    keep_checkpoints: int = 2
    """Keep the latest this many checkpoints (>= 1; they are what a resume continues from)."""
    keep_best_checkpoints: int = 1
    """Also keep the best this many by ``eval_return_mean`` (>= 0); never at the expense of the latest."""
    checkpoint_replay: bool = True
    """Replay algorithms (DQN family, SAC): save the replay buffer's contents (needed to resume;
    recorded in the checkpoint's metadata). Without it a checkpoint serves evaluation and ``load`` but not ``--resume``."""
    async_checkpointing: bool = True
    """Write checkpoints in a background thread (the host loop only waits for the device-to-host copy)."""

    def __post_init__(self) -> None:
        plain_numbers(self)
        if self.checkpoint_every_env_steps is not None:
            check_int("checkpoint_every_env_steps", self.checkpoint_every_env_steps, minimum=1)
        check_int("keep_checkpoints", self.keep_checkpoints, minimum=1)
        check_int("keep_best_checkpoints", self.keep_best_checkpoints, minimum=0)
        check_bool("checkpoint_replay", self.checkpoint_replay)
        check_bool("async_checkpointing", self.async_checkpointing)

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly dict of the fields."""
        return dataclasses.asdict(self)
