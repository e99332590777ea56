"""Brax physics envs on the device: ``"brax:<name>"`` ids as gymnax-interface envs.

The raw brax env (``brax.envs.get_environment(name, backend=...)``, none of brax's training
wrappers) is adapted by :class:`BraxEnv`, built on :class:`~tianji_jax.envs.suites.SuiteEnv`, so it
runs wherever gymnax ids run (Anakin and the async device actors) with every algorithm that takes a
Box action space (PPO with a Gaussian policy, SAC):

* ``step`` auto-resets, with the true successor observation in ``info["final_observation"]``;
* ``terminated`` is brax's ``done`` (a fall, or the pendulum leaving its range: hopper, walker2d, ant,
  humanoid and the pendulums end episodes this way; halfcheetah, reacher, pusher, swimmer never do);
  reaching the time limit (``episode_length`` env steps, brax's default 1000) alive is a
  **truncation**, so the learners bootstrap from ``V(final_observation)`` there;
* observations are brax's ``(observation_size,)`` float32 vector, unbounded;
* actions: a Box ``[-1, 1]^action_size`` float32, brax's convention for every env here. Envs whose
  actuators have another control range (humanoid and humanoidstandup ``[-0.4, 0.4]``, pusher
  ``[-2, 2]``, inverted_pendulum ``[-3, 3]``) rescale ``[-1, 1]`` to it in their own ``step``; the
  actuators clip to their range.

Id syntax: ``"brax:<name>"`` followed by optional ``|`` modifiers, then (optionally) the device
wrappers of :mod:`tianji_jax.envs.wrappers`: ``"brax:ant"``, ``"brax:hopper|backend=positional"``,
``"brax:inverted_pendulum|backend=spring|episode_length=200|clip_action"``. Modifiers
(:data:`BRAX_MODIFIERS`): ``backend`` is the physics pipeline (:data:`BRAX_BACKENDS`; default
:data:`DEFAULT_BACKEND`, brax's own default), ``episode_length`` the time limit. The spec's name puts
the given modifiers first, in that order, then the wrappers (``"hopper|backend=positional|clip_action"``).
``generalized`` and ``mjx`` compile for minutes on a CPU; ``positional`` and ``spring`` in seconds.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import warnings
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from tianji_jax.envs.suites import SuiteEnv

__all__ = ["BRAX_NAMES", "BRAX_BACKENDS", "DEFAULT_BACKEND", "DEFAULT_EPISODE_LENGTH", "BRAX_MODIFIERS", "REFUSED",
           "BraxEnv", "brax_installed", "make_brax_env", "resolve_brax_id"]

BRAX_NAMES = ("ant", "halfcheetah", "hopper", "humanoid", "humanoidstandup", "inverted_double_pendulum",
              "inverted_pendulum", "pusher", "reacher", "walker2d")
"""The brax envs of brax 0.14 that ``"brax:<name>"`` takes (brax's registry also has ``fast``, a
test env without physics, left out, and ``swimmer``, refused: :data:`REFUSED`)."""
REFUSED = {"swimmer": "brax 0.14.2's swimmer (its fluid forces, brax/fluid.py) calls jnp.clip(a_min=...), which "
                      "the jax this project pins (< 0.12) no longer has"}
"""brax envs that cannot run here, with the reason their refusal gives."""
BRAX_BACKENDS = ("generalized", "positional", "spring", "mjx")
"""brax's physics pipelines (``|backend=<one>``)."""
DEFAULT_BACKEND = "generalized"
"""The pipeline of an id without ``|backend=``: brax's own default for every env here."""
DEFAULT_EPISODE_LENGTH = 1000
"""The time limit in env steps of an id without ``|episode_length=`` (``brax.envs.create``'s)."""
BRAX_MODIFIERS = {
    "backend": f"one of {list(BRAX_BACKENDS)}, e.g. backend=positional (default {DEFAULT_BACKEND})",
    "episode_length": f"an integer >= 1, e.g. episode_length=500 (default {DEFAULT_EPISODE_LENGTH}; a truncation)",
}
"""The ``|`` modifiers of a brax id and the value each takes."""


def brax_installed() -> bool:
    """The ``brax`` package can be imported."""
    return importlib.util.find_spec("brax") is not None


def _brax_envs() -> Any:
    """``brax.envs``, imported with the two lines ``mujoco.mjx`` prints about its optional warp
    backend swallowed (Python prints only)."""
    with contextlib.redirect_stdout(io.StringIO()):
        import brax.envs
    return brax.envs


class BraxEnv(SuiteEnv):
    """A raw brax env as a gymnax-interface env (see the module docstring).

    ``reset(key, params) -> (obs (D,) float32, state)``; ``step(key, state, action (A,) float32,
    params) -> (obs (D,) float32, state, reward () float32, terminated () bool, truncated () bool,
    {"final_observation": (D,) float32})``; the state is :class:`~tianji_jax.envs.suites.SuiteState`
    holding brax's ``State`` and the episode's step count.

    Args:
        name: the spec's name (``"hopper|backend=positional"``).
        env: the brax env (``brax.envs.Env``: ``reset(rng)``, ``step(state, action)``,
            ``observation_size``, ``action_size``).
        time_limit: env steps after which an episode is truncated (>= 1).

    Raises:
        ValueError: ``time_limit < 1``.
    """

    def __init__(self, name: str, env: Any, time_limit: int = DEFAULT_EPISODE_LENGTH):
        if int(time_limit) < 1:
            raise ValueError(f"{name}: time_limit={time_limit}; allowed: an integer >= 1")
        self.name, self.brax_env = name, env
        self.action_size, self.action_mask_size, self.time_limit = int(env.action_size), 0, int(time_limit)

        def reset(key):
            state = env.reset(key)
            return state, jnp.reshape(state.obs, (-1,)).astype(jnp.float32)

        def step(key, state, action):  # brax's step is deterministic: the key is not needed
            state = env.step(state, jnp.asarray(action, jnp.float32))
            terminated = state.done > 0.5
            return (state, jnp.reshape(state.obs, (-1,)).astype(jnp.float32), state.reward, terminated,
                    jnp.zeros((), bool))

        self._reset, self._step = reset, step
        self._obs_size = int(jax.eval_shape(lambda: reset(jax.random.key(0)))[1].shape[0])  # traced only

    def action_space(self, params: Any = None) -> Any:
        """A gymnax Box ``[-1, 1]^(A,)`` float32 (``A = action_size``)."""
        from tianji_jax.envs.spaces import import_gymnax

        shape = (self.action_size,)
        return import_gymnax().environments.spaces.Box(np.full(shape, -1.0, np.float32),
                                                       np.full(shape, 1.0, np.float32), shape, jnp.float32)


def make_brax_env(name: str, backend: str = DEFAULT_BACKEND, episode_length: int = DEFAULT_EPISODE_LENGTH,
                  env_text: str = "", spec_name: str | None = None) -> BraxEnv:
    """The :class:`BraxEnv` of brax's ``name`` on physics pipeline ``backend``.

    Args:
        name: one of :data:`BRAX_NAMES`.
        backend: one of :data:`BRAX_BACKENDS`.
        episode_length: the time limit in env steps (a truncation), >= 1.
        env_text: the whole env id, quoted at the start of error messages.
        spec_name: the env's name (default: ``name``).

    Raises:
        ValueError: one line: brax is not installed (names the extra), an unknown name (lists
            :data:`BRAX_NAMES`), a :data:`REFUSED` env (says why), an unknown backend (lists
            :data:`BRAX_BACKENDS`), or brax refusing the env on that backend.
    """
    where = f"env={env_text or f'brax:{name}'!r}: "
    if not brax_installed():
        raise ValueError(f"{where}brax is not installed; install it with pip install \"tianji-jax[brax]\"")
    if name in REFUSED:
        raise ValueError(f"{where}brax env {name!r} is not supported: {REFUSED[name]}; allowed: {list(BRAX_NAMES)}")
    if name not in BRAX_NAMES:
        raise ValueError(f"{where}unknown brax env {name!r}; allowed: {list(BRAX_NAMES)}")
    if backend not in BRAX_BACKENDS:
        raise ValueError(f"{where}unknown brax backend {backend!r}; allowed: {list(BRAX_BACKENDS)}")
    envs = _brax_envs()
    with warnings.catch_warnings():  # brax warns on every system it loads that MJX is better maintained
        warnings.filterwarnings("ignore", message=".*not actively being maintained.*")
        try:
            env = envs.get_environment(name, backend=backend)
        except Exception as err:  # noqa: BLE001 - brax's own refusal, one line
            first = (str(err).strip().splitlines() or [""])[0]
            raise ValueError(f"{where}brax could not build {name!r} on backend {backend!r}: "
                             f"{type(err).__name__}: {first}") from None
    return BraxEnv(spec_name or name, env, episode_length)


def resolve_brax_id(env_id: str, terms: Sequence[str], env_text: str = "") -> tuple[BraxEnv, list[str]]:
    """Build the env of a brax id's name and ``|`` terms (:data:`BRAX_MODIFIERS` anywhere among
    them, each once; the other terms are device wrappers, returned in order for the caller to apply).

    Args:
        env_id: the name after ``"brax:"`` (``"hopper"``).
        terms: the ``|``-separated parts after it (``["backend=positional", "clip_action"]``).
        env_text: the whole env id, quoted at the start of error messages.

    Returns:
        ``(env, wrapper_terms)``; ``env.name`` is the name with the given modifiers in canonical
        order (``"hopper|backend=positional"``).

    Raises:
        ValueError: one line: a modifier given twice or with a bad value (gives the allowed values), a
            term that is neither a modifier nor a wrapper (lists both),
            and everything :func:`make_brax_env` refuses.
    """
    prefix = f"env={env_text or f'brax:{env_id}'!r}: "
    values: dict[str, Any] = {}
    wrappers = []
    for term in terms:
        key, eq, value = (s.strip() for s in term.strip().partition("="))
        if key not in BRAX_MODIFIERS:
            from tianji_jax.envs.wrappers import WRAPPER_SYNTAX, is_wrapper_name

            if not is_wrapper_name(key):
                raise ValueError(f"{prefix}unknown wrapper {key!r} (in {term.strip()!r}); allowed brax modifiers: "
                                 f"{list(BRAX_MODIFIERS)}; allowed wrappers: {list(WRAPPER_SYNTAX)}")
            wrappers.append(term)
            continue
        if key in values:
            raise ValueError(f"{prefix}modifier {key!r} given twice; give it once")
        ok = eq and (value in BRAX_BACKENDS if key == "backend" else value.isdigit() and int(value) >= 1)
        if not ok:
            got = f"value {value!r}" if eq else "no value"
            raise ValueError(f"{prefix}modifier {key!r} got {got}; allowed: {BRAX_MODIFIERS[key]}")
        values[key] = value if key == "backend" else int(value)
    name = env_id.strip()
    spec_name = name + "".join(f"|{k}={values[k]}" for k in BRAX_MODIFIERS if k in values)
    env = make_brax_env(name, values.get("backend", DEFAULT_BACKEND),
                        values.get("episode_length", DEFAULT_EPISODE_LENGTH), env_text, spec_name)
    return env, wrappers
