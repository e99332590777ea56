"""RLlib runner for ``experiments/convergence.py`` (protocol: ``_protocol.py``); runs in its own venv
(torch 2.13.0 CPU wheel, ``ray[rllib]==2.60.0``, which moves gymnasium to 1.2.x).

Hyper-parameters: RLlib's tuned examples ``rllib/tuned_examples/ppo/cartpole_ppo.py`` (one
32-unit linear layer shared by policy and value, lr 3e-4, 6 epochs, vf_loss_coeff 0.01, KL loss;
200k env steps) and ``rllib/tuned_examples/dqn/cartpole_dqn.py`` (dueling double DQN, prioritised
replay 50k, n-step 2..5, epsilon 1 -> 0.02 over 10k steps, batch 32, lr 5e-4, 256-unit layers;
200k env steps), on the new API stack with RLlib's default env runners; for LunarLander the same
configs on gymnasium ``LunarLander-v3`` with a 1M / 200k budget (RLlib ships no tuned LunarLander
example for the new stack). Ray runs as a private local instance (``address="local"``, 127.0.0.1,
no dashboard, a private temp dir, usage stats off) so it never joins another process's cluster.
Evaluation: ``eval_episodes`` episodes with the greedy action of the trained RLModule
(``forward_inference``: DQN's greedy ``actions``, PPO's argmax of the action-distribution inputs) on a separate env in this
process, after the first ``train()`` iteration past each multiple of ``eval_every`` env steps.
"""

from __future__ import annotations

import os
import time

import _protocol as P

spec = P.read_spec()
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

import gymnasium as gym  # noqa: E402
import numpy as np  # noqa: E402
import ray  # noqa: E402
import torch  # noqa: E402
from ray.rllib.algorithms.dqn import DQNConfig  # noqa: E402
from ray.rllib.algorithms.ppo import PPOConfig  # noqa: E402
from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig  # noqa: E402

torch.set_num_threads(int(spec.get("threads", 1)))
GYM_IDS = {"CartPole-v1": "CartPole-v1", "LunarLander": "LunarLander-v3"}
BUDGETS = {("ppo", "CartPole-v1"): 200_000, ("dqn", "CartPole-v1"): 200_000,
           ("ppo", "LunarLander"): 1_000_000, ("dqn", "LunarLander"): 200_000}
env_id, seed = GYM_IDS[spec["env"]], int(spec["seed"])
budget = int(spec.get("total_env_steps") or BUDGETS[(spec["algo"], spec["env"])])
gym.make(env_id).close()  # a missing Box2D fails here, before Ray starts

if spec["algo"] == "ppo":
    config = (PPOConfig().environment(env_id)
              .rl_module(model_config=DefaultModelConfig(fcnet_hiddens=[32], fcnet_activation="linear",
                                                         vf_share_layers=True))
              .training(gamma=0.99, lr=0.0003, num_epochs=6, vf_loss_coeff=0.01, use_kl_loss=True))
else:
    config = (DQNConfig().environment(env=env_id)
              .training(lr=0.0005, train_batch_size_per_learner=32,
                        replay_buffer_config={"type": "PrioritizedEpisodeReplayBuffer", "capacity": 50000,
                                              "alpha": 0.6, "beta": 0.4},
                        n_step=(2, 5), double_q=True, dueling=True, epsilon=[(0, 1.0), (10000, 0.02)])
              .rl_module(model_config=DefaultModelConfig(fcnet_hiddens=[256], fcnet_activation="tanh",
                                                         fcnet_bias_initializer="zeros_",
                                                         head_fcnet_bias_initializer="zeros_",
                                                         head_fcnet_hiddens=[256])))
config = config.debugging(seed=seed)
P.send("CONV_INFO", {"versions": {"ray": ray.__version__, "torch": torch.__version__, "gymnasium": gym.__version__},
                     "config": {k: v for k, v in config.to_dict().items()
                                if k in ("lr", "gamma", "num_epochs", "vf_loss_coeff", "use_kl_loss", "n_step",
                                         "double_q", "dueling", "epsilon", "train_batch_size_per_learner",
                                         "num_env_runners", "num_envs_per_env_runner", "replay_buffer_config",
                                         "model_config")},
                     "env_id": env_id, "budget_env_steps": budget})

ray.init(address="local", _node_ip_address="127.0.0.1", include_dashboard=False, _temp_dir=spec["tmp_dir"],
         num_cpus=2, log_to_driver=False, configure_logging=False)
try:
    algo = config.build_algo()
    module = algo.get_module()
    eval_env = gym.make(env_id)
    log = P.EvalLog(spec)

    def evaluate() -> list[float]:
        returns = []
        for ep in range(int(spec["eval_episodes"])):
            obs, _ = eval_env.reset(seed=10_000 * (seed + 1) + ep + 100 * log.count)
            done, total = False, 0.0
            while not done:
                with torch.no_grad():
                    out = module.forward_inference({"obs": torch.as_tensor(obs[None], dtype=torch.float32)})
                if "actions" in out:  # DQN's forward_inference returns the greedy (argmax-Q) actions
                    action = int(out["actions"].numpy()[0])
                else:  # PPO: the mode of the categorical over the action-distribution inputs
                    action = int(np.argmax(out["action_dist_inputs"].numpy()[0]))
                obs, r, term, trunc, _ = eval_env.step(action)
                total += float(r)
                done = term or trunc
            returns.append(total)
        return returns

    every, next_eval, steps = int(spec["eval_every"]), int(spec["eval_every"]), 0
    while steps < budget:
        result = algo.train()
        steps = int(result["env_runners"]["num_env_steps_sampled_lifetime"])
        if steps >= next_eval or steps >= budget:
            next_eval += every * ((steps - next_eval) // every + 1)
            t = time.perf_counter()
            module = algo.get_module()
            returns = evaluate()
            log.add_eval_time(time.perf_counter() - t)
            log.report(steps, returns)
    P.send("CONV_DONE", {"budget_env_steps": steps, "evals": log.count})
finally:
    ray.shutdown()
