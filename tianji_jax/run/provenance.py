"""Run provenance: package versions, git commit, command line, devices, XLA flags."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["provenance"]

_PACKAGES = ("tianji-jax", "jax", "jaxlib", "flax", "optax", "gymnax", "envpool", "orbax-checkpoint", "numpy",
             "craftax", "jumanji", "xminigrid", "brax")  # the env suites and brax: None where not installed


def _git_commit() -> str | None:
    root = Path(__file__).resolve().parent.parent
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=5)
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    return out.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def provenance() -> dict[str, Any]:
    """A JSON-friendly record of where and how this process runs."""
    import jax

    versions = {}
    for name in _PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return {
        "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command_line": sys.argv,
        "python": sys.version,
        "platform": platform.platform(),
        "hostname": platform.node(),
        "packages": versions,
        "git_commit": _git_commit(),
        "devices": [str(d) for d in jax.devices()],
        "backend": jax.default_backend(),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "cpu_count": os.cpu_count(),
    }
