"""Checkpoints of a run's whole train state: the format, its migrations and compatibility checks
(:mod:`~tianji_jax.checkpoint.core`), reading and writing with orbax
(:mod:`~tianji_jax.checkpoint.io`), verification of every restored leaf and file
(:mod:`~tianji_jax.checkpoint.verify`, :mod:`~tianji_jax.checkpoint.digests`), resuming from the
newest intact checkpoint (:mod:`~tianji_jax.checkpoint.fallback`), the settings
(:mod:`~tianji_jax.checkpoint.config`) and the checks that
a state fits a config (:mod:`~tianji_jax.checkpoint.state_check`)."""

from tianji_jax.checkpoint.config import CheckpointConfig
from tianji_jax.checkpoint.core import (ALLOWED_MISSING_LEAVES, FORMAT_VERSION, MIGRATIONS, RESUME_FREE_FIELDS,
                                        VERSION_CHECKED_PACKAGES, CheckpointError, CheckpointFormatError,
                                        CheckpointSaveError, ConfigMismatchError, CorruptCheckpointError, MissingLeaf,
                                        check_compatible, fill_from_template, flatten_state, migrate_meta,
                                        unflatten_state)
from tianji_jax.checkpoint.io import Restored, RunCheckpointer

__all__ = ["CheckpointConfig", "CheckpointError", "CheckpointSaveError", "CorruptCheckpointError",
           "CheckpointFormatError", "ConfigMismatchError",
           "RunCheckpointer", "Restored", "flatten_state", "unflatten_state", "check_compatible", "migrate_meta",
           "MissingLeaf", "fill_from_template", "FORMAT_VERSION", "MIGRATIONS", "ALLOWED_MISSING_LEAVES",
           "VERSION_CHECKED_PACKAGES", "RESUME_FREE_FIELDS"]
