"""Time from process start to the first metrics row, and where it goes, before and after a change.

Each run is a fresh Python process (``python -c``) that imports tianji_jax, builds a config (which
resolves the env) and trains until its first metrics row; it reports the seconds at each of
those points, counted from its first line, and the seconds JAX spent compiling or loading
executables (``jax.monitoring``'s backend-compile durations). ``before`` runs the library at a
git revision (checked out into a temporary worktree and put first on ``PYTHONPATH``), ``after``
the working tree. ``cold``: a fresh, empty compilation-cache directory; ``warm``: the same
directory again, right after the cold run. Systems alternate within each repeat, so a drift in
the machine's load hits both alike.

    python experiments/startup.py --before ad64a26 --repeats 3 --out experiments/results/startup
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import SHARED_NOTE, command, loadavg, median, write_csv, write_machine  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

CONFIGS = {
    # one chunk of 16 updates: the first row is the end of the run
    "anakin_ppo": "tj.PPOConfig(total_env_steps=16384)",
    # async DQN with its defaults (learning starts at 10,000 env steps): the first row after 12,000
    "async_dqn": "tj.DQNConfig(runtime='async', total_env_steps=12_000, eval_every_env_steps=12_000)",
}

CHILD = r"""
import time
T0 = time.perf_counter()
import json, sys
import jax
compile_s = [0.0]
def _listen(name, secs, **kw):
    if name == "/jax/core/compile/backend_compile_duration":
        compile_s[0] += secs
jax.monitoring.register_event_duration_secs_listener(_listen)
import tianji_jax as tj
t_import = time.perf_counter() - T0
config = CONFIG
t_config = time.perf_counter() - T0
first = []
tj.train(config, progress=False, callback=lambda row: first.append(time.perf_counter() - T0) if not first else None)
print("TIMES" + json.dumps({"import_s": t_import, "config_s": t_config - t_import, "first_row_s": first[0],
                            "train_to_first_row_s": first[0] - t_config, "compile_s": compile_s[0],
                            "module": tj.__file__}))
"""


def _run(python_path: str, config: str, cache: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TIANJI_COMPILATION_CACHE", "JAX_COMPILATION"))}
    env["TIANJI_COMPILATION_CACHE_DIR"] = str(cache)
    env["PYTHONPATH"] = python_path
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", CHILD.replace("CONFIG", config)], capture_output=True, text=True,
                         env=env, timeout=600, cwd=tempfile.gettempdir())
    wall = time.perf_counter() - t0
    if out.returncode != 0:
        raise RuntimeError(f"child failed ({out.returncode}):\n{out.stderr[-3000:]}")
    times = json.loads([x for x in out.stdout.splitlines() if x.startswith("TIMES")][-1][5:])
    times["process_wall_s"] = wall
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", required=True, help="git revision of the 'before' system")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=ROOT / "experiments/results/startup")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="tianji_startup_"))
    tree = work / "before"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), args.before], check=True,
                   capture_output=True)
    systems = {"before": str(tree), "after": str(ROOT)}
    rows = []
    load_start = loadavg()
    try:
        for rep in range(args.repeats):
            for name, config in CONFIGS.items():
                for system, path in systems.items():
                    cache = work / f"cache_{system}_{name}_{rep}"
                    for state in ("cold", "warm"):
                        t = _run(path, config, cache)
                        assert Path(t.pop("module")).resolve().is_relative_to(Path(path).resolve())
                        rows.append({"config": name, "system": system, "cache": state, "repeat": rep, **t,
                                     "loadavg_1m": (loadavg() or [float("nan")])[0]})
                        print(rows[-1], flush=True)
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], capture_output=True)
    write_csv(rows, args.out / "runs.csv")
    write_machine(args.out, {"loadavg_start": load_start, "before": args.before,
                             "after": subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                                                     capture_output=True, text=True).stdout.strip() + " + work tree"})
    cols = ["import_s", "config_s", "train_to_first_row_s", "first_row_s", "compile_s", "process_wall_s"]
    lines = [f"# Start-up: process start to the first metrics row\n\nCommand: `{command()}`\n\n{SHARED_NOTE}\n",
             f"Before: `{args.before}`; after: the working tree. Median of {args.repeats} repeats (seconds; "
             "counted from the child's first line, so Python's own start, ~0.05 s, is not in them). "
             "`compile_s`: JAX's backend compile-or-load seconds within the process (a warm cache loads).\n",
             "| config | cache | system | " + " | ".join(cols) + " |", "|---" * (3 + len(cols)) + "|"]
    for name in CONFIGS:
        for state in ("cold", "warm"):
            for system in systems:
                sel = [r for r in rows if r["config"] == name and r["cache"] == state and r["system"] == system]
                lines.append(f"| {name} | {state} | {system} | "
                             + " | ".join(f"{median(r[c] for r in sel):.2f}" for c in cols) + " |")
    (args.out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
