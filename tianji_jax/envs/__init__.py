"""Env layer: spaces, the Timestep protocol, registry, the gymnax backend, device env wrappers and the
host envs' latency wrapper."""

from tianji_jax.envs.core import Timestep
from tianji_jax.envs.gymnax_env import GymnaxVecEnv, VecEnvState
from tianji_jax.envs.latency import LatencyVecEnv
from tianji_jax.envs.registry import BACKENDS, EnvSpec, resolve_env
from tianji_jax.envs.spaces import Box, Discrete, MultiDiscrete
from tianji_jax.envs.wrappers import ClipAction, FrameStack, ObservationMask, apply_wrappers

__all__ = ["Timestep", "GymnaxVecEnv", "VecEnvState", "EnvSpec", "resolve_env", "BACKENDS", "Box", "Discrete",
           "MultiDiscrete", "ClipAction", "FrameStack", "ObservationMask", "apply_wrappers", "LatencyVecEnv"]
