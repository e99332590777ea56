"""tianji_jax SAC against Stable-Baselines3 SAC on HalfCheetah-v4, at equal env steps and hyper-parameters.

Both systems run SB3 SAC's defaults (1 env, one gradient update of batch 256 per env step, Adam 3e-4 for
actor, critics and temperature, gamma 0.99, tau 0.005 every update, MLP 256-256 relu, temperature learned
from 1.0 towards -|A| = -6, 1-step targets, no gradient clipping, a buffer larger than the budget) with one
``learning_starts`` for both (``--learning-starts``, default 1000: SB3's default is 100, rl-baselines3-zoo's
HalfCheetah entry 10000, which would leave little of this budget). tianji_jax: ``tj.SACConfig`` on envpool
``HalfCheetah-v4`` on the async runtime with ``schedule='sync'`` (the actor acts env step k with the params
after update k-1, as SB3's ``train_freq=1, gradient_steps=1`` loop; actor on cpu:0, learner on cpu:1);
SB3 2.9.2 (torch 2.13.0 CPU, ``torch.set_num_threads(1)``: measured before this run on the shared 2 cores
at a load average of 7 to 9, SB3 SAC made 12-15 updates/s with 1 torch thread and under 1 update/s with 2,
the machine's core count: torch's second intra-op thread spins for a core the neighbours hold; ``--threads``)
on gymnasium ``HalfCheetah-v4``
(``gymnasium[mujoco]``; obs 17, action 6, 1000-step episodes, as envpool's v4). Every run is a fresh
process (``convergence.run_one``: start-up, imports and compilation count in the wall time; tianji_jax's
persistent compilation cache is off). Every ``--eval-every`` env steps, ``--eval-episodes`` deterministic
episodes on a separate env; each runner times its evaluations and they are subtracted from the wall time.

Runs are interleaved seed by seed (tianji seed 0, SB3 seed 0, tianji seed 1, ...) so that the shared
machine's load affects both alike; each run is written to ``records/<system>__seed<k>.json`` as it ends
and skipped on a rerun (resumable; delete a file to redo a run).

    python experiments/sac_halfcheetah.py            # full: 3 seeds each, 5k env steps, installs SB3's venv
    python experiments/sac_halfcheetah.py --quick    # tianji_jax only, 1 seed, 1.5k env steps (tests)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
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

ENV = "HalfCheetah"
TIANJI = CV.System("tianji_jax SAC sync", "sac", "tianji_runner.py", mode="sync", envs=(ENV,))
SB3 = CV.System("SB3 SAC", "sac", "sb3_runner.py", "sb3", envs=(ENV,))
# gymnasium's MuJoCo envs for the SB3 venv (this benchmark only; the pins are what installs here)
MUJOCO = {"steps": [["gymnasium[mujoco]==1.4.0", "mujoco==3.14.0"]],
          "check": "import gymnasium as g; e = g.make('HalfCheetah-v4'); "
                   "assert e.observation_space.shape == (17,) and e.action_space.shape == (6,) "
                   "and e.spec.max_episode_steps == 1000"}


def ensure_sb3(cache_dir: Path, timeout: float) -> tuple[Path | None, str]:
    """SB3's venv (``convergence.ensure_venv``) with gymnasium's MuJoCo envs added; (python, error)."""
    python, err, _ = CV.ensure_venv("sb3", cache_dir, timeout)
    if python is None:
        return None, err
    ok, out = CV._run_ok([str(python), "-W", "ignore", "-c", MUJOCO["check"]], 300)
    if not ok:
        for step in MUJOCO["steps"]:
            ok, out = CV._run_ok([str(python), "-m", "pip", "install", "-q", *step], timeout)
        ok, out = CV._run_ok([str(python), "-W", "ignore", "-c", MUJOCO["check"]], 300) if ok else (ok, out)
    return (python, "") if ok else (None, f"gymnasium[mujoco]: {CV._tail(out)}")


def timer_stats(rec: dict[str, Any]) -> dict[str, float]:
    """Seconds per gradient update and per env step (acting) from the runner's phase timers, after the
    first evaluation (tianji_jax: metrics.csv rows after the first, which holds the compilation; SB3: the
    whole run, its acting time less its evaluations, which run inside SB3's rollout collection)."""
    t = (rec.get("done") or {}).get("timers")
    nan = {"update_ms": math.nan, "act_ms_per_step": math.nan, "h2d_ms_per_step": math.nan, "learner_wait_frac": math.nan}
    if not t:
        return nan
    if "env_steps" in t:  # tianji_jax: per-row sums of metrics.csv
        steps = np.asarray(t["env_steps"], float)
        upd = np.asarray([v if v is not None else np.nan for v in t["update_s"]], float)
        roll = np.asarray([v if v is not None else np.nan for v in t["rollout_s"]], float)
        wait = np.asarray([v if v is not None else np.nan for v in t["learner_wait_frac"]], float)
        h2d = np.asarray([v if v is not None else np.nan for v in t["h2d_s"]], float)
        if len(steps) < 2:
            return nan
        n = steps[-1] - steps[0]  # updates = env steps after learning started (replay ratio 1)
        return {"update_ms": 1e3 * np.nansum(upd[1:]) / n, "act_ms_per_step": 1e3 * np.nansum(roll[1:]) / n,
                "h2d_ms_per_step": 1e3 * np.nansum(h2d[1:]) / n, "learner_wait_frac": float(np.nanmean(wait[1:]))}
    evals = rec.get("evals") or [{}]
    steps = float(rec["done"]["budget_env_steps"])
    return {"update_ms": 1e3 * t["update_s"] / max(1, t["updates"]),
            "act_ms_per_step": 1e3 * (t["rollout_s"] - evals[-1].get("eval_s", 0.0)) / steps,
            "h2d_ms_per_step": 0.0, "learner_wait_frac": math.nan}


def run_line(rec: dict[str, Any]) -> dict[str, Any]:
    r = CV.summarize_run(rec)
    keep = ("system", "seed", "status", "budget_env_steps", "last_eval_env_steps", "final_eval_return",
            "best_eval_return", "steps_to_threshold", "train_wall_s_to_threshold", "wall_s_to_threshold",
            "first_eval_wall_s", "first_eval_train_s", "grad_updates_per_s", "train_env_sps", "eval_s_total",
            "process_wall_s", "reason")
    out = {k: r[k] for k in keep}
    out.update(timer_stats(rec))
    la, lb = rec.get("loadavg_start") or [math.nan], rec.get("loadavg_end") or [math.nan]
    out.update(loadavg_1m_start=la[0], loadavg_1m_end=lb[0])
    return out


def make_summary(args, lines: list[dict[str, Any]], records: list[dict[str, Any]], commands: list[str],
                 wall_s: float) -> str:
    f = lambda key, fmt: lambda rs: C.median_range([r[key] for r in rs], fmt)  # noqa: E731
    cols = [("seeds", lambda rs: str(len(rs))),
            (f"final eval return ({args.budget:,} steps)", f("final_eval_return", "{:.0f}")),
            (f"reached {args.threshold:g}", lambda rs: f"{sum(np.isfinite(r['steps_to_threshold']) for r in rs)}/{len(rs)}"),
            ("env steps to threshold", lambda rs: never(rs, "steps_to_threshold", "{:,.0f}")),
            ("train wall s to threshold", lambda rs: never(rs, "train_wall_s_to_threshold", "{:.0f}")),
            ("gradient updates/s", f("grad_updates_per_s", "{:.1f}")),
            ("ms per update", f("update_ms", "{:.1f}")), ("ms acting per env step", f("act_ms_per_step", "{:.1f}")),
            ("ms transfers per env step", f("h2d_ms_per_step", "{:.1f}")),
            ("first eval at s", f("first_eval_wall_s", "{:.0f}")), ("process s", f("process_wall_s", "{:.0f}")),
            ("load 1m start / end", lambda rs: f"{C.median_range([r['loadavg_1m_start'] for r in rs], '{:.1f}')} / "
                                               f"{C.median_range([r['loadavg_1m_end'] for r in rs], '{:.1f}')}")]
    out = [f"# SAC on HalfCheetah-v4: tianji_jax against Stable-Baselines3 {'(--quick)' if args.quick else ''}", "",
           f"Command: `{C.command()}`" + ("" if commands == [C.command()] else "; the runs were made by "
                                         + ", ".join(f"`{c}`" for c in commands)), "", C.SHARED_NOTE, "",
           f"Budget: **{args.budget:,} env steps** per run, 1 env, learning from {args.learning_starts:,} env steps "
           f"(uniform random actions before), then **one gradient update per env step** for both systems "
           f"({args.budget - args.learning_starts:,} updates). Evaluation every {args.eval_every:,} env steps, "
           f"{args.eval_episodes} deterministic episodes (1000 steps each) on a separate env; threshold "
           f"**{args.threshold:g}**. Median [min..max] over seeds; 'never' when most seeds did not reach it. "
           "Wall seconds from process start (interpreter, imports, compilation included) less evaluation time. "
           "*gradient updates/s*: updates between the first and the last evaluation per train wall second (after "
           "compilation, which tianji_jax does before its first evaluation; acting included, evaluation excluded). "
           "*ms per update* / *ms acting per env step*: the runners' phase timers (tianji_jax: `metrics.csv`'s "
           "`update_s` / `rollout_s` after its first row; SB3: `SAC.train` / `collect_rollouts` less evaluations). "
           f"Runs interleaved seed by seed; wall cap {args.cap_s:.0f} s per run. "
           + ("When several commands made the runs (above), they ran partly at the same time, each on its own "
              "seeds (both systems of a seed in one of them), to fit the session; the load columns say under what "
              "load each ran. " if len(commands) > 1 else "")
           + ("" if args.report_only else f"This invocation: {wall_s:.0f} s."), "",
           "Hyper-parameters (both): SB3 SAC's defaults: Adam 3e-4 (actor, critics, temperature), batch 256, gamma "
           "0.99, tau 0.005 every update, MLP 256-256 relu, temperature learned from 1.0 towards -6, 1-step targets, "
           f"buffer 1M, no gradient clipping (tianji_jax `max_grad_norm=1e6`), learning_starts {args.learning_starts:,} "
           "(SB3's default 100, the zoo's 10,000 for HalfCheetah). tianji_jax: `tj.SACConfig(env='envpool:HalfCheetah-v4', "
           "runtime='async', schedule='sync', num_envs=1, num_steps=1, replay_ratio=1)` (act step k with the params "
           "after update k-1, as SB3; actor on cpu:0, learner on cpu:1). SB3 2.9.2 / torch 2.13.0 CPU with "
           f"{args.threads} torch thread(s) (measured before the run at a load average of 7 to 9 on these 2 cores: "
           "SB3 SAC made 12-15 updates/s with 1 thread and under 1 update/s with 2 = the core count, torch's second "
           "intra-op thread spinning for a core the neighbours hold), gymnasium `HalfCheetah-v4` (mujoco 3.14). "
           "Implementation details differ (e.g. the actor's log-std bounds; SB3 clamps log-std to [-20, 2]).", "",
           "| system | " + " | ".join(c for c, _ in cols) + " |", "|---" * (len(cols) + 1) + "|"]
    systems = [s.name for s in (TIANJI, SB3) if any(r["system"] == s.name for r in lines)]
    for name in systems:
        rs = [r for r in lines if r["system"] == name and r["status"] in ("done", "capped")]
        if rs:
            out.append(f"| {name} | " + " | ".join(fn(rs) for _, fn in cols) + " |")
    out += [""] + [f"- {r['system']} seed {r['seed']}: **{r['status']}** {r['reason'][:300]}" for r in lines
                   if r["status"] not in ("done",)]
    out += ["", "Return at equal env steps (median over seeds of each evaluation):", "",
            "| env steps | " + " | ".join(systems) + " |", "|---" * (len(systems) + 1) + "|"]
    grid = sorted({e["env_steps"] for r in records for e in r["evals"]})
    for s in grid:
        vals = [C.median_range([e["eval_return_mean"] for r in records if r["system"] == n for e in r["evals"]
                                if e["env_steps"] == s], "{:.0f}") for n in systems]
        out.append(f"| {s:,} | " + " | ".join(vals) + " |")
    out += ["", *speed_lines(lines), ""]
    short = [n for n in systems if sum(r["system"] == n for r in lines) < args.seeds]
    if short:
        out += [f"**Partial**: fewer than {args.seeds} seeds for {', '.join(short)} (resume with the same command).", ""]
    return "\n".join(out)


def never(rs, key: str, fmt: str) -> str:
    v = [r[key] if np.isfinite(r[key]) else math.inf for r in rs]
    m = float(np.median(v))
    return "never" if not np.isfinite(m) else C.median_range([x for x in v if np.isfinite(x)], fmt)


def speed_lines(lines: list[dict[str, Any]]) -> list[str]:
    """Which system makes more gradient updates per second, and where the time goes (the phase timers)."""
    keys = ("grad_updates_per_s", "update_ms", "act_ms_per_step", "h2d_ms_per_step", "learner_wait_frac")
    med = {n: {k: C.median(r[k] for r in lines if r["system"] == n and r["status"] in ("done", "capped")) for k in keys}
           for n in (TIANJI.name, SB3.name)}
    t, s = med[TIANJI.name], med[SB3.name]
    if not (np.isfinite(t["grad_updates_per_s"]) and np.isfinite(s["grad_updates_per_s"])):
        return ["Speed: one system has no measured run, no comparison."]
    fast, slow = (TIANJI.name, SB3.name) if t["grad_updates_per_s"] > s["grad_updates_per_s"] else (SB3.name, TIANJI.name)
    ratio = med[fast]["grad_updates_per_s"] / med[slow]["grad_updates_per_s"]
    tsum = t["update_ms"] + t["act_ms_per_step"] + t["h2d_ms_per_step"]
    ssum = s["update_ms"] + s["act_ms_per_step"]
    diffs = {"the update": t["update_ms"] - s["update_ms"], "acting": t["act_ms_per_step"] - s["act_ms_per_step"],
             "tianji_jax's transfers (h2d)": t["h2d_ms_per_step"]}
    main_diff = max(diffs, key=lambda k: abs(diffs[k]))
    return ["## Which is faster, and why (profile)", "",
            f"**{fast}** makes {ratio:.2f}x the gradient updates per second of {slow} (medians "
            f"{med[fast]['grad_updates_per_s']:.2f} vs {med[slow]['grad_updates_per_s']:.2f}"
            + ("; within the seeds' spread on this shared machine, read it as a tie" if ratio < 1.15 else "")
            + "). Phase timers, median ms per env step (= per gradient update once learning started): "
            f"tianji_jax {t['update_ms']:.1f} in the learner (replay insert + compiled SAC update) + "
            f"{t['act_ms_per_step']:.1f} acting (policy + envpool step) + {t['h2d_ms_per_step']:.1f} in transfers "
            f"(the new params to the actor device after every update, the transition to the learner's) = {tsum:.1f}, "
            f"the learner waiting for data {100 * t['learner_wait_frac']:.0f}% of the time; SB3 {s['update_ms']:.1f} "
            f"in `SAC.train` (one gradient step) + {s['act_ms_per_step']:.1f} in `collect_rollouts` (evaluations "
            f"excluded) = {ssum:.1f}. The largest difference is in {main_diff} ({diffs[main_diff]:+.1f} ms per step "
            f"for tianji_jax). Both do the same arithmetic per update, about {update_gflop():.2f} GFLOP (the matmuls of "
            "a batch-256 SAC step with 256-256 MLPs: twin critics forward and backward, target critics and actor on the "
            "next observations, actor forward and backward through the critics), i.e. "
            f"{update_gflop() * 1e3 / s['update_ms']:.1f} GFLOP/s for SB3 and "
            f"{update_gflop() * 1e3 / t['update_ms']:.1f} for tianji_jax's learner: each process gets a fraction of a "
            "core at these load averages (table), so the rates measure the machine's share as much as the framework. "
            "tianji_jax's `sync` schedule also serialises acting and learning (lag 0, as SB3) across "
            "its two threads and devices, so it pays the hand-off and the param copy on every step; its `relaxed` "
            "schedule would overlap them (not measured here: it changes which params act)."]


def update_gflop(obs: int = 17, act: int = 6, hidden: int = 256, batch: int = 256) -> float:
    """Matmul GFLOP of one SAC gradient update (2 FLOP per multiply-add; backward = 2x forward)."""
    critic = (obs + act) * hidden + hidden * hidden + hidden  # one Q-network's multiply-adds per sample
    actor = obs * hidden + hidden * hidden + hidden * 2 * act  # mean and log-std heads
    macs = (2 * critic * 3  # twin critics forward + backward (critic loss)
            + 2 * critic + actor  # target critics and the actor on the next observations
            + actor * 3 + 2 * critic * 3)  # actor loss: actor forward + backward, twin critics forward + backward
    return 2 * macs * batch / 1e9


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="tianji_jax only, 1 seed, 1,500 env steps (tests)")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--seed-list", default="", help="comma-separated seeds for this invocation (default "
                        "0..seeds-1), e.g. to run a seed in a second, concurrent invocation on the same --out")
    parser.add_argument("--budget", type=int, default=5_000, help="env steps per run")
    parser.add_argument("--learning-starts", type=int, default=1_000)
    parser.add_argument("--eval-every", type=int, default=1_000)
    parser.add_argument("--eval-episodes", type=int, default=2)
    parser.add_argument("--threshold", type=float, default=500.0)
    parser.add_argument("--cap-s", type=float, default=900.0, help="wall cap per run (evaluations so far kept)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads for SB3 (see the docstring)")
    parser.add_argument("--cache-dir", type=Path, default=Path.home() / ".cache" / "tianji_jax" / "peers")
    parser.add_argument("--install-timeout-s", type=float, default=1800.0)
    parser.add_argument("--report-only", action="store_true", help="only rebuild the outputs from records/")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "sac_halfcheetah")
    args = parser.parse_args(argv)
    systems = [TIANJI, SB3]
    if args.quick:
        args.seeds, args.budget, args.learning_starts, args.eval_every, args.eval_episodes = 1, 1_500, 500, 500, 1
        systems = [TIANJI]
    t_start, load_start = time.perf_counter(), C.loadavg()
    records_dir = args.out / "records"
    records_dir.mkdir(parents=True, exist_ok=True)
    row = CV.Row(ENV, args.threshold, args.eval_every, args.cap_s, ("sac",))
    pythons: dict[str, Path | None] = {TIANJI.name: Path(sys.executable)}
    errors: dict[str, str] = {}
    if SB3 in systems and not args.report_only:
        pythons[SB3.name], err = ensure_sb3(args.cache_dir, args.install_timeout_s)
        if err:
            errors[SB3.name] = err
            print(f"SB3 skipped: {err[:500]}", flush=True)
    extra = {"eval_episodes": args.eval_episodes, "threads": args.threads, "total_env_steps": args.budget,
             "timers": True, "sac": {"learning_starts": args.learning_starts}}
    tmp_root = Path(tempfile.mkdtemp(prefix="tj-sac-"))
    for seed in [int(k) for k in args.seed_list.split(",") if k] or range(args.seeds):
        for s in systems:
            path = records_dir / f"{s.name.replace(' ', '_')}__seed{seed}.json"
            if path.exists() or args.report_only:
                continue
            if pythons.get(s.name) is None:
                rec = {"env": ENV, "system": s.name, "algo": "sac", "seed": seed, "threshold": args.threshold,
                       "status": "skipped", "reason": errors.get(s.name, ""), "evals": [], "info": {}}
            else:
                tmp = tmp_root / "run"
                shutil.rmtree(tmp, ignore_errors=True)
                tmp.mkdir(parents=True)
                load = C.loadavg()
                rec = CV.run_one(s, row, seed, pythons[s.name], extra, tmp)
                rec.update(loadavg_start=load, loadavg_end=C.loadavg())
                shutil.rmtree(tmp, ignore_errors=True)
            rec.update(command=C.command(), budget=args.budget, learning_starts=args.learning_starts)
            path.write_text(json.dumps(rec, indent=1, default=str) + "\n")
            ln = run_line(rec) if rec["status"] != "skipped" else {}
            print(f"seed {seed} {s.name}: {rec['status']} final {ln.get('final_eval_return', math.nan):.0f}, "
                  f"{ln.get('grad_updates_per_s', math.nan):.1f} updates/s, {rec.get('process_wall_s', 0):.0f} s "
                  f"{rec.get('reason', '')[:300]}", flush=True)
    shutil.rmtree(tmp_root, ignore_errors=True)
    write_outputs(args, systems, records_dir, time.perf_counter() - t_start, load_start, errors)
    return 0


def write_outputs(args, systems, records_dir: Path, wall_s: float, load_start, errors) -> None:
    names = [s.name for s in systems]
    records = [json.loads(p.read_text()) for p in sorted(records_dir.glob("*.json"))]
    records = sorted((r for r in records if r["system"] in names), key=lambda r: (names.index(r["system"]), r["seed"]))
    lines = [run_line(r) for r in records if r["status"] != "skipped"]
    lines += [{"system": r["system"], "seed": r["seed"], "status": "skipped", "reason": r["reason"]}
              for r in records if r["status"] == "skipped"]
    measured = [r for r in records if r["status"] != "skipped"]
    C.write_csv(lines, args.out / "results.csv")
    C.write_csv([{"system": r["system"], "seed": r["seed"], **e} for r in measured for e in r["evals"]],
                args.out / "curves.csv")
    commands = sorted({r.get("command", "") for r in records})
    summary = make_summary(args, [ln for ln in lines if ln["status"] != "skipped"] +
                           [ln for ln in lines if ln["status"] == "skipped"], measured, commands, wall_s)
    (args.out / "summary.md").write_text(summary)
    C.write_machine(args.out, {"loadavg_start": load_start, "wall_s": wall_s, "errors": errors,
                               "peer_versions": {r["system"]: r.get("info", {}).get("versions") for r in measured},
                               "sizes": {k: getattr(args, k) for k in ("seeds", "budget", "learning_starts",
                                                                       "eval_every", "eval_episodes", "threshold",
                                                                       "threads", "cap_s")}})
    plot(measured, args)
    print(summary)


def plot(records: list[dict[str, Any]], args) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, name in enumerate((TIANJI.name, SB3.name)):
        for r in (r for r in records if r["system"] == name and r["evals"]):
            ax.plot([e["env_steps"] for e in r["evals"]], [e["eval_return_mean"] for e in r["evals"]], color=f"C{i}",
                    marker="o", lw=1, alpha=0.8, label=name if r["seed"] == min(
                        q["seed"] for q in records if q["system"] == name) else None)
    ax.axhline(args.threshold, color="k", lw=0.7, ls=":")
    ax.set_xlabel("env steps (= gradient updates + learning_starts)")
    ax.set_ylabel(f"eval return ({args.eval_episodes} deterministic episodes)")
    ax.set_title("SAC on HalfCheetah-v4, every seed", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.out / "returns.png", dpi=100)


if __name__ == "__main__":
    sys.exit(main())
