"""Shared by the exact-resume tests: train a config uninterrupted, and again stopped by its
callback after the first metrics row and resumed, so the two final states can be compared."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest

import tianji_jax as tj


class Stop(Exception):
    """Raised by the interrupting callback."""


def full_and_resumed(config: Any, tmp_path: Path, cut: str = "cut") -> tuple[Any, Any]:
    """``(full, resumed)`` train results: ``config`` run uninterrupted in ``tmp_path / "full"``,
    and run in ``tmp_path / cut`` until a callback raises after its first row, then resumed there."""
    full = tj.train(config, run_dir=tmp_path / "full", progress=False)

    def stop_after_first(row):
        raise Stop

    with pytest.raises(Stop):
        tj.train(config, run_dir=tmp_path / cut, progress=False, callback=stop_after_first)
    return full, tj.train(config, run_dir=tmp_path / cut, progress=False, resume=True)


def assert_same_leaves(a: Any, b: Any) -> None:
    """Every leaf of pytree ``a`` equals the matching leaf of ``b`` bit for bit."""
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
