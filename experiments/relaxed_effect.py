"""Where relaxed hand-offs pay: a slow env step, acting time / learning time r from ~0.4 to ~3.

The TianJi claim (relaxed actor/learner assignment dependencies, staleness bounded, converge faster
in wall time than strict ones) can only show where acting costs about as much as learning and runs
on resources separate from the learner. Earlier experiments here measured relaxed/sync at
1.00-1.12x because acting was a small share of wall time. This one builds the regime with the host
env modifier ``|latency_ms=D`` (:class:`tianji_jax.envs.latency.LatencyVecEnv`): every batched step
of the N envs returns no earlier than D ms after its actions were sent, waiting without CPU, as a
simulator elsewhere would.

Setting: async PPO on ``envpool:CartPole-v1``, one actor thread (cpu:0) and the learner (cpu:1),
8 envs x 128 steps, MLP 512x512 (large enough that one update of the 1,024-step batch, 10 epochs x
4 minibatches, costs several times the rollout's own policy inference), evaluation of 10
deterministic episodes every 5,120 env steps, runs stopped at the threshold (475) or the budget.
The two XLA CPU devices share one intra-op thread pool over both cores (``XLA_FLAGS``
``--xla_cpu_multi_thread_eigen=false`` does not change that in this jaxlib: a 1024^2 matmul on cpu:1
runs in 6.7 ms either way, 15.6 ms under ``taskset -c 0``), so a lone learner (``sync``, while the
actor waits) uses the actor's core too; resources are not fully separate (see ``u x sync``).

1. Calibration (``calibration.json``, reused on resume): a warm-up run compiles every program; a
   ``sync`` run without latency measures the learner's update time ``u`` and the rollout time
   ``A0`` (seconds per update, medians over metrics rows, from ``update_s`` / ``rollout_s``). For
   each target r, ``D = (r*u - A0) / num_steps`` (0 where ``r*u < A0``: the floor of this setting),
   checked by a short ``sync`` run with that latency and corrected once from its measured rollout
   time. The neighbours' load moves ``u`` by up to 2x between runs, so the realized r differs from
   the target (the runs' measured r is reported and plotted); the target 6 is there because the
   target 3 realized r ~ 1.7 (the runs' u exceeded the calibration's).
2. For each r and schedule (``sync``; ``one_step``, K=1; ``relaxed``, K=2; ``auto``, ceiling K=2: the
   admission window tuned online, ``tianji_jax/runtime/tianji/auto_schedule.py``), per seed: env steps
   and wall seconds to the threshold, throughput (env steps consumed by the learner per second, the
   first metrics row excluded), measured r (``sum(rollout_s) / sum(update_s)`` over the run), lag
   mean/max, dropped fraction, time spent evaluating, load average before and after the run.
   Seeds are the outer loop (every (r, schedule) once per seed), so drift in the neighbours' load
   hits every variant alike. Wall times exclude compilation (warm-up runs) and the evaluation that
   decided the threshold row (evaluations run on the host-loop thread while actor and learner keep
   going; the row's wall stamp is taken after its evaluation, so that one evaluation's duration is
   subtracted; ``wall_s_to_threshold_incl_eval`` keeps it).
3. Speedup of a schedule over ``sync`` = sync's wall seconds to threshold / the schedule's, per
   seed, then the median; beside the ideal bound for overlapping two phases of lengths A and u,
   ``(A + u) / max(A, u) = 1 + min(r, 1/r)``.

Resumable: a (r, schedule, seed) already in ``results.csv`` is not run again (delete its row to redo
it); the calibration is reused from ``calibration.json``.

Writes ``experiments/results/relaxed_effect/{calibration.json, results.csv, curves.csv, summary.md,
relaxed_effect.png, machine.json}`` (``--quick``: under ``relaxed_effect/quick/``).

    python experiments/relaxed_effect.py            # target r in {0.3, 1, 3, 6}, 8 seeds, budget 100k env steps per run
    python experiments/relaxed_effect.py --quick    # r = 1 only, 1 seed, 10k env steps, 64x64 net, 2 epochs (tests)
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
import time
from pathlib import Path

import os

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 2)  # actor on cpu:0, learner on cpu:1 (docs/runtime.md, "Placement")

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402

import tianji_jax as tj  # noqa: E402
from tianji_jax.run import host_on_policy  # noqa: E402

SCHEDULES = (("sync", 0), ("one_step", 1), ("relaxed", 2), ("auto", 2))  # auto: its ceiling K = relaxed's
OVERLAPPING = tuple(s for s, _ in SCHEDULES if s != "sync")
KEY = ("r_target", "schedule", "seed")

# Seconds of each evaluation of the current run, in order (one per metrics row): the library's
# evaluator factory is wrapped (as experiments/peers/tianji_runner.py does); nothing is changed.
EVAL_S: list[float] = []


def _timed_factory(factory):
    def make(*args, **kwargs):
        fn = factory(*args, **kwargs)

        def timed(*a, **k):
            t = time.perf_counter()
            out = jax.block_until_ready(fn(*a, **k))
            EVAL_S.append(time.perf_counter() - t)
            return out

        return timed

    return make


host_on_policy.on_policy_evaluator = _timed_factory(host_on_policy.on_policy_evaluator)


def env_id(latency_ms: float) -> str:
    return "envpool:CartPole-v1" + (f"|latency_ms={latency_ms:.3f}" if latency_ms > 0 else "")


def base_config(args, latency_ms: float) -> tj.PPOConfig:
    return tj.PPOConfig(env=env_id(latency_ms), runtime="async", num_actors=1, actor_backend=args.actor_backend,
                        num_envs=args.num_envs,
                        num_steps=args.num_steps, hidden_sizes=tuple(args.hidden), update_epochs=args.update_epochs,
                        num_minibatches=args.num_minibatches, total_env_steps=args.total_env_steps,
                        eval_every_env_steps=args.eval_every, eval_episodes=10, stop_at_return=args.threshold)


def per_update(curve, col: str) -> np.ndarray:
    """``col`` per update of each metrics row (rows hold several updates)."""
    du = np.diff(np.concatenate([[0.0], curve["update"]]))
    return curve[col] / np.maximum(du, 1)


class _Stop(Exception):
    """Raised by :func:`short_run`'s callback to end a run after its rows."""


def short_run(args, latency_ms: float, rows: int, schedule: str = "sync", k: int = 0) -> tuple[dict, float]:
    """A run of exactly the measured config (same compiled programs: ``env``,
    ``total_env_steps`` and ``eval_every_env_steps`` all enter the library's compile key), ended
    after ``rows`` metrics rows by raising from the callback; returns its rows as a curve and its
    seconds. Used to compile (warm-up) and to calibrate."""
    got: list[dict] = []

    def stop(row):
        got.append(row)
        if len(got) >= rows:
            raise _Stop

    cfg = base_config(args, latency_ms).replace(schedule=schedule, max_policy_lag=None if schedule == "sync" else k,
                                               stop_at_return=None)
    with C.Timer() as t:
        try:
            tj.train(cfg, progress=False, callback=stop)
        except _Stop:
            pass
    return {k: np.asarray([g.get(k, math.nan) for g in got], float) for k in got[0]}, t.s


def calibrate(args, out: Path) -> dict:
    """``u``, ``A0`` and, per r, the latency D (see the module docstring), from ``calibration.json``
    when it exists for the same sizes; a target r missing there is calibrated from its ``u`` and
    ``A0`` and added (the D of the others are kept, so their rows stay comparable)."""
    path = out / "calibration.json"
    settings = {k: getattr(args, k) for k in ("num_envs", "num_steps", "hidden", "update_epochs", "num_minibatches",
                                              "total_env_steps", "eval_every")}
    cal = json.loads(path.read_text()) if path.exists() else None
    if cal is not None and {k: v for k, v in cal["settings"].items() if k != "r_values"} == settings:
        missing = [r for r in args.r_values if str(r) not in cal["r"]]
        print(f"calibration reused from {path}" + (f"; adding r = {missing}" if missing else ""), flush=True)
        if not missing:
            return cal
        u, a0 = cal["u_s"], cal["rollout0_s"]
    else:
        missing = list(args.r_values)
        cal = {"settings": settings, "loadavg_start": C.loadavg(), "r": {}}
        _, cal["warmup_s"] = short_run(args, 0.0, 1)  # compiles rollout, update and evaluator
        print(f"warm-up (compilation) {cal['warmup_s']:.1f} s", flush=True)
        c, _ = short_run(args, 0.0, args.cal_rows)
        u, a0 = float(np.median(per_update(c, "update_s")[1:])), float(np.median(per_update(c, "rollout_s")[1:]))
        cal.update(u_s=u, rollout0_s=a0, inference0_s=float(np.median(per_update(c, "inference_s")[1:])),
                   env_step0_s=float(np.median(per_update(c, "env_step_s")[1:])), r_floor=a0 / u)
        print(f"calibration: update u = {u * 1e3:.1f} ms, rollout without latency A0 = {a0 * 1e3:.1f} ms "
              f"(r floor {a0 / u:.2f})", flush=True)
    cal["settings"]["r_values"] = sorted({*cal["settings"].get("r_values", []), *args.r_values})
    for r in missing:
        d0 = max(0.0, r * u - a0) / args.num_steps * 1e3
        entry = {"latency_ms_initial": d0}
        d = d0
        if d0 > 0:  # check with a short sync run and correct once from the measured rollout time
            c, _ = short_run(args, d0, args.cal_check_rows)
            a = float(np.median(per_update(c, "rollout_s")[1:]))
            d = max(0.0, d0 + (r * u - a) / args.num_steps * 1e3)
            entry.update(rollout_check_s=a, r_check=a / u,
                         update_check_s=float(np.median(per_update(c, "update_s")[1:])))
        entry["latency_ms"] = round(d, 3)
        cal["r"][str(r)] = entry
        print(f"r = {r:g}: D = {d:.3f} ms per batched step (initial {d0:.3f} ms"
              + (f", check run rollout {entry['rollout_check_s'] * 1e3:.0f} ms = r {entry['r_check']:.2f})"
                 if d0 > 0 else "; r*u below the rollout's own time: no latency)"), flush=True)
    cal["loadavg_end"] = C.loadavg()
    path.write_text(json.dumps(cal, indent=2) + "\n")
    return cal


def run_one(args, cal: dict, r: float, schedule: str, k: int, seed: int) -> tuple[dict, list[dict]]:
    d = cal["r"][str(r)]["latency_ms"]
    cfg = base_config(args, d).replace(schedule=schedule, max_policy_lag=None if schedule == "sync" else k, seed=seed)
    EVAL_S.clear()
    load_before = C.loadavg() or [math.nan] * 3
    with C.Timer() as t:
        c = tj.train(cfg, progress=False).curve
    load_after = C.loadavg() or [math.nan] * 3
    ev = np.asarray(EVAL_S, float)
    if len(ev) != len(c["env_steps"]):
        ev = np.full(len(c["env_steps"]), math.nan)
    hit = np.nonzero(c["eval_return_mean"] >= args.threshold)[0]
    i = int(hit[0]) if len(hit) else None
    row = {"r_target": r, "latency_ms": d, "schedule": schedule, "max_policy_lag": k, "seed": seed,
           "steps_to_threshold": float(c["env_steps"][i]) if i is not None else math.nan,
           "wall_s_to_threshold": float(c["wall_time_s"][i] - ev[i]) if i is not None else math.nan,
           "wall_s_to_threshold_incl_eval": float(c["wall_time_s"][i]) if i is not None else math.nan,
           "eval_s_to_threshold": float(np.sum(ev[:i + 1])) if i is not None else math.nan,
           "final_eval_return": float(c["eval_return_mean"][-1]),
           "env_steps": float(c["env_steps"][-1]), "wall_s_total": float(c["wall_time_s"][-1]),
           "eval_s_total": float(np.sum(ev)), "train_call_s": t.s, "rows": len(c["env_steps"]),
           "updates": float(c["update"][-1]),
           "rollout_s_per_update": float(np.nansum(c["rollout_s"]) / c["update"][-1]),
           "update_s_per_update": float(np.nansum(c["update_s"]) / c["update"][-1]),
           "inference_s_per_update": float(np.nansum(c["inference_s"]) / c["update"][-1]),
           "r_measured": float(np.nansum(c["rollout_s"]) / np.nansum(c["update_s"])),
           "load_before_1m": load_before[0], "load_before_5m": load_before[1],
           "load_after_1m": load_after[0], "load_after_5m": load_after[1]}
    # throughput over the whole run (env steps consumed / wall), and steady-state rates (first row excluded)
    row["consumed_env_sps_run"] = row["env_steps"] / row["wall_s_total"]
    try:
        st = C.steady_async(c, args.update_epochs)
    except ValueError:  # one metrics row (threshold at the first evaluation): no steady state
        st = {}
    for key in ("consumed_env_sps", "production_sps", "dropped_frac", "policy_lag_mean", "policy_lag_max",
                "actor_wait_frac", "learner_wait_frac"):
        row[key] = st.get(key, math.nan)
    if not np.isfinite(row["policy_lag_max"]):
        row["policy_lag_max"] = float(np.nanmax(c["policy_lag_max"]))
        row["policy_lag_mean"] = float(np.nanmean(c["policy_lag_mean"]))
    row["dropped_env_steps"] = float(c["dropped_stale"][-1] + c["dropped_partial"][-1])
    # the admission window in force at each row (auto moves it; the fixed schedules' stays at K)
    row["lag_window_min"], row["lag_window_max"] = float(np.min(c["lag_window"])), float(np.max(c["lag_window"]))
    curves = [{"r_target": r, "schedule": schedule, "seed": seed, "env_steps": c["env_steps"][j],
               "wall_time_s": c["wall_time_s"][j], "eval_s": ev[j], "eval_return_mean": c["eval_return_mean"][j],
               "policy_lag_mean": c["policy_lag_mean"][j], "rollout_s": c["rollout_s"][j],
               "update_s": c["update_s"][j], "lag_window": c["lag_window"][j]} for j in range(len(c["env_steps"]))]
    return row, curves


def read_csv(path: Path) -> list[dict]:
    if not path.exists():
        return []
    out = []
    with open(path) as f:
        for r in csv.DictReader(f):
            d = {}
            for k, v in r.items():
                try:
                    d[k] = float(v)
                except (TypeError, ValueError):
                    d[k] = v
            for k in ("seed", "max_policy_lag"):
                if k in d and isinstance(d[k], float) and np.isfinite(d[k]):
                    d[k] = int(d[k])
            out.append(d)
    return out


def add_startup(rows: list[dict], curves: list[dict]) -> None:
    """``first_row_excess_s``: the first metrics row's wall seconds beyond the median row interval
    of the run (start-up of envs and threads, the first rollout before any overlap); NaN with one row."""
    for r in rows:
        w = np.asarray([c["wall_time_s"] for c in curves if c["r_target"] == r["r_target"]
                        and c["schedule"] == r["schedule"] and c["seed"] == r["seed"]], float)
        r["first_row_excess_s"] = float(w[0] - np.median(np.diff(w))) if len(w) >= 2 else math.nan


def add_ratios(rows: list[dict]) -> None:
    """Per (r, seed): speedups over that seed's ``sync`` run (> 1: faster than sync)."""
    for r in rows:
        s = next((x for x in rows if x["r_target"] == r["r_target"] and x["seed"] == r["seed"]
                  and x["schedule"] == "sync"), None)
        if s is None:
            continue
        r["speedup_wall_to_threshold"] = s["wall_s_to_threshold"] / r["wall_s_to_threshold"]
        r["speedup_consumed_sps"] = r["consumed_env_sps"] / s["consumed_env_sps"]
        r["steps_to_threshold_over_sync"] = r["steps_to_threshold"] / s["steps_to_threshold"]
        r["update_s_over_sync"] = r["update_s_per_update"] / s["update_s_per_update"]
        r["rollout_s_over_sync"] = r["rollout_s_per_update"] / s["rollout_s_per_update"]
        r["bound"] = 1 + min(s["r_measured"], 1 / s["r_measured"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="r = 1 only, 1 seed, 10k env steps, a 64x64 net with 2 epochs, into quick/")
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--actor-backend", choices=["threads", "ray"], default="threads",
                        help="ray: the actor in its own process (a private local Ray instance); use its own --out "
                             "and copy the threads run's calibration.json there to keep its latencies")
    parser.add_argument("--schedules", nargs="+", default=[s for s, _ in SCHEDULES],
                        choices=[s for s, _ in SCHEDULES], help="schedules to run (sync is every speedup's baseline)")
    parser.add_argument("--r-values", type=float, nargs="+", default=[0.3, 1.0, 3.0, 6.0],
                        help="target r = acting / learning time (D from the calibrated u; the realized r is measured)")
    parser.add_argument("--total-env-steps", type=int, default=100_352, help="budget per run (98 updates)")
    parser.add_argument("--eval-every", type=int, default=5_120, help="env steps between evaluations")
    parser.add_argument("--threshold", type=float, default=475.0)
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument("--num-steps", type=int, default=128)
    parser.add_argument("--hidden", type=int, nargs="+", default=[512, 512])
    parser.add_argument("--update-epochs", type=int, default=10)
    parser.add_argument("--num-minibatches", type=int, default=4)
    parser.add_argument("--cal-rows", type=int, default=4, help="metrics rows (of eval-every env steps) of the "
                        "calibration run; the first is left out")
    parser.add_argument("--cal-check-rows", type=int, default=3, help="metrics rows of each latency check run")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.quick:
        args.seeds, args.r_values, args.total_env_steps, args.cal_rows, args.cal_check_rows = 1, [1.0], 10_240, 3, 2
        args.hidden, args.update_epochs = [64, 64], 2  # the code path at a small learning cost (the test's run)
    if args.seeds < 1:
        parser.error(f"--seeds must be >= 1, got {args.seeds}")
    out = args.out or Path(__file__).parent / "results" / "relaxed_effect" / ("quick" if args.quick else "")
    out.mkdir(parents=True, exist_ok=True)
    t_start, load_start = time.perf_counter(), C.loadavg()

    cal = calibrate(args, out)
    rows, curves = read_csv(out / "results.csv"), read_csv(out / "curves.csv")
    done = {(r["r_target"], r["schedule"], r["seed"]) for r in rows}
    warmed: set[float] = set()
    for seed in range(args.seeds):
        for r in args.r_values:
            for schedule, k in SCHEDULES:
                if (r, schedule, seed) in done or schedule not in args.schedules:
                    continue
                if r not in warmed:  # the env id (latency) enters the compile key: compile every schedule first
                    for sch, kk in [(a, b) for a, b in SCHEDULES if a in args.schedules]:
                        short_run(args, cal["r"][str(r)]["latency_ms"], 1, sch, kk)
                    warmed.add(r)
                row, cs = run_one(args, cal, r, schedule, k, seed)
                rows.append(row)
                curves += cs
                add_ratios(rows)
                C.write_csv(rows, out / "results.csv")
                C.write_csv(curves, out / "curves.csv")
                print(f"seed {seed} r {r:g} (D {row['latency_ms']:.3f} ms) {schedule:8s}: steps to {args.threshold:g} "
                      f"{row['steps_to_threshold']:.0f}, wall {row['wall_s_to_threshold']:.1f} s (eval "
                      f"{row['eval_s_total']:.1f} s), consumed {row['consumed_env_sps']:,.0f} SPS, r meas "
                      f"{row['r_measured']:.2f} (A {row['rollout_s_per_update'] * 1e3:.0f} ms, u "
                      f"{row['update_s_per_update'] * 1e3:.0f} ms), lag {row['policy_lag_mean']:.2f}/"
                      f"{row['policy_lag_max']:.0f}, load {row['load_before_1m']:.1f}->{row['load_after_1m']:.1f}",
                      flush=True)
    rows = [r for r in rows if r["r_target"] in args.r_values and r["seed"] < args.seeds]
    add_ratios(rows)
    add_startup(rows, curves)
    C.write_csv(rows, out / "results.csv")
    wall_s = time.perf_counter() - t_start
    summary = make_summary(args, cal, rows, wall_s, load_start)
    (out / "summary.md").write_text(summary)
    C.write_machine(out, {"loadavg_start": load_start, "XLA_FLAGS": os.environ.get("XLA_FLAGS", ""),
                          "wall_s_this_invocation": wall_s, "calibration": cal,
                          "sizes": {"seeds": args.seeds, "r_values": args.r_values,
                                    "total_env_steps": args.total_env_steps, "eval_every_env_steps": args.eval_every,
                                    "num_envs": args.num_envs, "num_steps": args.num_steps, "hidden": args.hidden,
                                    "update_epochs": args.update_epochs, "num_minibatches": args.num_minibatches,
                                    "num_actors": 1, "actor_backend": args.actor_backend}})
    plot(args, rows, out / "relaxed_effect.png")
    print(summary)
    return 0


def vals(rs, key, fmt="{:.2f}") -> str:
    """``median [v_seed0, v_seed1, ...]``."""
    v = [r.get(key, math.nan) for r in sorted(rs, key=lambda x: x["seed"])]
    per = ", ".join("-" if not np.isfinite(x) else fmt.format(x) for x in v)
    return f"{fmt.format(C.median(v)) if np.isfinite(C.median(v)) else '-'} [{per}]"


def make_summary(args, cal, rows, wall_s, load_start) -> str:
    u, a0 = cal["u_s"], cal["rollout0_s"]
    lines = [f"# Relaxed vs strict hand-offs with a slow env step {'(--quick)' if args.quick else ''}", "",
             f"Command: `{C.command()}`", "", C.SHARED_NOTE,
             "The load average (1 min) before and after every run is in `results.csv` "
             "(`load_before_1m`, `load_after_1m`); the table gives its range per r.", "",
             f"Async PPO on `envpool:CartPole-v1|latency_ms=D`, {args.num_envs} envs x {args.num_steps} steps, MLP "
             f"{'x'.join(map(str, args.hidden))}, {args.update_epochs} epochs x {args.num_minibatches} minibatches, "
             + ("one actor thread (cpu:0), learner on cpu:1" if args.actor_backend == "threads" else
                "one Ray actor process (its own CPU policy copy; a private local Ray instance), learner on cpu:1")
             + "; evaluation of 10 deterministic episodes every "
             f"{args.eval_every} env steps, threshold {args.threshold:g}, budget {args.total_env_steps} env steps "
             f"(runs stop at the threshold). {args.seeds} seed(s), seeds the outer loop. Both XLA CPU devices "
             f"share one intra-op thread pool over the 2 cores, so a learner updating alone (sync: the actor "
             f"waits) also uses the actor's core, and one updating beside a busy actor does not.", "",
             f"**Calibration** (sync, no latency): learner update u = {u * 1e3:.1f} ms per update, rollout "
             f"A0 = {a0 * 1e3:.1f} ms per update (policy inference {cal['inference0_s'] * 1e3:.1f} ms, env step "
             f"and assembly {cal['env_step0_s'] * 1e3:.1f} ms), so the smallest r this setting reaches is "
             f"{cal['r_floor']:.2f}. D per batched step: "
             + ", ".join(f"r = {r}: {e['latency_ms']:.3f} ms" for r, e in cal["r"].items()) + ". "
             f"The measured runs' own times differ from the calibration's (the neighbours' load moves u by up to "
             f"2x): median per update over the sync runs u = "
             f"{C.median(x['update_s_per_update'] for x in rows if x['schedule'] == 'sync') * 1e3:.0f} ms, over "
             f"the one_step/relaxed runs u = "
             f"{C.median(x['update_s_per_update'] for x in rows if x['schedule'] != 'sync') * 1e3:.0f} ms; so the "
             f"realized r (*r meas*) is the one to read, and the plot's x axis.", "",
             "*Speedup* = sync's wall seconds to the threshold / the schedule's, per seed (same r), then the "
             "median; per-seed values in brackets (seed 0, 1, ...). Wall seconds exclude compilation and the "
             "evaluation of the threshold row (the other evaluations run on the host-loop thread beside actor "
             "and learner; their total is *eval s*). *SPS speedup* = ratio of env steps consumed per second "
             "(first metrics row excluded), which isolates the overlap from learning differences: wall "
             "speedup ~ SPS speedup / steps ratio. *bound* = 1 + min(r, 1/r) with r measured in that seed's "
             "sync run (`sum(rollout_s)/sum(update_s)`); *r meas* = that, median over sync runs; "
             "*u x sync* = the learner's seconds per update against sync's (> 1: the learner is slowed by "
             "the actor running beside it); *A x sync* the same for the actor's rollout seconds per update (> 1: "
             "the rollout's CPU part, policy inference and envpool, is slowed by the learner). *start-up s* = the first metrics row's wall seconds beyond the "
             "run's median row interval (envs and threads starting, the first rollout with nothing to "
             "overlap), median [min..max]: part of every wall time to threshold, and of its noise.", "",
             "| r target | D ms | r meas (sync) | bound | schedule | wall speedup | SPS speedup | steps x sync | "
             "u x sync | A x sync | reached | wall s to threshold | start-up s | lag mean/max | dropped | eval s | load 1m |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in args.r_values:
        d = cal["r"][str(r)]["latency_ms"]
        syncs = [x for x in rows if x["r_target"] == r and x["schedule"] == "sync"]
        rm = C.median(x["r_measured"] for x in syncs)
        for schedule, _ in SCHEDULES:
            rs = [x for x in rows if x["r_target"] == r and x["schedule"] == schedule]
            if not rs:
                continue
            reached = sum(np.isfinite(x["steps_to_threshold"]) for x in rs)
            loads = [x["load_before_1m"] for x in rs] + [x["load_after_1m"] for x in rs]
            lines.append(
                f"| {r:g} | {d:.3f} | {rm:.2f} | {vals(syncs, 'bound')} | {schedule} | "
                f"{'1' if schedule == 'sync' else vals(rs, 'speedup_wall_to_threshold')} | "
                f"{'1' if schedule == 'sync' else vals(rs, 'speedup_consumed_sps')} | "
                f"{'1' if schedule == 'sync' else vals(rs, 'steps_to_threshold_over_sync')} | "
                f"{'1' if schedule == 'sync' else vals(rs, 'update_s_over_sync')} | "
                f"{'1' if schedule == 'sync' else vals(rs, 'rollout_s_over_sync')} | {reached}/{len(rs)} | "
                f"{vals(rs, 'wall_s_to_threshold', '{:.1f}')} | "
                f"{C.median_range((x.get('first_row_excess_s', math.nan) for x in rs), '{:.1f}')} | "
                f"{C.median(x['policy_lag_mean'] for x in rs):.2f}/{max(x['policy_lag_max'] for x in rs):.0f} | "
                f"{C.median_range((x['dropped_frac'] for x in rs), '{:.3f}')} | "
                f"{C.median(x['eval_s_total'] for x in rs):.1f} | {min(loads):.1f}-{max(loads):.1f} |")
    lines += ["", "## Against the bound", ""]
    for r in args.r_values:
        syncs = [x for x in rows if x["r_target"] == r and x["schedule"] == "sync"]
        if not syncs:
            continue
        bound = C.median(x["bound"] for x in syncs)
        for schedule in OVERLAPPING:
            rs = [x for x in rows if x["r_target"] == r and x["schedule"] == schedule]
            if not rs:
                continue
            w, s = C.median(x["speedup_wall_to_threshold"] for x in rs), C.median(x["speedup_consumed_sps"] for x in rs)
            st, uu = C.median(x["steps_to_threshold_over_sync"] for x in rs), C.median(x["update_s_over_sync"] for x in rs)
            aa = C.median(x["rollout_s_over_sync"] for x in rs)
            lw = C.median(x["learner_wait_frac"] for x in rs)
            lines.append(f"- r = {r:g} (measured {C.median(x['r_measured'] for x in syncs):.2f}), {schedule}: wall "
                         f"speedup {w:.2f} and throughput speedup {s:.2f} against the bound {bound:.2f}; env steps to "
                         f"threshold x{st:.2f} of sync's; the learner's seconds per update x{uu:.2f} and the actor's x{aa:.2f} "
                         f"of sync's; "
                         f"learner waiting {lw:.0%} of the time"
                         + (f"; admission window {min(x.get('lag_window_min', math.nan) for x in rs):.0f}.."
                            f"{max(x.get('lag_window_max', math.nan) for x in rs):.0f} over its rows"
                            if all(np.isfinite(x.get('lag_window_min', math.nan)) for x in rs) else "") + ".")
    lines += ["", f"Total wall of this invocation {wall_s:.0f} s (calibration reused when `calibration.json` "
              f"existed; rows already in results.csv not run again); load average at its start {load_start}. "
              f"The {len(rows)} measured runs' `tj.train` calls took {sum(x['train_call_s'] for x in rows):.0f} s "
              f"in all (every invocation that wrote these rows), warm-ups and calibration not counted.", ""]
    return "\n".join(lines)


def plot(args, rows, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    xs = np.geomspace(0.1, 10, 200)
    for ax, key, title in ((axes[0], "speedup_wall_to_threshold", "wall time to threshold: sync / schedule"),
                           (axes[1], "speedup_consumed_sps", "throughput (consumed env SPS): schedule / sync")):
        ax.plot(xs, 1 + np.minimum(xs, 1 / xs), "k--", lw=1, label="ideal overlap 1 + min(r, 1/r)")
        ax.axhline(1.0, color="k", lw=0.5)
        for i, schedule in enumerate(OVERLAPPING):
            pts, meds = [], []
            for r in args.r_values:
                rs = [x for x in rows if x["r_target"] == r and x["schedule"] == schedule]
                syncs = [x for x in rows if x["r_target"] == r and x["schedule"] == "sync"]
                if not rs or not syncs:
                    continue
                rm = C.median(x["r_measured"] for x in syncs)
                jitter = 1.0 + 0.03 * (i - 1)
                pts += [(rm * jitter, x.get(key, math.nan)) for x in rs]
                meds.append((rm * jitter, C.median(x.get(key, math.nan) for x in rs)))
            if pts:
                ax.scatter(*zip(*pts), s=12, alpha=0.4, color=f"C{i}")
                ax.plot(*zip(*meds), "o-", color=f"C{i}", label=f"{schedule} (median; dots: seeds)")
        ax.set_xscale("log")
        ax.set_xlabel("r = acting time / learning time (measured in sync runs)")
        ax.set_ylabel("speedup over sync")
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    sys.exit(main())
