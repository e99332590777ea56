"""The package's floor plan, checked on the import statements of every module (at any depth, so a
function-level import counts too).

Layers, from the ground up; a module imports nothing from a layer above its own:

====  =====================================================================================
  0   ``caches``, ``compat`` (the compilation cache and the moved-path aliases: no package import)
  1   ``envs/``, ``nets/`` (environments and networks)
  2   ``buffers/`` (queues, replay buffers, rate limiter, schedule files)
  3   ``algos/`` (configs, the capability table, agents and their pure math)
  4   ``runtime/`` (Anakin, the TianJi runner, actors, learner layouts)
  5   ``checkpoint/`` (format, orbax I/O, verification)
  6   ``run/`` (host loops, run directory, results, evaluation, logging, plots)
  7   ``training``, ``sweep``, ``config``, ``__init__`` (the public API at the top)
  8   ``cli/`` (the ``tianji`` command)
====  =====================================================================================

Only the modules of layer 0 and 7 sit at the top of the package; everything else lives in a
folder with its public face in ``__init__.py``."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "tianji_jax"

LAYERS: dict[str, int] = {"caches": 0, "compat": 0, "envs": 1, "nets": 1, "buffers": 2, "algos": 3, "runtime": 4,
                          "checkpoint": 5, "run": 6, "training": 7, "sweep": 7, "config": 7, "__init__": 7, "cli": 8}
"""The room (a top-level module or folder of ``tianji_jax``) -> its layer."""


def _imports(path: Path) -> list[str]:
    """Every ``tianji_jax`` module ``path`` imports, at any depth of its code (``from A import b``
    counts as ``A`` and ``A.b``: ``b`` may be a module)."""
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module == "tianji_jax" and node.level == 0:
            names += [f"tianji_jax.{a.name}" for a in node.names]  # a module, or a name of the top face
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names += [node.module] + [f"{node.module}.{a.name}" for a in node.names]
    return [n for n in names if n == "tianji_jax" or n.startswith("tianji_jax.")]


def room_of(dotted: str) -> str:
    """``tianji_jax.buffers.replay`` -> ``buffers``; ``tianji_jax`` and a name of its face
    (``tianji_jax.PPOConfig``) -> ``__init__``."""
    parts = dotted.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else "__init__"


def upward_imports(pkg: Path) -> dict[str, list[str]]:
    """Module (path under ``pkg``) -> the imports of a higher layer than its own, or of a room
    :data:`LAYERS` does not place; a module in an unplaced room is reported with ``"<unplaced>"``."""
    bad: dict[str, list[str]] = {}
    for path in sorted(pkg.rglob("*.py")):
        rel = path.relative_to(pkg)
        room = rel.parts[0].removesuffix(".py")
        if room not in LAYERS:
            bad.setdefault(str(rel), []).append("<unplaced>")
            continue
        for name in _imports(path):
            other = room_of(name)
            if name == "tianji_jax" and room == "__init__":
                continue
            if LAYERS[other] > LAYERS[room]:
                bad.setdefault(str(rel), []).append(name)
    return bad


def test_no_module_imports_a_layer_above_its_own():
    assert not upward_imports(PKG), f"imports that run up the layers: {upward_imports(PKG)}"


def private_imports_across_rooms(pkg: Path) -> dict[str, list[str]]:
    """Module (path under ``pkg``) -> the private names (``_x``) it imports from another room
    (a helper two folders share is public, in the lower one)."""
    bad: dict[str, list[str]] = {}
    for path in sorted(pkg.rglob("*.py")):
        rel = path.relative_to(pkg)
        room = rel.parts[0].removesuffix(".py")
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
                    and (node.module == "tianji_jax" or node.module.startswith("tianji_jax."))):
                continue
            for alias in node.names:
                if not alias.name.startswith("_") or alias.name.startswith("__"):
                    continue
                other = room_of(node.module) if node.module != "tianji_jax" else room_of(f"tianji_jax.{alias.name}")
                if other != room:
                    bad.setdefault(str(rel), []).append(f"{node.module}.{alias.name}")
    return bad


def test_no_private_name_is_imported_across_folders():
    assert not private_imports_across_rooms(PKG), private_imports_across_rooms(PKG)


def test_the_check_fails_on_a_violating_import(tmp_path):
    """The rule is not vacuous: a buffer importing an algorithm, a runtime importing the run
    loop, a new top-level module and an algorithm importing the package's top are each caught."""
    pkg = tmp_path / "tianji_jax"
    for rel, text in {"buffers/replay.py": "from tianji_jax.algos.registry import get_algorithm\n",
                      "runtime/anakin.py": "def f():\n    from tianji_jax.run import host_loop\n",
                      "algos/ppo.py": "import tianji_jax\n",
                      "helpers.py": "",
                      "envs/ok.py": "from tianji_jax.caches import register\nfrom tianji_jax import caches\n",
                      "nets/face.py": "from tianji_jax import PPOConfig\n"}.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(text)
    assert upward_imports(pkg) == {"algos/ppo.py": ["tianji_jax"], "buffers/replay.py": [
        "tianji_jax.algos.registry", "tianji_jax.algos.registry.get_algorithm"], "helpers.py": ["<unplaced>"],
        "nets/face.py": ["tianji_jax.PPOConfig"], "runtime/anakin.py": ["tianji_jax.run", "tianji_jax.run.host_loop"]}
    (pkg / "run").mkdir()
    (pkg / "run" / "loop.py").write_text("from tianji_jax.runtime.async_on_policy import _distributed, placement\n"
                                         "from tianji_jax.run.files import _helper\n")  # the second: same folder
    assert private_imports_across_rooms(pkg) == {"run/loop.py": ["tianji_jax.runtime.async_on_policy._distributed"]}


def test_only_the_public_api_sits_at_the_top():
    top = sorted(p.stem for p in PKG.glob("*.py"))
    assert top == sorted(r for r in LAYERS if (PKG / f"{r}.py").is_file()) and len(top) <= 6, top
    folders = sorted(p.name for p in PKG.iterdir() if p.is_dir() and p.name != "__pycache__")
    assert all(f in LAYERS and (PKG / f / "__init__.py").is_file() for f in folders), folders


def test_importing_the_package_does_not_start_jax():
    """Multi-host processes join jax.distributed before JAX's backend starts: importing tianji_jax
    (and every built-in algorithm's config) must not start it (importing gymnax does, so it is
    imported lazily)."""
    import subprocess
    import sys

    code = ("import tianji_jax, tianji_jax.cli.commands, tianji_jax.algos.pqn.config, tianji_jax.algos.dqn.config\n"
            "from jax._src import xla_bridge\nprint(xla_bridge.backends_are_initialized())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "False", out.stderr[-2000:]


@pytest.mark.parametrize("old, new", [("tianji_jax.replay", "tianji_jax.buffers.replay"),
                                      ("tianji_jax.networks", "tianji_jax.nets.networks"),
                                      ("tianji_jax.results", "tianji_jax.run.results")])
def test_a_moved_import_path_is_an_alias_of_the_new_one(old, new):
    import importlib

    with pytest.warns(DeprecationWarning, match=f"{old} moved to {new}"):
        module = importlib.import_module(old)
    assert module is importlib.import_module(new)


def test_no_face_hides_a_module_of_its_folder():
    """A name a folder's ``__init__.py`` re-exports must not be the name of one of its modules
    (``tianji_jax.cli.main`` would then be the function, and ``import tianji_jax.cli.main`` break)
    unless it is that module. The package's own face is exempt: ``tj.sweep`` is the documented
    function (its module is reached as ``sys.modules["tianji_jax.sweep"]``)."""
    import importlib
    import types

    hidden = {}
    for init in PKG.rglob("__init__.py"):
        folder = init.parent
        if folder == PKG:
            continue
        dotted = ".".join(("tianji_jax", *folder.relative_to(PKG).parts))
        face = importlib.import_module(dotted)
        for sub in [p.stem for p in folder.glob("*.py") if p.stem != "__init__"] + \
                   [p.name for p in folder.iterdir() if (p / "__init__.py").is_file()]:
            value = getattr(face, sub, None)
            if value is not None and not isinstance(value, types.ModuleType):
                hidden[f"{dotted}.{sub}"] = type(value).__name__
    assert not hidden, f"face names that hide a module: {hidden}"
