"""Assemble per-env transitions from a host env's stream into ``(T, N)`` rollout chunks.

The async actor steps a host env (:mod:`tianji_jax.envs.host`) whose batches may hold any subset
of the ``N`` envs (envpool async mode) and include reset steps that are not transitions. The
:class:`TrajectoryChunker` keeps one buffer per ``env_id``, completes a transition when the env's
next step arrives, drops reset steps, and hands out chunks of ``T`` consecutive transitions of
every env, columns ordered by env id. Numpy only; one actor thread owns an instance (not
thread-safe).

Usage by the actor::

    step = env.reset()
    while running:
        action, log_prob, value = policy(params, step.obs)          # acted with ``version``
        chunker.record_action(step.env_id, step.obs, action, log_prob, value, version)
        step = env.step(action, step.env_id)
        chunker.record_step(step)
        while chunker.ready():
            queue.put(chunker.pop())
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tianji_jax.envs.host import HostStep
from tianji_jax.envs.spaces import Box, Discrete

__all__ = ["TrajectoryChunker", "CHUNK_KEYS"]

CHUNK_KEYS = ("obs", "action", "log_prob", "value", "reward", "terminated", "truncated", "done",
              "final_obs", "episode_return", "episode_length", "policy_version", "last_obs")
"""Keys of the dict :meth:`TrajectoryChunker.pop` returns."""


def _check_count(name: str, value: Any, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ValueError(f"{name}={value!r}: must be an integer >= {low}")
    return int(value)


class TrajectoryChunker:
    """Per-env ring buffers of transitions, popped as ``(T, N)`` chunks.

    A transition of env ``e`` is made of two halves: what the actor knew when it acted
    (:meth:`record_action`: obs, action, log-prob, value, policy version) and what the env
    returned for that action (:meth:`record_step`: reward, terminated, truncated, final obs,
    episode statistics). It is completed when env ``e``'s next :class:`HostStep` row arrives:

    * a valid row completes it and appends it to env ``e``'s buffer;
    * an invalid row (a reset step) means the action was taken on a done env's final obs and was
      ignored by the env: the pending action is discarded (counted in ``actions_discarded``);
    * an invalid row with no pending action (the first obs after a reset) changes nothing;
    * a valid row with no pending action is an actor bug and raises.

    Reset steps are therefore never stored, and every column of a chunk holds ``T`` consecutive
    transitions of one env: within a column, ``final_obs[t] == obs[t+1]`` unless ``done[t]``
    (then ``obs[t+1]`` is the first obs of the next episode).

    Accounting: ``transitions_in == transitions_out + transitions_discarded + resident`` and
    ``actions_recorded == transitions_in + actions_discarded + pending`` at all times.

    :meth:`discard` drops everything resident and everything in flight, so that a chunk holds only
    transitions acted with the params of one rollout: the async actor calls it when a rollout
    starts with new params (leftovers of the previous rollout carry an older policy version and
    would break the lag bound or the ``sync`` schedule's exactness).

    Memory: the ring holds ``N * capacity`` transitions, each
    ``2 * obs_bytes + action_bytes + 25`` bytes (obs and final_obs; 4-byte log_prob, value, reward,
    episode_return, episode_length, policy_version; 1-byte terminated, truncated), plus ``N``
    pending actions (``obs_bytes + action_bytes + 12`` each). ``capacity`` starts at
    ``initial_capacity`` (default ``2 * T``) and doubles whenever one env has ``capacity``
    transitions resident, i.e. when an env runs that far ahead of the slowest env (envpool async
    mode); it never shrinks. Example: Atari (4x84x84 uint8 obs = 28,224 bytes), ``N = 8``,
    ``T = 128``: about 115 MB at the default capacity. A pop copies ``T * N`` transitions (the
    returned arrays own their memory) and costs O(T * N) whatever the capacity.

    Args:
        num_envs: ``N >= 1``; env ids are ``0 .. N-1``.
        num_steps: ``T >= 1``, transitions per env per chunk.
        obs_shape: shape of one env's observation.
        obs_dtype: dtype observations are stored in (obs given to :meth:`record_action` must cast
            to it under numpy's ``same_kind`` rule).
        action_shape: shape of one env's action (``()`` for Discrete).
        action_dtype: dtype actions are stored in (``int32`` for Discrete, ``float32`` for Box).
        initial_capacity: ring slots per env, ``>= T`` (default ``2 * T``).
        extra: more columns of the actor's half, ``{name: (shape, dtype)}`` per env (a recurrent
            actor's core state and reset flag), given to :meth:`record_action` as ``extra`` and
            returned by :meth:`pop` as ``(T, N, *shape)`` arrays under the same names.

    Raises:
        ValueError: a count below its minimum, or ``initial_capacity < num_steps``.
    """

    def __init__(self, num_envs: int, num_steps: int, obs_shape: tuple[int, ...],
                 obs_dtype: Any = np.float32, action_shape: tuple[int, ...] = (),
                 action_dtype: Any = np.int32, initial_capacity: int | None = None,
                 extra: dict[str, tuple[tuple[int, ...], Any]] | None = None):
        self.num_envs = _check_count("num_envs", num_envs, 1)
        self.num_steps = _check_count("num_steps", num_steps, 1)
        cap = 2 * self.num_steps if initial_capacity is None else initial_capacity
        self.capacity = _check_count("initial_capacity", cap, self.num_steps)
        self.obs_shape = tuple(int(s) for s in obs_shape)
        self.obs_dtype = np.dtype(obs_dtype)
        self.action_shape = tuple(int(s) for s in action_shape)
        self.action_dtype = np.dtype(action_dtype)
        n = self.num_envs
        self._specs = {
            "obs": (self.obs_shape, self.obs_dtype),
            "action": (self.action_shape, self.action_dtype),
            "log_prob": ((), np.dtype(np.float32)),
            "value": ((), np.dtype(np.float32)),
            "reward": ((), np.dtype(np.float32)),
            "terminated": ((), np.dtype(bool)),
            "truncated": ((), np.dtype(bool)),
            "final_obs": (self.obs_shape, self.obs_dtype),
            "episode_return": ((), np.dtype(np.float32)),
            "episode_length": ((), np.dtype(np.int32)),
            "policy_version": ((), np.dtype(np.int32)),
        }
        self._extra = {k: (tuple(int(d) for d in shape), np.dtype(dtype)) for k, (shape, dtype) in (extra or {}).items()}
        clash = sorted(set(self._extra) & (set(self._specs) | set(CHUNK_KEYS)))
        if clash:
            raise ValueError(f"extra: column names {clash} are taken by the chunk's own keys")
        self._specs.update(self._extra)
        self._actor_keys = ("obs", "action", "log_prob", "value", "policy_version", *self._extra)
        self._ring = {k: np.zeros((n, self.capacity, *shape), dtype)
                      for k, (shape, dtype) in self._specs.items()}
        self._flat = self._flat_views()
        self._head = np.zeros((n,), np.int64)
        self._count = np.zeros((n,), np.int64)
        self._pending = {k: np.zeros((n, *self._specs[k][0]), self._specs[k][1]) for k in self._actor_keys}
        self._has_pending = np.zeros((n,), bool)
        self._stale_pending = np.zeros((n,), bool)
        self.transitions_discarded = 0
        self.stale_actions = 0  # in-flight actions discarded by :meth:`discard` when they arrived
        self.actions_recorded = 0
        self.actions_discarded = 0
        self.transitions_in = 0
        self.transitions_out = 0
        self.chunks_out = 0

    @classmethod
    def from_spaces(cls, num_envs: int, num_steps: int, observation_space: Box,
                    action_space: Discrete | Box, **kwargs: Any) -> "TrajectoryChunker":
        """Build a chunker for an env's spaces (Discrete actions stored as int32).

        Args:
            num_envs: ``N``.
            num_steps: ``T``.
            observation_space: :class:`Box` of one env's observation.
            action_space: :class:`Discrete` or :class:`Box` of one env's action.
            **kwargs: ``initial_capacity``.

        Raises:
            ValueError: as the constructor, or an unsupported space type.
        """
        if not isinstance(observation_space, Box):
            raise ValueError(f"observation_space: expected a Box, got {observation_space!r}")
        if isinstance(action_space, Discrete):
            act_shape, act_dtype = (), np.int32
        elif isinstance(action_space, Box):
            act_shape, act_dtype = action_space.shape, action_space.dtype
        else:
            raise ValueError(f"action_space: expected Discrete or Box, got {action_space!r}")
        return cls(num_envs, num_steps, observation_space.shape, observation_space.dtype,
                   act_shape, act_dtype, **kwargs)

    # -- accounting ------------------------------------------------------------------------------

    @property
    def counts(self) -> np.ndarray:
        """``(N,)`` int64 copy: complete transitions resident per env."""
        return self._count.copy()

    @property
    def resident(self) -> int:
        """Complete transitions stored and not yet popped, all envs together."""
        return int(self._count.sum())

    @property
    def pending_mask(self) -> np.ndarray:
        """``(N,)`` bool copy: envs with an action recorded whose env step has not arrived yet."""
        return self._has_pending.copy()

    @property
    def pending(self) -> int:
        """Actions recorded whose env step has not arrived yet."""
        return int(self._has_pending.sum())

    def ready(self) -> bool:
        """True when every env has at least ``T`` complete transitions, so :meth:`pop` succeeds."""
        return bool(self._count.min() >= self.num_steps)

    # -- input -----------------------------------------------------------------------------------

    def _check_ids(self, env_id: Any, what: str) -> np.ndarray:
        ids = np.asarray(env_id)
        ok = ids.ndim == 1 and ids.dtype.kind in "iu" and ids.size > 0
        if ok:  # in range and distinct; a bincount is far cheaper per step than np.unique's sort
            ok = ids.min() >= 0 and ids.max() < self.num_envs and np.bincount(ids).max() <= 1
        if not ok:
            raise ValueError(f"{what}: env_id must be a non-empty 1-D integer array of distinct ids "
                             f"in [0, {self.num_envs}), got {ids.tolist() if ids.size <= 64 else ids.shape}")
        return ids.astype(np.int64)

    def _cast(self, name: str, value: Any, batch: int, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        a = np.asarray(value)
        want = (batch, *shape)
        if a.shape != want or not np.can_cast(a.dtype, dtype, casting="same_kind"):
            raise ValueError(f"{name}: expected shape {want} castable to {dtype.name} (same_kind), "
                             f"got shape {a.shape} dtype {a.dtype}")
        return a.astype(dtype, copy=False)

    def record_action(self, env_id: Any, obs: Any, action: Any, log_prob: Any, value: Any,
                      version: Any, extra: dict[str, Any] | None = None) -> None:
        """Record the actor's half of one transition for each env in ``env_id``.

        Args:
            env_id: ``(B,)`` distinct env ids in ``[0, N)``.
            obs: ``(B, *obs_shape)`` the observation acted on (the ``obs`` of the last
                :class:`HostStep` rows for these envs).
            action: ``(B, *action_shape)`` the actions sent to the env.
            log_prob: ``(B,)`` behaviour log-probabilities of the actions.
            value: ``(B,)`` value estimates ``V(obs)`` at acting time.
            version: the policy version the actor acted with: an integer or ``(B,)`` integers.
            extra: ``{name: (B, *shape)}`` for each of the constructor's ``extra`` columns (all of
                them when there are any).

        Raises:
            ValueError: bad ids, shapes or dtypes (message names the field), an ``extra`` that does
                not name exactly the constructor's columns, or an env that already has a pending
                action (its step has not been recorded yet).
        """
        ids = self._check_ids(env_id, "record_action")
        b = ids.shape[0]
        if self._has_pending[ids].any():
            dup = ids[self._has_pending[ids]].tolist()
            raise ValueError(f"record_action: env ids {dup} already have a pending action; call "
                             "record_step with their next HostStep first")
        ver = np.asarray(version)
        if ver.ndim == 0:
            ver = np.broadcast_to(ver, (b,))
        if not np.issubdtype(ver.dtype, np.integer):
            raise ValueError(f"version: expected an integer or (B,) integers, got dtype {ver.dtype}")
        cols = {
            "obs": self._cast("obs", obs, b, self.obs_shape, self.obs_dtype),
            "action": self._cast("action", action, b, self.action_shape, self.action_dtype),
            "log_prob": self._cast("log_prob", log_prob, b, (), np.dtype(np.float32)),
            "value": self._cast("value", value, b, (), np.dtype(np.float32)),
            "policy_version": self._cast("version", ver, b, (), np.dtype(np.int32)),
        }
        extra = extra or {}
        if set(extra) != set(self._extra):
            raise ValueError(f"record_action: extra must name the columns {sorted(self._extra)}, got {sorted(extra)}")
        for k, (shape, dtype) in self._extra.items():
            cols[k] = self._cast(k, extra[k], b, shape, dtype)
        for k, v in cols.items():
            self._pending[k][ids] = v
        self._has_pending[ids] = True
        self.actions_recorded += b

    def _grow(self) -> None:
        old, new_cap = self.capacity, 2 * self.capacity
        idx = (self._head[:, None] + np.arange(old)[None, :]) % old
        rows = np.arange(self.num_envs)[:, None]
        for k, (shape, dtype) in self._specs.items():
            grown = np.zeros((self.num_envs, new_cap, *shape), dtype)
            grown[:, :old] = self._ring[k][rows, idx]
            self._ring[k] = grown
        self._head[:] = 0
        self.capacity = new_cap
        self._flat = self._flat_views()

    def _flat_views(self) -> dict[str, np.ndarray]:
        """Each ring as an ``(N * capacity, *shape)`` view: slot ``s`` of env ``e`` is row
        ``e * capacity + s`` (one-axis fancy indexing is much cheaper than two-axis)."""
        return {k: r.reshape(self.num_envs * self.capacity, *r.shape[2:]) for k, r in self._ring.items()}

    def record_step(self, step: HostStep) -> int:
        """Complete (valid rows) or discard (invalid rows) the pending actions of ``step``'s envs.

        Args:
            step: the :class:`HostStep` the env returned; its rows' env ids must be distinct.

        Returns:
            The number of transitions completed and stored.

        Raises:
            ValueError: bad ids, a valid row for an env with no pending action, or an obs shape
                other than ``obs_shape``.
        """
        ids = self._check_ids(step.env_id, "record_step")
        b = ids.shape[0]
        valid = np.asarray(step.valid, bool).reshape(b)
        has = self._has_pending[ids]
        orphan = valid & ~has
        if orphan.any():
            raise ValueError(f"record_step: valid steps for env ids {ids[orphan].tolist()} that have "
                             "no pending action; call record_action before stepping the env")
        stale = self._stale_pending[ids] & has
        self.actions_discarded += int(((~valid & has) | stale).sum())
        self.stale_actions += int(stale.sum())
        self._has_pending[ids] = False
        self._stale_pending[ids] = False
        keep = valid & has & ~stale
        if not keep.any():
            return 0
        rows = np.nonzero(keep)[0]
        e = ids[rows]
        count = self._count[e]
        while count.max() >= self.capacity:
            self._grow()
        flat = e * self.capacity + (self._head[e] + count) % self.capacity
        ring, pending = self._flat, self._pending
        for k in self._actor_keys:
            ring[k][flat] = pending[k][e]
        final_obs = self._cast("final_obs", step.final_obs, b, self.obs_shape, self.obs_dtype)
        every = rows.size == b  # the common case: no row to leave out
        ring["final_obs"][flat] = final_obs if every else final_obs[rows]
        for k in ("reward", "terminated", "truncated", "episode_return", "episode_length"):
            col = np.asarray(getattr(step, k)).reshape(b)
            ring[k][flat] = col if every else col[rows]
        self._count[e] = count + 1
        self.transitions_in += rows.size
        return int(rows.size)

    def record_block(self, block: dict[str, Any], version: int) -> int:
        """Record ``S`` sync-mode steps of all ``N`` envs at once (a compiled rollout's output):
        row ``j`` of every column is env ``0..N-1``'s ``j``-th step, acted with ``version``.

        The same as ``S`` rounds of :meth:`record_action` then :meth:`record_step` with every env
        in id order, vectorised: each valid row completes a transition, each invalid row (a reset
        step) discards its action.

        Args:
            block: ``(S, N, ...)`` arrays ``obs``, ``action``, ``log_prob``, ``value`` (the actor's
                half), ``reward``, ``terminated``, ``truncated``, ``final_obs``,
                ``episode_return``, ``episode_length`` (the env's half) and ``valid`` bool.
            version: the policy version every action was taken with.

        Returns:
            The number of transitions stored.

        Raises:
            ValueError: pending actions or ``extra`` columns (a block needs neither), or a column
                of the wrong shape or dtype kind.
        """
        if self._has_pending.any() or self._extra:
            raise ValueError("record_block: needs no pending actions and no extra columns")
        valid = np.asarray(block["valid"], bool)
        s = valid.shape[0]
        if valid.shape != (s, self.num_envs):
            raise ValueError(f"record_block: valid must be (S, N={self.num_envs}), got {valid.shape}")
        add = valid.sum(axis=0)
        while (self._count + add).max() > self.capacity:
            self._grow()
        js, es = np.nonzero(valid)  # time-major: each env's transitions in order
        rank = np.cumsum(valid, axis=0)[js, es] - 1
        flat = es * self.capacity + (self._head[es] + self._count[es] + rank) % self.capacity
        cols = dict(block, policy_version=np.full(valid.shape, version, np.int32))
        for k, (shape, dtype) in self._specs.items():
            a = np.asarray(cols[k])
            if a.shape != (s, self.num_envs, *shape) or not np.can_cast(a.dtype, dtype, casting="same_kind"):
                raise ValueError(f"record_block: {k} must be shape {(s, self.num_envs, *shape)} castable to "
                                 f"{dtype.name}, got shape {a.shape} dtype {a.dtype}")
            self._flat[k][flat] = a[js, es]
        self._count += add
        stored = int(add.sum())
        self.actions_recorded += s * self.num_envs
        self.actions_discarded += s * self.num_envs - stored
        self.transitions_in += stored
        return stored

    def discard(self) -> int:
        """Drop every resident transition and mark every pending action to be discarded when its
        step arrives (its transition was acted with older params). Returns the number of resident
        transitions dropped (added to ``transitions_discarded``)."""
        dropped = int(self._count.sum())
        self._count[:] = 0
        self.transitions_discarded += dropped
        self._stale_pending |= self._has_pending
        return dropped

    # -- output ----------------------------------------------------------------------------------

    def pop(self) -> dict[str, np.ndarray]:
        """Remove and return the oldest ``T`` transitions of every env as ``(T, N, ...)`` arrays.

        Column ``n`` holds env ``n``'s ``T`` oldest resident transitions in order; anything beyond
        them stays for the next chunk.

        Returns:
            A dict with keys :data:`CHUNK_KEYS`: ``obs``, ``final_obs`` ``(T, N, *obs_shape)``;
            ``action`` ``(T, N, *action_shape)``; ``log_prob``, ``value``, ``reward``,
            ``episode_return`` float32, ``terminated``, ``truncated``, ``done`` bool,
            ``episode_length``, ``policy_version`` int32, all ``(T, N)``; and ``last_obs``
            ``(N, *obs_shape)`` = ``final_obs[T-1]``, the successor of each column's last
            transition. Bootstrapping from it is right in every case: if step ``T-1`` did not end
            the episode it is the next obs to act on; if it was truncated it is the true final obs
            (the learner's GAE bootstraps truncation through ``final_obs`` anyway); if it
            terminated, GAE masks the bootstrap with ``1 - terminated``. The next obs the actor
            acts on would be wrong after a truncation (it would be the final obs once more, then
            the next episode's first obs after the reset step, which belongs to another episode).
            ``episode_return``/``episode_length`` are non-zero only where an episode for statistics
            ended. All arrays own their memory. The constructor's ``extra`` columns are added
            as ``(T, N, *shape)`` arrays.

        Raises:
            RuntimeError: some env has fewer than ``T`` transitions (the message gives the counts).
        """
        t = self.num_steps
        if not self.ready():
            raise RuntimeError(f"pop: every env needs >= num_steps={t} transitions, have "
                               f"{self._count.tolist()} (check ready() first)")
        idx = (self._head[:, None] + np.arange(t)[None, :]) % self.capacity
        rows = np.arange(self.num_envs)[:, None]
        out = {k: np.ascontiguousarray(np.swapaxes(self._ring[k][rows, idx], 0, 1))
               for k in self._specs}
        out["done"] = out["terminated"] | out["truncated"]
        out["last_obs"] = out["final_obs"][t - 1].copy()
        self._head = (self._head + t) % self.capacity
        self._count -= t
        self.transitions_out += t * self.num_envs
        self.chunks_out += 1
        return {k: out[k] for k in (*CHUNK_KEYS, *self._extra)}
