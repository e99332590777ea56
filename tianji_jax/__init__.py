"""tianji_jax: highly parallel deep-RL training in JAX (TianJi, AAAI 2025).

Public API::

    import tianji_jax as tj
    config = tj.PPOConfig(env="gymnax:CartPole-v1", total_env_steps=500_000)
    result = tj.train(config, run_dir="runs/cartpole")      # host loop over compiled chunks
    trainer = tj.make_train(config)                        # the compiled chunk itself
    tj.evaluate(config, result.state, num_episodes=10)
"""

# First: JAX's persistent compilation cache (sets jax.config options only; starts no backend).
from tianji_jax.caches import cache_dir, clear_caches, enable_persistent_cache, pin_cpu_collective_schedule

pin_cpu_collective_schedule()
enable_persistent_cache()

from tianji_jax import compat

compat.install()  # the module paths that moved stay importable, as aliases of the new ones

from tianji_jax.algos.registry import Algorithm, algorithm_names, register_algorithm
from tianji_jax.config import CheckpointConfig, DQNConfig, PPOConfig, PQNConfig, SACConfig, load_config
from tianji_jax.run.evaluation import EvalResult
from tianji_jax.runtime.anakin import OnPolicyAnakin, OnPolicyTrainState, PPOAnakin, PPOTrainState, make_train
from tianji_jax.runtime.anakin import DQNAnakin, DQNTrainState, ReplayAnakin, ReplayTrainState, make_dqn_train
from tianji_jax.training import METRIC_COLUMNS, LoadedRun, TrainResult, evaluate, load, load_params, train
from tianji_jax.sweep import SweepResult, sweep, traced_hyperparameters

__version__ = "0.1.0"

__all__ = [
    "PPOConfig", "make_train", "train", "evaluate", "load_params", "TrainResult", "PPOTrainState", "PPOAnakin",
    "EvalResult", "METRIC_COLUMNS", "__version__",
    "PQNConfig", "SACConfig", "OnPolicyTrainState", "OnPolicyAnakin",
    "DQNConfig", "make_dqn_train", "DQNTrainState", "DQNAnakin", "ReplayTrainState", "ReplayAnakin",
    "sweep", "SweepResult", "traced_hyperparameters",
    "CheckpointConfig", "load", "LoadedRun", "load_config", "clear_caches", "cache_dir",
    "Algorithm", "register_algorithm", "algorithm_names",
]
