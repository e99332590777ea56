"""Host-side (numpy) vectorised envs for the async actor: envpool and gymnasium backends.

The async actor runs its policy on a JAX device and steps these envs on the host. Both backends
return one :class:`HostStep` per call: a batch of ``B`` env steps keyed by ``env_id`` (``B = N``
in sync mode; ``B = batch_size < N`` in envpool's async mode, where each received batch holds
whichever envs finished first).

Auto-reset ("next step" convention, shared by both backends)
    When env ``e`` finishes at step ``t`` (``terminated`` or ``truncated``), the obs returned at
    ``t`` is the true final obs of the episode. The env is reset on its *next* step, which ignores
    the action it is given and returns the first obs of a new episode with reward 0 and both flags
    False. That step is not a transition: :class:`HostStep` marks it ``valid=False``. Hence:

    * on a done step, ``final_obs`` = ``obs`` = the final obs (the policy acts on it; envpool
      ignores that action, and :class:`~tianji_jax.runtime.actors.chunker.TrajectoryChunker` discards
      it when the invalid step arrives);
    * on a valid non-done step, ``final_obs`` = ``obs`` = the successor obs;
    * on an invalid (reset) step, ``obs`` = the new episode's first obs, and ``final_obs`` = ``obs``
      (there is no transition, so no successor).

    So ``final_obs`` always holds the same values as ``obs`` for these backends (it is the same
    array object: treat both as read-only). The field exists so that consumers of the env protocol
    (:class:`~tianji_jax.envs.core.Timestep`) read the successor from one place whatever the
    backend's auto-reset convention. The first obs of every env after :meth:`reset` is also
    ``valid=False``: validity is ``not (this env's previous step was done)``, with every env
    starting "done", tracked by the adapter per ``env_id`` (never inferred from
    ``info["elapsed_step"]``, see below).

Verified empirically (envpool 1.2.5, gymnasium 1.3.0; the checks are repeated in
``tests/envs/test_host_envs.py``):

    * envpool CartPole-v1 (gymnasium API, ``max_episode_steps=20``): a balanced pole gives
      ``truncated=True, terminated=False`` with ``info["elapsed_step"] == 20``; the next step gives
      reward 0, both flags False, ``elapsed_step == 0`` and a fresh obs. A falling pole gives
      ``terminated=True``, same reset step after it. ``info`` keys: ``env_id``, ``players``
      (``{"env_id": ...}``, identical to ``env_id`` for these single-player envs; multi-player envs
      are rejected), ``elapsed_step``. There is no ``info["TimeLimit.truncated"]`` in the gymnasium
      API: truncation comes only from the ``truncated`` array, which is what is used.
    * envpool async mode (``num_envs=8, batch_size=4``): :meth:`async_reset` then ``recv`` returns
      batches of 4 envs whose ids are in ``info["env_id"]``; the reset step after a done appears in
      the env's next batch exactly as in sync mode.
    * envpool Atari with ``episodic_life=True`` (Breakout-v5): losing a life sets ``terminated=True``
      with ``info["lives"]`` decremented and ``info["terminated"] == 0``; the following step is a
      reset step too (reward 0, flags False, action ignored) but it does not reset the game: lives
      and score continue and ``info["elapsed_step"]`` keeps the previous value instead of dropping
      to 0. Only when the last life is lost (``info["lives"] == 0``) is ``info["terminated"] == 1``,
      and the game restarts (``elapsed_step`` back to 0, lives back to 5). Pong-v5 has no lives
      (``info["lives"]`` is always 0), so there every ``terminated`` is a game over.
      ``info["reward"]`` is the raw game score, unclipped even with ``reward_clip=True``
      (SpaceInvaders-v5, 400 random steps: clipped sum 8, ``info["reward"]`` sum 120).
    * envpool accepts wrong actions silently (an int32 batch of the wrong length, float actions
      for a Discrete space, out-of-range indices), so this module validates actions itself.
    * gymnasium ``make_vec(..., vectorization_mode="sync")`` defaults to
      ``AutoresetMode.NEXT_STEP``, with exactly the reset-step behaviour above (reward 0, flags
      False, new first obs) and an empty ``info``. This module asks for ``NEXT_STEP`` explicitly,
      so both backends share one code path, rather than ``SAME_STEP``.

Episode statistics (``episode_return``, ``episode_length``) are computed here, per ``env_id``, from
valid steps only, and zeroed when an episode ends, so they never carry over a reset. For envpool
Atari an "episode" for statistics is a full game, not a life: a life-loss step is a done step for
learning (``terminated=True``) but the return keeps accumulating until
``info["terminated"]`` (game over) or ``truncated``; the return sums ``info["reward"]`` (the
unclipped score) where envpool provides it, else the step reward. ``episode_length`` counts valid
steps (agent steps, each ``frame_skip`` frames), so the reset steps after lost lives are not in it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tianji_jax.envs.host_common import (HostStep, _check_id, _check_num_envs, _EpisodeTracker, _HostVecEnv,
                                         envpool_ids, flatten_observation, from_gymnasium_space, gymnasium_ids,
                                         observation_space, quiet_envpool_spaces)

__all__ = ["HostStep", "EnvpoolVecEnv", "quiet_envpool_spaces", "GymnasiumVecEnv", "envpool_ids", "gymnasium_ids",
           "from_gymnasium_space", "observation_space", "flatten_observation"]


class EnvpoolVecEnv(_HostVecEnv):
    """``num_envs`` envpool envs (gymnasium API), sync or async, returning :class:`HostStep` batches.

    Sync mode (``batch_size`` None or ``num_envs``): :meth:`reset` returns all ``N`` envs and
    :meth:`step` acts for all of them and returns all of them. Async mode (``batch_size < num_envs``):
    :meth:`reset` returns the first batch of ``batch_size`` envs; :meth:`step` sends the actions for
    the envs of the last returned batch and returns the next batch envpool finishes (its ids from
    ``info["env_id"]``), so ``N - batch_size`` envs are stepping while the actor computes actions.
    See the module docstring for the reset-step, truncation and Atari life semantics.

    Args:
        env_id: an envpool id (see :func:`envpool_ids`), e.g. ``"CartPole-v1"``, ``"Pong-v5"``.
        num_envs: ``N >= 1``.
        batch_size: ``None`` (= ``num_envs``, sync) or an integer in ``[1, num_envs]``.
        seed: envpool's base seed (env ``i`` is seeded from it by envpool).
        **envpool_kwargs: further envpool config, e.g. ``max_episode_steps=20``,
            ``episodic_life=True``, ``num_threads=2`` (the keys of
            ``envpool.make_spec(env_id).config``).

    Attributes:
        observation_space: :class:`Box` of one env's observation.
        action_space: :class:`Discrete` or :class:`Box` of one env's action.
        num_envs: ``N``.
        batch_size: ``B``, rows per :class:`HostStep`.
        is_async: ``batch_size < num_envs``.

    Raises:
        ValueError: unknown ``env_id`` (closest ids listed), ``num_envs < 1``, ``batch_size``
            outside ``[1, num_envs]``, an unknown or reserved config key (allowed keys listed), a
            multi-player env, or a non-Box observation / non-Discrete-or-Box action space.
    """

    _RESERVED = ("num_envs", "batch_size", "seed", "env_type")

    def __init__(self, env_id: str, num_envs: int, batch_size: int | None = None, seed: int = 0,
                 **envpool_kwargs: Any):
        import envpool

        _check_id(env_id, envpool_ids(), "envpool", "envpool.list_all_envs()")
        self.num_envs = _check_num_envs(num_envs)
        if batch_size is None:
            batch_size = self.num_envs
        if (isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer))
                or not 1 <= batch_size <= self.num_envs):
            raise ValueError(f"batch_size={batch_size!r}: must be None or an integer in "
                             f"[1, num_envs={self.num_envs}]")
        self.batch_size = int(batch_size)
        self.is_async = self.batch_size < self.num_envs
        allowed = [k for k in envpool.make_spec(env_id)._config_keys if k not in self._RESERVED]
        bad = sorted(k for k in envpool_kwargs if k not in allowed)
        if bad:
            raise ValueError(f"envpool_kwargs: unknown or reserved keys {bad} for env_id={env_id!r}; "
                             f"allowed: {allowed} (num_envs, batch_size and seed are arguments)")
        if int(envpool_kwargs.get("max_num_players", 1)) != 1:
            raise ValueError(f"max_num_players={envpool_kwargs['max_num_players']!r}: only "
                             "single-player envs are supported (allowed: 1)")
        self.env_id = env_id
        with quiet_envpool_spaces():
            self._env = envpool.make(env_id, env_type="gymnasium", num_envs=self.num_envs,
                                     batch_size=self.batch_size, seed=int(seed), **envpool_kwargs)
        players = int(self._env.spec.config.max_num_players)
        if players != 1:
            self._env.close()
            raise ValueError(f"env_id={env_id!r}: multi-player envs are not supported "
                             f"(max_num_players={players}, allowed: 1)")
        with quiet_envpool_spaces():
            self._init_spaces(self._env.observation_space, self._env.action_space, env_id)
        self._tracker = _EpisodeTracker(self.num_envs)
        self._awaiting: np.ndarray | None = None  # env ids that need an action next
        self._awaiting_sorted = False  # _awaiting is 0..N-1 in order (sync mode: actions need no reordering)
        self._all = np.arange(self.num_envs, dtype=np.int32)
        self._closed = False

    def _convert(self, out: tuple) -> HostStep:
        obs, reward, terminated, truncated, info = out
        env_id = np.asarray(info["env_id"], np.int32)
        truncated = np.asarray(truncated, bool)
        stat_reward = info.get("reward", reward)
        if "terminated" in info:  # Atari: a game over, as opposed to a lost life
            episode_end = truncated | (np.asarray(info["terminated"]) != 0)
        else:
            episode_end = np.ones(env_id.shape, bool)
        step = self._make_step(env_id, obs, reward, terminated, truncated, stat_reward, episode_end)
        self._awaiting = step.env_id
        self._awaiting_sorted = step.env_id.size == self.num_envs and bool((step.env_id == self._all).all())
        return step

    def reset(self) -> HostStep:
        """Reset the envs and return their first observations (every row ``valid=False``).

        Sync mode: all ``N`` envs (may be called again at any time: every env restarts and the
        statistics of unfinished episodes are dropped). Async mode: the first received batch of
        ``batch_size`` envs; the others' first observations arrive, also ``valid=False``, in the
        following :meth:`step` calls.

        Raises:
            RuntimeError: the env is closed, or async mode and :meth:`reset` was already called
                (envs are in flight; create a new instance to restart).
        """
        if self._closed:
            raise RuntimeError(f"EnvpoolVecEnv({self.env_id!r}) is closed")
        if self.is_async:
            if self._awaiting is not None:
                raise RuntimeError("async mode: reset() may be called only once, before stepping "
                                   "(envs are in flight); create a new EnvpoolVecEnv to restart")
            self._env.async_reset()
            self._tracker.restart()
            return self._convert(self._env.recv())
        self._tracker.restart()
        obs, info = self._env.reset()
        n = self.num_envs
        return self._convert((obs, np.zeros(n, np.float32), np.zeros(n, bool), np.zeros(n, bool),
                              {"env_id": info["env_id"]}))

    def step(self, actions: Any, env_id: Any = None) -> HostStep:
        """Act for the envs awaiting an action and return the next batch.

        Args:
            actions: ``(B,)`` int (Discrete, in ``[0, n)``) or ``(B, *action_shape)`` float (Box),
                row ``i`` for env ``env_id[i]``. The action for a done env's final obs is ignored
                by envpool (its next step is a reset step).
            env_id: ``(B,)`` int, the env ids of the last returned :class:`HostStep` in any order
                (async mode: required; sync mode: defaults to ``0..N-1`` and may be any
                permutation of it).

        Returns:
            Sync mode: the :class:`HostStep` of all ``N`` envs. Async mode: the next received batch
            of ``batch_size`` envs (any of them, not necessarily the ones just sent).

        Raises:
            RuntimeError: :meth:`reset` not called yet, or the env is closed.
            ValueError: bad ``env_id`` (see :meth:`check_env_id`) or bad actions (see
                :meth:`check_actions`).
        """
        if self._closed:
            raise RuntimeError(f"EnvpoolVecEnv({self.env_id!r}) is closed")
        if self._awaiting is None:
            raise RuntimeError("step() before reset(): call reset() first")
        if env_id is None:
            if self.is_async:
                raise ValueError(f"env_id: required in async mode (batch_size={self.batch_size} < "
                                 f"num_envs={self.num_envs}); pass the env_id of the last HostStep, "
                                 f"{np.sort(self._awaiting).tolist()}")
            env_id = np.arange(self.num_envs, dtype=np.int32)
        ids = self.check_env_id(env_id, self._awaiting)
        acts = self.check_actions(actions, ids.shape[0])
        if self.is_async:
            self._env.send(acts, ids)
            return self._convert(self._env.recv())
        if ids is not self._awaiting or not self._awaiting_sorted:
            ordered = np.empty_like(acts)
            ordered[ids] = acts
            acts = ordered
        return self._convert(self._env.step(acts, self._all))

    def close(self) -> None:
        """Close envpool's env (idempotent)."""
        if not self._closed:
            self._closed = True
            self._env.close()


class GymnasiumVecEnv(_HostVecEnv):
    """``num_envs`` gymnasium envs in a ``SyncVectorEnv`` (next-step auto-reset), as :class:`HostStep`.

    The same :meth:`reset`/:meth:`step` API as :class:`EnvpoolVecEnv` in sync mode (there is no
    async mode: ``batch_size == num_envs``). Built with
    ``gymnasium.make_vec(env_id, num_envs, vectorization_mode="sync",
    vector_kwargs={"autoreset_mode": AutoresetMode.NEXT_STEP}, **kwargs)``; see the module
    docstring for the verified auto-reset behaviour.

    Args:
        env_id: a gymnasium id (see :func:`gymnasium_ids`), e.g. ``"CartPole-v1"``.
        num_envs: ``N >= 1``.
        seed: the first :meth:`reset` seeds env ``i`` with ``seed + i`` (gymnasium's vector
            convention); later resets continue the envs' generators.
        **kwargs: passed to ``gymnasium.make`` for every env, e.g. ``max_episode_steps=20``.

    Attributes:
        observation_space, action_space, num_envs, batch_size (``= num_envs``), is_async (False).

    Raises:
        ValueError: unknown ``env_id`` (closest ids listed), ``num_envs < 1``, kwargs the env
            rejects (the env's message is included), or unsupported spaces.
    """

    def __init__(self, env_id: str, num_envs: int, seed: int = 0, **kwargs: Any):
        import gymnasium

        _check_id(env_id, gymnasium_ids(), "gymnasium", "gymnasium.registry")
        self.num_envs = _check_num_envs(num_envs)
        self.batch_size = self.num_envs
        self.is_async = False
        self.env_id = env_id
        try:
            self._env = gymnasium.make_vec(
                env_id, num_envs=self.num_envs, vectorization_mode="sync",
                vector_kwargs={"autoreset_mode": gymnasium.vector.AutoresetMode.NEXT_STEP}, **kwargs)
        except TypeError as err:
            raise ValueError(f"kwargs: env_id={env_id!r} rejected {sorted(kwargs)}: {err}") from None
        self._init_spaces(self._env.single_observation_space, self._env.single_action_space, env_id)
        self._seed = int(seed)
        self._tracker = _EpisodeTracker(self.num_envs)
        self._all = np.arange(self.num_envs, dtype=np.int32)
        self._started = False
        self._closed = False

    def reset(self) -> HostStep:
        """Reset all envs and return their first observations (every row ``valid=False``).

        May be called again at any time (statistics of unfinished episodes are dropped).

        Raises:
            RuntimeError: the env is closed.
        """
        if self._closed:
            raise RuntimeError(f"GymnasiumVecEnv({self.env_id!r}) is closed")
        obs, _ = self._env.reset(seed=None if self._started else self._seed)
        self._started = True
        self._tracker.restart()
        n = self.num_envs
        zeros = np.zeros(n, bool)
        return self._make_step(self._all, obs, np.zeros(n, np.float32), zeros, zeros,
                               np.zeros(n), np.ones(n, bool))

    def step(self, actions: Any, env_id: Any = None) -> HostStep:
        """Act for all envs and return all of them.

        Args:
            actions: ``(N,)`` int (Discrete) or ``(N, *action_shape)`` float (Box), row ``i`` for
                env ``env_id[i]``.
            env_id: ``None`` (= ``0..N-1``) or any permutation of ``0..N-1``.

        Returns:
            The :class:`HostStep` of all ``N`` envs, rows in env id order.

        Raises:
            RuntimeError: :meth:`reset` not called yet, or the env is closed.
            ValueError: ``env_id`` is not a permutation of all env ids, or bad actions.
        """
        if self._closed:
            raise RuntimeError(f"GymnasiumVecEnv({self.env_id!r}) is closed")
        if not self._started:
            raise RuntimeError("step() before reset(): call reset() first")
        ids = self._all if env_id is None else self.check_env_id(env_id, self._all)
        acts = self.check_actions(actions, self.num_envs)
        ordered = np.empty_like(acts)
        ordered[ids] = acts
        obs, reward, terminated, truncated, _ = self._env.step(ordered)
        return self._make_step(self._all, obs, reward, terminated, truncated, reward,
                               np.ones(self.num_envs, bool))

    def close(self) -> None:
        """Close the vector env (idempotent)."""
        if not self._closed:
            self._closed = True
            self._env.close()
