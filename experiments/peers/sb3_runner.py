"""Stable-Baselines3 runner for ``experiments/convergence.py`` (protocol: ``_protocol.py``); runs in
its own venv (torch 2.13.0 CPU wheel, stable-baselines3, gymnasium[box2d]) with one torch thread.

Hyper-parameters: rl-baselines3-zoo's tuned ``hyperparams/ppo.yml`` and ``dqn.yml`` entries for
CartPole-v1 and LunarLander, and ``ppo.yml``'s HalfCheetah-v3 / Hopper-v3 entries with ``VecNormalize``
(``experiments/ppo_mujoco.py``) (copied as data below; ``lin_x`` = linear decay from x to 0, as in the
zoo). gymnasium ``CartPole-v1`` and ``LunarLander-v3`` (the zoo's LunarLander-v2 entry; gymnasium
1.x renamed the env). Evaluation: ``evaluate_policy`` with ``deterministic=True`` on a separate
env, from a callback at the first training step past each multiple of ``eval_every`` env steps.
"""

from __future__ import annotations

import time

import _protocol as P

spec = P.read_spec()

import torch  # noqa: E402

torch.set_num_threads(int(spec.get("threads", 1)))

import gymnasium as gym  # noqa: E402
import stable_baselines3 as sb3  # noqa: E402
from stable_baselines3.common.callbacks import BaseCallback  # noqa: E402
from stable_baselines3.common.env_util import make_vec_env  # noqa: E402
from stable_baselines3.common.evaluation import evaluate_policy  # noqa: E402

ZOO = {
    ("ppo", "CartPole-v1"): dict(n_envs=8, n_timesteps=100_000, n_steps=32, batch_size=256, gae_lambda=0.8,
                                 gamma=0.98, n_epochs=20, ent_coef=0.0, learning_rate="lin_0.001", clip_range="lin_0.2"),
    ("ppo", "LunarLander"): dict(n_envs=16, n_timesteps=1_000_000, n_steps=1024, batch_size=64, gae_lambda=0.98,
                                 gamma=0.999, n_epochs=4, ent_coef=0.01),
    ("dqn", "CartPole-v1"): dict(n_envs=1, n_timesteps=50_000, learning_rate=2.3e-3, batch_size=64,
                                 buffer_size=100_000, learning_starts=1000, gamma=0.99, target_update_interval=10,
                                 train_freq=256, gradient_steps=128, exploration_fraction=0.16,
                                 exploration_final_eps=0.04, policy_kwargs={"net_arch": [256, 256]}),
    ("dqn", "LunarLander"): dict(n_envs=1, n_timesteps=100_000, learning_rate=6.3e-4, batch_size=128,
                                 buffer_size=50_000, learning_starts=0, gamma=0.99, target_update_interval=250,
                                 train_freq=4, gradient_steps=-1, exploration_fraction=0.12,
                                 exploration_final_eps=0.1, policy_kwargs={"net_arch": [256, 256]}),
}
# experiments/sac_halfcheetah.py: SB3 SAC's own defaults (written out), with the benchmark's learning_starts
ZOO[("sac", "HalfCheetah")] = dict(n_envs=1, n_timesteps=10_000, learning_rate=3e-4, buffer_size=1_000_000,
                                   learning_starts=1000, batch_size=256, tau=0.005, gamma=0.99, train_freq=1,
                                   gradient_steps=1, ent_coef="auto", target_update_interval=1, target_entropy="auto",
                                   policy_kwargs={"net_arch": [256, 256]})
# experiments/ppo_mujoco.py: the zoo's tuned ppo.yml HalfCheetah-v3 / Hopper-v3 entries (run on the v4 envs);
# ``normalize`` = VecNormalize on observations and rewards (the zoo's ``normalize: true``); ``policy_kwargs``
# log_std_init -2, ortho_init False, ReLU, separate 256-256 actor and critic
_MUJOCO_NET = {"log_std_init": -2, "ortho_init": False, "activation_fn": "relu", "net_arch": {"pi": [256, 256], "vf": [256, 256]}}
ZOO[("ppo", "HalfCheetah")] = dict(normalize=True, n_envs=1, n_timesteps=1_000_000, batch_size=64, n_steps=512,
                                   gamma=0.98, learning_rate=2.0633e-05, ent_coef=0.000401762, clip_range=0.1,
                                   n_epochs=20, gae_lambda=0.92, max_grad_norm=0.8, vf_coef=0.58096,
                                   policy_kwargs=_MUJOCO_NET)
ZOO[("ppo", "Hopper")] = dict(normalize=True, n_envs=1, n_timesteps=1_000_000, batch_size=32, n_steps=512,
                              gamma=0.999, learning_rate=9.80828e-05, ent_coef=0.00229519, clip_range=0.2, n_epochs=5,
                              gae_lambda=0.99, max_grad_norm=0.7, vf_coef=0.835671, policy_kwargs=_MUJOCO_NET)
GYM_IDS = {"CartPole-v1": "CartPole-v1", "LunarLander": "LunarLander-v3", "HalfCheetah": "HalfCheetah-v4",
           "Hopper": "Hopper-v4"}


def linear(x0: float):
    return lambda progress_remaining: progress_remaining * x0


hp = {**ZOO[(spec["algo"], spec["env"])], **spec.get("sac", {})}
n_envs, budget = hp["n_envs"], int(spec.get("total_env_steps") or hp["n_timesteps"])
P.send("CONV_INFO", {"versions": {"stable-baselines3": sb3.__version__, "torch": torch.__version__,
                                  "gymnasium": gym.__version__, "torch_threads": torch.get_num_threads()},
                     "config": hp, "env_id": GYM_IDS[spec["env"]], "budget_env_steps": budget,
                     **({"updates_per_env_step": 1.0} if spec["algo"] == "sac" else {})})
del hp["n_envs"], hp["n_timesteps"]
normalize = hp.pop("normalize", False)
if "policy_kwargs" in hp and isinstance(hp["policy_kwargs"].get("activation_fn"), str):
    hp["policy_kwargs"] = {**hp["policy_kwargs"], "activation_fn": getattr(torch.nn, {"relu": "ReLU"}[
        hp["policy_kwargs"]["activation_fn"]])}
for k in ("learning_rate", "clip_range"):
    if isinstance(hp.get(k), str):
        hp[k] = linear(float(hp[k].split("_")[1]))

seed = int(spec["seed"])
env = make_vec_env(GYM_IDS[spec["env"]], n_envs=n_envs, seed=seed)
if normalize:  # the zoo's ``normalize: true``; evaluation on raw returns with the training statistics, frozen
    from stable_baselines3.common.vec_env import VecNormalize

    env = VecNormalize(env, gamma=hp["gamma"])
    eval_env = VecNormalize(make_vec_env(GYM_IDS[spec["env"]], n_envs=1, seed=10_000 + seed), training=False,
                            norm_reward=False)
else:
    eval_env = gym.make(GYM_IDS[spec["env"]])
    eval_env.reset(seed=10_000 + seed)
cls = {"ppo": sb3.PPO, "dqn": sb3.DQN, "sac": sb3.SAC}[spec["algo"]]
model = cls("MlpPolicy", env, seed=seed, verbose=0, device="cpu", **hp)
TIMERS = {"update_s": 0.0, "rollout_s": 0.0, "updates": 0}  # spec ``timers``: seconds in SB3's two phases


def _timed(name, fn):
    def wrapped(*a, **k):
        t = time.perf_counter()
        out = fn(*a, **k)
        TIMERS[name] += time.perf_counter() - t
        if name == "update_s":
            TIMERS["updates"] += int(k.get("gradient_steps", a[0] if a else 0))
        return out
    return wrapped


if spec.get("timers"):  # off-policy: train() = the gradient steps, collect_rollouts() = acting (evaluation inside)
    model.train = _timed("update_s", model.train)
    model.collect_rollouts = _timed("rollout_s", model.collect_rollouts)
log = P.EvalLog(spec)
every = int(spec["eval_every"])


class EvalEvery(BaseCallback):
    def __init__(self):
        super().__init__()
        self.next = every
        self.last = -1  # env steps of the last evaluation

    def _on_step(self) -> bool:
        if self.num_timesteps >= self.next:
            self.next += every * ((self.num_timesteps - self.next) // every + 1)
            t = time.perf_counter()
            if normalize:
                eval_env.obs_rms = env.obs_rms.copy()
            returns, _ = evaluate_policy(self.model, eval_env, n_eval_episodes=int(spec["eval_episodes"]),
                                         deterministic=True, return_episode_rewards=True)
            log.add_eval_time(time.perf_counter() - t)
            log.report(self.num_timesteps, [float(r) for r in returns])
            self.last = self.num_timesteps
        return True


callback = EvalEvery()
model.learn(total_timesteps=budget, callback=callback)
if callback.last < model.num_timesteps:  # the budget ended between two evaluations: evaluate its end
    callback.next = model.num_timesteps
    callback.num_timesteps = model.num_timesteps
    callback._on_step()
P.send("CONV_DONE", {"budget_env_steps": int(model.num_timesteps), "evals": log.count,
                     **({"timers": TIMERS} if spec.get("timers") else {})})
