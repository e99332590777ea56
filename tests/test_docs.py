"""The documentation: the site builds with ``mkdocs build --strict`` (a broken link, a missing anchor,
an unresolved cross-reference or a ``::: module`` that does not exist fails it), its API reference
lists every public name, and the Python code blocks of README.md and docs/ run.

Budget: about 35 s on 2 idle cores (the build 6-8 s, the code blocks 25-30 s, most of it the
quickstart's two compilations); twice that on a loaded machine.

Code blocks. Every fenced ```` ```python ```` block of README.md and ``docs/**/*.md`` runs, unless the
line right before it is ``<!-- not run: REASON -->`` (a full training run, a run directory the
reader made, a sketch with elided bodies). A page's blocks run in order in one namespace, as a reader
pasting them would run them, which starts with ``import tianji_jax as tj`` done; every page gets a
fresh namespace, and all pages run in one child process (one import of JAX), in a scratch directory.
A page whose runnable blocks equal another page's (the README's quickstart is Get started's) runs once.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import tianji_jax as tj

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
pytestmark = pytest.mark.timeout(600)

BUILD_TIMEOUT_S = 240
"""Limit for ``mkdocs build`` (seconds); it takes 6-8 s on 2 idle cores."""

BLOCKS_TIMEOUT_S = 420
"""Limit for running every code block (seconds); 25-30 s on 2 idle cores."""

REQUIRED_MODULES = (
    "tianji_jax", "tianji_jax.config", "tianji_jax.training", "tianji_jax.run.results", "tianji_jax.sweep",
    "tianji_jax.run.evaluation", "tianji_jax.caches", "tianji_jax.algos.capabilities", "tianji_jax.envs",
    "tianji_jax.envs.wrappers", "tianji_jax.envs.host", "tianji_jax.envs.suites", "tianji_jax.envs.brax_env",
    "tianji_jax.algos.registry", "tianji_jax.algos.on_policy", "tianji_jax.algos.replay_agent",
    "tianji_jax.algos.on_policy_config", "tianji_jax.algos.replay_config", "tianji_jax.algos.guard",
    "tianji_jax.nets.networks", "tianji_jax.runtime.anakin", "tianji_jax.runtime.tianji.async_runtime",
    "tianji_jax.runtime.layouts.distributed", "tianji_jax.runtime.actors.ray_actors", "tianji_jax.checkpoint.core",
    "tianji_jax.buffers.queues", "tianji_jax.buffers.rate_limiter", "tianji_jax.buffers.replay",
    "tianji_jax.buffers", "tianji_jax.nets", "tianji_jax.run", "tianji_jax.checkpoint", "tianji_jax.cli",
    "tianji_jax.checkpoint.config", "tianji_jax.algos.config_file", "tianji_jax.compat",
)
"""Modules users import from; the reference must render each (and then every name of its ``__all__``)."""

NOT_RUN = re.compile(r"^<!-- not run: (.+?) -->$")
FENCE = re.compile(r"^```(\w*)\s*$")


# --------------------------------------------------------------------------------------------- build


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site built by ``mkdocs build --strict`` into a scratch directory."""
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # mkdocs-material's banner about MkDocs 2.0
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}"
    return out


def _anchors(site: Path) -> set[str]:
    ids = set()
    for page in (site / "reference").rglob("index.html"):
        ids.update(re.findall(r'id="(tianji_jax(?:\.\w+)*)"', page.read_text()))
    return ids


def _rendered_modules() -> list[str]:
    mods = []
    for page in sorted((DOCS / "reference").glob("*.md")):
        mods += re.findall(r"(?m)^::: (tianji_jax(?:\.\w+)*)\s*$", page.read_text())
    return [m for m in mods if m == "tianji_jax" or importlib.util.find_spec(m) is not None]


def test_reference_lists_every_name_of_tianji_jax_all(site):
    ids = _anchors(site)
    top = site / "reference" / "tianji_jax" / "index.html"
    assert top.exists()
    missing = [n for n in tj.__all__ if f'id="tianji_jax.{n}"' not in top.read_text()]
    assert not missing, f"docs/reference/tianji_jax.md lacks {missing} (add a '::: tianji_jax.NAME' entry)"
    assert {f"tianji_jax.{n}" for n in tj.__all__} <= ids


def test_reference_lists_every_name_of_the_public_modules(site):
    """Each module of the reference pages, and every required one, is rendered, and every name of its
    ``__all__`` is documented: under the module itself or, for a name it re-exports, wherever the
    same object is documented under the same name (``tianji_jax.train`` for ``tianji_jax.training.train``)."""
    ids = _anchors(site)
    modules = _rendered_modules()
    assert set(REQUIRED_MODULES) <= set(modules), f"not in the reference: {sorted(set(REQUIRED_MODULES) - set(modules))}"
    documented = set()
    for name in modules:
        mod = importlib.import_module(name)
        for attr in vars(mod):
            if f"{name}.{attr}" in ids:
                documented.add((attr, id(getattr(mod, attr))))
    missing = []
    for name in modules:
        assert name in ids, f"module {name} is not rendered"
        mod = importlib.import_module(name)
        for attr in getattr(mod, "__all__", ()):
            if f"{name}.{attr}" not in ids and (attr, id(getattr(mod, attr))) not in documented:
                missing.append(f"{name}.{attr}")
    assert not missing, "names of an __all__ missing from the API reference:\n  " + "\n  ".join(missing)


def test_site_holds_the_benchmark_plots_and_the_changelog(site):
    plots = sorted(p.relative_to(ROOT) for p in (ROOT / "experiments" / "results").rglob("*.png"))
    assert plots
    assert all((site / p).is_file() for p in plots), "the hook (tools/docs/hooks.py) did not copy every plot"
    shown = (site / "benchmarks" / "index.html").read_text()
    assert all(p.as_posix() in shown for p in plots), "docs/benchmarks.md does not show every plot"
    assert "What is here today" in (ROOT / "CHANGELOG.md").read_text()
    assert (site / "changelog" / "index.html").is_file()


# ------------------------------------------------------------------------------------------- README


def test_readme_keeps_the_ci_test_command_and_the_quickstart():
    """.ci/run runs the README's test command: the two must stay byte-identical. The README's Python
    quickstart is Get started's (so it runs once, below)."""
    readme = (ROOT / "README.md").read_text()
    ci = [ln for ln in (ROOT / ".ci" / "run").read_text().splitlines() if ln.startswith("pip install")]
    assert len(ci) == 1
    assert f"\npython3 -m venv .venv && . .venv/bin/activate && {ci[0]}\n" in readme
    assert ("python3 -m venv .venv && . .venv/bin/activate && pip install -e . && tianji train") in readme
    readme_py = [code for _, code in _blocks(ROOT / "README.md")[0]]
    start_py = [code for _, code in _blocks(DOCS / "get-started.md")[0]]
    assert readme_py and readme_py[0] == start_py[0]
    assert len(readme.splitlines()) <= 210


def test_readme_links_resolve():
    """The README is not a page of the site (mkdocs does not check it): its relative links must name
    files of the repository, and their anchors headings of those files."""
    readme = (ROOT / "README.md").read_text()
    links = re.findall(r"\]\(([^)\s]+)\)", readme)
    assert links
    for link in links:
        if re.match(r"\w+://", link):
            continue
        path, _, anchor = link.partition("#")
        target = ROOT / path
        assert target.is_file(), f"README.md links to {link}, which does not exist"
        if anchor:
            slugs = {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
                     for h in re.findall(r"(?m)^#+ (.*)$", target.read_text())}
            assert anchor in slugs, f"README.md links to {link}: no such heading in {path}"


# -------------------------------------------------------------------------------------- code blocks


def _blocks(path: Path) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    """The page's python blocks as (first code line, code): those to run, and those marked not run."""
    run, skipped = [], []
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if fence and fence.group(1):
            j = i + 1
            while j < len(lines) and lines[j].rstrip() != "```":
                j += 1
            if fence.group(1) == "python":
                marker = NOT_RUN.match(lines[i - 1].strip()) if i else None
                (skipped if marker else run).append((i + 2, "\n".join(lines[i + 1:j]) + "\n"))
            i = j + 1
            continue
        i += 1
    return run, skipped


def _pages() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


def test_not_run_markers_name_a_reason_and_sit_on_a_python_block():
    for page in _pages():
        lines = page.read_text().splitlines()
        for k, line in enumerate(lines):
            if line.strip().startswith("<!-- not run"):
                assert NOT_RUN.match(line.strip()), f"{page}:{k + 1}: write '<!-- not run: REASON -->'"
                assert k + 1 < len(lines) and lines[k + 1].startswith("```python"), \
                    f"{page}:{k + 1}: a not-run marker must be the line right before a ```python block"


_RUNNER = r"""
import json, sys, time, traceback
pages = json.loads(sys.stdin.read())
failed = []
for label, blocks in pages:
    t0 = time.perf_counter()
    namespace = {"__name__": "__main__"}
    exec("import tianji_jax as tj", namespace)
    for line, code in blocks:
        try:
            exec(compile("\n" * (line - 1) + code, label, "exec"), namespace)
        except BaseException:
            failed.append(f"{label}:{line}")
            print(f"FAILED {label}, block at line {line}:\n{traceback.format_exc()}", file=sys.stderr)
            break
    print(f"{label}: {len(blocks)} blocks in {time.perf_counter() - t0:.1f} s", flush=True)
sys.exit(1 if failed else 0)
"""


def test_code_blocks_run(tmp_path):
    pages, seen = [], set()
    for page in _pages():
        blocks, _ = _blocks(page)
        key = tuple(code for _, code in blocks)
        if blocks and key not in seen:
            seen.add(key)
            pages.append((str(page.relative_to(ROOT)), blocks))
    assert any(label == "docs/get-started.md" for label, _ in pages) or any(
        label == "README.md" for label, _ in pages), "the quickstart does not run"
    env = {**os.environ, "MPLBACKEND": "Agg",
           "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    proc = subprocess.run([sys.executable, "-c", _RUNNER], input=json.dumps(pages), cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=BLOCKS_TIMEOUT_S)
    print(proc.stdout)  # per-page timings (pytest -s)
    assert proc.returncode == 0, f"code blocks failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-12000:]}"
    ran = {ln.split(":")[0] for ln in proc.stdout.splitlines() if " blocks in " in ln}
    assert ran == {label for label, _ in pages}, proc.stdout
