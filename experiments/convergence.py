"""Time to a return threshold: tianji_jax (Anakin; async ``sync`` / ``one_step`` / ``relaxed``) against peers.

For each row (env) and system, ``--seeds`` runs, each in a fresh process started by this script
(so interpreter start-up, imports, JIT compilation and env creation are counted alike for every
system; tianji_jax's persistent compilation cache is switched off there,
``TIANJI_COMPILATION_CACHE=0``, so that each run compiles as a peer's does; with ``--warm``, each JAX
system reads a persistent cache of its own, filled by one unmeasured warm-up run), report: wall seconds
from process start and env steps until ``eval_return_mean`` over 10 deterministic episodes first
reaches the threshold, and the evaluation return at the end of the budget. Evaluations run every
``eval_every`` env steps (rounded to each system's iteration); evaluation time is measured by every
runner and subtracted (``train_wall_s_to_threshold``, the headline), and also reported included
(``wall_s_to_threshold``).

Rows: CartPole-v1 (threshold 475; gymnax for tianji_jax and rejax, gymnasium for SB3 and RLlib),
LunarLander (threshold 200; envpool ``LunarLander-v2`` for tianji_jax, gymnasium
``LunarLander-v3`` for the peers) and, for SAC only, gymnax Pendulum-v1 (threshold -250, evaluation
every 2,000 env steps, budget 50k env steps; ``--pendulum-cap-s``). Systems: tianji_jax PPO in Anakin mode and on the async runtime
with each schedule (and in Anakin mode with SB3's tuned CartPole PPO hyper-parameters, ``sb3-hp``),
tianji_jax DQN in Anakin mode and on the async runtime with the ``sync``
(CartPole only) and ``relaxed`` schedules, tianji_jax PQN in Anakin mode (with its defaults, and on
CartPole with rejax's tuned PQN hyper-parameters, ``rejax-hp``), tianji_jax C51 and QR-DQN in Anakin
mode on CartPole with the settings of ``tests/learning/test_dqn_distributional.py`` and plain DQN with the same
settings (``dist-plain``), tianji_jax SAC in Anakin mode on Pendulum; Stable-Baselines3, RLlib and rejax
PPO and DQN, rejax PQN and rejax SAC (Pendulum), each with the hyper-parameters its authors tuned (see the runner
scripts in ``experiments/peers/``), each installed on demand into its own virtual environment
under ``--cache-dir``. A system that cannot run a row (Anakin on a host env, rejax without a
gymnax LunarLander) is recorded as unsupported with the reason; a peer whose
installation fails is recorded as skipped with the error.

Each run is written to ``records/<env>__<system>__seed<k>.json`` as soon as it ends, and a run with a
file is not run again: an interrupted invocation resumes where it stopped (delete a file to redo a
run). Each run has a wall-time cap (``--cartpole-cap-s``, ``--lunarlander-cap-s``; kept in its record);
a capped run keeps the evaluations it made.
Seeds are the middle loop (env, then seed, then system), so an interrupted run leaves every system
of a row with the same number of seeds. Ratios: each system's median against the best tianji_jax
variant of the same algorithm on the same row, measured in the same invocation.

Writes ``experiments/results/convergence/{records/, runs.csv, curves.csv, results.csv, summary.md,
convergence.png, machine.json}``.

    python experiments/convergence.py             # full: all systems, 3 seeds, CartPole then LunarLander
    python experiments/convergence.py --quick     # tianji_jax only, 1 seed, small budgets, CartPole to 200 (tests)
    python experiments/convergence.py --systems "tianji_jax PQN,rejax PQN"   # run only these (outputs: all records)
    python experiments/convergence.py --systems "dist-plain,C51,QR-DQN,SAC" --pendulum-cap-s 150  # the distributional DQN and SAC rows
    python experiments/convergence.py --envs CartPole-v1 --systems "PPO anakin,rejax PPO,SB3 PPO" --warm --out DIR  # warm caches

(The records of the earlier system ``tianji_jax DQN async``, made before DQN's async runtime had
schedules, were retired: its runs are redone as ``tianji_jax DQN relaxed``.)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import _common as C  # noqa: E402

PEERS_DIR = HERE / "peers"
ROOT = HERE.parent


@dataclass(frozen=True)
class Row:
    """One env row: ``threshold`` (return), ``eval_every`` (env steps), ``cap_s`` (wall s per run)."""

    name: str
    threshold: float
    eval_every: int
    cap_s: float
    algos: tuple[str, ...] | None = None  # the algorithms it is for; None: all


@dataclass(frozen=True)
class System:
    """One system: ``runner`` script in ``experiments/peers/``; ``venv`` None = this interpreter."""

    name: str
    algo: str
    runner: str
    venv: str | None = None
    mode: str | None = None
    envs: tuple[str, ...] | None = None  # the rows it runs; None: all
    hp: str | None = None  # tianji_jax: another system's hyper-parameters (``tianji_runner.py``); None: its own

    def runs_on(self, row: "Row") -> bool:
        """Whether this system has a run on ``row`` (not the same as supported: an unsupported
        system still runs to report the library's reason)."""
        return (self.envs is None or row.name in self.envs) and (row.algos is None or self.algo in row.algos)

    @property
    def is_tianji(self) -> bool:
        """True for the tianji_jax variants (run with this interpreter and this checkout)."""
        return self.venv is None


TIANJI = [System(f"tianji_jax PPO {m}", "ppo", "tianji_runner.py", mode=m)
          for m in ("anakin", "sync", "one_step", "relaxed")] + \
         [System("tianji_jax DQN anakin", "dqn", "tianji_runner.py", mode="anakin"),
          # 'sync' reproduces Anakin (one actor, lag 0): on CartPole only, the LunarLander time went to 'relaxed'
          System("tianji_jax DQN sync", "dqn", "tianji_runner.py", mode="sync", envs=("CartPole-v1",)),
          System("tianji_jax DQN relaxed", "dqn", "tianji_runner.py", mode="relaxed"),
          # DQNConfig()'s defaults with 8 env steps per env per iteration (actor chunk) instead of 1, in
          # Anakin and async relaxed: the async runtime's per-chunk costs at the same value in both
          System("tianji_jax DQN anakin steps8", "dqn", "tianji_runner.py", mode="anakin", envs=("CartPole-v1",),
                 hp="steps8"),
          System("tianji_jax DQN relaxed steps8", "dqn", "tianji_runner.py", mode="relaxed", envs=("CartPole-v1",),
                 hp="steps8"),
          System("tianji_jax DQN anakin steps1", "dqn", "tianji_runner.py", mode="anakin", envs=("CartPole-v1",),
                 hp="steps1"),
          System("tianji_jax DQN relaxed steps1", "dqn", "tianji_runner.py", mode="relaxed", envs=("CartPole-v1",),
                 hp="steps1"),
          # the same runtime with SB3's tuned CartPole PPO hyper-parameters: runtime against runtime
          System("tianji_jax PPO anakin sb3-hp", "ppo", "tianji_runner.py", mode="anakin", envs=("CartPole-v1",),
                 hp="sb3"),
          # PQN (Anakin only; on envpool LunarLander the library's own reason is recorded), with its defaults
          # (the PQN paper's CartPole settings) and with rejax's tuned CartPole PQN: runtime against runtime
          System("tianji_jax PQN anakin", "pqn", "tianji_runner.py", mode="anakin"),
          System("tianji_jax PQN anakin rejax-hp", "pqn", "tianji_runner.py", mode="anakin", envs=("CartPole-v1",),
                 hp="rejax"),
          # distributional DQN (C51, QR-DQN) with tests/learning/test_dqn_distributional.py's settings, and plain DQN with
          # the same settings (``dist-plain``): the distributional heads against the expected-value one
          System("tianji_jax DQN anakin dist-plain", "dqn", "tianji_runner.py", mode="anakin", envs=("CartPole-v1",),
                 hp="dist-plain"),
          System("tianji_jax C51 anakin", "dqn", "tianji_runner.py", mode="anakin", envs=("CartPole-v1",), hp="c51"),
          System("tianji_jax QR-DQN anakin", "dqn", "tianji_runner.py", mode="anakin", envs=("CartPole-v1",),
                 hp="qr"),
          # SAC (Anakin) with SACConfig()'s defaults on gymnax Pendulum-v1
          System("tianji_jax SAC anakin", "sac", "tianji_runner.py", mode="anakin", envs=("Pendulum-v1",))]
PEERS = [System("rejax PPO", "ppo", "rejax_runner.py", "rejax"), System("rejax DQN", "dqn", "rejax_runner.py", "rejax"),
         System("rejax PQN", "pqn", "rejax_runner.py", "rejax"),
         System("rejax SAC", "sac", "rejax_runner.py", "rejax", envs=("Pendulum-v1",)),
         System("SB3 PPO", "ppo", "sb3_runner.py", "sb3"), System("SB3 DQN", "dqn", "sb3_runner.py", "sb3"),
         System("RLlib PPO", "ppo", "rllib_runner.py", "rllib"), System("RLlib DQN", "dqn", "rllib_runner.py", "rllib")]

ALGOS = ("ppo", "dqn", "pqn", "sac")  # ratios and "a peer is faster" compare systems of the same algorithm

# Virtual environments of the peers: pip steps in order, the import that proves an install, and
# whether Box2D (LunarLander) is wanted. torch==2.13.0 first: it resolves to the CPU wheel on this
# machine's local index (another torch spec may pull a multi-GB CUDA build). Box2D: the prebuilt
# ``box2d`` 2.3.10 wheel (gymnasium 1.2's ``[box2d]`` extra asks for box2d-py 2.3.5, which must be
# built with swig and fails here) and pygame, which gymnasium's box2d package imports.
VENVS: dict[str, dict[str, Any]] = {
    "sb3": {"steps": [["torch==2.13.0"], ["stable-baselines3==2.9.2"]], "check": "import stable_baselines3",
            "box2d": True},
    "rllib": {"steps": [["torch==2.13.0"], ["ray[rllib]==2.60.0"]], "check": "import ray.rllib", "box2d": True},
    "rejax": {"steps": [["rejax==0.1.3", "gymnax==0.0.9"]], "check": "import rejax", "box2d": False},
    # experiments/ppo_brax.py: brax's own PPO trainer; brax 0.14.2's trainer calls jax.device_put_replicated,
    # which jax 0.10 (tianji_jax's pin) no longer has, so this venv takes jax 0.7.2
    "brax": {"steps": [["brax==0.14.2", "jax[cpu]==0.7.2", "jaxlib==0.7.2"]],
             "check": "import jax; jax.device_put_replicated; from brax.training.agents.ppo import train", "box2d": False},
}
BOX2D = {"steps": [["box2d==2.3.10", "pygame"]], "check": "import Box2D, gymnasium; gymnasium.make('LunarLander-v3')"}


def _tail(text: str, n: int = 1500) -> str:
    return text[-n:].strip()


def _run_ok(cmd: list[str], timeout: float, env: dict[str, str] | None = None) -> tuple[bool, str]:
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return False, f"timed out after {timeout:.0f} s: {' '.join(cmd)}"
    return p.returncode == 0, p.stdout + p.stderr


def ensure_venv(name: str, cache_dir: Path, install_timeout_s: float) -> tuple[Path | None, str, str]:
    """(python of the venv or None, install error or '', Box2D error or '') for peer ``name``.

    A venv whose check import succeeds is used as it is; otherwise it is (re)created under
    ``cache_dir/name`` with ``python -m venv`` and the pip steps of :data:`VENVS` (each step
    limited to ``install_timeout_s``)."""
    spec, venv = VENVS[name], cache_dir / name
    python = venv / "bin" / "python"
    ok, _ = _run_ok([str(python), "-c", spec["check"]], 120) if python.exists() else (False, "")
    if not ok:
        print(f"installing peer {name} into {venv} ...", flush=True)
        shutil.rmtree(venv, ignore_errors=True)
        base = getattr(sys, "_base_executable", sys.executable)  # the interpreter this venv was made from
        ok, out = _run_ok([base, "-m", "venv", str(venv)], 300)
        if not ok:
            return None, _tail(out), ""
        for step in spec["steps"]:
            ok, out = _run_ok([str(python), "-m", "pip", "install", "-q", *step], install_timeout_s)
            if not ok:
                return None, f"pip install {' '.join(step)} failed: {_tail(out)}", ""
        ok, out = _run_ok([str(python), "-c", spec["check"]], 300)
        if not ok:
            return None, f"{spec['check']!r} failed after installation: {_tail(out)}", ""
    box2d_error = ""
    if spec["box2d"]:
        ok, out = _run_ok([str(python), "-c", BOX2D["check"]], 120)
        if not ok:
            for step in BOX2D["steps"]:
                ok, out = _run_ok([str(python), "-m", "pip", "install", "-q", *step], install_timeout_s)
                if not ok:
                    break
            if ok:
                ok, out = _run_ok([str(python), "-c", BOX2D["check"]], 120)
            box2d_error = "" if ok else f"Box2D for LunarLander: {_tail(out)}"
    return python, "", box2d_error


def cache_env(system: System, warm_dir: Path | None) -> dict[str, str | None]:
    """The environment variables of a run's compilation cache (None = remove the variable).

    Cold (``warm_dir`` None): every run compiles, as a peer without a cache does -- tianji_jax's
    persistent cache (on by default) is switched off and no JAX cache directory is inherited.
    Warm: every JAX system gets its own persistent cache directory under ``warm_dir`` (tianji_jax
    through its own variable; a JAX peer through JAX's, with the minimum compile time and entry
    size at 0 so that small programs are cached too, as tianji_jax's defaults do); a peer without
    JAX (SB3, RLlib on torch) ignores them."""
    if warm_dir is None:
        return {"TIANJI_COMPILATION_CACHE": "0", "JAX_COMPILATION_CACHE_DIR": None}
    if system.is_tianji:
        return {"TIANJI_COMPILATION_CACHE": "1", "TIANJI_COMPILATION_CACHE_DIR": str(warm_dir / "tianji_jax"),
                "JAX_COMPILATION_CACHE_DIR": None}
    return {"TIANJI_COMPILATION_CACHE": None, "JAX_COMPILATION_CACHE_DIR": str(warm_dir / system.venv),
            "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0", "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"}


def run_one(system: System, row: Row, seed: int, python: Path, extra: dict[str, Any], tmp_dir: Path,
            warm_dir: Path | None = None) -> dict[str, Any]:
    """Run one (system, row, seed) in a fresh process; the record written to ``records/``.

    ``warm_dir``: None for a cold compilation cache, else the directory of the warm ones
    (:func:`cache_env`). ``status``: ``done`` (budget finished), ``capped`` (killed at
    ``row.cap_s``; the evaluations so far are kept), ``failed`` (non-zero exit; ``reason`` = the end
    of its stderr) or ``unsupported`` (``reason`` from the runner)."""
    spec = {"algo": system.algo, "env": row.name, "seed": seed, "eval_every": row.eval_every, "eval_episodes": 10,
            "mode": system.mode, "threads": 1, "tmp_dir": str(tmp_dir), "hp": system.hp, **extra}
    env = dict(os.environ)
    for name, value in cache_env(system, warm_dir).items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    if system.is_tianji:  # the tianji_jax of this checkout
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    else:  # a peer sees only its own venv
        env.pop("PYTHONPATH", None)
        env["RAY_USAGE_STATS_ENABLED"] = "0"
    err_path = tmp_dir / "stderr.txt"
    record: dict[str, Any] = {"env": row.name, "system": system.name, "algo": system.algo, "mode": system.mode,
                              "seed": seed, "threshold": row.threshold, "eval_every": row.eval_every,
                              "cap_s": row.cap_s, "evals": [], "info": {}, "reason": "",
                              "compilation_cache": "cold" if warm_dir is None else "warm"}
    lines: queue.Queue[str | None] = queue.Queue()
    with open(err_path, "w") as err:
        spec["t0"] = time.time()
        proc = subprocess.Popen([str(python), str(PEERS_DIR / system.runner), json.dumps(spec)], cwd=PEERS_DIR,
                                env=env, stdout=subprocess.PIPE, stderr=err, text=True, start_new_session=True)

        def pump():
            for line in proc.stdout:
                lines.put(line)
            lines.put(None)

        threading.Thread(target=pump, daemon=True).start()
        deadline, status = spec["t0"] + row.cap_s, None
        while True:
            try:
                line = lines.get(timeout=max(0.1, deadline - time.time()))
            except queue.Empty:
                status = "capped"
                break
            if line is None:
                break
            kind, _, payload = line.partition(" ")
            if kind == "CONV_EVAL":
                record["evals"].append(json.loads(payload))
            elif kind == "CONV_INFO":
                record["info"] = json.loads(payload)
            elif kind == "CONV_DONE":
                record["done"] = json.loads(payload)
            elif kind == "CONV_PROFILE":
                record["profile"] = json.loads(payload)
            elif kind == "CONV_UNSUPPORTED":
                status, record["reason"] = "unsupported", json.loads(payload)["reason"]
        if status == "capped":
            os.killpg(proc.pid, signal.SIGKILL)  # the runner and what it started in its process group
        rc = proc.wait(timeout=60)
    kill_leftovers(tmp_dir)
    record["process_wall_s"] = time.time() - spec["t0"]
    if status is None:
        status = "done" if rc == 0 and "done" in record else "failed"
        if status == "failed":
            record["reason"] = f"exit code {rc}: {_tail(err_path.read_text(errors='replace'), 2500)}"
    record["status"] = status
    return record


def run_fresh(system: System, row: Row, seed: int, python: Path, extra: dict[str, Any], tmp_root: Path,
              warm_dir: Path | None = None) -> dict[str, Any]:
    """:func:`run_one` in a fresh scratch directory ``tmp_root/run`` (removed afterwards), with the
    1-min load average at its start as the record's ``loadavg_start``."""
    tmp = tmp_root / "run"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    load = C.loadavg()
    record = run_one(system, row, seed, python, extra, tmp, warm_dir)
    record["loadavg_start"] = load
    shutil.rmtree(tmp, ignore_errors=True)
    return record


def kill_leftovers(tmp_dir: Path) -> list[int]:
    """SIGKILL processes whose command line names this run's private ``tmp_dir`` (Ray's GCS, raylet
    and workers start in sessions of their own, so killing the runner's group may miss them).
    Returns the pids killed."""
    killed = []
    for proc_dir in Path("/proc").glob("[0-9]*"):
        try:
            cmdline = (proc_dir / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(tmp_dir) in cmdline and int(proc_dir.name) != os.getpid():
            try:
                os.kill(int(proc_dir.name), signal.SIGKILL)
                killed.append(int(proc_dir.name))
            except OSError:
                pass
    return killed


def run_key(row: str, system: str, seed: int) -> str:
    """File stem of a run record: ``<row>__<system with _ for spaces>__seed<k>``."""
    return f"{row}__{system.replace(' ', '_')}__seed{seed}"


def summarize_run(r: dict[str, Any]) -> dict[str, Any]:
    """One line of ``runs.csv`` from a run record (NaN where not reached / not measured)."""
    ev = r.get("evals", [])
    steps = np.asarray([e["env_steps"] for e in ev], float)
    wall = np.asarray([e["wall_s"] for e in ev], float)
    eval_s = np.asarray([e["eval_s"] for e in ev], float)
    ret = np.asarray([e["eval_return_mean"] for e in ev], float)
    hit = np.nonzero(ret >= r["threshold"])[0]
    i = hit[0] if len(hit) else None
    info = r.get("info", {})
    # (records of SB3 runs made before its runner reported the budget carry the zoo's n_timesteps)
    budget = info.get("budget_env_steps", info.get("config", {}).get("n_timesteps", math.nan))
    return {
        "env": r["env"], "system": r["system"], "algo": r["algo"], "seed": r["seed"], "status": r["status"],
        "steps_to_threshold": steps[i] if i is not None else math.nan,
        "train_wall_s_to_threshold": wall[i] - eval_s[i] if i is not None else math.nan,
        "wall_s_to_threshold": wall[i] if i is not None else math.nan,
        "first_eval_wall_s": wall[0] if len(wall) else math.nan,
        "final_eval_return": ret[-1] if len(ret) and r["status"] == "done" else math.nan,
        "last_eval_return": ret[-1] if len(ret) else math.nan,
        "best_eval_return": ret.max() if len(ret) else math.nan,
        "last_eval_env_steps": steps[-1] if len(steps) else math.nan,
        "budget_env_steps": float(budget) if budget is not None else math.nan,
        "evals": len(ev), "eval_s_total": eval_s[-1] if len(eval_s) else math.nan,
        "process_wall_s": r.get("process_wall_s", math.nan), "reason": r.get("reason", "").replace("\n", " ")[:300],
        "cap_s": r.get("cap_s", math.nan),
        # time to the first evaluation (start-up, imports, compilation, the first interval), evaluation excluded,
        # and the training rate after it (env steps per train wall s between the first and the last evaluation)
        "first_eval_train_s": wall[0] - eval_s[0] if len(wall) else math.nan,
        "train_env_sps": ((steps[-1] - steps[0]) / ((wall[-1] - eval_s[-1]) - (wall[0] - eval_s[0]))
                          if len(steps) > 1 and wall[-1] - eval_s[-1] > wall[0] - eval_s[0] else math.nan),
        # rejax: its own split of the process (start-up until the algorithm exists, ahead-of-time compilation)
        # (tianji_jax: also in CONV_INFO, so that capped runs have it; records made before that have it in done only)
        "startup_s": r.get("done", {}).get("startup_s", info.get("startup_s", math.nan)),
        # gradient updates per second of training after the first evaluation (replay algorithms whose runner
        # reports its updates per env step; learning has started by the first evaluation in these rows)
        "grad_updates_per_s": ((steps[-1] - steps[0]) * float(info["updates_per_env_step"])
                               / ((wall[-1] - eval_s[-1]) - (wall[0] - eval_s[0]))
                               if info.get("updates_per_env_step") and len(steps) > 1
                               and wall[-1] - eval_s[-1] > wall[0] - eval_s[0] else math.nan),
        "compile_s": r.get("done", {}).get("compile_s", math.nan),
        **interval_columns(wall, eval_s, (r.get("done") or {}).get("tail_compile_s")),
    }


def interval_columns(wall: np.ndarray, eval_s: np.ndarray, tail: list[float] | None) -> dict[str, float]:
    """Train seconds (evaluation excluded) of the evaluation intervals after the first: median of all
    (``interval_s``), and for a tianji_jax Anakin run that compiled its last, shorter chunk in the
    background (``tail`` = [start, end] wall s, from ``tianji_runner.py``) the window's length and the
    median of the intervals overlapping it (``interval_s_tail``, how many: ``intervals_tail``) and of the
    others (``interval_s_no_tail``)."""
    train = wall - eval_s
    d = np.diff(train)
    out = {"interval_s": float(np.median(d)) if len(d) else math.nan, "tail_compile_start_s": math.nan,
           "tail_compile_window_s": math.nan, "intervals_tail": math.nan, "interval_s_tail": math.nan,
           "interval_s_no_tail": math.nan}
    if tail and len(d):
        during = (wall[:-1] < tail[1]) & (wall[1:] > tail[0])
        out.update(tail_compile_start_s=tail[0], tail_compile_window_s=tail[1] - tail[0],
                   intervals_tail=float(during.sum()),
                   interval_s_tail=float(np.median(d[during])) if during.any() else math.nan,
                   interval_s_no_tail=float(np.median(d[~during])) if (~during).any() else math.nan)
    return out


def _median_inf(values) -> float:
    """Median with NaN (threshold never reached) counted as +inf: a median over seeds that mostly
    never reach the threshold is itself 'never'."""
    v = np.asarray([np.inf if not np.isfinite(x) else x for x in values], float)
    return float(np.median(v)) if len(v) else math.nan


def aggregate(runs: list[dict[str, Any]], systems: list[System], rows: list[Row]) -> list[dict[str, Any]]:
    """``results.csv``: per (row, system) medians over seeds and ratios against tianji_jax's best.

    ``*_median`` count a seed that never reached the threshold as +inf (written as ``inf``);
    ``x_tianji_best_*`` divide by the smallest such median among the tianji_jax variants of the
    same algorithm on the same row (NaN when none reached it)."""
    out = []
    for row in rows:
        for s in systems:
            rs = [r for r in runs if r["env"] == row.name and r["system"] == s.name]
            if not rs:
                continue
            measured = [r for r in rs if r["status"] in ("done", "capped")]
            statuses = sorted({r["status"] for r in rs})
            res = {"env": row.name, "threshold": row.threshold, "system": s.name, "algo": s.algo,
                   "tianji": s.is_tianji, "status": "/".join(statuses), "seeds": len(measured),
                   "reached": sum(np.isfinite(r["steps_to_threshold"]) for r in measured),
                   "budget_env_steps": C.median(r["budget_env_steps"] for r in rs),
                   "reason": next((r["reason"] for r in rs if r["reason"]), "")}
            for k in ("train_wall_s_to_threshold", "wall_s_to_threshold", "steps_to_threshold"):
                vals = [r[k] for r in measured]
                finite = [v for v in vals if np.isfinite(v)]
                res[k + "_median"] = _median_inf(vals) if measured else math.nan
                res[k + "_min"] = min(finite) if finite else math.nan
                res[k + "_max"] = max(finite) if finite else math.nan
            for k in ("final_eval_return", "last_eval_return", "first_eval_wall_s", "loadavg_1m", "first_eval_train_s",
                      "train_env_sps", "grad_updates_per_s", "startup_s", "compile_s", "interval_s", "tail_compile_start_s",
                      "tail_compile_window_s", "intervals_tail", "interval_s_tail", "interval_s_no_tail"):
                vals = [r[k] for r in measured if np.isfinite(r[k])]
                res[k + "_median"] = C.median(vals)
                res[k + "_min"] = min(vals) if vals else math.nan
                res[k + "_max"] = max(vals) if vals else math.nan
            out.append(res)
        for algo in ALGOS:
            same = [o for o in out if o["env"] == row.name and o["algo"] == algo]
            tj = [o for o in same if o["tianji"] and o["seeds"]]
            for k in ("train_wall_s_to_threshold", "steps_to_threshold"):
                best = min((o[k + "_median"] for o in tj), default=math.inf)
                for o in same:
                    o["x_tianji_best_" + k.split("_to_")[0]] = (o[k + "_median"] / best if np.isfinite(best)
                                                                and o["seeds"] else math.nan)
            best_sys = min(tj, key=lambda o: o["train_wall_s_to_threshold_median"], default=None)
            for o in same:
                o["tianji_best"] = best_sys["system"] if best_sys and np.isfinite(
                    best_sys["train_wall_s_to_threshold_median"]) else ""
    return out


def fmt_range(o: dict[str, Any], key: str, fmt: str) -> str:
    """``median [min..max]`` of ``results.csv`` columns ``key_{median,min,max}``; 'never' for inf."""
    m = o.get(key + "_median", math.nan)
    if not np.isfinite(m):
        return "never" if m == math.inf else "-"
    lo, hi = o[key + "_min"], o[key + "_max"]
    return fmt.format(m) + (f" [{fmt.format(lo)}..{fmt.format(hi)}]" if np.isfinite(lo) and lo != hi else "")


def make_summary(args, rows: list[Row], systems: list[System], results: list[dict[str, Any]],
                 runs: list[dict[str, Any]], peer_errors: dict[str, str], load_start, wall_s: float,
                 commands: list[str]) -> str:
    """``summary.md``: protocol, one table per row, capped / failed / unsupported / skipped runs."""
    lines = [f"# Time to threshold: tianji_jax against peers {'(--quick)' if args.quick else ''}", "",
             f"Command: `{C.command()}`" + ("" if commands == [C.command()] else "; the runs were made by "
                                             + ", ".join(f"`{c}`" for c in commands)), "", C.SHARED_NOTE, "",
             "Every run is a fresh process; wall seconds count from its start (interpreter, imports, JIT "
             "compilation and env creation included; " + (
                 "**warm compilation caches**: each JAX system (tianji_jax, rejax) reads and writes a persistent "
                 "compilation cache of its own, filled by one unmeasured warm-up run of the first seed before the "
                 "measured runs, `warmup/`; JAX peers with JAX's `JAX_COMPILATION_CACHE_DIR` and minimum compile "
                 "time and entry size 0, as tianji_jax's defaults; rejax's runner reports each evaluation from inside "
                 "its compiled program with `io_callback`, and JAX writes no program with host callbacks to the "
                 "persistent cache, so rejax compiles in every run (`compile_s` in its records); SB3 has nothing "
                 "to compile"
                 if getattr(args, "warm", False) else
                 "tianji_jax's persistent compilation cache is off in these processes, `TIANJI_COMPILATION_CACHE=0`, "
                 "so that every run compiles as a peer's does") + ") to the end of "
             "the first evaluation whose mean return over 10 deterministic episodes reaches the threshold, **minus the time spent in evaluations** (each runner "
             "times its own; `wall incl. eval` keeps it). Evaluation every `eval_every` env steps (rounded up to "
             "each system's iteration), so steps and seconds to threshold are resolved to one evaluation interval. "
             "Median [min..max] over seeds; a seed that never reached the threshold counts as +inf in the median "
             "('never' when most did not). *x best* = median / the median of the best tianji_jax variant of the "
             "same algorithm on the same row (marked 1.00), measured on this machine (the load column says under what load). *return at end* = "
             "the evaluation at the end of each system's own budget (empty for runs stopped by the wall cap). "
             "Runs were sequential (env, then seed, then system). "
             + ("This invocation only rebuilt the tables from the run records in `records/`. " if args.report_only
                else f"Total wall {wall_s:.0f} s of this invocation (earlier invocations' runs were resumed from "
                     f"`records/`); load average at its start {load_start}. ")
             + "Load average at each run's start: `runs.csv` (`loadavg_1m`).", "",
             "Hyper-parameters: tianji_jax's defaults (`PPOConfig()`: CleanRL's tuned CartPole PPO with 8 envs; "
             "`DQNConfig()`: CleanRL/PureJaxRL DQN + Double DQN + 3-step targets; LunarLander PPO and DQN with the "
             "rl-baselines3-zoo LunarLander settings, the DQN ones as SB3 DQN runs them: 1 env, 1-step, no Double "
             "DQN, 100k env steps; `tianji_jax PPO anakin sb3-hp`: the Anakin runtime with SB3's tuned CartPole PPO "
             "hyper-parameters below, clip range kept at 0.2 where the zoo anneals it, so that its row against SB3 PPO "
             "compares runtimes rather than hyper-parameters); Stable-Baselines3 with rl-baselines3-zoo's tuned "
             "`ppo.yml`/`dqn.yml`; RLlib with its tuned examples `cartpole_ppo.py`/`cartpole_dqn.py`; rejax with its "
             "`configs/gymnax/cartpole.yaml` (0.1.x API). PQN: `tianji_jax PQN anakin` with `PQNConfig()`'s defaults, "
             "the PQN paper's CartPole settings (32 envs x 64 steps, 4 epochs x 16 minibatches, lr 1e-4, epsilon "
             "1 -> 0.05 over 20% of the budget, lambda 0.95, LayerNorm MLP 128x2); `rejax PQN` with its "
             "`cartpole.yaml` `pqn` section (16 envs x 128 steps, 5 epochs x 16 minibatches, lr 3e-4, epsilon "
             "1 -> 0.05 over 50% of 524,288 env steps, lambda 0.9, LayerNorm MLP 64x64); `tianji_jax PQN anakin "
             "rejax-hp`: the Anakin runtime with those rejax hyper-parameters (runtime against runtime). Each "
             "system keeps its own tuned budget (column *budget*). Distributional DQN (CartPole-v1, Anakin): "
             "`tianji_jax C51 anakin` (`distributional='c51'`, 51 atoms on [0, 100]) and `tianji_jax QR-DQN anakin` "
             "(`distributional='qr'`, 51 quantiles) with the settings of `tests/learning/test_dqn_distributional.py` "
             "(`tests/dqn_settings.py` `CARTPOLE_FAST`: 10 envs x 8 steps, replay ratio 0.25, batch 64, lr 1e-3, "
             "MLP 256-256, Polyak tau 0.005, Double DQN, 3-step targets, buffer 10k, learning from 10k env steps, "
             "epsilon 1 -> 0.02 over 18,750 env steps) and a budget of 80k env steps (the test's is 150k, stopped at "
             "475), against `tianji_jax DQN anakin dist-plain`, plain DQN with the same settings. SAC (gymnax "
             "Pendulum-v1, threshold -250, budget 50k env steps for both): `tianji_jax SAC anakin` with `SACConfig()`'s "
             "defaults (4 envs, replay ratio 1, batch 256, Adam 3e-4, tau 0.005, MLP 256-256 relu, 1000 uniform random "
             "warm-up steps, learned temperature); `rejax SAC` with rejax's tuned `configs/gymnax/pendulum.yaml` `sac` "
             "section (copied from the repository; the 0.1.3 wheel ships no configs: 1 env, batch 256, lr 0.01, one "
             "update per env step, polyak 0.98, swish MLP 64x64, observation normalization, learning after 256 env "
             "steps), its budget raised from the yaml's 10k to the row's 50k env steps. "
             "See `experiments/peers/*_runner.py`.", ""]
    loads = [r["loadavg_1m"] for r in runs if np.isfinite(r["loadavg_1m"])]
    if loads:
        lines += [f"Load average (1 min) at the start of the runs: {min(loads):.1f} to {max(loads):.1f} on 2 cores "
                  "(per system: the last column; a row measured under a higher load than another is slower for it, "
                  "so compare rows measured at similar loads). "
                  + ("When several commands made the runs (listed above), they ran partly at the same time, each "
                     "on its own seeds or systems, to fit the runs into the time available." if len(commands) > 1
                     else ""), ""]
    for row in rows:
        rs = [o for o in results if o["env"] == row.name]
        if not rs:
            continue
        lines += [f"## {row.name} (threshold {row.threshold:g}; evaluation every {row.eval_every} env steps; "
                  f"{cap_text(row, runs)})", "",
                  "| system | budget (env steps) | seeds | reached | train wall s to threshold | x best | "
                  "wall s incl. eval | env steps to threshold | x best | return at end | first eval at (s) | "
                  "load 1m at start |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for o in rs:
            if o["status"] in ("unsupported", "skipped") or not o["seeds"]:
                continue
            xb = lambda k: (f"{o[k]:.2f}" if np.isfinite(o[k]) else "-")  # noqa: E731
            lines.append(
                f"| {o['system']} | {o['budget_env_steps']:,.0f} | {o['seeds']} | {o['reached']}/{o['seeds']} | "
                f"{fmt_range(o, 'train_wall_s_to_threshold', '{:.1f}')} | {xb('x_tianji_best_train_wall_s')} | "
                f"{fmt_range(o, 'wall_s_to_threshold', '{:.1f}')} | {fmt_range(o, 'steps_to_threshold', '{:,.0f}')} | "
                f"{xb('x_tianji_best_steps')} | {fmt_range(o, 'final_eval_return', '{:.0f}')} | "
                f"{fmt_range(o, 'first_eval_wall_s', '{:.1f}')} | {fmt_range(o, 'loadavg_1m', '{:.1f}')} |")
        capped = sorted({(r["system"], r["seed"], r["cap_s"]) for r in runs
                         if r["env"] == row.name and r["status"] == "capped"})
        failed = [r for r in runs if r["env"] == row.name and r["status"] == "failed"]
        lines.append("")
        if capped:
            lines.append("Stopped by the wall cap (evaluations so far kept, no return at end): "
                         + ", ".join(f"{s} seed {k} ({c:.0f} s)" for s, k, c in capped) + ".")
        for r in failed:
            lines.append(f"Failed: {r['system']} seed {r['seed']}: `{r['reason'][-300:]}`")
        for o in rs:
            if o["status"] in ("unsupported", "skipped"):
                lines.append(f"- {o['system']}: **{o['status']}**: {o['reason']}")
        not_run = [s.name for s in systems if not quick_skip(args, row, s) and s.runs_on(row) and not any(o["system"] == s.name for o in rs)]
        if not_run:
            lines.append(f"- not run (no record in `records/`): {', '.join(not_run)}")
        lines.append("")
    lines += peer_faster_lines(rows, results) + pqn_lines(rows, results, args.out / "profile") \
        + sac_lines(rows, results, args.out / "profile") + distributional_lines(rows, results) \
        + profile_lines(args.out / "profile")
    if peer_errors:
        lines += ["Peer installation: " + "; ".join(f"{k}: {v[:300]}" for k, v in peer_errors.items()), ""]
    short = sorted({(o["env"], o["system"], o["seeds"]) for o in results
                    if o["status"] not in ("unsupported", "skipped") and o["seeds"] < args.seeds})
    if short:
        lines += ["**Partial results**: fewer than the requested " f"{args.seeds} seeds (the run was interrupted "
                  "or is still to be resumed): " + ", ".join(f"{e} / {s}: {n}" for e, s, n in short) + ".", ""]
    return "\n".join(lines)


def cap_text(row: Row, runs: list[dict[str, Any]]) -> str:
    """The wall cap of ``row``'s runs as their records have it (the most common one, then the systems
    run under another), or ``row.cap_s`` when no record has one."""
    caps: dict[float, list[str]] = {}
    for r in runs:
        if r["env"] == row.name and r["status"] in ("done", "capped") and np.isfinite(r.get("cap_s", math.nan)):
            names = caps.setdefault(float(r["cap_s"]), [])
            if r["system"] not in names:
                names.append(r["system"])
    if not caps:
        return f"cap {row.cap_s:.0f} s per run"
    main = max(caps, key=lambda c: len(caps[c]))
    others = [f"{c:.0f} s for {', '.join(caps[c])}" for c in sorted(caps) if c != main]
    return f"cap {main:.0f} s per run" + (f"; {'; '.join(others)}" if others else "")


def peer_faster_lines(rows: list[Row], results: list[dict[str, Any]]) -> list[str]:
    """``summary.md``'s section on every (row, algorithm) where a peer's median beats a tianji_jax
    variant's, in train wall seconds or in env steps to the threshold (empty list: nowhere)."""
    out = []
    for row in rows:
        for algo in ALGOS:
            same = [o for o in results if o["env"] == row.name and o["algo"] == algo and o["seeds"]
                    and o["status"] not in ("unsupported", "skipped")]
            for p in (o for o in same if not o["tianji"]):
                for key, unit, fmt in (("train_wall_s_to_threshold", "train wall s", "{:.1f}"),
                                       ("steps_to_threshold", "env steps", "{:,.0f}")):
                    pm = p[key + "_median"]
                    slower = [t for t in same if t["tianji"] and t[key + "_median"] > pm]
                    if not np.isfinite(pm) or not slower:
                        continue
                    out.append(f"- {row.name}: **{p['system']}** reaches {row.threshold:g} in {fmt.format(pm)} {unit} "
                               f"(median), less than " + ", ".join(
                                   f"{t['system']} ({fmt.format(t[key + '_median']) if np.isfinite(t[key + '_median']) else 'never'})"
                                   for t in slower) + ".")
    if not out:
        peers = any(not o["tianji"] and o["seeds"] for o in results)
        return ["Where a peer is faster than tianji_jax: " + ("nowhere in these results." if peers else
                                                             "no peer ran in these results."), ""]
    return ["## Where a peer is faster than tianji_jax", "",
            "Medians over seeds from the tables above. Env steps to the threshold follow from each system's own "
            "tuned hyper-parameters (rollout and batch sizes, epochs, learning rate, exploration), not from the "
            "runtime; wall seconds add each system's start-up, compilation and throughput (the profiles below "
            "show where tianji_jax's time goes).", "",
            *out, ""]


def pqn_lines(rows: list[Row], results: list[dict[str, Any]], profile_dir: Path) -> list[str]:
    """``summary.md``'s section on PQN: tianji_jax against rejax, per row with both measured. The time
    to the threshold is split into the time to the first evaluation and the evaluation intervals after
    it (all from the measured runs); start-up and compilation (rejax: its own runs; tianji_jax: the
    ``--profile`` run, when there is one); tianji_jax's intervals during and outside the background
    compilation of its last, shorter chunk; and the ``rejax-hp`` variant (runtime against runtime)."""
    out = []
    for row in rows:
        pqn = {o["system"]: o for o in results if o["env"] == row.name and o["algo"] == "pqn" and o["seeds"]
               and o["status"] not in ("unsupported", "skipped")}
        tj, rx, tj_rx = (pqn.get(k) for k in ("tianji_jax PQN anakin", "rejax PQN", "tianji_jax PQN anakin rejax-hp"))
        if not (tj and rx):
            continue
        prof = {}
        for name in pqn:
            path = profile_dir / (run_key(row.name, name, 0) + ".json")
            if path.is_file():
                rec = json.loads(path.read_text())
                if rec.get("profile"):
                    prof[name] = (rec["profile"]["startup_s"],
                                  rec["profile"]["timers"].get("compile_s", {}).get("total", math.nan))
        f1 = lambda v: f"{v:.1f}" if np.isfinite(v) else "-"  # noqa: E731
        f2 = lambda v: f"{v:.2f}" if np.isfinite(v) else "-"  # noqa: E731
        f0 = lambda v: f"{v:.0f}" if np.isfinite(v) else "-"  # noqa: E731
        out += [f"## PQN: tianji_jax against rejax ({row.name})", "",
                f"Medians over seeds of the measured runs above (threshold {row.threshold:g}). *to first eval* = train "
                "wall s from process start to the first evaluation (start-up, imports, compilation and the first "
                f"{row.eval_every:,} env steps); *s per interval* = train wall s (evaluation excluded) of each later "
                f"evaluation interval of about {row.eval_every:,} env steps; for tianji_jax also during / outside the "
                "window in which its Anakin loop compiles the run's last, shorter chunk (the budget is not a multiple "
                "of the chunk) in a background thread (window: start, length, intervals overlapping it); *start-up* "
                "(until the algorithm is created) and *compilation*: rejax's own runs (its whole program compiled "
                "ahead of time, before training), tianji_jax's `--profile` run of seed 0 (jax's compile events in "
                "every thread: the chunk, the evaluator, the last chunk).", "",
                "| system | train wall s to threshold | env steps to threshold | return at end | to first eval (s) | "
                "s per interval | during / outside tail compile | tail compile window | start-up s | "
                "compilation s | load 1m |", "|---|---|---|---|---|---|---|---|---|---|---|"]
        for o in (tj, rx, tj_rx):
            if not o:
                continue
            su, cs = prof.get(o["system"], (o["startup_s_median"], o["compile_s_median"]))
            tail = (f"{f2(o['interval_s_tail_median'])} / {f2(o['interval_s_no_tail_median'])}"
                    if np.isfinite(o["tail_compile_window_s_median"]) else "-")
            window = (f"{o['tail_compile_start_s_median']:.1f} s + {o['tail_compile_window_s_median']:.1f} s "
                      f"({o['intervals_tail_median']:.0f})" if np.isfinite(o["tail_compile_window_s_median"]) else "-")
            out.append(f"| {o['system']} | {fmt_range(o, 'train_wall_s_to_threshold', '{:.1f}')} | "
                       f"{fmt_range(o, 'steps_to_threshold', '{:,.0f}')} | "
                       f"{fmt_range(o, 'final_eval_return', '{:.0f}')} | "
                       f"{fmt_range(o, 'first_eval_train_s', '{:.1f}')} | {fmt_range(o, 'interval_s', '{:.2f}')} | "
                       f"{tail} | {window} | {f1(su)} | {f1(cs)} | {fmt_range(o, 'loadavg_1m', '{:.1f}')} |")
        tw, rw = tj["train_wall_s_to_threshold_median"], rx["train_wall_s_to_threshold_median"]
        ts, rs = tj["steps_to_threshold_median"], rx["steps_to_threshold_median"]
        never = lambda v, f: f.format(v) if np.isfinite(v) else "never"  # noqa: E731
        text = [f"Median train wall s to {row.threshold:g}: tianji_jax PQN anakin {never(tw, '{:.1f}')}, rejax PQN "
                f"{never(rw, '{:.1f}')}; env steps {never(ts, '{:,.0f}')} against {never(rs, '{:,.0f}')}; "
                "return at the "
                f"end of the budget {f0(tj['final_eval_return_median'])} against {f0(rx['final_eval_return_median'])}."]
        if np.isfinite(tw) and np.isfinite(rw):
            faster = "rejax PQN" if rw < tw else "tianji_jax PQN anakin"
            d_first = tj["first_eval_train_s_median"] - rx["first_eval_train_s_median"]
            text.append(f"**{faster}** is faster by {abs(tw - rw):.1f} s (x{max(tw, rw) / min(tw, rw):.2f}). Of "
                        f"tianji_jax's time minus rejax's ({tw - rw:+.1f} s), {d_first:+.1f} s are spent before the "
                        f"first evaluation ({tj['first_eval_train_s_median']:.1f} s against "
                        f"{rx['first_eval_train_s_median']:.1f} s) and {(tw - rw) - d_first:+.1f} s after it: the env "
                        "steps still needed then, at each system's seconds per interval "
                        f"({f2(tj['interval_s_median'])} against {f2(rx['interval_s_median'])} s).")
        if tj_rx and np.isfinite(tj_rx["steps_to_threshold_median"]):
            m = tj_rx["steps_to_threshold_median"]
            within = np.isfinite(rs) and rx["steps_to_threshold_min"] <= m <= rx["steps_to_threshold_max"] and \
                tj_rx["steps_to_threshold_min"] <= rs <= tj_rx["steps_to_threshold_max"]
            text.append(f"With rejax's hyper-parameters, tianji_jax's runtime reaches {row.threshold:g} in "
                        f"{m:,.0f} env steps and {tj_rx['train_wall_s_to_threshold_median']:.1f} s (rejax: "
                        f"{never(rs, '{:,.0f}')} and {f1(rw)} s), at {f2(tj_rx['interval_s_median'])} s per interval "
                        f"(rejax {f2(rx['interval_s_median'])}): "
                        + ("the env steps each default needs are its hyper-parameters' (at equal hyper-parameters "
                           "the two medians lie within each other's range over seeds), and the seconds that remain "
                           "between the two at equal hyper-parameters are the runtimes'." if within else
                           "at equal hyper-parameters the env steps still differ beyond the range over seeds (the "
                           "implementations differ: see the runner scripts)."))
        for o in (tj, tj_rx):
            if o and np.isfinite(o["tail_compile_window_s_median"]) and np.isfinite(o["interval_s_tail_median"]):
                text.append(f"{o['system']}: while the last chunk compiles in the background "
                            f"({o['tail_compile_start_s_median']:.1f} s to "
                            f"{o['tail_compile_start_s_median'] + o['tail_compile_window_s_median']:.1f} s after "
                            f"the process started, overlapping {o['intervals_tail_median']:.0f} intervals), an "
                            f"interval takes {f2(o['interval_s_tail_median'])} s against "
                            f"{f2(o['interval_s_no_tail_median'])} s outside that window; rejax compiles its one "
                            "program before training starts.")
        out += ["", " ".join(text), ""]
    return out


def _side_by_side(os_: list[dict[str, Any]]) -> list[str]:
    """A table of ``results.csv`` rows: time and env steps to the threshold, return at the end of the
    budget (and the last evaluation, which capped runs also have), the split of the time into the time to
    the first evaluation and the later intervals, gradient updates per second, start-up and compilation."""
    f1 = lambda v: f"{v:.1f}" if np.isfinite(v) else "-"  # noqa: E731
    out = ["| system | status | train wall s to threshold | env steps to threshold | return at end | last eval "
           "return | to first eval (s) | s per interval | gradient updates / s | start-up s | "
           "compilation s | load 1m |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for o in os_:
        out.append(f"| {o['system']} | {o['status']} | {fmt_range(o, 'train_wall_s_to_threshold', '{:.1f}')} | "
                   f"{fmt_range(o, 'steps_to_threshold', '{:,.0f}')} | {fmt_range(o, 'final_eval_return', '{:.0f}')} | "
                   f"{fmt_range(o, 'last_eval_return', '{:.0f}')} | {fmt_range(o, 'first_eval_train_s', '{:.1f}')} | "
                   f"{fmt_range(o, 'interval_s', '{:.2f}')} | {fmt_range(o, 'grad_updates_per_s', '{:,.0f}')} | "
                   f"{f1(o['startup_s_median'])} | {f1(o['compile_s_median'])} | {fmt_range(o, 'loadavg_1m', '{:.1f}')} |")
    return out


def sac_lines(rows: list[Row], results: list[dict[str, Any]], profile_dir: Path) -> list[str]:
    """``summary.md``'s section on SAC: tianji_jax against rejax on each row with both measured (start-up
    and compilation of tianji_jax from its ``--profile`` run of seed 0, when there is one)."""
    out = []
    f1 = lambda v: f"{v:.1f}" if np.isfinite(v) else "-"  # noqa: E731
    for row in rows:
        sac = {o["system"]: o for o in results if o["env"] == row.name and o["algo"] == "sac" and o["seeds"]}
        tj, rx = sac.get("tianji_jax SAC anakin"), sac.get("rejax SAC")
        if not (tj and rx):
            continue
        never = lambda v, f: f.format(v) if np.isfinite(v) else "never"  # noqa: E731
        tw, rw = tj["train_wall_s_to_threshold_median"], rx["train_wall_s_to_threshold_median"]
        ts, rs = tj["steps_to_threshold_median"], rx["steps_to_threshold_median"]
        tu, ru = tj["grad_updates_per_s_median"], rx["grad_updates_per_s_median"]
        su, cs = tj["startup_s_median"], math.nan
        path = profile_dir / (run_key(row.name, tj["system"], 0) + ".json")
        if path.is_file() and json.loads(path.read_text()).get("profile"):
            prof = json.loads(path.read_text())["profile"]
            su, cs = prof["startup_s"], prof["timers"].get("compile_s", {}).get("total", math.nan)
        text = [f"Median train wall s to {row.threshold:g}: tianji_jax SAC anakin {never(tw, '{:.1f}')}, rejax SAC "
                f"{never(rw, '{:.1f}')}; env steps {never(ts, '{:,.0f}')} against {never(rs, '{:,.0f}')}; gradient "
                f"updates per second after the first evaluation {never(tu, '{:,.0f}')} against {never(ru, '{:,.0f}')} "
                "(one update per env step in both: SACConfig's replay ratio 1, rejax's num_epochs / num_envs = 1)."]
        if np.isfinite(tw) and np.isfinite(rw):
            faster = "rejax SAC" if rw < tw else "tianji_jax SAC anakin"
            d_first = tj["first_eval_train_s_median"] - rx["first_eval_train_s_median"]
            text.append(f"**{faster}** is faster by {abs(tw - rw):.1f} s (x{max(tw, rw) / min(tw, rw):.2f}). Of "
                        f"tianji_jax's time minus rejax's ({tw - rw:+.1f} s), {d_first:+.1f} s are spent before the "
                        f"first evaluation at {row.eval_every:,} env steps ({tj['first_eval_train_s_median']:.1f} s "
                        f"against {rx['first_eval_train_s_median']:.1f} s; start-up until the algorithm exists "
                        f"{f1(su)} s against {f1(rx['startup_s_median'])} s, compilation {f1(cs)} s (tianji_jax: its "
                        f"`--profile` run of seed 0, jax's compile events in every thread; '-': not profiled) against "
                        f"rejax's ahead-of-time {f1(rx['compile_s_median'])} s) and {(tw - rw) - d_first:+.1f} s after "
                        "it, at "
                        f"{tj['interval_s_median']:.2f} against {rx['interval_s_median']:.2f} train s per "
                        f"{row.eval_every:,}-step interval.")
        text.append("The two run different hyper-parameters, each its own library's: an update of tianji_jax's "
                    "256-256 actor and twin critics costs about 15 times the multiply-adds of rejax's 64-64 ones "
                    "(both batch 256), which sets the gradient updates per second on these CPU cores; rejax's "
                    "tuned learning rate (0.01 against 3e-4) and observation normalization set its env steps.")
        capped = [o["system"] for o in (tj, rx) if "capped" in o["status"]]
        if capped:
            text.append(f"Runs of {', '.join(capped)} were stopped by the wall cap ({row.cap_s:.0f} s) before the "
                        "end of the 50k-step budget: their return at the end is missing and *last eval return* is "
                        "the evaluation before the cap.")
        out += [f"## SAC: tianji_jax against rejax ({row.name})", "",
                f"Medians [min..max] over seeds of the measured runs (threshold {row.threshold:g}; *to first eval* = "
                "train wall s from process start to the first evaluation: start-up, imports, compilation and the "
                f"first {row.eval_every:,} env steps; *s per interval* = train wall s of each later interval; "
                "*gradient updates / s* = env steps between the first and the last evaluation times the updates per "
                "env step, over the train wall s between them; *start-up* = process start to the algorithm's "
                "creation (tianji_jax: to `train()`), *compilation* = rejax's ahead-of-time compilation of its "
                "whole program).", "", *_side_by_side([tj, rx]), "", " ".join(text), ""]
    return out


def distributional_lines(rows: list[Row], results: list[dict[str, Any]]) -> list[str]:
    """``summary.md``'s section on C51 and QR-DQN against plain DQN with the same settings."""
    out = []
    for row in rows:
        by = {o["system"]: o for o in results if o["env"] == row.name and o["seeds"]}
        plain = by.get("tianji_jax DQN anakin dist-plain")
        dist = [by[k] for k in ("tianji_jax C51 anakin", "tianji_jax QR-DQN anakin") if k in by]
        if not (plain and dist):
            continue
        never = lambda v, f: f.format(v) if np.isfinite(v) else "never"  # noqa: E731
        text = []
        for o in dist:
            for key, unit, f in (("steps_to_threshold", "env steps", "{:,.0f}"),
                                 ("train_wall_s_to_threshold", "train wall s", "{:.1f}")):
                m, p = o[key + "_median"], plain[key + "_median"]
                ratio = f" (x{m / p:.2f})" if np.isfinite(m) and np.isfinite(p) else ""
                text.append(f"{o['system']}: {never(m, f)} {unit} to {row.threshold:g} against plain DQN's "
                            f"{never(p, f)}{ratio}.")
            text.append(f"Gradient updates per second {never(o['grad_updates_per_s_median'], '{:,.0f}')} against "
                        f"{never(plain['grad_updates_per_s_median'], '{:,.0f}')}.")
        out += [f"## Distributional DQN against plain DQN ({row.name})", "",
                "C51 and QR-DQN against plain DQN with the same settings (`tests/learning/test_dqn_distributional.py`'s; "
                "the columns as in the SAC section). Medians [min..max] over seeds. Wall seconds depend on the "
                "load of the shared machine (last column): compare them between systems measured at similar loads, "
                "as these three were (interleaved per seed), not with rows measured at another load.", "",
                *_side_by_side([plain, *dist]), "", " ".join(text), ""]
    return out


def profile_lines(profile_dir: Path) -> list[str]:
    """``summary.md``'s table of the profiled tianji_jax runs in ``profile_dir`` (``--profile``)."""
    records = [json.loads(p.read_text()) for p in sorted(profile_dir.glob("*.json"))] if profile_dir.is_dir() else []
    records = [r for r in records if r.get("profile")]
    if not records:
        return []
    lines = ["## Where tianji_jax's time to the threshold goes (`--profile`)", "",
             "One extra run per system and row (the first seed, stopped when the evaluation reaches the threshold) "
             "with `tj.train(..., profile=True)` (a `jax.profiler` trace and per-phase timers, "
             "`tianji_jax/run/profiling.py`); profiling and the checkpoints it writes cost time, so these runs are not "
             "measurements. Seconds of wall clock: *start-up* = interpreter, imports and config before `train()`; "
             "*compilation* = jax's trace + lower + XLA compile events in every thread (they overlap the phases); "
             "*first chunk* includes compiling it; *other* = run setup (trainer, `init`, run directory, env "
             "creation) and host-loop overhead, and for the async runtime the wait for the learner's rows while "
             "actors and learner run in their threads. Async runs only (summed over the rows, from `metrics.csv`): "
             "*learner update s* = seconds the learner spent in its compiled updates, *learner wait* / *actor "
             "wait* = mean fraction of the time the learner waited for data / the actors waited for admission or "
             "params. Files: `profile/*.json`.", "",
             "| run | stopped at (env steps) | process s | start-up s | compilation s | first chunk s | later chunks s "
             "| evaluation s | checkpoints s | other s | learner update s | learner wait | actor wait | load 1m |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in records:
        prof, t = r["profile"], r["profile"]["timers"]
        ph = t.get("phases", {})
        chunk = ph.get("chunk") or {}
        if not chunk.get("count"):  # the async runtime's host loop runs no compiled chunks
            chunk = {}
        fmt = lambda v: f"{v:.1f}" if isinstance(v, (int, float)) and np.isfinite(v) else "-"  # noqa: E731
        pct = lambda v: f"{100 * v:.0f}%" if isinstance(v, (int, float)) and np.isfinite(v) else "-"  # noqa: E731
        rt = t.get("runtime") or {}
        steps = r["evals"][-1]["env_steps"] if r.get("evals") else math.nan
        lines.append(
            f"| {r['env']} / {r['system']} seed {r['seed']} | {steps:,.0f} | {fmt(prof['process_s'])} | "
            f"{fmt(prof['startup_s'])} | {fmt(t.get('compile_s', {}).get('total', math.nan))} | "
            f"{fmt(chunk['first_s']) if chunk else '-'} | {fmt(chunk['total_s'] - chunk['first_s']) if chunk else '-'} | "
            f"{fmt(ph.get('eval', {}).get('total_s', math.nan))} | {fmt(ph.get('checkpoint', {}).get('total_s', math.nan))} | "
            f"{fmt(t.get('other_s', math.nan))} | {fmt(rt.get('update_s', math.nan))} | "
            f"{pct(rt.get('learner_wait_frac_mean', math.nan))} | {pct(rt.get('actor_wait_frac_mean', math.nan))} | "
            f"{fmt((r.get('loadavg_start') or [math.nan])[0])} |")
    return lines + [""]


def plot(rows: list[Row], runs: list[dict[str, Any]], results: list[dict[str, Any]], path: Path) -> None:
    """``convergence.png``: per row, every run's eval return against wall s (evaluation excluded, log
    scale), and the median wall s to threshold per system."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [row for row in rows if any(r["env"] == row.name and r["evals"] for r in runs)]
    fig, axes = plt.subplots(max(1, len(shown)), 2, figsize=(14, 4.5 * max(1, len(shown))), squeeze=False)
    for row, (ax, bx) in zip(shown, axes):
        names = [o["system"] for o in results if o["env"] == row.name and o["seeds"]]
        for i, name in enumerate(names):
            for r in runs:
                if r["env"] == row.name and r["system"] == name and r["evals"]:
                    t = [e["wall_s"] - e["eval_s"] for e in r["evals"]]
                    ax.plot(t, [e["eval_return_mean"] for e in r["evals"]], color=f"C{i % 10}",
                            ls="-" if "tianji" in name else "--", lw=1, alpha=0.8, label=name if r["seed"] == 0 else None)
        ax.axhline(row.threshold, color="k", lw=0.7, ls=":")
        ax.set_xscale("log")
        ax.set_xlabel("wall s from process start, evaluation time excluded (log)")
        ax.set_ylabel("eval return (10 deterministic episodes)")
        ax.set_title(f"{row.name}: every seed", fontsize=9)
        ax.legend(fontsize=7)
        res = [o for o in results if o["env"] == row.name and o["seeds"]]
        med = [o["train_wall_s_to_threshold_median"] for o in res]
        fin = [m if np.isfinite(m) else np.nan for m in med]
        bx.barh(range(len(res)), fin, color=[f"C{i % 10}" for i in range(len(res))])
        for i, m in enumerate(med):
            if not np.isfinite(m):
                bx.text(0.01, i, "never / not reached", va="center", fontsize=7, transform=bx.get_yaxis_transform())
        bx.set_yticks(range(len(res)))
        bx.set_yticklabels([o["system"] for o in res], fontsize=7)
        bx.set_xlabel(f"median wall s to {row.threshold:g} (evaluation excluded)")
        bx.invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv: list[str] | None = None) -> int:
    """Install the peers if needed, run what ``records/`` lacks, write the outputs; returns 0.

    Raises (through argparse, before any work): unknown ``--envs``, ``--seeds < 1``, ``--systems``
    matching nothing."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="tianji_jax only (PPO anakin and relaxed, DQN anakin and sync on CartPole; the "
                             "unsupported DQN anakin LunarLander row), 1 seed, 30k env steps, CartPole threshold 200")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--seed-list", default="", help="comma-separated seeds to run in this invocation "
                        "(default 0..seeds-1); e.g. to run seeds in concurrent invocations on one --out")
    parser.add_argument("--envs", default="CartPole-v1,LunarLander,Pendulum-v1", help="comma-separated rows, in order")
    parser.add_argument("--systems", default="", help="comma-separated substrings; run only the systems whose "
                        "name contains one, or whose name is one given as =NAME (default: all); the outputs still "
                        "cover every system's records")
    parser.add_argument("--cartpole-cap-s", type=float, default=300.0, help="wall cap per CartPole run")
    parser.add_argument("--lunarlander-cap-s", type=float, default=900.0, help="wall cap per LunarLander run")
    parser.add_argument("--pendulum-cap-s", type=float, default=300.0, help="wall cap per Pendulum run")
    parser.add_argument("--cache-dir", type=Path, default=Path.home() / ".cache" / "tianji_jax" / "peers",
                        help="where the peers' virtual environments are created")
    parser.add_argument("--install-timeout-s", type=float, default=1800.0)
    parser.add_argument("--report-only", action="store_true",
                        help="write the outputs from the run records already in --out; run and install nothing")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "convergence")
    parser.add_argument("--warm", action="store_true",
                        help="warm compilation caches: each JAX system writes and reads a persistent cache of its "
                             "own in a fresh directory of this invocation, filled by one unmeasured warm-up run "
                             "(the first seed) per system and row before the measured runs (default: cold, every "
                             "run compiles)")
    parser.add_argument("--profile", action="store_true",
                        help="after the runs, one profiled run (the first seed, stopped at the threshold) of each "
                             "selected tianji_jax system per row, written to OUT/profile/: where its time to the "
                             "threshold goes (profiling costs time: these runs are not measurements)")
    args = parser.parse_args(argv)
    t_start, load_start = time.perf_counter(), C.loadavg()
    discrete = ("ppo", "dqn", "pqn")
    all_rows = {"CartPole-v1": Row("CartPole-v1", 475.0, 10_240, args.cartpole_cap_s, discrete),
                "LunarLander": Row("LunarLander", 200.0, 32_768, args.lunarlander_cap_s, discrete),
                "Pendulum-v1": Row("Pendulum-v1", -250.0, 2_000, args.pendulum_cap_s, ("sac",))}
    names = [e for e in args.envs.split(",") if e]
    unknown = [e for e in names if e not in all_rows]
    if unknown:
        parser.error(f"--envs: unknown {unknown}; allowed: {list(all_rows)}")
    if args.seeds < 1:
        parser.error(f"--seeds must be >= 1, got {args.seeds}")
    rows = [all_rows[e] for e in names]
    systems = TIANJI + PEERS
    extra: dict[str, dict[str, Any]] = {}
    if args.quick:  # threshold 200 on CartPole, so that the small budgets reach it and the ratios are exercised
        args.seeds = 1
        rows = [Row("CartPole-v1", 200.0, 10_240, args.cartpole_cap_s, discrete), all_rows["LunarLander"]]
        systems = [s for s in TIANJI if s.name in QUICK]
        extra = {"ppo": {"total_env_steps": 30_720}, "dqn": {"total_env_steps": 30_000}}
    reported = systems  # the outputs cover these (and the rows of --envs), whatever --systems runs
    if args.systems:
        keep = [k for k in args.systems.split(",") if k]
        systems = [s for s in systems if any(s.name == k[1:] if k.startswith("=") else k in s.name for k in keep)]
        if not systems:
            parser.error(f"--systems {args.systems!r} matches none of {[s.name for s in TIANJI + PEERS]}")
    seeds = [int(k) for k in args.seed_list.split(",") if k] or list(range(args.seeds))
    if any(k < 0 for k in seeds):
        parser.error(f"--seed-list: seeds must be >= 0, got {args.seed_list!r}")
    runs_dir = args.out / "records"  # (not "runs/": the repository's .gitignore ignores run directories)
    runs_dir.mkdir(parents=True, exist_ok=True)
    # per-run scratch (Ray's temp dir): short, outside the repo (Ray's socket paths must stay < 108 bytes)
    tmp_root = Path(tempfile.mkdtemp(prefix="tj-conv-"))

    pythons: dict[str | None, Path | None] = {None: Path(sys.executable)}
    peer_errors: dict[str, str] = {}
    box2d_errors: dict[str, str] = {}
    for name in sorted({s.venv for s in systems if s.venv} if not args.report_only else ()):
        python, err, box_err = ensure_venv(name, args.cache_dir, args.install_timeout_s)
        pythons[name] = python
        if err:
            peer_errors[name] = err
        if box_err:
            box2d_errors[name] = box_err
        print(f"peer {name}: {python or 'SKIPPED: ' + err[:300]}{' (' + box_err[:200] + ')' if box_err else ''}",
              flush=True)

    warm_dir = tmp_root / "xla" if args.warm else None
    for row in rows:
        if warm_dir is not None and not args.report_only:
            warm_up(args, row, systems, seeds, runs_dir, pythons, extra, tmp_root, warm_dir)
        for seed in seeds:
            for s in systems:
                if quick_skip(args, row, s) or not s.runs_on(row):
                    continue
                path = runs_dir / (run_key(row.name, s.name, seed) + ".json")
                if path.exists() or args.report_only:
                    continue
                base = {"env": row.name, "system": s.name, "algo": s.algo, "mode": s.mode, "seed": seed,
                        "threshold": row.threshold, "eval_every": row.eval_every, "cap_s": row.cap_s, "evals": [],
                        "info": {}}
                if s.venv and pythons[s.venv] is None:
                    record = {**base, "status": "skipped", "reason": f"installation failed: {peer_errors[s.venv]}"}
                elif s.venv and row.name == "LunarLander" and s.venv in box2d_errors:
                    record = {**base, "status": "skipped", "reason": box2d_errors[s.venv]}
                else:
                    record = run_fresh(s, row, seed, pythons[s.venv], extra.get(s.algo, {}), tmp_root, warm_dir)
                record["command"] = C.command()
                path.write_text(json.dumps(record, indent=1, default=str) + "\n")
                r = summarize_run(record)
                print(f"{row.name} seed {seed} {s.name:24s} {record['status']:11s} to {row.threshold:g}: "
                      f"{r['steps_to_threshold']:.0f} steps, {r['train_wall_s_to_threshold']:.1f} s "
                      f"(+eval {r['wall_s_to_threshold']:.1f} s); end return {r['final_eval_return']:.1f}; "
                      f"{record['process_wall_s'] if 'process_wall_s' in record else 0:.0f} s {r['reason'][:200]}",
                      flush=True)
    if args.profile and not args.report_only:
        (args.out / "profile").mkdir(exist_ok=True)
        for row in rows:
            for s in systems:
                path = args.out / "profile" / (run_key(row.name, s.name, seeds[0]) + ".json")
                if not s.is_tianji or not s.runs_on(row) or quick_skip(args, row, s) or path.exists():
                    continue
                record = run_fresh(s, row, seeds[0], pythons[None], {**extra.get(s.algo, {}), "profile": True,
                                                                     "threshold": row.threshold}, tmp_root)
                if record["status"] == "unsupported":
                    continue
                record["command"] = C.command()
                path.write_text(json.dumps(record, indent=1, default=str) + "\n")
                print(f"{row.name} {s.name:24s} profiled: {record['status']}", flush=True)
    shutil.rmtree(tmp_root, ignore_errors=True)
    write_outputs(args, rows, reported, runs_dir, peer_errors, load_start, time.perf_counter() - t_start)
    return 0


def warm_up(args, row: Row, systems, seeds, runs_dir: Path, pythons, extra, tmp_root: Path, warm_dir: Path) -> None:
    """``--warm``: one unmeasured run (the first seed) of every system of ``row`` that still has a
    measured run to make, filling its persistent compilation cache in ``warm_dir``; each warm-up's
    record goes to ``OUT/warmup/`` (for its compile seconds), never into the results."""
    (args.out / "warmup").mkdir(exist_ok=True)
    for s in systems:
        missing = [k for k in seeds if not (runs_dir / (run_key(row.name, s.name, k) + ".json")).exists()]
        if quick_skip(args, row, s) or not s.runs_on(row) or not missing or (s.venv and pythons[s.venv] is None):
            continue
        record = run_fresh(s, row, seeds[0], pythons[s.venv], extra.get(s.algo, {}), tmp_root, warm_dir)
        record["command"] = C.command()
        (args.out / "warmup" / (run_key(row.name, s.name, seeds[0]) + ".json")).write_text(
            json.dumps(record, indent=1, default=str) + "\n")
        print(f"{row.name} {s.name:24s} warm-up run: {record['status']} in {record.get('process_wall_s', 0):.0f} s",
              flush=True)


QUICK = ("tianji_jax PPO anakin", "tianji_jax PPO relaxed", "tianji_jax DQN anakin", "tianji_jax DQN sync")


def quick_skip(args, row: Row, s: System) -> bool:
    """--quick runs CartPole for its systems and, on LunarLander, only the unsupported DQN anakin row."""
    return args.quick and row.name == "LunarLander" and s.name != "tianji_jax DQN anakin"


def write_outputs(args, rows, systems, runs_dir: Path, peer_errors, load_start, wall_s: float) -> None:
    """Everything under ``args.out`` from the run records in ``runs_dir`` (those of ``systems`` and ``rows``)."""
    wanted = {(row.name, s.name) for row in rows for s in systems}
    records = [json.loads(p.read_text()) for p in sorted(runs_dir.glob("*.json"))]
    records = [r for r in records if (r["env"], r["system"]) in wanted]
    order = {(row.name, s.name): i for i, (row, s) in enumerate((row, s) for row in rows for s in systems)}
    records.sort(key=lambda r: (order[(r["env"], r["system"])], r["seed"]))
    runs = []
    for rec in records:
        line = summarize_run(rec)
        line["loadavg_1m"] = (rec.get("loadavg_start") or [math.nan])[0]
        runs.append(line)
    results = aggregate(runs, systems, rows)
    C.write_csv(runs, args.out / "runs.csv")
    C.write_csv([{"env": r["env"], "system": r["system"], "seed": r["seed"], **e} for r in records for e in r["evals"]],
                args.out / "curves.csv")
    C.write_csv(results, args.out / "results.csv")
    commands = sorted({r.get("command", "python experiments/convergence.py") for r in records})
    summary = make_summary(args, rows, systems, results, runs, peer_errors, load_start, wall_s, commands)
    (args.out / "summary.md").write_text(summary)
    versions = {}
    for r in records:
        versions.setdefault(r["system"].split()[0], r.get("info", {}).get("versions"))
    C.write_machine(args.out, {"loadavg_start": load_start, "wall_s": wall_s, "peer_versions": versions,
                               "peer_install_errors": peer_errors, "cache_dir": str(args.cache_dir),
                               "systems_run": args.systems or "all", "compilation_cache": "warm" if args.warm else "cold",
                               "sizes": {"seeds": args.seeds, "rows": [r.__dict__ for r in rows],
                                         "systems": [s.name for s in systems]}})
    plot(rows, records, results, args.out / "convergence.png")
    print(summary)


if __name__ == "__main__":
    sys.exit(main())
