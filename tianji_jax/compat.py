"""Import paths that moved, kept as thin aliases: ``import tianji_jax.replay`` (or ``from
tianji_jax.networks import ActorCritic``) still works and gives the module at its new path
(:data:`MOVED`), the same module object, so ``isinstance`` checks and monkeypatching see one
module; it warns once per old path with a ``DeprecationWarning`` naming the new one. Installed by
``import tianji_jax``; nothing of the library imports an old path."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings
from typing import Any

__all__ = ["MOVED", "install"]

MOVED: dict[str, str] = {f"tianji_jax.{old}": f"tianji_jax.{new}" for old, new in {
    "buffers": "buffers.queues", "rate_limiter": "buffers.rate_limiter", "transition": "buffers.transition",
    "sum_tree": "buffers.sum_tree", "replay": "buffers.replay", "replay_sampling": "buffers.replay.sampling",
    "frame_replay": "buffers.frame_replay", "frame_replay_sample": "buffers.frame_replay.sampling",
    "schedule_file": "buffers.schedule_file", "networks": "nets.networks", "recurrent": "nets.recurrent",
    "config_base": "algos.config_base", "config_checks": "algos.config_checks", "capabilities": "algos.capabilities",
    "checkpoint_io": "checkpoint.io", "checkpoint_verify": "checkpoint.verify", "checkpoint_digests": "checkpoint.digests",
    "state_check": "checkpoint.state_check", "host_loop": "run.host_loop", "host_on_policy": "run.host_on_policy",
    "host_replay": "run.host_replay", "run_files": "run.run_files", "run_status": "run.run_status",
    "results": "run.results", "evaluation": "run.evaluation", "logging": "run.logging", "plotting": "run.plotting",
    "provenance": "run.provenance", "profiling": "run.profiling", "cli_argv": "cli.argv", "cli_sweep": "cli.sweep",
    # runtime/ in folders: the runner core, the actors, the learner layouts
    **{f"runtime.{m}": f"runtime.tianji.{m}" for m in ("async_runtime", "replay_runner", "scheduled",
                                                        "auto_schedule", "param_store")},
    **{f"runtime.{m}": f"runtime.actors.{m}" for m in ("host_actor", "chunker", "replay_host", "envpool_rollout",
                                                        "ray_actors", "host_normalize")},
    **{f"runtime.{m}": f"runtime.layouts.{m}" for m in ("data_parallel", "replay_sharded", "learner_groups",
                                                         "collectives", "distributed")},
}.items() if old != "buffers"}
"""Old dotted module path -> the module's path now. (``tianji_jax.buffers``, once the queues
module, is now the buffers package, whose face re-exports the queues' public names;
``tianji_jax.checkpoint`` and ``tianji_jax.cli`` became packages whose faces re-export what the
modules of those names exported.)"""


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """A meta path finder that answers an old path of :data:`MOVED` with the module at its new one."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: Any) -> Any:
        new = MOVED[spec.name]
        warnings.warn(f"{spec.name} moved to {new}; import it from there (the old path is an alias)",
                      DeprecationWarning, stacklevel=2)
        return importlib.import_module(new)

    def exec_module(self, module: Any) -> None:
        """Nothing to run: the module at the new path is already executed."""


def install() -> None:
    """Put the alias finder on ``sys.meta_path`` (once per process)."""
    if not any(isinstance(f, _MovedModules) for f in sys.meta_path):
        sys.meta_path.append(_MovedModules())
