"""The frame replay's state and write side: :class:`FrameReplayState`, its sizes, :func:`init`,
:func:`add`, and the ring's index arithmetic the read side shares. The layout, the validity rule
of a sampled transition and the usage are on the package (:mod:`tianji_jax.buffers.frame_replay`)."""


import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from tianji_jax.buffers import sum_tree
from tianji_jax.buffers.replay.state import check_fits


__all__ = ["FrameReplayState", "init", "add", "frame_replay_bytes", "slots_per_env"]

# per slot: action, reward, version, step_index, priority (4 bytes each) + first, stack_start,
# terminated, truncated, valid (1 byte each)
_SLOT_META_BYTES = 25
# scalars: max_priority, num_valid
_SCALAR_BYTES = 8


@struct.dataclass
class FrameReplayState:
    """The buffer's state: per env a ring of ``F`` slots; a pytree (static config in the treedef).

    Slot ``k`` of env ``e`` holds absolute step ``step_index[e, k]`` of that env (``-1`` if never
    written): its frame, and the step that *produced* that frame (action, reward, flags, the
    version that chose the action). The transition *starting* at slot ``k`` uses the frame stack
    ending at ``k`` and the actions/rewards stored on the following slots.

    Attributes:
        frames: ``(E, F, *frame_shape)`` frames (uint8 for Atari).
        action: ``(E, F)`` int32 action whose step produced the slot's frame.
        reward: ``(E, F)`` float32 reward of that step.
        first: ``(E, F)`` bool, the frame is an episode's first frame (no transition leads into it).
        stack_start: ``(E, F)`` bool, the observation stack restarts at this frame (it is
            repeated for the older stack positions); usually equal to ``first``.
        terminated: ``(E, F)`` bool, the frame is a terminal episode end.
        truncated: ``(E, F)`` bool, the frame is the last of a time-limited episode.
        policy_version: ``(E, F)`` int32 version that chose ``action``; -1 if unwritten.
        step_index: ``(E, F)`` int32 absolute step (per-env write counter) of the slot; -1 if unwritten.
        priority: ``(E, F)`` float32 ``p^alpha`` of the transition starting at the slot (new:
            ``max_priority``); all 1 and unused in a uniform buffer.
        valid: ``(E, F)`` bool, the transition starting at the slot can be sampled (module doc).
        tree: :class:`~tianji_jax.buffers.sum_tree.SumTree` over the ``E * F`` slots (flat index
            ``e * F + k``), leaf ``valid * priority``.
        count: ``(E,)`` int32 steps written per env (next slot ``count % F``).
        num_valid: ``()`` int32 transitions that can be sampled now (``sum(valid)``, kept
            incrementally).
        max_priority: ``()`` float32 largest ``p^alpha`` seen so far (1 initially).
        stack: ``S`` frames per observation (static).
        n_step: ``n`` (static).
        gamma: discount in [0, 1] (static).
        prioritised: sample proportionally to priority (static); False = uniform.
    """

    frames: jax.Array
    action: jax.Array
    reward: jax.Array
    first: jax.Array
    stack_start: jax.Array
    terminated: jax.Array
    truncated: jax.Array
    policy_version: jax.Array
    step_index: jax.Array
    priority: jax.Array
    valid: jax.Array
    tree: sum_tree.SumTree
    count: jax.Array
    num_valid: jax.Array
    max_priority: jax.Array
    stack: int = struct.field(pytree_node=False)
    n_step: int = struct.field(pytree_node=False)
    gamma: float = struct.field(pytree_node=False)
    prioritised: bool = struct.field(pytree_node=False)

    @property
    def num_envs(self) -> int:
        """``E``."""
        return self.frames.shape[0]

    @property
    def slots_per_env(self) -> int:
        """``F``, frames held per env."""
        return self.frames.shape[1]


# ------------------------------------------------------------------------------------------------
# sizes and validation
# ------------------------------------------------------------------------------------------------
def _check_int(name: str, value: Any, lo: int) -> int:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < lo:
        raise ValueError(f"{name} must be a Python int >= {lo}, got {value!r}")
    return int(value)


def _check_frame_shape(frame_shape: Any) -> tuple[int, ...]:
    try:
        shape = tuple(int(d) for d in frame_shape)
    except TypeError:
        shape = None
    if not shape or any(d < 1 for d in shape):
        raise ValueError(f"frame_shape must be a non-empty tuple of ints >= 1 (e.g. (84, 84)), got {frame_shape!r}")
    return shape


def slots_per_env(num_envs: int, capacity: int) -> int:
    """``F = ceil(capacity / num_envs)``: frames (slots) per env ring; the buffer holds ``E * F``.

    Raises:
        ValueError: ``num_envs`` or ``capacity`` not an int ``>= 1``.
    """
    num_envs = _check_int("num_envs", num_envs, 1)
    capacity = _check_int("capacity", capacity, 1)
    return -(-capacity // num_envs)


def frame_replay_bytes(num_envs: int, capacity: int, frame_shape: tuple[int, ...] = (84, 84),
                       frame_dtype: Any = jnp.uint8) -> int:
    """Bytes a :func:`init` buffer occupies: ``E F (frame bytes + 25) + sum-tree + 4 E + 8``.

    With ``E F = 10^6`` Atari frames (84 x 84 uint8): ``7.06e9`` frame bytes + ``25e6`` metadata
    + ``16.8e6`` sum-tree = ``7.10e9`` bytes (6.61 GiB), against ``56.5e9`` (52.6 GiB) for
    :mod:`tianji_jax.buffers.replay` storing ``obs`` and ``next_obs`` stacks of 4 frames per transition:
    about 1/8.

    Args:
        num_envs: ``E >= 1``.
        capacity: transitions (frames) in total, ``>= 1``; rounded up to ``E * F``.
        frame_shape: shape of one frame.
        frame_dtype: dtype of one frame.

    Raises:
        ValueError: bad ``num_envs``, ``capacity`` or ``frame_shape``.
    """
    f = slots_per_env(num_envs, capacity)
    shape = _check_frame_shape(frame_shape)
    n = num_envs * f
    frame = math.prod(shape) * np.dtype(frame_dtype).itemsize
    return n * (frame + _SLOT_META_BYTES) + sum_tree.nbytes(n) + 4 * num_envs + _SCALAR_BYTES


def init(num_envs: int, capacity: int, frame_shape: tuple[int, ...] = (84, 84), *, stack: int = 4,
         n_step: int = 1, gamma: float = 0.99, prioritised: bool = False, frame_dtype: Any = jnp.uint8,
         device: Any = None, check_memory: bool = True) -> FrameReplayState:
    """Allocate an empty buffer of ``num_envs`` rings of ``ceil(capacity / num_envs)`` frames.

    Eager (outside ``jit``) when ``check_memory``: :func:`tianji_jax.buffers.replay.check_fits` runs on
    :func:`frame_replay_bytes` first, so an oversized buffer raises ``MemoryError`` before XLA
    allocates anything.

    Args:
        num_envs: ``E``, envs that feed the buffer (``env_id`` in ``[0, E)``).
        capacity: total transitions, ``>= E * (stack + n_step)`` so each ring can hold one
            sampleable transition (``F > S + n - 1``).
        frame_shape: one frame's shape, ``(84, 84)`` for Atari.
        stack: ``S >= 1`` frames per observation (4 for Atari, as envpool's ``stack_num``).
        n_step: ``n >= 1`` steps of n-step returns.
        gamma: discount in [0, 1].
        prioritised: proportional prioritised sampling (Schaul et al. 2016) instead of uniform.
        frame_dtype: frame dtype (uint8 for Atari).
        device: where the state lives; default JAX's default device.
        check_memory: run the memory check.

    Raises:
        ValueError: a bad argument (the message names it and the allowed values).
        MemoryError: the buffer would not fit (see :func:`tianji_jax.buffers.replay.check_fits`).
    """
    stack = _check_int("stack", stack, 1)
    n_step = _check_int("n_step", n_step, 1)
    f = slots_per_env(num_envs, capacity)
    shape = _check_frame_shape(frame_shape)
    if num_envs * f > sum_tree.MAX_CAPACITY:
        raise ValueError(f"capacity must be <= {sum_tree.MAX_CAPACITY} transitions, got {num_envs * f}")
    if f < stack + n_step:
        raise ValueError(f"capacity must be >= num_envs * (stack + n_step) = {num_envs * (stack + n_step)} "
                         f"so every env's ring holds a whole transition, got capacity={capacity}")
    if not isinstance(gamma, (int, float)) or isinstance(gamma, bool) or not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be a Python float in [0, 1], got {gamma!r}")
    if not isinstance(prioritised, bool):
        raise ValueError(f"prioritised must be a bool, got {prioritised!r}")
    nbytes = frame_replay_bytes(num_envs, capacity, shape, frame_dtype)
    if check_memory:
        check_fits(nbytes, device)
    e = num_envs

    def full(value, dtype, shape=(e, f)):
        return jnp.full(shape, value, dtype, device=device)

    return FrameReplayState(
        frames=full(0, frame_dtype, (e, f, *shape)), action=full(0, jnp.int32), reward=full(0.0, jnp.float32),
        first=full(False, bool), stack_start=full(False, bool), terminated=full(False, bool), truncated=full(False, bool),
        policy_version=full(-1, jnp.int32), step_index=full(-1, jnp.int32), priority=full(1.0, jnp.float32),
        valid=full(False, bool), tree=sum_tree.init(e * f, device=device), count=full(0, jnp.int32, (e,)),
        num_valid=full(0, jnp.int32, ()), max_priority=full(1.0, jnp.float32, ()), stack=stack, n_step=n_step, gamma=float(gamma),
        prioritised=prioritised)


# ------------------------------------------------------------------------------------------------
# the buffer
# ------------------------------------------------------------------------------------------------
# ------------------------------------------------------------------------------------------------
# index arithmetic (all on absolute per-env steps ``t``; slot = t mod F)
# ------------------------------------------------------------------------------------------------
def _held(state: FrameReplayState, e: jax.Array, t: jax.Array) -> jax.Array:
    """Absolute step ``t`` of env ``e`` is written and not yet overwritten."""
    w = state.count[e]
    return (t >= 0) & (t >= w - state.slots_per_env) & (t < w)


def _at(arr: jax.Array, state: FrameReplayState, e: jax.Array, t: jax.Array) -> jax.Array:
    return arr[e, t % state.slots_per_env]


def _done(state, e, t):
    return _at(state.terminated, state, e, t) | _at(state.truncated, state, e, t)


def _history(state: FrameReplayState, e: jax.Array, t: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``(h, ok)``: frames back to the stack's start frame, capped at ``S - 1``; all of them are held."""
    s = state.stack
    h = jnp.full(t.shape, s - 1, jnp.int32)
    for j in reversed(range(s - 1)):  # the nearest first frame wins
        h = jnp.where(_held(state, e, t - j) & _at(state.stack_start, state, e, t - j), j, h)
    return h, _held(state, e, t - h)  # frames t - h .. t are then all held (a contiguous range)


def _valid_start(state: FrameReplayState, e: jax.Array, t: jax.Array) -> jax.Array:
    """The transition starting at absolute step ``t`` of env ``e`` can be sampled (module doc)."""
    ok = _held(state, e, t) & ~_done(state, e, t)
    ok &= _history(state, e, t)[1]
    ended = jnp.zeros(t.shape, bool)
    for j in range(1, state.n_step + 1):
        held = _held(state, e, t + j)
        ok &= ended | (held & ~_at(state.first, state, e, t + j))
        ended |= held & _done(state, e, t + j)
    return ok


def _stack(state: FrameReplayState, e: jax.Array, t: jax.Array) -> jax.Array:
    """``(B, S, *frame_shape)`` frames ``t - S + 1 .. t``, the stack's start frame repeated before it."""
    h = _history(state, e, t)[0]
    back = jnp.arange(state.stack - 1, -1, -1, dtype=jnp.int32)  # S-1 .. 0: oldest first
    pos = t[:, None] - jnp.minimum(back[None, :], h[:, None])
    return state.frames[e[:, None], pos % state.slots_per_env]


# ------------------------------------------------------------------------------------------------
# row checks (the writer, add, and the read side, in sampling.py)
# ------------------------------------------------------------------------------------------------
def _rows(name: str, x: Any, b: int, dtype: Any = None) -> jax.Array:
    x = jnp.asarray(x)
    if x.shape != (b,):
        raise ValueError(f"{name} must have shape ({b},) (one entry per row), got {x.shape}")
    return x if dtype is None else x.astype(dtype)


def _write(state: FrameReplayState, env: jax.Array, frame: jax.Array, action: jax.Array, reward: jax.Array,
           terminated: jax.Array, truncated: jax.Array, first: jax.Array, stack_start: jax.Array,
           version: jax.Array, mask: jax.Array) -> FrameReplayState:
    """One slot per masked-in row; then refresh the validity of every start the write affects."""
    e_n, f = state.num_envs, state.slots_per_env
    t_new = state.count[env]
    first = first | (t_new == 0)  # an env's first write always starts an episode and a stack
    stack_start = stack_start | (t_new == 0)
    terminated, truncated = terminated & ~first, truncated & ~first
    ev = jnp.where(mask, env, e_n)  # out of bounds: dropped
    slot = t_new % f

    def put(arr, x):
        return arr.at[ev, slot].set(x.astype(arr.dtype), mode="drop")

    state = state.replace(
        frames=put(state.frames, frame), action=put(state.action, action), reward=put(state.reward, reward),
        first=put(state.first, first), stack_start=put(state.stack_start, stack_start), terminated=put(state.terminated, terminated),
        truncated=put(state.truncated, truncated), policy_version=put(state.policy_version, version),
        step_index=put(state.step_index, t_new), priority=put(state.priority, jnp.broadcast_to(
            state.max_priority if state.prioritised else 1.0, env.shape)),
        count=state.count.at[ev].add(1, mode="drop"))
    # starts whose validity may change: the new one and the n before it (lookahead), and the S - 1
    # oldest held ones (their history lost the overwritten frame t_new - F)
    offsets = jnp.concatenate([-jnp.arange(state.n_step + 1), -f + 1 + jnp.arange(state.stack - 1)]).astype(jnp.int32)
    ts = t_new[:, None] + offsets[None, :]
    es = jnp.broadcast_to(env[:, None], ts.shape)
    touch = mask[:, None] & _held(state, es, ts)  # held starts of one env are distinct slots
    ok = _valid_start(state, es, ts)
    leaf = es * f + ts % f
    value = jnp.where(ok, _at(state.priority, state, es, ts), 0.0)
    was = _at(state.valid, state, es, ts)
    valid = state.valid.at[jnp.where(touch, es, e_n), ts % f].set(ok, mode="drop")
    # F >= S + n, so the touched starts of one row are distinct: the count changes by the flips
    flips = jnp.sum(touch & ok, dtype=jnp.int32) - jnp.sum(touch & was, dtype=jnp.int32)
    tree = sum_tree.update(state.tree, leaf.reshape(-1), value.reshape(-1), touch.reshape(-1))
    return state.replace(valid=valid, tree=tree, num_valid=state.num_valid + flips)


def add(state: FrameReplayState, frame: jax.Array, action: jax.Array, reward: jax.Array, terminated: jax.Array,
        truncated: jax.Array, first: jax.Array, version: Any, *, final_frame: jax.Array | None = None,
        stack_reset: jax.Array | None = None, env_id: jax.Array | None = None,
        mask: jax.Array | None = None) -> FrameReplayState:
    """Record one env step for ``B`` envs (see the module docstring for the actor mapping).

    Each masked-in row writes its env's next ring slot (two slots for a done row when
    ``final_frame`` is given), overwriting that env's oldest frame once its ring is full, and
    refreshes which starts can be sampled. ``O(B (S + n) log C)``. Jit with ``donate_argnums=0``.

    Args:
        state: the buffer.
        frame: ``(B, *frame_shape)`` the newest frame of each env's observation after this step
            (envpool: ``obs[:, -1]``); cast to the buffer's dtype.
        action: ``(B,)`` int action whose step produced ``frame`` (ignored where ``first``).
        reward: ``(B,)`` float reward of that step (ignored where ``first``).
        terminated: ``(B,)`` bool, ``frame`` ends the episode in a terminal state.
        truncated: ``(B,)`` bool, ``frame`` ends the episode by a time limit.
        first: ``(B,)`` bool, ``frame`` is the first frame of a new episode (a reset; an env's
            first write is always treated as one). Envpool: ``~HostStep.valid``.
        version: int policy version that chose ``action``, scalar or ``(B,)``.
        final_frame: optional ``(B, *frame_shape)`` for same-step auto-reset envs: where
            ``terminated | truncated``, ``final_frame`` is the episode's true last frame and
            ``frame`` the next episode's first one; both are written.
        stack_reset: optional ``(B,)`` bool, the env's observation stack restarts at ``frame``
            (``frame`` fills all ``S`` positions). Default: ``first`` (with ``final_frame``:
            ``first | terminated | truncated``). It differs from ``first`` only for envs that
            begin a new episode for learning without resetting their frame stack: envpool Atari
            with ``episodic_life=True`` keeps stacking across a lost life (checked with envpool
            1.2.5 Breakout-v5: the reset step after a life loss shifts one frame in, like any
            step), so there pass ``stack_reset = ~valid & game_over`` where ``game_over`` is
            whether the env's previous step ended the game (``HostStep.episode_length > 0``).
        env_id: optional ``(B,)`` int env of each row, distinct, in ``[0, E)``; default ``arange(E)``.
        mask: optional ``(B,)`` bool, False = skip the row.

    Returns:
        the new :class:`FrameReplayState`.

    Raises:
        ValueError: a field has the wrong shape or dtype kind (the message names it).
    """
    frame = jnp.asarray(frame)
    b = frame.shape[0] if frame.ndim else 0
    fshape = state.frames.shape[2:]
    if frame.shape[1:] != fshape or frame.ndim == 0:
        raise ValueError(f"frame must have shape (B, {', '.join(map(str, fshape))}), got {frame.shape}")
    if not jnp.can_cast(frame.dtype, state.frames.dtype, casting="same_kind"):
        raise ValueError(f"frame dtype {frame.dtype} cannot be stored in a {state.frames.dtype} buffer")
    if env_id is None:
        if b != state.num_envs:
            raise ValueError(f"without env_id there must be one row per env ({state.num_envs}), got {b} rows")
        env_id = jnp.arange(b, dtype=jnp.int32)
    env_id = _rows("env_id", env_id, b, jnp.int32)
    action = _rows("action", action, b)
    if not jnp.issubdtype(action.dtype, jnp.integer):
        raise ValueError(f"action must be integer (discrete actions), got {action.dtype}")
    reward = _rows("reward", reward, b, jnp.float32)
    terminated = _rows("terminated", terminated, b, bool)
    truncated = _rows("truncated", truncated, b, bool)
    first = _rows("first", first, b, bool)
    mask = jnp.ones((b,), bool) if mask is None else _rows("mask", mask, b, bool)
    if stack_reset is not None:
        stack_reset = _rows("stack_reset", stack_reset, b, bool)
    version = jnp.asarray(version)
    if not jnp.issubdtype(version.dtype, jnp.integer) or version.ndim > 1 or version.size not in (1, b):
        raise ValueError(f"version must be an int scalar or shape ({b},), got {version.dtype}{version.shape}")
    version = jnp.broadcast_to(version.astype(jnp.int32).reshape(-1), (b,))
    mask = mask & (env_id >= 0) & (env_id < state.num_envs)
    if final_frame is None:
        sr = first if stack_reset is None else stack_reset
        return _write(state, env_id, frame, action, reward, terminated, truncated, first, sr, version, mask)
    final_frame = jnp.asarray(final_frame)
    if final_frame.shape != frame.shape:
        raise ValueError(f"final_frame must have frame's shape {frame.shape}, got {final_frame.shape}")
    done = (terminated | truncated) & ~first
    sr = (first | done) if stack_reset is None else stack_reset
    state = _write(state, env_id, jnp.where(done.reshape((b,) + (1,) * len(fshape)), final_frame, frame),
                   action, reward, terminated, truncated, first, sr & ~done, version, mask)
    no = jnp.zeros((b,), bool)
    return _write(state, env_id, frame, action, reward, no, no, ~no, sr, version, mask & done)
