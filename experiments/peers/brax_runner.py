"""brax's own PPO trainer (``brax.training.agents.ppo.train``) as a runner of ``experiments/ppo_brax.py``
(protocol: ``_protocol.py``), in its own venv (brax 0.14.2 with jax 0.7.2: brax 0.14.2's trainer calls
``jax.device_put_replicated``, which the jax that tianji_jax pins, 0.10.2, no longer has).

Env: brax's ``inverted_pendulum`` on the ``positional`` pipeline (spec ``env`` ``"inverted_pendulum"``), an
episode length of 1000 (brax's training wrappers: auto-reset, the time limit a truncation).
Hyper-parameters (spec ``hp``):

* ``"brax"``: brax's published settings for ``inverted_pendulum`` (its training notebook,
  ``notebooks/training.ipynb``): 2048 envs, unroll length 5, batch size 1024 x 32 minibatches (one training
  step = 1024 * 32 * 5 = 163,840 env steps), 4 passes, gamma 0.97, GAE lambda 0.95 (brax's default), clip 0.3
  (default), entropy cost 1e-2, Adam 3e-4 constant, reward scaling 10, observation normalisation, no gradient
  clipping; brax's default networks: policy MLP 32x4 swish with a tanh-squashed Gaussian, value MLP 256x5 swish.
* ``"64x64-tanh"``: the same with tianji_jax's default networks in brax's factory: policy and value MLPs 64-64
  tanh (the policy distribution stays brax's tanh-squashed Gaussian).

Evaluation: brax's evaluator on ``eval_episodes`` envs, one full episode each, deterministic policy
(``deterministic_eval=True``; brax's default is stochastic), every ``eval_every`` env steps rounded to whole
training steps (brax's ``num_evals``), and once before training (env steps 0). ``eval_s`` is brax's own
``eval/walltime`` (cumulative). The run stops after the first evaluation at or above spec ``stop_at_return``
(the progress callback raises; brax has no early stop), or at ``total_env_steps``.
"""

from __future__ import annotations

import functools
import math
import time

import _protocol as P

spec = P.read_spec()

import jax  # noqa: E402
from flax import linen  # noqa: E402

with __import__("contextlib").redirect_stdout(__import__("io").StringIO()):  # mjx's two lines about warp
    import brax  # noqa: E402
    from brax import envs  # noqa: E402
    from brax.training.agents.ppo import networks as ppo_networks  # noqa: E402
    from brax.training.agents.ppo import train as ppo  # noqa: E402

log = P.EvalLog(spec)
if spec["env"] != "inverted_pendulum":
    P.unsupported(f"the brax runner is defined for inverted_pendulum only, not {spec['env']!r}")
HP = dict(num_envs=2048, unroll_length=5, batch_size=1024, num_minibatches=32, num_updates_per_batch=4,
          discounting=0.97, gae_lambda=0.95, clipping_epsilon=0.3, entropy_cost=1e-2, learning_rate=3e-4,
          reward_scaling=10.0, normalize_observations=True, episode_length=1000, action_repeat=1)
NETS = {"brax": {}, "64x64-tanh": dict(policy_hidden_layer_sizes=(64, 64), value_hidden_layer_sizes=(64, 64),
                                        activation=linen.tanh)}
hp = spec.get("hp") or "brax"
if hp not in NETS:
    P.unsupported(f"unknown brax hp {hp!r}; allowed: {sorted(NETS)}")
step_size = HP["batch_size"] * HP["num_minibatches"] * HP["unroll_length"]  # env steps per training step
budget = int(spec["total_env_steps"])
per_eval = max(1, round(int(spec["eval_every"]) / step_size))  # training steps between evaluations
num_evals = max(2, math.ceil(budget / (per_eval * step_size)) + 1)  # + the one before training
threshold = spec.get("stop_at_return")


class _Reached(Exception):
    """Raised by the progress callback at the threshold: brax's trainer has no early stop."""


def progress(step: int, metrics) -> None:
    ret = float(metrics["eval/episode_reward"])
    log.eval_s = float(metrics.get("eval/walltime", log.eval_s))
    log.report(int(step), ret)
    if threshold is not None and ret >= float(threshold):
        raise _Reached


env = envs.get_environment("inverted_pendulum", backend="positional")
P.send("CONV_INFO", {"versions": {"brax": brax.__version__, "jax": jax.__version__},
                     "config": {**HP, "networks": hp, "num_timesteps": budget, "num_evals": num_evals,
                                "num_eval_envs": int(spec["eval_episodes"]), "deterministic_eval": True,
                                "env_steps_per_training_step": step_size},
                     "budget_env_steps": budget, "startup_s": time.time() - float(spec["t0"])})
try:
    ppo.train(environment=env, num_timesteps=budget, num_evals=num_evals, num_eval_envs=int(spec["eval_episodes"]),
              deterministic_eval=True, seed=int(spec["seed"]), progress_fn=progress,
              network_factory=functools.partial(ppo_networks.make_ppo_networks, **NETS[hp]), **HP)
except _Reached:
    pass
P.send("CONV_DONE", {"budget_env_steps": budget, "evals": log.count})
