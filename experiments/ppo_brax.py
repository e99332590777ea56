"""PPO on a brax env: tianji_jax against brax's own PPO trainer, env steps and wall seconds to a return threshold.

Env: brax's ``inverted_pendulum`` on the ``positional`` pipeline (cheap to compile on a CPU), episodes of 1000
steps (reward 1 per step alive; a fall ends the episode; the time limit is a truncation). Threshold: a
deterministic evaluation return of **950** (of 1000) over ``--eval-episodes`` episodes. Every run is a fresh
process (``convergence.run_one``; tianji_jax's persistent compilation cache off, so both compile every run)
and stops at its first evaluation at or above the threshold, or at ``--budget`` env steps.

Systems (hyper-parameters in ``peers/brax_runner.py`` and ``peers/tianji_runner.py`` ``BRAX_PPO``):

* ``brax PPO``: brax 0.14.2's ``ppo.train`` with brax's published inverted_pendulum settings and its default
  networks (policy 32x4 swish with a tanh-squashed Gaussian, value 256x5 swish), in its own venv (installed by
  this script: brax 0.14.2 with jax 0.7.2, the newest jax whose API brax 0.14.2's trainer still calls);
* ``brax PPO 64x64-tanh``: the same trainer with tianji_jax's default network sizes (64-64 tanh policy and
  value), which separates the networks' cost from the runtime's;
* ``tianji_jax PPO anakin``: brax's settings in ``PPOConfig`` fields where it has one (2048 envs x 80 steps per
  update = one brax training step, 4 epochs x 32 minibatches, gamma 0.97, lambda 0.95, clip 0.3, entropy 1e-2,
  Adam 3e-4, observation normalisation, no gradient clipping), 64-64 tanh networks, Anakin (one compiled
  program); differences: GAE over the 80-step rollout (brax: within each 5-step unroll), a Gaussian policy with
  actions clipped by the env (brax: tanh-squashed), no constant reward scaling (brax: x10);
* ``tianji_jax PPO sync``: the same on the async runtime with a device actor (``schedule='sync'``: the actor's
  rollout k uses the params after update k-1; actor on ``cpu:0``, learner on ``cpu:1``).

Both evaluate ``--eval-episodes`` deterministic episodes every ``--eval-every`` env steps (brax rounds it to
whole training steps of 163,840 env steps; it also evaluates once before training). Runs are interleaved seed by
seed and written to ``records/<system>__seed<k>.json`` as each ends; a rerun skips finished runs (resumable per
(system, seed); delete a file to redo it).

    python experiments/ppo_brax.py                  # 3 seeds, four systems
    python experiments/ppo_brax.py --quick          # tianji_jax anakin only, 1 seed, a small budget (tests)
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

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import _common as C  # noqa: E402
import convergence as CV  # noqa: E402

ENV = "inverted_pendulum"
THRESHOLD = 950.0
BRAX = CV.System("brax PPO", "ppo", "brax_runner.py", "brax", hp="brax")
BRAX64 = CV.System("brax PPO 64x64-tanh", "ppo", "brax_runner.py", "brax", hp="64x64-tanh")
TJ = CV.System("tianji_jax PPO anakin", "ppo", "tianji_runner.py", mode="anakin", hp="brax")
TJ_SYNC = CV.System("tianji_jax PPO sync", "ppo", "tianji_runner.py", mode="sync", hp="brax")
SYSTEMS = (BRAX, BRAX64, TJ, TJ_SYNC)
ASYNC = (TJ_SYNC.name,)
"""Systems whose evaluations run beside training (the async runtime's host loop evaluates while the learner
and actor threads go on), so their 'train wall' and training rate are not reported."""
COLUMNS = ("steps_to_threshold", "wall_s_to_threshold", "train_wall_s_to_threshold", "first_eval_wall_s",
           "train_env_sps", "eval_s_total")


def run_line(rec: dict[str, Any]) -> dict[str, Any]:
    """One results.csv row: steps and wall seconds to the threshold, start-up, training rate, load."""
    r = CV.summarize_run(rec)
    out = {k: r[k] for k in ("system", "seed", "status", "best_eval_return", "last_eval_env_steps", *COLUMNS)}
    la, lb = rec.get("loadavg_start") or [math.nan], rec.get("loadavg_end") or [math.nan]
    out.update(loadavg_1m_start=la[0], loadavg_1m_end=lb[0], reason=r["reason"])
    if rec["system"] in ASYNC:  # its evaluations overlap training: wall less evaluation is no training time
        out.update(train_wall_s_to_threshold=math.nan, train_env_sps=math.nan)
    return out


def make_summary(args, records: list[dict[str, Any]], commands: list[str], wall_s: float) -> str:
    """summary.md: the table (median [min..max] over seeds) and each system's time against brax PPO's."""
    lines = {s.name: [run_line(r) for r in records if r["system"] == s.name and r["status"] in ("done", "capped")]
             for s in SYSTEMS if s.name in args.systems}
    out = ["# PPO on brax inverted_pendulum: tianji_jax against brax's own PPO trainer", "",
           "Command: " + ", ".join(f"`{c}`" for c in commands if c), "", C.SHARED_NOTE, "",
           f"Threshold: deterministic evaluation return >= {THRESHOLD:.0f} (of 1000) over {args.eval_episodes} "
           f"episodes, evaluated every {args.eval_every:,} env steps; each run stops there (budget "
           f"{args.budget:,} env steps). Wall seconds count from before the process starts (interpreter, imports, "
           "compilation, evaluations); 'train wall' leaves the evaluations out ('-' for the async runtime, whose "
           "evaluations overlap training). brax evaluates once before training, so its first evaluation comes "
           "before any training step; tianji_jax's first comes after its first update. Median [min..max] over seeds. "
           "What each system is, and how their hyper-parameters differ: `experiments/ppo_brax.py`'s docstring.", "",
           "| system | seeds | reached | env steps to threshold | wall s to threshold | train wall s to threshold "
           "| first eval wall s | train env steps/s | eval s | load 1m start |", "|---" * 10 + "|"]
    for name, ls in lines.items():
        if not ls:
            out.append(f"| {name} | 0 | not run |" + " |" * 7)
            continue
        f = lambda k, fmt: C.median_range([ln[k] for ln in ls], fmt)  # noqa: E731
        reached = sum(math.isfinite(ln["steps_to_threshold"]) for ln in ls)
        out.append(f"| {name} | {len(ls)} | {reached}/{len(ls)} | {f('steps_to_threshold', '{:,.0f}')} | "
                   f"{f('wall_s_to_threshold', '{:.0f}')} | {f('train_wall_s_to_threshold', '{:.0f}')} | "
                   f"{f('first_eval_wall_s', '{:.0f}')} | {f('train_env_sps', '{:,.0f}')} | "
                   f"{f('eval_s_total', '{:.0f}')} | {f('loadavg_1m_start', '{:.1f}')} |")
    base = [ln["wall_s_to_threshold"] for ln in lines.get(BRAX.name, [])]
    if base and all(math.isfinite(b) for b in base):
        med = sorted(base)[len(base) // 2]
        out += ["", f"Wall seconds to the threshold relative to brax PPO's median ({med:.0f} s; < 1 is faster):", ""]
        for name, ls in lines.items():
            vals = [ln["wall_s_to_threshold"] / med for ln in ls]
            if vals and name != BRAX.name:
                out.append(f"- {name}: {C.median_range(vals, '{:.2f}x')}")
    other = [r for r in records if r["status"] != "done" and r["system"] in lines]
    out += [""] + [f"- {r['system']} seed {r['seed']}: **{r['status']}** {r.get('reason', '')[:300]}" for r in other]
    short = [n for n, ls in lines.items() if len(ls) < args.seeds]
    if short:
        out += [f"**Partial**: fewer than {args.seeds} seeds for {', '.join(short)} (resume with the same command).", ""]
    out.append(f"Total wall of the last invocation {wall_s:.0f} s.")
    return "\n".join(out) + "\n"


def plot(records: list[dict[str, Any]], path: Path) -> None:
    """Evaluation return against wall seconds and against env steps, one colour per system."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    for i, s in enumerate(SYSTEMS):
        runs = [r for r in records if r["system"] == s.name and r["evals"]]
        for j, r in enumerate(runs):
            ev = r["evals"]
            for ax, key in zip(axes, ("wall_s", "env_steps")):
                ax.plot([e[key] for e in ev], [e["eval_return_mean"] for e in ev], "o-", ms=3, color=f"C{i}", lw=1,
                        alpha=0.8, label=s.name if j == 0 else None)
    for ax, xl in zip(axes, ("wall s (process start, evaluations included)", "env steps")):
        ax.axhline(THRESHOLD, color="k", lw=0.8, ls="--", label=f"threshold {THRESHOLD:.0f}")
        ax.set_xlabel(xl)
        ax.set_ylabel("deterministic eval return")
        ax.legend(fontsize=7)
    fig.suptitle("PPO on brax inverted_pendulum (positional pipeline)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="tianji_jax anakin only, 1 seed, 327,680 env steps")
    parser.add_argument("--systems", nargs="+", choices=[s.name for s in SYSTEMS], default=[s.name for s in SYSTEMS])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--budget", type=int, default=5_000_000, help="env steps at most per run")
    parser.add_argument("--eval-every", type=int, default=327_680)
    parser.add_argument("--eval-episodes", type=int, default=16)
    parser.add_argument("--cap-s", type=float, default=1800.0, help="wall cap per run (evaluations so far kept)")
    parser.add_argument("--cache-dir", type=Path, default=Path.home() / ".cache" / "tianji_jax" / "peers")
    parser.add_argument("--install-timeout-s", type=float, default=1800.0)
    parser.add_argument("--report-only", action="store_true", help="only rebuild the outputs from records/")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "ppo_brax")
    args = parser.parse_args(argv)
    if args.quick:
        args.seeds, args.budget, args.eval_every, args.eval_episodes, args.systems = 1, 327_680, 163_840, 2, [TJ.name]
    systems = [s for s in SYSTEMS if s.name in args.systems]
    t_start, load_start = time.perf_counter(), C.loadavg()
    records_dir = args.out / "records"
    records_dir.mkdir(parents=True, exist_ok=True)
    python, err = Path(sys.executable), ""
    peer_python: Path | None = None
    if any(not s.is_tianji for s in systems) and not args.report_only:
        peer_python, err, _ = CV.ensure_venv("brax", args.cache_dir, args.install_timeout_s)
        if err:
            print(f"brax skipped: {err[:500]}", flush=True)
    row = CV.Row(ENV, THRESHOLD, args.eval_every, args.cap_s, ("ppo",))
    extra = {"eval_episodes": args.eval_episodes, "total_env_steps": args.budget, "stop_at_return": THRESHOLD}
    tmp_root = Path(tempfile.mkdtemp(prefix="tj-ppo-brax-"))
    for seed in range(args.seeds):
        for s in systems:
            path = records_dir / f"{s.name.replace(' ', '_')}__seed{seed}.json"
            if path.exists() or args.report_only:
                continue
            exe = python if s.is_tianji else peer_python
            if exe is None:
                rec = {"env": ENV, "system": s.name, "algo": "ppo", "seed": seed, "status": "skipped", "reason": err,
                       "evals": [], "info": {}, "threshold": THRESHOLD}
            else:
                tmp = tmp_root / "run"
                shutil.rmtree(tmp, ignore_errors=True)
                tmp.mkdir(parents=True)
                load = C.loadavg()
                rec = CV.run_one(s, row, seed, exe, extra, tmp)
                rec.update(loadavg_start=load, loadavg_end=C.loadavg())
                shutil.rmtree(tmp, ignore_errors=True)
            rec.update(command=C.command(), budget=args.budget)
            path.write_text(json.dumps(rec, indent=1, default=str) + "\n")
            ln = run_line(rec) if rec["status"] in ("done", "capped") else {}
            print(f"seed {seed} {s.name}: {rec['status']} steps {ln.get('steps_to_threshold', math.nan):,.0f}, wall "
                  f"{ln.get('wall_s_to_threshold', math.nan):.0f} s {rec.get('reason', '')[:300]}", flush=True)
    shutil.rmtree(tmp_root, ignore_errors=True)
    records = [json.loads(p.read_text()) for p in sorted(records_dir.glob("*.json"))]
    records = [r for r in records if r["system"] in args.systems]
    measured = [r for r in records if r["status"] in ("done", "capped")]
    C.write_csv([run_line(r) for r in measured], args.out / "results.csv")
    C.write_csv([{"system": r["system"], "seed": r["seed"], **e} for r in measured for e in r["evals"]],
                args.out / "curves.csv")
    summary = make_summary(args, records, sorted({r.get("command", "") for r in records}),
                           time.perf_counter() - t_start)
    (args.out / "summary.md").write_text(summary)
    C.write_machine(args.out, {"loadavg_start": load_start, "errors": {BRAX.name: err} if err else {},
                               "sizes": {k: getattr(args, k) for k in ("seeds", "budget", "eval_every", "eval_episodes",
                                                                       "cap_s")}})
    plot(measured, args.out / "returns.png")
    print(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
