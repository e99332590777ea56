"""The library on whatever JAX backend the machine has (a GPU where there is one), CPU beside it.

Three measurements, each row tagged with its JAX platform so a run on the accelerator and a run
with ``--platform cpu`` on the same machine sit side by side in one table:

- ``scaling``: gymnax CartPole-v1 with ``num_envs`` N in ``--envs-list``: the raw env SPS (a
  jitted ``num_steps``-step scan of N envs with random actions, the env's bound on this device)
  and Anakin PPO's steady SPS with the same N and ``num_steps`` 128 (first row, which includes
  compilation, excluded; evaluation every 2 updates with 10 episodes, counted in the wall time);
  and, at the N that ``--async-envs`` names, async PPO with device actors (``relaxed`` and
  ``sync`` with one actor thread, ``relaxed`` with two; actors and learner share the device when
  there is only one): its steady consumed env SPS (``sps``, epoch reuse not counted) and
  production SPS, with the rollout and update shares of the wall time.
- ``threshold``: wall seconds (from ``tj.train``'s start, compilation included) and env steps
  until the mean of 10 deterministic evaluation episodes reaches 475 on CartPole-v1, for the
  library's default PPO, PQN and DQN configs (Anakin), ``--seeds`` seeds each, budget 500k env
  steps (DQN: 250k).
- ``sweep``: ``tj.sweep`` over ``--sweep-members`` learning rates of the default PPO config
  (one compiled, vmapped program, 100k env steps each) against one single run of the same config:
  the members per second of each.

Each section runs under its own time cap (``--cap-s``); a section that runs out writes what it
has. Writes ``accelerator_<platform>.csv`` (one row per measurement: section, platform, device,
quantities) and ``machine_<platform>.json`` under ``--out``, appending as it goes, so a run cut
off by its time limit keeps its finished rows.

    python experiments/accelerator.py --out experiments/results/gpu            # the device's backend
    python experiments/accelerator.py --platform cpu --out experiments/results/gpu
    python experiments/accelerator.py --quick --out /tmp/acc                   # a few seconds each
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import _common as C  # noqa: E402


_ROWS: dict[str, list[dict[str, Any]]] = {}


def _write_row(out: Path, platform: str, row: dict[str, Any]) -> None:
    """Adds ``row`` to this platform's rows and rewrites ``accelerator_<platform>.csv`` with every
    row so far (columns: the union of keys, in first-seen order)."""
    rows = _ROWS.setdefault(platform, [])
    rows.append(row)
    C.write_csv(rows, out / f"accelerator_{platform}.csv")
    print(json.dumps(row), flush=True)


def _steady(curve: dict[str, np.ndarray]) -> float:
    wall, steps = curve["wall_time_s"], curve["env_steps"]
    return float((steps[-1] - steps[0]) / (wall[-1] - wall[0])) if len(wall) >= 2 else math.nan


def raw_sps(tj, jax, num_envs: int, num_steps: int, seconds: float) -> float:
    """Env steps per second of a jitted ``num_steps``-step scan of ``num_envs`` gymnax
    CartPole-v1 envs with uniformly random actions on the default device (compiled first)."""
    fn, reset = C.gymnax_random_rollout(num_envs, num_steps)
    k = jax.random.PRNGKey(0)
    state, _ = reset(k)
    k, state, r = fn(k, state)
    jax.block_until_ready(r)
    t0, n_steps = time.perf_counter(), 0
    while time.perf_counter() - t0 < seconds:
        k, state, r = fn(k, state)
        jax.block_until_ready(r)
        n_steps += num_envs * num_steps
    return n_steps / (time.perf_counter() - t0)


def scaling(tj, jax, args, emit, deadline: float) -> None:
    """Raw env SPS, Anakin PPO SPS and (at ``--async-envs``) async PPO SPS against num_envs."""
    for n in args.envs_list:
        if time.perf_counter() > deadline:
            print(f"scaling: cap reached before num_envs={n}", flush=True)
            return
        emit({"section": "scaling", "what": "raw_env", "num_envs": n, "num_steps": 128,
              "sps": raw_sps(tj, jax, n, 128, args.raw_s)})
        per_update = n * 128
        cfg = tj.PPOConfig(env="gymnax:CartPole-v1", num_envs=n, num_steps=128,
                           total_env_steps=per_update * args.updates, eval_every_env_steps=per_update * 2,
                           seed=0)
        t0 = time.perf_counter()
        res = tj.train(cfg, progress=False)
        emit({"section": "scaling", "what": "anakin_ppo", "num_envs": n, "num_steps": 128,
              "sps": _steady(res.curve), "wall_s": time.perf_counter() - t0,
              "first_row_s": float(res.curve["wall_time_s"][0]),
              "final_eval_return": float(res.curve["eval_return_mean"][-1])})
        if n in args.async_envs:
            for schedule, actors in (("relaxed", 1), ("sync", 1), ("relaxed", 2)):
                acfg = cfg.replace(runtime="async", schedule=schedule, num_actors=actors)
                t0 = time.perf_counter()
                res = tj.train(acfg, progress=False)
                c = res.curve
                st = C.steady_async(c, cfg.update_epochs)
                emit({"section": "scaling", "what": f"async_ppo_{schedule}_A{actors}", "num_envs": n,
                      "num_steps": 128, "sps": st["consumed_env_sps"], "production_sps": st["production_sps"],
                      "wall_s": time.perf_counter() - t0, "first_row_s": float(c["wall_time_s"][0]),
                      "update_share": st["update_s_share"], "rollout_share": st["rollout_s_share"],
                      "policy_lag_max": st["policy_lag_max"],
                      "final_eval_return": float(c["eval_return_mean"][-1])})


def threshold(tj, jax, args, emit, deadline: float) -> None:
    """Default PPO, PQN and DQN configs to an evaluation return of 475 on CartPole-v1."""
    configs = {
        "ppo": tj.PPOConfig(env="gymnax:CartPole-v1", stop_at_return=475.0, total_env_steps=args.budget),
        "pqn": tj.PQNConfig(env="gymnax:CartPole-v1", stop_at_return=475.0, total_env_steps=args.budget),
        "dqn": tj.DQNConfig(env="gymnax:CartPole-v1", stop_at_return=475.0, total_env_steps=args.budget // 2,
                            **({"learning_starts": 1000} if args.quick else {})),
    }
    for seed in range(args.seeds):
        for name, cfg in configs.items():
            if time.perf_counter() > deadline:
                print(f"threshold: cap reached before {name} seed {seed}", flush=True)
                return
            t0 = time.perf_counter()
            res = tj.train(cfg.replace(seed=seed), progress=False)
            c = res.curve
            hit = np.nonzero(c["eval_return_mean"] >= 475.0)[0]
            emit({"section": "threshold", "what": f"anakin_{name}", "seed": seed,
                  "num_envs": cfg.num_envs, "num_steps": cfg.num_steps,
                  "env_steps_to_475": float(c["env_steps"][hit[0]]) if len(hit) else math.nan,
                  "wall_s_to_475": float(c["wall_time_s"][hit[0]]) if len(hit) else math.nan,
                  "first_row_s": float(c["wall_time_s"][0]), "wall_s": time.perf_counter() - t0,
                  "sps": _steady(c), "final_eval_return": float(c["eval_return_mean"][-1])})


def sweep(tj, jax, args, emit, deadline: float) -> None:
    """One vmapped sweep of M learning rates against one single run of the same config."""
    if time.perf_counter() > deadline:
        return
    cfg = tj.PPOConfig(env="gymnax:CartPole-v1", total_env_steps=args.sweep_steps,
                       eval_every_env_steps=args.sweep_steps // 4)
    t0 = time.perf_counter()
    tj.train(cfg, progress=False)
    single = time.perf_counter() - t0
    lrs = np.geomspace(1e-4, 3e-3, args.sweep_members).tolist()
    res = tj.sweep(cfg, {"learning_rate": lrs})
    table = res.table()
    emit({"section": "sweep", "what": "ppo_single_run", "members": 1, "env_steps_each": args.sweep_steps,
          "wall_s": single, "members_per_s": 1.0 / single})
    emit({"section": "sweep", "what": "ppo_sweep", "members": len(lrs), "env_steps_each": args.sweep_steps,
          "wall_s": res.wall_s, "members_per_s": len(lrs) / res.wall_s,
          "best_final_eval_return": float(max(r["final_eval_return"] for r in table))})


SECTIONS = {"scaling": scaling, "threshold": threshold, "sweep": sweep}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--platform", default="", help="JAX platform (cpu, cuda); default: JAX's choice")
    parser.add_argument("--sections", default="scaling,threshold,sweep")
    parser.add_argument("--envs-list", default="64,1024,8192,65536")
    parser.add_argument("--async-envs", default="1024", help="num_envs values that also run async PPO")
    parser.add_argument("--updates", type=int, default=8, help="PPO updates per scaling run")
    parser.add_argument("--raw-s", type=float, default=2.0, help="seconds per raw env measurement")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--budget", type=int, default=500_000)
    parser.add_argument("--sweep-members", type=int, default=32)
    parser.add_argument("--sweep-steps", type=int, default=102_400)
    parser.add_argument("--cap-s", type=float, default=120.0, help="seconds per section (checked between runs)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes (a smoke test of this script)")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "gpu")
    args = parser.parse_args(argv)
    if args.quick:
        args.envs_list, args.async_envs, args.updates, args.raw_s = "8,32", "32", 3, 0.2
        args.seeds, args.budget, args.sweep_members, args.sweep_steps = 1, 4096, 2, 4096
    args.envs_list = [int(x) for x in args.envs_list.split(",")]
    args.async_envs = {int(x) for x in args.async_envs.split(",") if x}
    if args.platform:
        os.environ["JAX_PLATFORMS"] = args.platform
    import jax

    jax.config.update("jax_num_cpu_devices", 1)
    import tianji_jax as tj
    from tianji_jax.run.provenance import provenance

    args.out.mkdir(parents=True, exist_ok=True)
    dev = jax.devices()[0]
    platform = dev.platform
    try:
        info = provenance()
    except Exception as e:  # a copy without git metadata, say: the run still counts
        info = {"provenance_error": repr(e), "jax": jax.__version__}
    info.update({"command": " ".join([Path(sys.executable).name, *sys.argv]), "cpu_count": os.cpu_count(),
                 "device_kind": dev.device_kind, "loadavg_start": list(os.getloadavg())})
    (args.out / f"machine_{platform}.json").write_text(json.dumps(info, indent=2, default=str) + "\n")
    print(f"platform {platform}: {jax.devices()}", flush=True)

    def emit(row: dict[str, Any]) -> None:
        _write_row(args.out, platform, {"platform": platform, "device": dev.device_kind, **row})

    for name in args.sections.split(","):
        t0 = time.perf_counter()
        try:
            SECTIONS[name](tj, jax, args, emit, t0 + args.cap_s)
        except Exception as e:  # a failed section is reported and the next one runs
            import traceback

            traceback.print_exc()
            emit({"section": name, "what": "error", "error": f"{type(e).__name__}: {e}"[:300]})
        print(f"section {name}: {time.perf_counter() - t0:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
