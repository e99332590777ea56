"""rejax runner for ``experiments/convergence.py`` (protocol: ``_protocol.py``); runs in its own venv
(rejax 0.1.3 with gymnax 0.0.9: rejax's ``env.step`` unpacks gymnax 0.0.x's 5-tuple).

Hyper-parameters: rejax's ``configs/gymnax/cartpole.yaml`` (ppo, dqn and pqn sections of the 0.1.x API,
copied as data below; the later ``configs/cartpole.yaml`` names DQN fields 0.1.3 does not have;
the pqn section is the same at the v0.1.3 tag and at the repository's head),
except ``eval_freq``, which is the experiment's common evaluation interval. rejax trains in one
compiled ``lax.scan`` with an evaluation callback every ``eval_freq`` env steps; the callback here
plays ``eval_episodes`` deterministic episodes (argmax of the policy logits / of Q) instead of
rejax's 128 sampled ones (its PQN acts with epsilon 0.005 there), and reports each evaluation to
the host with ``io_callback`` as the compiled program runs, so wall times are taken while training
proceeds. The program is compiled ahead of time (``jax.jit(train).lower(key).compile()``, what
the first call of the jitted function does anyway) so that ``CONV_DONE`` can report the seconds
of start-up (process start to the algorithm's creation), compilation and execution (training with
its evaluations). gymnax has no LunarLander: that row is unsupported.

SAC (gymnax ``Pendulum-v1``): rejax's tuned ``configs/gymnax/pendulum.yaml`` ``sac`` section (not shipped in
the 0.1.3 wheel; copied as data below from the repository: 1 env, buffer 10k, learning after 256 env
steps, batch 256, lr 0.01, one update per env step, gamma 0.99, polyak 0.98, swish MLP 64x64 (rejax's
default widths), observation normalization, target entropy -|A|), except its budget: 50k env steps, the
row's common budget, instead of the yaml's 10k (and ``eval_freq``, the common evaluation interval). The
deterministic evaluation action is the squashed mean of the policy, ``loc + scale * tanh(mean)``, on the
normalized observation. ``CONV_INFO`` reports ``updates_per_env_step`` (``num_epochs / num_envs`` for
SAC and DQN, rejax's updates per iteration over its env steps).
"""

from __future__ import annotations

import importlib.metadata
import time

import _protocol as P

spec = P.read_spec()
if spec["env"] not in ("CartPole-v1", "Pendulum-v1"):
    P.unsupported(f"rejax trains on gymnax/brax envs; gymnax has no {spec['env']}")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.experimental import io_callback  # noqa: E402

import rejax  # noqa: E402
from rejax.evaluate import evaluate  # noqa: E402

CARTPOLE_YAML = {  # rejax configs/gymnax/cartpole.yaml of the 0.1.x API (DQN: num_epochs, polyak)
    "ppo": dict(env="CartPole-v1", agent_kwargs={"activation": "tanh"}, num_envs=5, num_steps=100, num_epochs=5,
                num_minibatches=5, learning_rate=0.00075, max_grad_norm=0.5, total_timesteps=100_000, gamma=0.99,
                gae_lambda=0.95, clip_eps=0.2, ent_coef=0.01, vf_coef=0.5),
    "dqn": dict(env="CartPole-v1", agent="DuelingQNetwork", agent_kwargs={"activation": "swish"}, num_envs=10,
                buffer_size=50_000, fill_buffer=5_000, batch_size=100, max_grad_norm=10, learning_rate=0.001,
                num_epochs=5, total_timesteps=100_000, polyak=0.98, eps_start=1, eps_end=0.05,
                exploration_fraction=0.5, gamma=0.99, ddqn=True, normalize_observations=False),
    "pqn": dict(env="CartPole-v1", num_envs=16, num_steps=128, num_minibatches=16, max_grad_norm=10,
                learning_rate=0.0003, num_epochs=5, total_timesteps=524_288, eps_start=1, eps_end=0.05,
                exploration_fraction=0.5, gamma=0.99, td_lambda=0.9, normalize_observations=False),
}
PENDULUM_YAML = {  # rejax configs/gymnax/pendulum.yaml ``sac`` (the budget: see the module docstring)
    "sac": dict(env="Pendulum-v1", agent_kwargs={"activation": "swish"}, num_envs=1, buffer_size=10_000,
                fill_buffer=256, batch_size=256, learning_rate=0.01, num_epochs=1, total_timesteps=50_000,
                gamma=0.99, polyak=0.98, target_entropy_ratio=None, normalize_observations=True),
}
algo_name = spec["algo"]
YAML = PENDULUM_YAML if spec["env"] == "Pendulum-v1" else CARTPOLE_YAML
if algo_name not in YAML:
    P.unsupported(f"no rejax {algo_name} configuration for {spec['env']} in this experiment")
config = dict(YAML[algo_name], eval_freq=int(spec["eval_every"]), skip_initial_evaluation=True)
if spec.get("total_env_steps"):
    config["total_timesteps"] = int(spec["total_env_steps"])
updates = config.get("num_epochs", 1) / config["num_envs"] if algo_name in ("sac", "dqn") else None
P.send("CONV_INFO", {"versions": {"rejax": importlib.metadata.version("rejax"), "jax": jax.__version__,
                                  "gymnax": importlib.metadata.version("gymnax")}, "config": config,
                     "budget_env_steps": config["total_timesteps"], "updates_per_env_step": updates})

log = P.EvalLog(spec)
_started = [0.0]


def _start(step) -> np.ndarray:
    _started[0] = time.perf_counter()
    return np.zeros((), np.uint32)


def _end(step, returns) -> None:
    log.add_eval_time(time.perf_counter() - _started[0])
    log.report(int(step), [float(r) for r in np.asarray(returns)])


def greedy(algo, ts):
    if algo_name == "ppo":
        def act(obs, rng):
            dist = algo.actor.apply(ts.actor_ts.params, obs[None], method="_action_dist")
            return jnp.squeeze(jnp.argmax(dist.logits, axis=-1))
    elif algo_name == "sac":  # the squashed mean, on the normalized observation
        def mode(module, obs):
            return module.action_loc + jnp.tanh(module.action_mean(module.features(obs))) * module.action_scale

        def act(obs, rng):
            obs = algo.normalize_obs(ts.obs_rms_state, obs) if algo.normalize_observations else obs
            return jnp.squeeze(algo.actor.apply(ts.actor_ts.params, obs[None], method=mode), axis=0)
    else:  # dqn, pqn: argmax of Q (neither normalizes observations in these configs)
        def act(obs, rng):
            return jnp.squeeze(jnp.argmax(algo.agent.apply(ts.q_ts.params, obs[None]), axis=-1))
    return act


def eval_callback(algo, ts, rng):
    # the start stamp depends on the trained state (so training is over) and the evaluation on the stamp
    zero = io_callback(_start, jax.ShapeDtypeStruct((), jnp.uint32), ts.global_step, ordered=True)
    rng = jax.random.fold_in(rng, zero)
    _, returns = evaluate(greedy(algo, ts), rng, algo.env, algo.env_params, int(spec["eval_episodes"]),
                          algo.env_params.max_steps_in_episode)
    io_callback(_end, None, ts.global_step, returns, ordered=True)
    return returns


algo = rejax.get_algo(algo_name).create(**config)
algo = algo.replace(eval_callback=eval_callback)
key = jax.random.PRNGKey(int(spec["seed"]))
t_compile = time.time()
train = jax.jit(algo.train).lower(key).compile()
t_run = time.time()
ts, _ = jax.block_until_ready(train(key))
P.send("CONV_DONE", {"budget_env_steps": int(ts.global_step), "evals": log.count,
                     "startup_s": t_compile - log.t0, "compile_s": t_run - t_compile, "run_s": time.time() - t_run,
                     "eval_s": log.eval_s})
