"""What the host backends of :mod:`tianji_jax.envs.host` share: the step batch, spaces, id checks, episodes.

Holds :class:`HostStep` (one batch of host env steps), :func:`quiet_envpool_spaces`,
:func:`from_gymnasium_space`, :func:`envpool_ids` and :func:`gymnasium_ids`, the env-id and
``num_envs`` checks, the per-env validity and episode-statistics tracker, and ``_HostVecEnv``,
the validation and bookkeeping base class of both backends. :mod:`tianji_jax.envs.host`
re-exports the public names and is the import path to use; its docstring gives the auto-reset,
validity and episode-statistics semantics implemented here.
"""

from __future__ import annotations

import contextlib
import difflib
import warnings
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np

from tianji_jax.envs.spaces import Box, Discrete

__all__ = ["HostStep", "quiet_envpool_spaces", "from_gymnasium_space", "observation_space", "flatten_observation",
           "envpool_ids", "gymnasium_ids"]


@dataclass(frozen=True, eq=False)
class HostStep:
    """One batch of ``B`` env steps on the host (numpy arrays, row ``i`` is env ``env_id[i]``).

    Attributes:
        env_id: ``(B,)`` int32, the env of each row (unique within a batch).
        obs: ``(B, *obs_shape)`` (the backend's dtype: float32 for CartPole, uint8 for Atari) the
            observation to act on next. For a done step it is the episode's final obs (the action
            taken on it will be ignored by the env); for an invalid step, the new first obs.
        reward: ``(B,)`` float32 reward of this step (as the env returns it, clipped if the env
            clips; 0 on invalid steps).
        terminated: ``(B,)`` bool, a terminal state was reached (no bootstrap). With envpool's
            ``episodic_life=True`` a lost life counts as terminal.
        truncated: ``(B,)`` bool, the episode was cut by a time limit (bootstrap from
            ``final_obs``).
        final_obs: ``(B, *obs_shape)`` true successor observation of this step (same values as
            ``obs`` for the next-step auto-reset backends here, see the module docstring).
        valid: ``(B,)`` bool, False for a reset step (the first obs after :meth:`reset` or the step
            after a done one): not a transition, to be dropped from losses and statistics.
        episode_return: ``(B,)`` float32, undiscounted return of the episode (Atari: the game)
            that ended at this step, 0 where none ended.
        episode_length: ``(B,)`` int32, valid steps of that episode, 0 where none ended (so
            ``episode_length > 0`` marks the rows where an episode for statistics ended).
    """

    env_id: np.ndarray
    obs: np.ndarray
    reward: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    final_obs: np.ndarray
    valid: np.ndarray
    episode_return: np.ndarray
    episode_length: np.ndarray

    @property
    def done(self) -> np.ndarray:
        """``(B,)`` bool, ``terminated | truncated``: the env resets on its next step."""
        return self.terminated | self.truncated

    def __len__(self) -> int:
        """Number of rows ``B``."""
        return int(self.env_id.shape[0])


@contextlib.contextmanager
def quiet_envpool_spaces() -> Iterator[None]:
    """Silence gymnasium's "Box ... precision lowered by casting to float32" warnings while
    envpool builds its spaces: envpool declares float32 Boxes with float64 bounds (not
    actionable for the user; the bounds are cast exactly as gymnasium says)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*precision lowered by casting to float32", category=UserWarning)
        yield


def from_gymnasium_space(space: Any) -> Discrete | Box:
    """Convert a gymnasium space (as envpool and gymnasium expose them) into :class:`Discrete`/:class:`Box`.

    Args:
        space: a ``gymnasium.spaces.Discrete`` (with ``start == 0``) or ``gymnasium.spaces.Box``.

    Returns:
        The matching :class:`Discrete` or :class:`Box` (bounds as float64 arrays of ``shape``).

    Raises:
        ValueError: another space type (Dict, Tuple, MultiDiscrete, ...), or a Discrete space whose
            ``start`` is not 0; the message names the type found and what is allowed.
    """
    import gymnasium.spaces as gs

    if isinstance(space, gs.Discrete):
        if int(space.start) != 0:
            raise ValueError(f"space: Discrete with start={int(space.start)} is not supported; "
                             "allowed: Discrete spaces starting at 0")
        return Discrete(int(space.n))
    if isinstance(space, gs.Box):
        shape = tuple(int(s) for s in space.shape)
        low = np.broadcast_to(np.asarray(space.low, dtype=np.float64), shape).copy()
        high = np.broadcast_to(np.asarray(space.high, dtype=np.float64), shape).copy()
        return Box(shape, np.dtype(space.dtype), low, high)
    if isinstance(space, gs.MultiDiscrete):
        raise ValueError(f"space: {space!r} is not supported on a host backend (envpool, gymnasium take Discrete "
                         "and Box actions); allowed: Discrete, Box (MultiDiscrete actions: the device suites, e.g. "
                         "jumanji:RubiksCube-v0, with PPO)")
    raise ValueError(f"space: unsupported space {type(space).__name__}; allowed: Discrete, Box")


def observation_space(space: Any) -> tuple[Box, tuple[str, ...] | None]:
    """The :class:`Box` an agent sees for a host env's gymnasium observation space, and the keys
    of a flattened Dict.

    A ``Box`` passes through (:func:`from_gymnasium_space`; keys None). A ``Dict`` of Boxes (e.g.
    envpool's DeepMind Control tasks: ``position``, ``velocity``, ...) becomes one float32 vector:
    every component flattened and concatenated in the Dict's key order (:func:`flatten_observation`),
    with unbounded limits (envpool's Dict specs report meaningless ones).

    Raises:
        ValueError: another space type, or a Dict component that is not a Box; the message names
            the component and what is allowed.
    """
    import gymnasium.spaces as gs

    if not isinstance(space, gs.Dict):
        return from_gymnasium_space(space), None
    keys = tuple(space.spaces)
    for key in keys:
        if not isinstance(space.spaces[key], gs.Box):
            raise ValueError(f"space: Dict observation component {key!r} is a {type(space.spaces[key]).__name__}; "
                             "allowed: Dict observations whose components are all Box (flattened into one vector)")
    size = sum(int(np.prod(space.spaces[key].shape)) for key in keys)
    return Box((size,), np.dtype(np.float32), np.full(size, -np.inf), np.full(size, np.inf)), keys


def flatten_observation(obs: Any, keys: tuple[str, ...], batch: int) -> np.ndarray:
    """``(batch, D)`` float32: the Dict observation batch ``obs`` (key -> ``(batch, *shape)``)
    flattened per row and concatenated in ``keys`` order (:func:`observation_space`)."""
    return np.concatenate([np.asarray(obs[key]).reshape(batch, -1) for key in keys], axis=1).astype(np.float32)


def envpool_ids() -> list[str]:
    """All env ids envpool can make (``envpool.list_all_envs()``), e.g. ``"CartPole-v1"``, ``"Pong-v5"``."""
    import envpool

    return list(envpool.list_all_envs())


def gymnasium_ids() -> list[str]:
    """All env ids registered with gymnasium (``gymnasium.registry``), e.g. ``"CartPole-v1"``."""
    import gymnasium

    return sorted(gymnasium.registry.keys())


def _check_id(env_id: Any, known: list[str], backend: str, listing: str) -> None:
    if not isinstance(env_id, str) or env_id not in known:
        close = difflib.get_close_matches(str(env_id), known, n=5, cutoff=0.4)
        raise ValueError(f"env_id={env_id!r}: unknown {backend} env id; closest known ids: "
                         f"{close or known[:5]} (all: {listing})")


def _check_num_envs(num_envs: Any) -> int:
    if isinstance(num_envs, bool) or not isinstance(num_envs, (int, np.integer)) or num_envs < 1:
        raise ValueError(f"num_envs={num_envs!r}: must be an integer >= 1")
    return int(num_envs)


class _EpisodeTracker:
    """Validity and per-episode statistics of ``N`` envs, keyed by env id.

    ``expect_reset[e]`` is True when env ``e``'s next step is a reset step (initially True: the
    first obs after a reset is not a transition). Returns accumulate in float64.
    """

    def __init__(self, num_envs: int):
        self.expect_reset = np.ones((num_envs,), bool)
        self.ret = np.zeros((num_envs,), np.float64)
        self.length = np.zeros((num_envs,), np.int64)

    def restart(self) -> None:
        """Forget everything: every env's next step is a reset step, statistics are zero."""
        self.expect_reset[:] = True
        self.ret[:] = 0.0
        self.length[:] = 0

    def update(self, env_id: np.ndarray, stat_reward: np.ndarray, done: np.ndarray,
               episode_end: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Account one batch (``env_id`` unique). Returns ``(valid, episode_return, episode_length)``.

        ``episode_end`` (a subset of ``done``) says where an episode for statistics ends (a game
        over for Atari, else any done).
        """
        valid = ~self.expect_reset[env_id]
        self.ret[env_id] += np.where(valid, stat_reward, 0.0)
        self.length[env_id] += valid
        end = valid & done & episode_end
        ep_ret = np.where(end, self.ret[env_id], 0.0).astype(np.float32)
        ep_len = np.where(end, self.length[env_id], 0).astype(np.int32)
        self.ret[env_id] = np.where(end, 0.0, self.ret[env_id])
        self.length[env_id] = np.where(end, 0, self.length[env_id])
        self.expect_reset[env_id] = done
        return valid, ep_ret, ep_len


class _HostVecEnv:
    """Validation and bookkeeping shared by the host backends."""

    num_envs: int
    observation_space: Box
    action_space: Discrete | Box
    obs_keys: tuple[str, ...] | None = None  # a Dict observation's keys, flattened in this order

    def _init_spaces(self, obs_space: Any, act_space: Any, name: str) -> None:
        try:
            self.observation_space, self.obs_keys = observation_space(obs_space)
            self.action_space = from_gymnasium_space(act_space)
        except ValueError as err:
            raise ValueError(f"env_id={name!r}: {err}") from None
        if not isinstance(self.observation_space, Box):
            raise ValueError(f"env_id={name!r}: observation space must be a Box, got "
                             f"{self.observation_space!r}")

    def check_env_id(self, env_id: Any, expected: np.ndarray) -> np.ndarray:
        """Check that ``env_id`` is exactly the set of envs awaiting an action, in any order.

        Args:
            env_id: ``(B,)`` integer array of env ids.
            expected: the env ids awaiting an action (all envs in sync mode; the ids of the last
                received batch in async mode).

        Returns:
            ``env_id`` as an int32 array. The ``expected`` array itself (the env id array of the
            last :class:`HostStep`, handed back unchanged as an actor does) is returned unchecked.

        Raises:
            ValueError: not a 1-D integer array, duplicates, or a set different from ``expected``;
                the message gives the ids expected.
        """
        if env_id is expected and expected.dtype == np.int32:  # the env's own array, handed back
            return expected
        ids = np.asarray(env_id)
        exp = np.sort(np.asarray(expected))
        if (ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer)
                or ids.shape[0] != exp.shape[0] or not np.array_equal(np.sort(ids), exp)):
            raise ValueError(
                f"env_id: expected a 1-D integer array holding each of the env ids awaiting an "
                f"action exactly once, {exp.tolist()} (in any order), got "
                f"{ids.tolist() if ids.size <= 64 else ids.shape} dtype {ids.dtype}")
        return ids.astype(np.int32)

    def check_actions(self, actions: Any, batch: int) -> np.ndarray:
        """Check an action batch and convert it to the dtype the env takes.

        Args:
            actions: ``(B,)`` integers in ``[0, n)`` for :class:`Discrete`, or ``(B, *shape)``
                floats for :class:`Box` (not clipped to the bounds here).
            batch: ``B``, the number of env ids the actions are for.

        Returns:
            int32 actions (Discrete) or actions cast to the space's dtype (Box).

        Raises:
            ValueError: wrong shape, wrong dtype kind (integer for Discrete, floating for Box), or
                a Discrete index out of range; the message gives what is allowed.
        """
        a = np.asarray(actions)
        space = self.action_space
        want = (batch, *space.shape)
        if isinstance(space, Discrete):
            ok_kind = np.issubdtype(a.dtype, np.integer)
            kind = "integer"
        else:
            ok_kind = np.issubdtype(a.dtype, np.floating)
            kind = "floating"
        if a.shape != want or not ok_kind:
            raise ValueError(f"actions: expected shape {want} and {kind} dtype for {space!r} and "
                             f"{batch} env ids, got shape {a.shape} dtype {a.dtype}")
        if isinstance(space, Discrete):
            if a.size and (a.min() < 0 or a.max() >= space.n):
                raise ValueError(f"actions: Discrete({space.n}) indices must lie in [0, {space.n}), "
                                 f"got min {a.min()} max {a.max()}")
            return a.astype(np.int32)
        return a.astype(space.dtype)

    def _make_step(self, env_id: np.ndarray, obs: np.ndarray, reward: np.ndarray,
                   terminated: np.ndarray, truncated: np.ndarray, stat_reward: np.ndarray,
                   episode_end: np.ndarray) -> HostStep:
        env_id = np.asarray(env_id, np.int32)
        obs = flatten_observation(obs, self.obs_keys, env_id.shape[0]) if self.obs_keys else np.asarray(obs)
        reward = np.asarray(reward, np.float32)
        terminated = np.asarray(terminated, bool)
        truncated = np.asarray(truncated, bool)
        done = terminated | truncated
        valid, ep_ret, ep_len = self._tracker.update(
            env_id, np.asarray(stat_reward, np.float64), done, np.asarray(episode_end, bool))
        return HostStep(env_id=env_id, obs=obs, reward=reward, terminated=terminated,
                        truncated=truncated, final_obs=obs, valid=valid,
                        episode_return=ep_ret, episode_length=ep_len)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:  # pragma: no cover - overridden
        raise NotImplementedError
