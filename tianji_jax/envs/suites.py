"""JAX env suites on the device: Craftax, Jumanji and XLand-MiniGrid as gymnax-interface envs.

Ids are ``"<suite>:<Name>"`` (:data:`SUITES` lists each suite's ids and the pip extra that
installs it): ``"craftax:Craftax-Classic-Symbolic-v1"``, ``"jumanji:Maze-v0"``,
``"xminigrid:MiniGrid-Empty-8x8"``. Each is adapted to the gymnax interface every device runtime
runs (:class:`SuiteEnv`; Anakin and the async device actors, like a gymnax id); a Jumanji env object
given as ``env=<object>`` takes the same adapter (:func:`suite_env_of`), and a :class:`SuiteEnv` object
keeps its mask:

* ``reset(key, params) -> (obs, state)`` and ``step(key, state, action, params) -> (obs, state,
  reward, terminated, truncated, info)`` with auto-reset inside ``step`` and the true successor
  observation in ``info["final_observation"]``;
* observations are one float32 vector: the suite's observation fields flattened in their declared
  order (a Jumanji observation is a named tuple of arrays; Craftax's symbolic one is a vector
  already; XLand-MiniGrid's is its ``(view, view, 2)`` grid of tile and colour ids);
* **action masks** (Jumanji tasks whose observation has an ``action_mask``) travel as the *last*
  ``action_mask_size`` entries of the observation vector (1.0 = allowed). Every algorithm reads
  them from there (:func:`action_mask`): the mask of the next state is stored with it in replay,
  and masked greedy, masked epsilon-random and masked bootstrap maxima need nothing else;
* **multi-discrete actions** (Jumanji's ``MultiDiscreteArray``): a task without a mask
  (RubiksCube: ``[face, depth, direction]``) keeps its factored action space,
  :class:`~tianji_jax.envs.spaces.MultiDiscrete` (int32 ``(len(nvec),)`` per env; PPO only, with a
  factored categorical policy). A task whose mask is *joint* over the factors (Minesweeper: a
  ``(rows, cols)`` mask of cells; Tetris: ``(rotations, columns)``) cannot have that mask split into
  per-factor masks, so its action space is flattened to one ``Discrete(prod(nvec))`` in C order
  (the first factor most significant: :func:`unflatten_action`, Stoix's ``MultiDiscreteToDiscrete``)
  and its mask flattened in the same order, carried as above (PPO, PQN and the DQN family);
* ``terminated`` / ``truncated``: where the suite marks the end of an episode with a zero discount
  it is a termination, with discount one (or on reaching the time limit) a truncation. Craftax
  reports one ``done``: reaching ``max_timesteps`` alive is a truncation, death (or lava) a
  termination. Jumanji tasks without a time limit of their own (Game2048, Knapsack, TSP) get
  :data:`DEFAULT_TIME_LIMIT` env steps, counted as truncation; several Jumanji tasks (Maze) end on
  their own time limit with a zero discount and put the step count in the observation, which is
  kept as the task defines it (a termination; RubiksCube too). Tetris ends its episodes at its time
  limit with a zero discount but its observation's ``step_count`` is always 0 (Jumanji 1.1.2), so
  there reaching the limit (the board not full, the action allowed) is a truncation. Minesweeper
  has no time limit; an episode cannot outlast ``rows * cols - mines`` allowed steps (each reveals
  a safe cell), which is its limit here (it never binds).

Only procedurally generated tasks: nothing downloads data (XLand-MiniGrid's ``XLand-*`` ids need a
benchmark of rulesets, which it downloads, and are refused; its ``MiniGrid-*`` ids generate their
levels).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

__all__ = ["SUITES", "Suite", "SuiteEnv", "SuiteState", "SuiteParams", "make_suite_env", "action_mask", "masked",
           "random_allowed", "unflatten_action", "flatten_action", "DEFAULT_TIME_LIMIT", "MASKED", "suite_env_of"]

DEFAULT_TIME_LIMIT = 10_000
"""Env steps after which an episode of a task with no time limit of its own is truncated."""

MASKED = -1e9
"""The value a masked action's logit or Q-value takes (finite: ``0 * MASKED`` stays 0)."""


@dataclass(frozen=True)
class Suite:
    """One JAX env suite.

    Attributes:
        name: the id prefix (``"jumanji"`` in ``"jumanji:Maze-v0"``).
        package: the module it imports.
        extra: the ``pip install "tianji-jax[<extra>]"`` extra that installs it.
        ids: the supported ids (a function: listing them imports the package).
        build: ``build(id) -> SuiteEnv``.
    """

    name: str
    package: str
    extra: str
    ids: Callable[[], tuple[str, ...]]
    build: Callable[[str], "SuiteEnv"]

    def installed(self) -> bool:
        """The suite's package can be imported."""
        return importlib.util.find_spec(self.package) is not None


@struct.dataclass
class SuiteParams:
    """Env params of a suite env: the time limit, in env steps, evaluation reads (gymnax's name)."""

    max_steps_in_episode: int = struct.field(pytree_node=False, default=DEFAULT_TIME_LIMIT)


@struct.dataclass
class SuiteState:
    """The suite's own state and the steps of the current episode (int32 scalar)."""

    inner: Any
    steps: jax.Array


def _flatten(fields: list[jax.Array]) -> jax.Array:
    leaves = [leaf for f in fields for leaf in jax.tree.leaves(f)]  # a field may be a pytree (a position)
    return jnp.concatenate([jnp.reshape(leaf, (-1,)).astype(jnp.float32) for leaf in leaves])


class SuiteEnv:
    """A suite task as a gymnax-interface env (see the module docstring).

    Args:
        name: the id (without the suite prefix).
        reset_fn: ``key -> (inner_state, obs (D,) float32)``.
        step_fn: ``(key, inner_state, action) -> (inner_state, obs, reward, terminated, truncated)``.
        num_actions: ``n`` of the Discrete action space, or the ``nvec`` (a tuple of sizes) of a
            :class:`~tianji_jax.envs.spaces.MultiDiscrete` one (then ``step_fn`` takes int32
            ``(len(nvec),)`` actions, and :attr:`num_actions` is ``prod(nvec)``, the joint count).
        action_mask_size: how many trailing observation entries are the action mask (0: none).
        time_limit: env steps after which an episode is truncated.

    Raises:
        ValueError: ``num_actions < 1``, a mask size other than 0 or ``num_actions``, or a mask with a
            MultiDiscrete action space (a mask needs one Discrete action: flatten it first).
    """

    def __init__(self, name: str, reset_fn: Callable, step_fn: Callable, num_actions: int | tuple[int, ...],
                 action_mask_size: int = 0, time_limit: int = DEFAULT_TIME_LIMIT):
        self.nvec = tuple(int(n) for n in num_actions) if isinstance(num_actions, (tuple, list)) else None
        if self.nvec is not None:
            if action_mask_size or not self.nvec or min(self.nvec) < 1:
                raise ValueError(f"{name}: nvec={list(self.nvec)}, action_mask_size={action_mask_size}; allowed: "
                                 "sizes >= 1 and no mask (a joint mask needs the flattened Discrete space)")
            num_actions = int(np.prod(self.nvec))
        if num_actions < 1 or action_mask_size not in (0, num_actions):
            raise ValueError(f"{name}: num_actions={num_actions}, action_mask_size={action_mask_size}; allowed: "
                             "num_actions >= 1 and a mask of 0 or num_actions entries")
        self.name, self._reset, self._step = name, reset_fn, step_fn
        self.num_actions, self.action_mask_size, self.time_limit = int(num_actions), int(action_mask_size), int(time_limit)
        self._obs_size = int(jax.eval_shape(lambda: reset_fn(jax.random.key(0)))[1].shape[0])  # traced only

    @property
    def default_params(self) -> SuiteParams:
        """:class:`SuiteParams` with this task's time limit."""
        return SuiteParams(self.time_limit)

    def reset(self, key: jax.Array, params: SuiteParams | None = None) -> tuple[jax.Array, SuiteState]:
        """``(obs (D,) float32, state)`` of a new episode."""
        inner, obs = self._reset(key)
        return obs, SuiteState(inner, jnp.zeros((), jnp.int32))

    def step(self, key: jax.Array, state: SuiteState, action: jax.Array, params: SuiteParams | None = None):
        """One step with auto-reset: ``(obs, state, reward () float32, terminated () bool, truncated ()
        bool, {"final_observation": obs before the reset})``."""
        limit = self.time_limit if params is None else params.max_steps_in_episode
        k_step, k_reset = jax.random.split(key)
        inner, obs, reward, terminated, truncated = self._step(k_step, state.inner, action)
        steps = state.steps + 1
        terminated = jnp.asarray(terminated, bool)
        truncated = (jnp.asarray(truncated, bool) | (steps >= limit)) & ~terminated
        done = terminated | truncated
        new_inner, new_obs = self._reset(k_reset)
        inner = jax.tree.map(lambda a, b: jnp.where(done, a, b), new_inner, inner)
        next_obs = jnp.where(done, new_obs, obs)
        return (next_obs, SuiteState(inner, jnp.where(done, 0, steps)), jnp.asarray(reward, jnp.float32),
                terminated, truncated, {"final_observation": obs})

    def observation_space(self, params: Any = None) -> Any:
        """A gymnax Box ``(D,)`` float32 (the mask entries, if any, in [0, 1])."""
        from tianji_jax.envs.spaces import import_gymnax

        low = np.full((self._obs_size,), -np.inf, np.float32)
        high = np.full((self._obs_size,), np.inf, np.float32)
        if self.action_mask_size:
            low[-self.action_mask_size:], high[-self.action_mask_size:] = 0.0, 1.0
        return import_gymnax().environments.spaces.Box(low, high, (self._obs_size,), jnp.float32)

    def action_space(self, params: Any = None) -> Any:
        """A gymnax Discrete of ``num_actions``, or a :class:`~tianji_jax.envs.spaces.MultiDiscrete` of
        ``nvec`` (gymnax has no such space)."""
        from tianji_jax.envs.spaces import MultiDiscrete, import_gymnax

        if self.nvec is not None:
            return MultiDiscrete(self.nvec)
        return import_gymnax().environments.spaces.Discrete(self.num_actions)


def action_mask(obs: jax.Array, size: int) -> jax.Array | None:
    """The allowed actions ``(..., size)`` bool carried in the last ``size`` entries of ``obs``
    ``(..., D)``, or None when ``size`` is 0. A state with no allowed action (an episode's last)
    allows every action, so a maximum over it stays finite."""
    if not size:
        return None
    mask = obs[..., -size:] > 0.5
    return mask | ~jnp.any(mask, axis=-1, keepdims=True)


def masked(values: jax.Array, obs: jax.Array, size: int) -> jax.Array:
    """``values (..., A)`` (logits or Q-values) with the actions ``obs``'s mask forbids set to
    :data:`MASKED`; ``values`` unchanged when ``size`` is 0. Masked greedy (argmax), masked
    sampling (categorical over the logits) and the masked bootstrap maximum all follow."""
    mask = action_mask(obs, size)
    return values if mask is None else jnp.where(mask, values, MASKED)


def random_allowed(key: jax.Array, obs: jax.Array, size: int, num_actions: int) -> jax.Array:
    """``(B,)`` int32 actions drawn uniformly among the allowed ones of each row of ``obs (B, D)``
    (all ``num_actions`` when ``size`` is 0: ``jax.random.randint``, as without masks)."""
    mask = action_mask(obs, size)
    if mask is None:
        return jax.random.randint(key, obs.shape[:1], 0, num_actions, dtype=jnp.int32)
    return jax.random.categorical(key, jnp.where(mask, 0.0, MASKED), axis=-1).astype(jnp.int32)


def unflatten_action(action: jax.Array, nvec: tuple[int, ...]) -> jax.Array:
    """The factored action ``(..., len(nvec))`` int32 of a flat ``Discrete(prod(nvec))`` action
    ``(...)`` int, in C order: the first factor is the most significant digit (``a = ((a0 * n1) + a1)
    * n2 + a2``, Stoix's ``MultiDiscreteToDiscrete``), the order a ``(n0, n1, ...)`` mask flattens in."""
    return jnp.stack(jnp.unravel_index(jnp.asarray(action, jnp.int32), tuple(nvec)), axis=-1).astype(jnp.int32)


def flatten_action(action: jax.Array, nvec: tuple[int, ...]) -> jax.Array:
    """The inverse of :func:`unflatten_action`: ``(..., len(nvec))`` int -> ``(...)`` int32."""
    parts = tuple(jnp.asarray(action, jnp.int32)[..., k] for k in range(len(nvec)))
    return jnp.ravel_multi_index(parts, tuple(nvec), mode="clip").astype(jnp.int32)


# ---- Craftax ----------------------------------------------------------------------------------------
_CRAFTAX_IDS = ("Craftax-Classic-Symbolic-v1", "Craftax-Symbolic-v1")


def _craftax(env_id: str) -> SuiteEnv:
    from craftax.craftax_env import make_craftax_env_from_name

    env = make_craftax_env_from_name(env_id, auto_reset=False)
    params = env.default_params

    def reset(key):
        obs, state = env.reset(key, params)
        return state, jnp.reshape(obs, (-1,)).astype(jnp.float32)

    def step(key, state, action):
        obs, state, reward, done, _ = env.step(key, state, action, params)
        alive_at_limit = ~env.is_terminal(state.replace(timestep=jnp.zeros_like(state.timestep)), params)
        truncated = done & (state.timestep >= params.max_timesteps) & alive_at_limit
        return state, jnp.reshape(obs, (-1,)).astype(jnp.float32), reward, done & ~truncated, truncated

    return SuiteEnv(env_id, reset, step, env.num_actions, 0, int(params.max_timesteps))


# ---- Jumanji ----------------------------------------------------------------------------------------
_JUMANJI_IDS = ("Game2048-v1", "Maze-v0", "Knapsack-v1", "Snake-v1", "TSP-v1", "SlidingTilePuzzle-v0",
                "RubiksCube-v0", "Minesweeper-v0", "Tetris-v0")


def _jumanji_obs(observation: Any, mask_size: int) -> jax.Array:
    fields = [getattr(observation, f) for f in observation._fields if f != "action_mask"]
    if mask_size:
        fields.append(observation.action_mask)  # flattened in C order, as unflatten_action numbers the actions
    return _flatten(fields)


def _tetris_at_limit(env: Any, prev: Any, new: Any, action: jax.Array) -> jax.Array:
    """Tetris ended its episode only because of its time limit (the board not full, the action
    allowed): a truncation, since its observation's step count is always 0."""
    allowed = prev.action_mask[action[0], action[1]]
    return (new.step_count >= env.time_limit) & jnp.any(new.action_mask) & allowed


_AT_LIMIT: dict[str, Callable] = {"Tetris-v0": _tetris_at_limit}
"""Tasks whose time-limit ends (zero discount) are truncations: ``(env, state, next_state, action) -> bool``."""
_TIME_LIMITS: dict[str, Callable] = {"Minesweeper-v0": lambda env: env.num_rows * env.num_cols - env.num_mines}
"""Tasks without a ``time_limit`` whose episodes are bounded anyway: ``env -> steps``."""


def _jumanji(env_id: str, env: Any = None, name: str | None = None) -> SuiteEnv:
    """The adapter of Jumanji task ``env_id`` (an id of :data:`_JUMANJI_IDS`): of ``jumanji.make(env_id)``,
    or of ``env``, an object of that task's class (:func:`suite_env_of`), named ``name`` (default the id)."""
    import jumanji

    env = jumanji.make(env_id) if env is None else env
    spec = env.action_spec
    nvec = tuple(int(n) for n in np.reshape(getattr(spec, "num_values", ()), (-1,)))
    if not hasattr(spec, "num_values") or np.ndim(spec.num_values) > 1:
        raise ValueError(f"jumanji:{env_id}: its action space is {type(spec).__name__}; allowed: a discrete or "
                         f"multi-discrete action (ids: {list(_JUMANJI_IDS)})")
    multi, has_mask = np.ndim(spec.num_values) == 1, "action_mask" in vars(env.observation_spec)
    n = int(np.prod(nvec))
    if has_mask and tuple(env.observation_spec.action_mask.shape) != (nvec if multi else (n,)):
        raise ValueError(f"jumanji:{env_id}: action mask of shape {env.observation_spec.action_mask.shape} does not "
                         f"match the action sizes {list(nvec)}")
    mask_size = n if has_mask else 0
    factored = multi and not has_mask  # a joint mask: flattened to one Discrete(n), actions unflattened for the env
    to_env = (lambda a: unflatten_action(a, nvec)) if multi and has_mask else (lambda a: a)
    at_limit = _AT_LIMIT.get(env_id)

    def reset(key):
        state, ts = env.reset(key)
        return state, _jumanji_obs(ts.observation, mask_size)

    def step(key, state, action):
        action = to_env(action)
        new, ts = env.step(state, action)
        last = ts.last()
        terminated = last & (ts.discount == 0)
        if at_limit is not None:
            terminated = terminated & ~at_limit(env, state, new, action)
        return new, _jumanji_obs(ts.observation, mask_size), ts.reward, terminated, last & ~terminated

    limit = _TIME_LIMITS[env_id](env) if env_id in _TIME_LIMITS else getattr(env, "time_limit", None)
    return SuiteEnv(name or env_id, reset, step, nvec if factored else n, mask_size,
                    DEFAULT_TIME_LIMIT if limit is None else int(limit))


def suite_env_of(env: Any) -> SuiteEnv | None:
    """A suite's own env object given as ``env=<object>`` through that suite's adapter (the one its
    id takes, mask and time-limit rules included): a Jumanji ``Environment`` of a task of
    :data:`SUITES` (``jumanji.make("Maze-v0")``, or a ``Maze(...)`` of other sizes) becomes the
    :class:`SuiteEnv` of its task, named by its class. None for any other object (resolved as a
    gymnax-style env).

    Raises:
        ValueError: one line naming ``env``: a Jumanji env object of a task not offered here (a
            wrapper or another task; lists the task classes that are).
    """
    if not (type(env).__module__ or "").startswith("jumanji."):
        return None
    import jumanji

    if not isinstance(env, jumanji.env.Environment):
        return None
    by_class = {i.partition("-v")[0]: i for i in _JUMANJI_IDS}
    env_id = by_class.get(type(env).__name__)
    if env_id is None:
        raise ValueError(f"env: a jumanji env object of type {type(env).__name__} is not supported; allowed: an "
                         f"object of {sorted(by_class)} (unwrapped), or an id 'jumanji:<id>' of {list(_JUMANJI_IDS)}")
    return _jumanji(env_id, env, type(env).__name__)


# ---- XLand-MiniGrid ---------------------------------------------------------------------------------
def _xminigrid_ids() -> tuple[str, ...]:
    import xminigrid

    return tuple(i for i in xminigrid.registered_environments() if i.startswith("MiniGrid-"))


def _xminigrid(env_id: str) -> SuiteEnv:
    import xminigrid

    env, params = xminigrid.make(env_id)

    def reset(key):
        ts = env.reset(params, key)
        return ts, _flatten([ts.observation])

    def step(key, ts, action):
        ts = env.step(params, ts, action)
        last = ts.last()
        terminated = last & (ts.discount == 0)
        return ts, _flatten([ts.observation]), ts.reward, terminated, last & ~terminated

    return SuiteEnv(env_id, reset, step, int(env.num_actions(params)), 0, int(params.max_steps))


SUITES: dict[str, Suite] = {
    "craftax": Suite("craftax", "craftax", "craftax", lambda: _CRAFTAX_IDS, _craftax),
    "jumanji": Suite("jumanji", "jumanji", "jumanji", lambda: _JUMANJI_IDS, _jumanji),
    "xminigrid": Suite("xminigrid", "xminigrid", "xminigrid", _xminigrid_ids, _xminigrid),
}
"""The suites by id prefix."""


def make_suite_env(suite: str, env_id: str, env_text: str = "") -> SuiteEnv:
    """The :class:`SuiteEnv` of ``"<suite>:<env_id>"``.

    Raises:
        ValueError: one line: the suite's package is not installed (names the extra), or an id the
            suite does not support here (lists the supported ids).
    """
    where = f"env={env_text or f'{suite}:{env_id}'!r}: "
    info = SUITES[suite]
    if not info.installed():
        raise ValueError(f"{where}the {suite} suite is not installed; install it with "
                         f"pip install \"tianji-jax[{info.extra}]\"")
    ids = info.ids()
    if env_id not in ids:
        why = (" (XLand-* ids sample rulesets from benchmarks that are downloaded on first use; only the "
               "procedurally generated MiniGrid-* ids are offered)" if suite == "xminigrid" and env_id.startswith("XLand")
               else "")
        raise ValueError(f"{where}unknown or unsupported {suite} id {env_id!r}{why}; allowed: {list(ids)}")
    return info.build(env_id)
