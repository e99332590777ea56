"""PPO on MuJoCo (envpool HalfCheetah-v4, Hopper-v4): tianji_jax with and without normalisation against
CleanRL's reported returns and Stable-Baselines3 PPO run here side by side.

Systems (every run a fresh process, ``convergence.run_one``; tianji_jax's persistent compilation cache off):

* ``tianji_jax PPO norm``: CleanRL's ``ppo_continuous_action.py`` hyper-parameters in ``tj.PPOConfig``
  fields: 1 env x 2048 steps, 10 epochs x 32 minibatches (64 samples), Adam 3e-4 annealed linearly to 0,
  gamma 0.99, GAE lambda 0.95, clip 0.2 with value clipping, no entropy bonus, value coefficient 0.5,
  global-norm clip 0.5, separate 64-64 tanh actor and critic (orthogonal init, state-independent log-std),
  actions clipped to the Box bounds (``|clip_action``), observations normalised by running statistics
  (clip 10) and rewards scaled by the running std of the discounted return (clip 10):
  ``normalize_observations=True, scale_rewards=True``. On the async runtime with ``schedule='sync'``
  (the actor's rollout k uses the params after update k-1, as CleanRL's loop), envpool ``HalfCheetah-v4``
  / ``Hopper-v4``.
* ``tianji_jax PPO raw``: the same without normalisation and reward scaling.
* ``tianji_jax PPO zoo-hp``: tianji_jax PPO with the SB3 system's hyper-parameters below (the zoo's tuned
  entries: 1 env x 512 steps, 20 / 5 epochs, minibatches of 64 / 32, constant learning rate, 256-256 ReLU,
  ``log_std_init=-2``, normalisation and reward scaling; ``peers/tianji_runner.py`` ``ZOO_PPO``), to tell the
  hyper-parameters' share of the gap to SB3 from the implementations'. One difference remains: SB3's
  ``ortho_init=False`` (torch's default initialisation), which tianji_jax's orthogonal networks do not offer.
* ``SB3 PPO``: Stable-Baselines3 2.9.2 PPO with rl-baselines3-zoo's tuned ``ppo.yml`` entries for
  ``HalfCheetah-v3`` / ``Hopper-v3`` (``VecNormalize`` on observations and rewards, 1 env, 256-256 ReLU,
  log-std init -2; ``peers/sb3_runner.py``) on gymnasium's ``HalfCheetah-v4`` / ``Hopper-v4``, one torch
  thread, in its own venv (installed by this script, with gymnasium's MuJoCo envs).

CleanRL's docs (``docs/rl-algorithms/ppo.md``, "Experiment results", openrlbenchmark tag ``pr-424``) report
for ``ppo_continuous_action.py`` at 1M steps: HalfCheetah-v4 1442.64 +- 46.03, Hopper-v4 2382.86 +- 271.74
(mean +- std over seeds of the average episodic return of the training episodes at the end, stochastic
policy). This experiment evaluates deterministic policies (``--eval-episodes`` episodes on a separate env,
every ``--eval-every`` env steps; SB3's evaluation env shares the training env's frozen statistics), so the
CleanRL row is a reference, not a run here.

Runs are interleaved seed by seed and env by env (the shared machine's load affects all alike), written to
``records/<env>__<system>__seed<k>.json`` as each ends and skipped on a rerun: the experiment is resumable per
(env, system, seed); delete a file to redo a run.

    python experiments/ppo_mujoco.py                       # 1M env steps, 3 seeds, both envs, three systems
    python experiments/ppo_mujoco.py --envs HalfCheetah --budget 300000
    python experiments/ppo_mujoco.py --quick               # tianji_jax only, 1 seed, 4,096 env steps (tests)
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import _common as C  # noqa: E402
import convergence as CV  # noqa: E402
import sac_halfcheetah as SH  # noqa: E402  (SB3's venv with gymnasium's MuJoCo envs)

ENVS = ("HalfCheetah", "Hopper")
NORM = CV.System("tianji_jax PPO norm", "ppo", "tianji_runner.py", mode="sync", envs=ENVS, hp="cleanrl")
RAW = CV.System("tianji_jax PPO raw", "ppo", "tianji_runner.py", mode="sync", envs=ENVS, hp="cleanrl-raw")
SB3 = CV.System("SB3 PPO", "ppo", "sb3_runner.py", "sb3", envs=ENVS)
ZOO = CV.System("tianji_jax PPO zoo-hp", "ppo", "tianji_runner.py", mode="sync", envs=ENVS, hp="sb3")
SYSTEMS = (NORM, RAW, SB3, ZOO)
# CleanRL's reported returns at 1M env steps (see the module docstring): (mean, std over seeds)
CLEANRL = {"HalfCheetah": (1442.64, 46.03), "Hopper": (2382.86, 271.74)}


def run_line(rec: dict[str, Any]) -> dict[str, Any]:
    """One results.csv row: the run's final and best evaluation, wall seconds and env steps per second."""
    r = CV.summarize_run(rec)
    keep = ("system", "seed", "status", "budget_env_steps", "last_eval_env_steps", "final_eval_return",
            "best_eval_return", "first_eval_wall_s", "train_env_sps", "eval_s_total", "process_wall_s", "reason")
    out = {"env": rec["env"], **{k: r[k] for k in keep}}
    la, lb = rec.get("loadavg_start") or [math.nan], rec.get("loadavg_end") or [math.nan]
    out.update(loadavg_1m_start=la[0], loadavg_1m_end=lb[0])
    return out


def return_at(rec: dict[str, Any], steps: int, slack: int = 0) -> float:
    """The run's evaluation return at the last evaluation at or before ``steps + slack`` env steps (NaN:
    none). ``slack`` absorbs the systems' different rollout lengths (tianji_jax evaluates at the end of the
    2048-step rollout that crosses a cadence mark, SB3 on its own 512-step grid)."""
    vals = [e["eval_return_mean"] for e in rec["evals"] if e["env_steps"] <= steps + slack]
    return float(vals[-1]) if vals else math.nan


def make_summary(args, records: list[dict[str, Any]], commands: list[str], wall_s: float) -> str:
    systems = [s for s in SYSTEMS if any(r["system"] == s.name for r in records)]
    measured = [r for r in records if r["status"] in ("done", "capped")]
    out = ["# PPO on MuJoCo: tianji_jax (with and without normalisation) against CleanRL and SB3", "",
           "Command: " + ", ".join(f"`{c}`" for c in commands if c), "",
           C.SHARED_NOTE, "",
           f"Budget **{args.budget:,} env steps** per run (1 env); evaluation every {args.eval_every:,} env steps, "
           f"{args.eval_episodes} deterministic episodes on a separate env (not counted in the budget). Median "
           "[min..max] over seeds. Hyper-parameters and what each system is: `experiments/ppo_mujoco.py`'s "
           "docstring. CleanRL's row is its documented result at 1M steps (average training-episode return, "
           "stochastic policy), not a run here.", ""]
    for env in args.envs:
        rs = [r for r in measured if r["env"] == env]
        grid = list(range(args.eval_every, args.budget + 1, args.eval_every)) if rs else []
        out += [f"## {env}-v4", "", "| system | seeds | final eval return | best eval return | train env steps/s "
                "| process wall s | load 1m start |", "|---|---|---|---|---|---|---|"]
        for s in systems:
            lines = [run_line(r) for r in rs if r["system"] == s.name]
            if not lines:
                out.append(f"| {s.name} | 0 | not run | | | | |")
                continue
            f = lambda k, fmt: C.median_range([ln[k] for ln in lines], fmt)  # noqa: E731
            out.append(f"| {s.name} | {len(lines)} | {f('final_eval_return', '{:.0f}')} | "
                       f"{f('best_eval_return', '{:.0f}')} | {f('train_env_sps', '{:.0f}')} | "
                       f"{f('process_wall_s', '{:.0f}')} | {f('loadavg_1m_start', '{:.1f}')} |")
        mean, std = CLEANRL[env]
        out += [f"| CleanRL ppo_continuous_action (reported, 1M steps) | - | {mean:.0f} +- {std:.0f} | | | | |", ""]
        if grid:
            names = [s.name for s in systems if any(r["system"] == s.name for r in rs)]
            out += [f"Evaluation return at equal env steps (the last evaluation within {args.eval_every // 50:,} steps past "
                    "the mark; median [min..max] over seeds):", "",
                    "| env steps | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
            for st in grid:
                vals = [C.median_range([return_at(r, st, args.eval_every // 50) for r in rs if r["system"] == n], "{:.0f}") for n in names]
                out.append(f"| {st:,} | " + " | ".join(vals) + " |")
            out.append("")
    other = [r for r in records if r["status"] not in ("done",)]
    out += [f"- {r['env']} {r['system']} seed {r['seed']}: **{r['status']}** {r.get('reason', '')[:300]}" for r in other]
    short = [f"{env} {s.name}" for env in args.envs for s in systems if s.name in args.systems
             if sum(r["env"] == env and r["system"] == s.name for r in measured) < args.seeds]
    if short:
        out += ["", f"**Partial**: fewer than {args.seeds} seeds for {', '.join(short)} (resume with the same "
                "command; finished runs are kept).", ""]
    if not args.report_only:
        out.append(f"Total wall of the last invocation {wall_s:.0f} s.")
    return "\n".join(out) + "\n"


def plot(records: list[dict[str, Any]], args) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(args.envs), figsize=(6 * len(args.envs), 4.2), squeeze=False)
    for ax, env in zip(axes[0], args.envs):
        for i, s in enumerate(SYSTEMS):
            runs = [r for r in records if r["env"] == env and r["system"] == s.name and r["evals"]]
            for j, r in enumerate(runs):
                ax.plot([e["env_steps"] for e in r["evals"]], [e["eval_return_mean"] for e in r["evals"]],
                        color=f"C{i}", lw=1, alpha=0.8, label=s.name if j == 0 else None)
        mean, std = CLEANRL[env]
        ax.axhspan(mean - std, mean + std, color="k", alpha=0.12, label="CleanRL reported at 1M (+- std)")
        ax.set_title(f"{env}-v4", fontsize=9)
        ax.set_xlabel("env steps")
        ax.set_ylabel(f"eval return ({args.eval_episodes} deterministic episodes)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(args.out / "returns.png", dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="tianji_jax only, 1 seed, 4,096 env steps (tests)")
    parser.add_argument("--envs", nargs="+", choices=ENVS, default=list(ENVS))
    parser.add_argument("--systems", nargs="+", choices=[s.name for s in SYSTEMS], default=[s.name for s in SYSTEMS])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--budget", type=int, default=1_000_000, help="env steps per run")
    parser.add_argument("--eval-every", type=int, default=100_000)
    parser.add_argument("--eval-episodes", type=int, default=5)
    parser.add_argument("--cap-s", type=float, default=7200.0, help="wall cap per run (evaluations so far kept)")
    parser.add_argument("--cache-dir", type=Path, default=Path.home() / ".cache" / "tianji_jax" / "peers")
    parser.add_argument("--install-timeout-s", type=float, default=1800.0)
    parser.add_argument("--report-only", action="store_true", help="only rebuild the outputs from records/")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "ppo_mujoco")
    args = parser.parse_args(argv)
    systems = [s for s in SYSTEMS if s.name in args.systems]
    if args.quick:
        args.seeds, args.budget, args.eval_every, args.eval_episodes = 1, 4_096, 2_048, 1
        args.envs, args.systems, systems = ["HalfCheetah"], [NORM.name], [NORM]
    t_start, load_start = time.perf_counter(), C.loadavg()
    records_dir = args.out / "records"
    records_dir.mkdir(parents=True, exist_ok=True)
    pythons: dict[str, Path | None] = {n: Path(sys.executable) for n in (NORM.name, RAW.name, ZOO.name)}
    errors: dict[str, str] = {}
    if SB3 in systems and not args.report_only:
        pythons[SB3.name], err = SH.ensure_sb3(args.cache_dir, args.install_timeout_s)
        if err:
            errors[SB3.name] = err
            print(f"SB3 skipped: {err[:500]}", flush=True)
    extra = {"eval_episodes": args.eval_episodes, "total_env_steps": args.budget, "threads": 1}
    tmp_root = Path(tempfile.mkdtemp(prefix="tj-ppo-mujoco-"))
    for seed in range(args.seeds):
        for env in args.envs:
            row = CV.Row(env, math.inf, args.eval_every, args.cap_s, ("ppo",))
            for s in systems:
                path = records_dir / f"{env}__{s.name.replace(' ', '_')}__seed{seed}.json"
                if path.exists() or args.report_only:
                    continue
                if pythons.get(s.name) is None:
                    rec = {"env": env, "system": s.name, "algo": "ppo", "seed": seed, "status": "skipped",
                           "reason": errors.get(s.name, ""), "evals": [], "info": {}}
                else:
                    tmp = tmp_root / "run"
                    shutil.rmtree(tmp, ignore_errors=True)
                    tmp.mkdir(parents=True)
                    load = C.loadavg()
                    rec = CV.run_one(s, row, seed, pythons[s.name], extra, tmp)
                    rec.update(loadavg_start=load, loadavg_end=C.loadavg())
                    shutil.rmtree(tmp, ignore_errors=True)
                rec.update(command=C.command(), budget=args.budget)
                path.write_text(json.dumps(rec, indent=1, default=str) + "\n")
                ln = run_line(rec) if rec["status"] != "skipped" else {}
                print(f"{env} seed {seed} {s.name}: {rec['status']} final {ln.get('final_eval_return', math.nan):.0f}, "
                      f"{rec.get('process_wall_s', 0):.0f} s {rec.get('reason', '')[:300]}", flush=True)
    shutil.rmtree(tmp_root, ignore_errors=True)
    records = [json.loads(p.read_text()) for p in sorted(records_dir.glob("*.json"))]
    # the outputs hold every system with records (a --systems run that fills some cells keeps the others)
    records = [r for r in records if r["env"] in args.envs and r["system"] in [s.name for s in SYSTEMS]]
    measured = [r for r in records if r["status"] in ("done", "capped")]
    C.write_csv([run_line(r) for r in measured], args.out / "results.csv")
    C.write_csv([{"env": r["env"], "system": r["system"], "seed": r["seed"], **e} for r in measured for e in r["evals"]],
                args.out / "curves.csv")
    summary = make_summary(args, records, sorted({r.get("command", "") for r in records}),
                           time.perf_counter() - t_start)
    (args.out / "summary.md").write_text(summary)
    C.write_machine(args.out, {"loadavg_start": load_start, "errors": errors,
                               "sizes": {k: getattr(args, k) for k in ("seeds", "budget", "eval_every", "eval_episodes",
                                                                       "cap_s")}})
    plot(measured, args)
    print(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
