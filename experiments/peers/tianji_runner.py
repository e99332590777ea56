"""tianji_jax runner for ``experiments/convergence.py`` (protocol: ``_protocol.py``).

Modes: ``anakin`` (acting and learning fused in one compiled chunk), ``sync`` / ``one_step`` /
``relaxed`` (the async runtime's schedules; DQN has ``sync`` and ``relaxed``: ``sync`` is one actor
acting chunk k with the params published after chunk k-1, as an Anakin iteration; ``relaxed`` is
the TianJi mode with the lag gate at insert, ``max_policy_lag`` 4). Hyper-parameters: the
library's defaults for CartPole-v1 (``PPOConfig()`` = CleanRL's tuned CartPole PPO with 8 envs,
``DQNConfig()`` = CleanRL/PureJaxRL DQN plus Double DQN and 3-step targets); for LunarLander PPO
on envpool ``LunarLander-v2``, the rl-baselines3-zoo LunarLander PPO settings (16 envs x 1024
steps, minibatch 64, 4 epochs, gamma 0.999, lambda 0.98, entropy 0.01, lr 3e-4 constant); for
LunarLander DQN, the rl-baselines3-zoo ``dqn.yml`` LunarLander-v2 entry (the one SB3 DQN runs
with, ``sb3_runner.py``) in tianji_jax's fields: 1 env, 4 env steps per iteration (``train_freq``
4) with one gradient update per env step (``gradient_steps`` -1 -> ``replay_ratio`` 1), lr 6.3e-4,
batch 128, buffer 50k, hard target copy every 250 updates (= 250 env steps), epsilon 1 -> 0.1 over
12% of the 100k-step budget, gamma 0.99, 256-256 ReLU MLP, Huber loss (delta 1, SB3's smooth L1),
plain (not Double) 1-step DQN as SB3's; learning from 128 transitions (SB3 starts at 0 and
samples with replacement; tianji_jax needs one batch in replay).
Spec ``hp`` ``"sb3"`` on the MuJoCo rows: rl-baselines3-zoo's tuned HalfCheetah / Hopper PPO (``ZOO_PPO``
below, ``experiments/ppo_mujoco.py``). Spec ``hp`` ``"sb3"`` (the ``sb3-hp`` system, CartPole-v1 PPO): rl-baselines3-zoo's tuned CartPole
PPO, as ``sb3_runner.py`` runs it: 8 envs x 32 steps, one minibatch of 256, 20 epochs, gamma 0.98,
lambda 0.8, no entropy bonus, lr 1e-3 annealed linearly to 0 over the 100k-step budget; the zoo
also anneals the clip range 0.2 -> 0, which tianji_jax does not (clip 0.2 throughout).
PQN (``tj.PQNConfig``, Anakin only): the library's defaults, the PQN paper's CartPole settings (32 envs
x 64 steps, 4 epochs x 16 minibatches, lr 1e-4, epsilon 1 -> 0.05 over 20% of the budget, lambda
0.95, LayerNorm MLP 128x2); spec ``hp`` ``"rejax"`` (the ``rejax-hp`` system): rejax's tuned CartPole
PQN (``configs/gymnax/cartpole.yaml``, as ``rejax_runner.py`` runs it: 16 envs x 128 steps, 5 epochs
x 16 minibatches, lr 3e-4, epsilon 1 -> 0.05 over 50% of 524,288 env steps, lambda 0.9, LayerNorm MLP
64x64, gradient clipping at 10: rejax clips each gradient element, tianji_jax the global norm). On
LunarLander (envpool) the library rejects Anakin: unsupported.
SAC (``tj.SACConfig``, Anakin only, gymnax ``Pendulum-v1``): the library's defaults (4 envs x 1 step,
replay ratio 1, batch 256, Adam 3e-4 for actor, critics and temperature, tau 0.005, MLP 256-256 relu,
1000 uniform random warm-up steps, 50k env steps).
Spec ``hp`` ``"steps8"`` / ``"steps1"`` (CartPole-v1 DQN, Anakin or async ``relaxed``): ``DQNConfig()``'s
defaults with ``num_steps=8`` (the default since it was measured faster; each iteration, and each
async actor chunk, is 8 steps of the 10 envs; the replay ratio 0.1 then gives 8 gradient updates
per iteration) or ``num_steps=1`` (the earlier default: one update per iteration).
Distributional DQN on CartPole-v1 (spec ``hp`` ``"c51"`` / ``"qr"`` / ``"dist-plain"``, Anakin): the
settings of ``tests/learning/test_dqn_distributional.py`` (``tests/dqn_settings.py``'s ``CARTPOLE_FAST``, copied
below as data: 10 envs x 8 steps, replay ratio 0.25, batch 64, lr 1e-3, MLP 256-256, Polyak tau 0.005,
Double DQN, 3-step targets, buffer 10k, learning from 10k env steps, epsilon 1 -> 0.02 over 18,750 env
steps), with a budget of 80k env steps instead of the test's 150k (the epsilon decay fraction is
rescaled so that it ends at the same 18,750 env steps); ``"c51"``: ``distributional="c51"``, 51 atoms
on [0, 100]; ``"qr"``: ``distributional="qr"``, 51 quantiles; ``"dist-plain"``: the same settings with
plain (expected-value) DQN. ``CONV_INFO`` reports ``updates_per_env_step`` (gradient updates per env
step once learning has started) and ``startup_s`` (process start to the end of the config, just before
``train()``; also in ``CONV_DONE``, measured there just before ``train()``). ``CONV_DONE``'s
``backend_compile_s``: the seconds JAX spent in XLA backend compilation in the process (loads from a
warm persistent cache count as such, so it is small then).
Spec ``hp`` ``"brax"`` (``experiments/ppo_brax.py``, env ``inverted_pendulum``: brax's id
``brax:inverted_pendulum|backend=positional``): brax's published inverted_pendulum PPO settings in
``PPOConfig``'s fields (``BRAX_PPO`` below), Anakin or async ``sync``. Spec ``stop_at_return`` (any row):
the run stops at its first evaluation at or above it (``PPOConfig.stop_at_return``).
Evaluation time (the library's evaluator, its compilation included) is measured by wrapping the
evaluator factories of :mod:`tianji_jax.run.host_on_policy` and :mod:`tianji_jax.run.host_replay` (looked up there by
``train`` and ``evaluate``); nothing in the library is changed. ``CONV_DONE``'s ``tail_compile_s``
is always None now: the library runs an Anakin run's last, shorter chunk with the same compiled
program as its full ones (the results committed before that change measured a background
compilation of it).
"""

from __future__ import annotations

import time

import _protocol as P

spec = P.read_spec()

import jax  # noqa: E402

if spec["mode"] != "anakin":  # async: actor on cpu:0, learner on cpu:1 (docs/runtime.md, "Placement")
    jax.config.update("jax_num_cpu_devices", 2)
_COMPILE_S = [0.0]  # XLA backend compile-or-load seconds of this process (CONV_DONE's backend_compile_s)
jax.monitoring.register_event_duration_secs_listener(
    lambda event, secs, **_: _COMPILE_S.__setitem__(0, _COMPILE_S[0] + secs)
    if event == "/jax/core/compile/backend_compile_duration" else None)

import tianji_jax as tj  # noqa: E402
from tianji_jax.run import host_on_policy, host_replay  # noqa: E402
from tianji_jax.run.provenance import provenance  # noqa: E402

log = P.EvalLog(spec)


def _timed_factory(factory):
    def make(*args, **kwargs):
        fn = factory(*args, **kwargs)

        def timed(*a, **k):
            t = time.perf_counter()
            out = jax.block_until_ready(fn(*a, **k))
            log.add_eval_time(time.perf_counter() - t)
            return out

        return timed

    return make


host_on_policy.on_policy_evaluator = _timed_factory(host_on_policy.on_policy_evaluator)
host_replay.replay_evaluator = _timed_factory(host_replay.replay_evaluator)

ENVS = {"CartPole-v1": {"gymnax": "gymnax:CartPole-v1", "envpool": "envpool:CartPole-v1"},
        "LunarLander": {"envpool": "envpool:LunarLander-v2"}, "Pendulum-v1": {"gymnax": "gymnax:Pendulum-v1"},
        "HalfCheetah": {"envpool": "envpool:HalfCheetah-v4"}, "Hopper": {"envpool": "envpool:Hopper-v4"},
        "inverted_pendulum": {"gymnax": "brax:inverted_pendulum|backend=positional"}}
# brax's published inverted_pendulum PPO settings (experiments/ppo_brax.py, peers/brax_runner.py) in PPOConfig's
# fields (spec ``hp`` ``"brax"``): 2048 envs x 80 steps per update (brax: 16 unrolls of 5 per env per training
# step, GAE within each unroll; here GAE over the 80 steps), 4 epochs x 32 minibatches, gamma 0.97, lambda 0.95,
# clip 0.3, entropy 1e-2, Adam 3e-4 constant, observation normalisation, no gradient clipping (1e6 never binds);
# tianji_jax's default 64-64 tanh networks with a state-independent Gaussian, no constant reward scaling (brax: 10)
BRAX_PPO = dict(num_envs=2048, num_steps=80, update_epochs=4, num_minibatches=32, learning_rate=3e-4, anneal_lr=False,
                gamma=0.97, gae_lambda=0.95, clip_eps=0.3, ent_coef=1e-2, vf_coef=0.5, max_grad_norm=1e6,
                normalize_observations=True, hidden_sizes=(64, 64), activation="tanh")
# CleanRL's ppo_continuous_action.py in PPOConfig's fields (experiments/ppo_mujoco.py; spec ``hp`` ``"cleanrl"``,
# and ``"cleanrl-raw"`` without normalisation): actions clipped to the Box bounds, 1 env x 2048 steps
CLEANRL_PPO = dict(num_envs=1, num_steps=2048, update_epochs=10, num_minibatches=32, learning_rate=3e-4, anneal_lr=True,
                   gamma=0.99, gae_lambda=0.95, clip_eps=0.2, clip_value_loss=True, ent_coef=0.0, vf_coef=0.5,
                   max_grad_norm=0.5, hidden_sizes=(64, 64), activation="tanh", normalize_advantages=True)
# rl-baselines3-zoo's tuned ppo.yml HalfCheetah-v3 / Hopper-v3 entries, as sb3_runner.py runs them (spec ``hp``
# ``"sb3"`` on the MuJoCo rows, experiments/ppo_mujoco.py): 1 env x 512 steps, minibatches of 64 (HalfCheetah)
# / 32 (Hopper), constant Adam rate, no value clipping, separate 256-256 ReLU actor and critic, log-std init -2,
# observation normalisation and reward scaling (VecNormalize's, clip 10), actions clipped to the Box bounds.
# Not replicated: SB3's ``ortho_init=False`` (torch's default init; tianji_jax's networks are orthogonal)
_ZOO_NET = dict(hidden_sizes=(256, 256), activation="relu", log_std_init=-2.0, clip_value_loss=False, anneal_lr=False,
                normalize_advantages=True, normalize_observations=True, scale_rewards=True, num_envs=1, num_steps=512)
ZOO_PPO = {"HalfCheetah": dict(num_minibatches=8, gamma=0.98, learning_rate=2.0633e-05, ent_coef=0.000401762,
                               clip_eps=0.1, update_epochs=20, gae_lambda=0.92, max_grad_norm=0.8, vf_coef=0.58096,
                               **_ZOO_NET),
           "Hopper": dict(num_minibatches=16, gamma=0.999, learning_rate=9.80828e-05, ent_coef=0.00229519, clip_eps=0.2,
                          update_epochs=5, gae_lambda=0.99, max_grad_norm=0.7, vf_coef=0.835671, **_ZOO_NET)}
# tests/dqn_settings.py CARTPOLE_FAST (the distributional DQN learning tests), less its evaluation and stop
# settings; budget 80k env steps with the test's epsilon decay of 0.125 * 150k = 18,750 env steps
DIST_BUDGET = 80_000
DIST_HP = dict(num_steps=8, replay_ratio=0.25, batch_size=64, learning_rate=1e-3, hidden_sizes=(256, 256),
               target_update_period=None, tau=0.005, epsilon_end=0.02, epsilon_decay_fraction=18_750 / DIST_BUDGET,
               total_env_steps=DIST_BUDGET)
# Stable-Baselines3 SAC's defaults in SACConfig's fields (experiments/sac_halfcheetah.py): 1 env, one gradient
# update per env step, batch 256, Adam 3e-4 (actor, critics, temperature), gamma 0.99, tau 0.005, MLP 256-256 relu,
# temperature learned from 1.0 towards -|A|, 1-step targets, a buffer larger than the budget, no gradient clipping
# (SB3 clips none; 1e6 never binds); learning_starts is the benchmark's choice (spec ``sac``)
SB3_SAC = dict(num_envs=1, num_steps=1, replay_ratio=1.0, batch_size=256, learning_rate=3e-4, gamma=0.99, tau=0.005,
               hidden_sizes=(256, 256), activation="relu", init_alpha=1.0, autotune=True, n_step=1,
               buffer_capacity=1_000_000, max_grad_norm=1e6, learning_starts=1000)
DIST_KIND = {"c51": dict(distributional="c51", v_min=0.0, v_max=100.0), "qr": dict(distributional="qr"),
             "dist-plain": {}}


def make_config():
    env, algo, mode = spec["env"], spec["algo"], spec["mode"]
    common = dict(seed=int(spec["seed"]), eval_every_env_steps=int(spec["eval_every"]),
                  eval_episodes=int(spec["eval_episodes"]))
    if spec.get("total_env_steps"):
        common["total_env_steps"] = int(spec["total_env_steps"])
    env_id = ENVS[env].get("gymnax") or ENVS[env]["envpool"]
    if algo == "sac" and env == "HalfCheetah":  # experiments/sac_halfcheetah.py: SB3's SAC defaults
        if mode not in ("sync", "relaxed"):
            P.unsupported(f"SAC on envpool HalfCheetah-v4 runs on the async runtime ('sync' / 'relaxed'), not {mode!r}")
        return tj.SACConfig(env=env_id, runtime="async", schedule=mode, **{**SB3_SAC, **common,
                                                                            **spec.get("sac", {})})
    if algo == "sac":  # the library's defaults (gymnax Pendulum-v1)
        if env != "Pendulum-v1" or mode != "anakin":
            P.unsupported(f"the convergence experiment runs SAC in Anakin mode on Pendulum-v1 only, not {mode!r} "
                          f"on {env}")
        return tj.SACConfig(env=env_id, runtime="anakin", **common)
    if algo == "dqn" and spec.get("hp") in DIST_KIND:  # tests/learning/test_dqn_distributional.py's settings
        if env != "CartPole-v1" or mode != "anakin":
            P.unsupported("the distributional DQN variants are defined for CartPole-v1 in Anakin mode only")
        return tj.DQNConfig(env=env_id, runtime="anakin", **{**DIST_HP, **DIST_KIND[spec["hp"]], **common})
    if algo == "ppo" and spec.get("hp") in ("cleanrl", "cleanrl-raw"):  # experiments/ppo_mujoco.py
        if env not in ("HalfCheetah", "Hopper") or mode == "anakin":
            P.unsupported("the cleanrl variants are defined for the MuJoCo rows on the async runtime only")
        norm = spec["hp"] == "cleanrl"
        return tj.PPOConfig(env=env_id + "|clip_action", runtime="async", schedule=mode,
                            normalize_observations=norm, scale_rewards=norm,
                            **{**CLEANRL_PPO, "total_env_steps": 1_000_000, **common})
    if algo == "ppo" and spec.get("hp") == "sb3" and env in ZOO_PPO:  # experiments/ppo_mujoco.py
        if mode == "anakin":
            P.unsupported("the MuJoCo sb3 variants run on the async runtime only (envpool host envs)")
        return tj.PPOConfig(env=env_id + "|clip_action", runtime="async", schedule=mode,
                            **{**ZOO_PPO[env], "total_env_steps": 1_000_000, **common})
    if algo == "ppo" and spec.get("hp") == "brax":  # experiments/ppo_brax.py
        if env != "inverted_pendulum" or mode not in ("anakin", "sync"):
            P.unsupported("the brax variant is defined for inverted_pendulum in Anakin and async 'sync' modes only")
        return tj.PPOConfig(env=env_id, runtime="anakin" if mode == "anakin" else "async",
                            **({} if mode == "anakin" else {"schedule": mode}), **{**BRAX_PPO, **common})
    if algo == "ppo" and spec.get("hp") == "sb3":  # rl-baselines3-zoo ppo.yml CartPole-v1, as sb3_runner.py
        if env != "CartPole-v1":
            P.unsupported("the sb3-hp variant is defined for CartPole-v1 only")
        common.update(num_envs=8, num_steps=32, num_minibatches=1, update_epochs=20, gamma=0.98, gae_lambda=0.8,
                      ent_coef=0.0, learning_rate=1e-3, anneal_lr=True,
                      total_env_steps=common.get("total_env_steps", 100_000))
        return tj.PPOConfig(env=env_id, runtime=mode if mode == "anakin" else "async",
                            **({} if mode == "anakin" else {"schedule": mode}), **common)
    if algo == "pqn":  # the library's defaults (the PQN paper's CartPole settings), or rejax's tuned ones
        if spec.get("hp") == "rejax":  # rejax configs/gymnax/cartpole.yaml ``pqn``, as rejax_runner.py runs it
            if env != "CartPole-v1":
                P.unsupported("the rejax-hp variant is defined for CartPole-v1 only")
            common.update(num_envs=16, num_steps=128, num_minibatches=16, update_epochs=5, learning_rate=3e-4,
                          max_grad_norm=10.0, hidden_sizes=(64, 64), activation="relu", q_lambda=0.9, gamma=0.99,
                          epsilon_start=1.0, epsilon_finish=0.05, epsilon_anneal_fraction=0.5,
                          total_env_steps=common.get("total_env_steps", 524_288))
        if mode != "anakin":
            P.unsupported(f"the convergence experiment runs PQN in Anakin mode only, not {mode!r}")
        return tj.PQNConfig(env=env_id, runtime="anakin", **common)
    if algo == "ppo":
        extra = {} if env == "CartPole-v1" else dict(
            num_envs=16, num_steps=1024, num_minibatches=256, update_epochs=4, gamma=0.999, gae_lambda=0.98,
            ent_coef=0.01, learning_rate=3e-4, anneal_lr=False, total_env_steps=common.get("total_env_steps",
                                                                                          1_015_808))
        common.update(extra)
        if mode == "anakin":
            return tj.PPOConfig(env=env_id, runtime="anakin", **common)
        return tj.PPOConfig(env=env_id, runtime="async", schedule=mode, **common)
    if env == "LunarLander":  # rl-baselines3-zoo dqn.yml LunarLander-v2 (see the module docstring)
        common = {**dict(num_envs=1, num_steps=4, replay_ratio=1.0, learning_rate=6.3e-4, batch_size=128,
                      buffer_capacity=50_000, learning_starts=128, gamma=0.99, target_update_period=250,
                      epsilon_start=1.0, epsilon_end=0.1, epsilon_decay_fraction=0.12, hidden_sizes=(256, 256),
                      activation="relu", huber_delta=1.0, double_q=False, n_step=1, total_env_steps=100_000),
                  **common}
    if spec.get("hp") in ("steps8", "steps1"):  # DQNConfig()'s defaults with 8 (the default) or 1 env steps per env per iteration
        if env != "CartPole-v1":
            P.unsupported(f"the {spec['hp']} variant is defined for CartPole-v1 only")
        common["num_steps"] = int(spec["hp"][5:])  # replay ratio 0.1 kept: 10 envs x 8 steps x 0.1 = 8 updates per iteration
    if mode == "anakin":
        return tj.DQNConfig(env=env_id, runtime="anakin", **common)
    if mode not in ("sync", "relaxed"):
        P.unsupported(f"DQNConfig's async runtime has the schedules 'sync' and 'relaxed', not {mode!r}")
    return tj.DQNConfig(env=env_id, runtime="async", schedule=mode, **common)


try:
    config = make_config()
    if spec.get("stop_at_return") is not None:  # experiments/ppo_brax.py: the run ends at the threshold
        config = config.replace(stop_at_return=float(spec["stop_at_return"]))
except ValueError as err:  # e.g. Anakin on a host env (envpool): the library rejects the config
    P.unsupported(f"not yet supported by tianji_jax: {err}")

P.send("CONV_INFO", {"versions": {"tianji_jax": provenance()["packages"].get("tianji-jax", "?"),
                                  "jax": jax.__version__},
                     "config": config.to_dict(), "budget_env_steps": config.env_steps,
                     "updates_per_env_step": getattr(config, "replay_ratio", None),
                     "startup_s": time.time() - float(spec["t0"])})


def on_row(row):
    if row.get("eval_return_mean") == row.get("eval_return_mean"):  # not NaN
        log.report(int(row["env_steps"]), float(row["eval_return_mean"]))


if spec.get("profile"):  # convergence.py --profile: where the time to the threshold goes (not a measurement)
    import json
    from pathlib import Path

    run_dir = Path(spec["tmp_dir"]) / "profiled"
    startup_s = time.time() - float(spec["t0"])  # interpreter, imports, config: before train() starts
    tj.train(config.replace(stop_at_return=float(spec["threshold"])), run_dir=run_dir, profile=True, progress=False,
             callback=on_row, tensorboard=False)
    P.send("CONV_PROFILE", {"startup_s": startup_s, "process_s": time.time() - float(spec["t0"]),
                            "timers": json.loads((run_dir / "profile" / "timers.json").read_text())})
else:
    startup_s = time.time() - float(spec["t0"])  # interpreter, imports, config: before train() starts
    run_dir = None
    if spec.get("timers"):  # sac_halfcheetah.py: the phase timers of metrics.csv, summed over its rows
        from pathlib import Path

        run_dir = Path(spec["tmp_dir"]) / "run"
    tj.train(config, progress=False, callback=on_row, tensorboard=False, **({"run_dir": run_dir} if run_dir else {}))
timers = None
if spec.get("timers") and not spec.get("profile"):
    import csv

    with open(run_dir / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    timers = {k: [float(r[k]) if r.get(k) not in (None, "") else None for r in rows]
              for k in ("env_steps", "wall_time_s", "rollout_s", "inference_s", "env_step_s", "h2d_s", "update_s",
                        "actor_wait_frac", "learner_wait_frac")}
P.send("CONV_DONE", {"budget_env_steps": config.env_steps, "evals": log.count,
                     "tail_compile_s": None, "startup_s": startup_s, "timers": timers,
                     "backend_compile_s": _COMPILE_S[0]})
