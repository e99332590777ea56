"""The layering rules, checked on the import statements of every module (at any depth, so a
function-level import counts too): the math and configs import no runtime, the buffers import no
algorithm and no runtime, and no module under ``tianji_jax/`` is over 500 lines."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "tianji_jax"

BUFFERS = ("buffers.py", "replay.py", "replay_sampling.py", "frame_replay.py", "frame_replay_sample.py",
           "sum_tree.py", "rate_limiter.py", "transition.py")
RULES = [  # (modules, forbidden import prefixes)
    ([p for p in (PKG / "algos").rglob("*.py")], ("tianji_jax.runtime",)),
    ([PKG / "config.py", PKG / "config_base.py", PKG / "config_checks.py", PKG / "capabilities.py"],
     ("tianji_jax.runtime",)),
    ([PKG / name for name in BUFFERS], ("tianji_jax.runtime", "tianji_jax.algos")),
]


def _imports(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names += [node.module] + [f"{node.module}.{a.name}" for a in node.names]
    return names


@pytest.mark.parametrize("modules, forbidden", RULES, ids=["math", "config", "buffers"])
def test_layers_import_nothing_above_them(modules, forbidden):
    bad = {str(p.relative_to(PKG)): name for p in modules for name in _imports(p) if name.startswith(forbidden)}
    assert not bad, f"imports across the layering: {bad}"


def test_no_module_over_500_lines():
    long = {str(p.relative_to(PKG)): n for p in PKG.rglob("*.py") if (n := len(p.read_text().splitlines())) > 500}
    assert not long, long


def test_importing_the_package_does_not_start_jax():
    """Multi-host processes join jax.distributed before JAX's backend starts: importing tianji_jax
    (and every built-in algorithm's config) must not start it (importing gymnax does, so it is
    imported lazily)."""
    import subprocess
    import sys

    code = ("import tianji_jax, tianji_jax.cli, tianji_jax.algos.pqn.config, tianji_jax.algos.dqn.config\n"
            "from jax._src import xla_bridge\nprint(xla_bridge.backends_are_initialized())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "False", out.stderr[-2000:]
