"""Replay-algorithm actors on host envs (envpool, gymnasium): the Sebulba host actor acting with
the agent's behaviour policy (DQN: epsilon-greedy; SAC: its squashed Gaussian), turning its
``(T, N)`` chunks into exact n-step replay transitions.

The env loop, reset-step handling and per-env chunk assembly are
:class:`~tianji_jax.runtime.actors.host_actor.HostActor`'s and
:class:`~tianji_jax.runtime.actors.chunker.TrajectoryChunker`'s, shared with PPO: envpool's reset steps
(the step after an episode ends, whose action the env ignores) never become transitions, and every
column of a chunk holds ``T`` consecutive transitions of one env with ``final_obs[t]`` the true
successor of step ``t`` (the final observation on a terminated or truncated step). This module
adds what the replay data path needs on top (n-step targets as in Hessel et al. 2018):

* **actions**: the agent's :meth:`~tianji_jax.algos.replay_agent.ReplayAgent.host_act` on the
  actor device, with per-env exploration parameters from its
  :meth:`~tianji_jax.algos.replay_agent.ReplayAgent.host_explore` (DQN: the linear epsilon
  schedule on the run's env steps, or Ape-X's fixed per-env epsilons);
* **n-step windows across chunks**: :class:`HostNStep` keeps the last ``n - 1`` steps of every env
  on the actor device and runs :func:`~tianji_jax.algos.replay_agent.window_transitions`, the same
  builder gymnax actors use, so no transition is lost or duplicated at a chunk boundary. A
  termination ends the n-step sum with discount 0; a truncation ends it and bootstraps from the
  true final observation;
* **versions**: as for PPO, a rollout that starts with new params drops the chunker's leftovers
  acted with older params (counted in ``chunker.transitions_discarded`` / ``stale_actions``), so
  a chunk's steps carry one version and every replay item keeps the exact version it was acted
  with. Dropping leftovers leaves a gap in those envs' streams: the window before the gap is
  closed as a truncation (:func:`window_transitions`' ``gap``), so its transitions keep correct
  ``k < n``-step targets instead of reaching across the gap.

Observations keep the env's dtype end to end (uint8 Atari frames are not cast on the host; the
Q-network casts on device).

**Frame chunks** (``config.frame_replay``: envpool Atari, stacks of uint8 frames): instead of
n-step transitions with whole ``obs`` / ``next_obs`` stacks, the actor hands the learner the
chunk's frames (:data:`~tianji_jax.algos.dqn.agent.FRAME_KEYS`: the stacks acted on, each
step's newest successor frame, actions, rewards, flags, versions and ``start``, where a stack
begins a stretch of the env's stream) and the learner's
:meth:`~tianji_jax.algos.dqn.agent.DQNAgent.insert_frames` stores every frame once in
:mod:`tianji_jax.buffers.frame_replay`, which forms n-step targets when sampling. ``start`` is set after
every ``terminated`` / ``truncated`` step (a game over or, with ``episodic_life``, a lost life),
for every env at the actor's first chunk, and for the envs whose leftovers were dropped (a gap).
Chunks carry the actor's sequence number so the learner treats a chunk dropped by the lag gate
as a gap too.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from tianji_jax.envs.host import HostStep
from tianji_jax.algos.replay_agent import HISTORY_KEYS, ReplayAgent, window_transitions
from tianji_jax.runtime.actors.host_actor import HostActor, fold_key

__all__ = ["HostNStep", "ReplayHostActor", "chunk_episode_stats", "replay_host_actor"]


def chunk_episode_stats(chunk: dict[str, np.ndarray]) -> dict[str, float]:
    """Episode statistics of a host chunk: ``episode_return_sum``, ``episode_length_sum`` (float)
    and ``episode_count`` (int) over the steps where an episode for statistics ended
    (``episode_length > 0``; for envpool Atari a whole game, not a life)."""
    ended = np.asarray(chunk["episode_length"]) > 0
    return {"episode_return_sum": float(np.asarray(chunk["episode_return"])[ended].sum()),
            "episode_length_sum": float(np.asarray(chunk["episode_length"])[ended].sum()),
            "episode_count": int(ended.sum())}


class HostNStep:
    """n-step transitions from a host actor's consecutive ``(T, N)`` chunks (one per actor).

    Holds the last ``H = n_step - 1`` steps of each env (on ``device``) between chunks and builds
    the ``T * N`` transitions that start at the oldest ``T`` steps of ``history + chunk``
    (:func:`~tianji_jax.algos.replay_agent.window_transitions`): every transition is exact
    (``n`` steps, or fewer when its episode ends, or before a :meth:`cut`), inserted once, ``H``
    chunks-steps late. Slots not filled yet at the start come back with ``mask=False``.

    Args:
        agent: the run's :class:`~tianji_jax.algos.replay_agent.ReplayAgent` (window shape, ``gamma``,
            ``n_step``).
        device: where the window lives and the builder runs (the actor device).
        build: optional jitted ``window_transitions`` (shared between actors); built if None.
    """

    def __init__(self, agent: ReplayAgent, device: Any = None, build: Callable | None = None):
        cfg = agent.config
        self.num_envs, self.history_len = cfg.num_envs, agent.history_len
        self.device = device
        self.history = jax.device_put(agent.init_history(), device)
        self._build = build if build is not None else jax.jit(partial(window_transitions, gamma=cfg.gamma,
                                                                       n=cfg.n_step))
        self._gap = np.zeros((cfg.num_envs,), bool)
        self.continuous = agent.continuous

    def cut(self, envs: np.ndarray) -> None:
        """Mark a gap in the streams of ``envs`` (``(N,)`` bool): steps between the last chunk and
        the next were dropped. Their pending windows end at the last step seen (as a truncation)."""
        self._gap |= np.asarray(envs, bool).reshape(self.num_envs)

    def __call__(self, chunk: dict[str, np.ndarray]) -> tuple[Any, jax.Array, jax.Array]:
        """Transitions of one chunk.

        Args:
            chunk: :meth:`~tianji_jax.runtime.actors.chunker.TrajectoryChunker.pop`'s dict (``obs``,
                ``action``, ``reward``, ``terminated``, ``truncated``, ``final_obs``,
                ``policy_version`` are read; leaves ``(T, N, ...)``), continuing the previous chunk
                env by env.

        Returns:
            ``(items, item_version, mask)`` on ``device``: a
            :class:`~tianji_jax.algos.dqn.Transition` with leaves ``(T * N, ...)`` (obs in their
            own dtype), ``(T * N,)`` int32 acting versions, ``(T * N,)`` bool validity.
        """
        steps = {k: chunk[k] for k in HISTORY_KEYS if k != "valid"}
        steps["valid"] = np.ones(np.shape(chunk["reward"]), bool)
        steps["action"] = np.asarray(steps["action"], np.float32 if self.continuous else np.int32)
        steps, gap = jax.device_put((steps, self._gap.copy()), self.device)
        items, item_version, mask, self.history = self._build(self.history, steps, gap=gap)
        self._gap[:] = False
        return items, item_version, mask


class ReplayHostActor(HostActor):
    """One replay actor thread on a host env; call it as the runtime's ``act(params, version)``.

    Steps the env until every env has ``T = num_steps`` transitions acted with ``params``, acting
    epsilon-greedy on the actor device, then returns the chunk's n-step transitions (see the
    module docstring) on the learner device.

    Args:
        config: the run's replay config (host ``env``, ``runtime='async'``).
        agent: the run's :class:`~tianji_jax.algos.replay_agent.ReplayAgent` (may be a cached one
            built from the compile key).
        host_act: jitted :meth:`~tianji_jax.algos.replay_agent.ReplayAgent.host_act`.
        build: jitted :func:`window_transitions` for ``config`` (``gamma``, ``n_step`` bound).
        actor_id: index of this actor (its envs' seeds and Ape-X epsilons).
        key: the actor's PRNG key.
        actor_device: where acting (and the n-step window builder) runs.
        to_learner: ``to_learner(tree) -> tree`` places a chunk's arrays (``(items, item_version,
            mask)``, or the frame dict) where the learner inserts them (its device, or sharded
            over data-parallel learners); None leaves them on the actor device.
        run_env_steps: ``() -> int``, env steps of the whole run so far (the linear epsilon schedule).
        timer: ``timer(name, t0)`` as :class:`HostActor`.
        seed: run seed the envs' seeds derive from (default ``config.seed``; a resumed run passes
            :func:`~tianji_jax.runtime.async_on_policy.resume_seed`'s).

    Returns (per call):
        ``(((items, item_version, mask, stats), None), T * N)``: the first three placed by ``to_learner``
        (as :meth:`~tianji_jax.algos.replay_agent.ReplayAgent.rollout` returns them; with ``config.frame_replay``: ``(frames, seq,
        None, stats)``, ``frames`` the :data:`~tianji_jax.algos.dqn.agent.FRAME_KEYS` dict on
        the learner and ``seq`` this actor's chunk number), ``stats`` host numbers ``episode_return_sum``,
        ``episode_length_sum``, ``episode_count`` and ``epsilon`` (mean over the actor's envs of
        their epsilons when the chunk is complete).
    """

    HOST_STATISTICS = False  # normalisation: the learner's statistics come with the params (ActingParams)

    def __init__(self, config: Any, agent: ReplayAgent, host_act: Callable, build: Callable, actor_id: int,
                 key: jax.Array, actor_device: Any, to_learner: Callable | None, run_env_steps: Callable[[], int],
                 timer: Callable[[str, float], None], seed: int | None = None):
        self.run_env_steps = run_env_steps
        self.to_learner_tree = to_learner or (lambda tree: tree)
        self._host_act = host_act
        self.agent = agent
        self.num_actors = config.num_actors
        self.frames = agent.frame_replay
        self.n_step = None if self.frames else HostNStep(agent, actor_device, build)
        self._start = np.ones((config.num_envs,), bool)  # frames: the next step of each env starts a stretch
        self.chunks_sent = 0  # frames: sequence number of the next chunk
        super().__init__(config, None, actor_id, key, actor_device, self._finish, timer, seed=seed)

    def _act(self, params: Any, step: HostStep) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        eps = self.agent.host_explore(self.run_env_steps(), self.actor_id, self.num_actors)[step.env_id]
        # numpy in: jit places it beside the committed params and key (cheaper than jax.device_put)
        action, self.key = self._host_act(params, step.obs, self.key, np.asarray(eps, np.float32))
        action = np.asarray(action)
        zeros = np.zeros(action.shape[:1], np.float32)  # no log-prob / value on the replay path
        return action, action, zeros, zeros

    def _traceable_act(self) -> Callable:
        """The agent's :meth:`~tianji_jax.algos.replay_agent.ReplayAgent.host_act` in a compiled
        block's signature (``arg``: the ``(N,)`` exploration parameters; zero log-probs and values)."""
        host_act = self.agent.host_act

        def act(params, obs, key, explore):
            action, key = host_act(params, obs, key, explore)
            zeros = jnp.zeros(action.shape[:1], jnp.float32)
            return action, action, zeros, zeros, key

        return act

    def _block_arg(self) -> np.ndarray:
        """The ``(N,)`` float32 exploration parameters now (read once per compiled block)."""
        return np.asarray(self.agent.host_explore(self.run_env_steps(), self.actor_id, self.num_actors), np.float32)

    def _explore_stat(self) -> dict[str, float]:
        """The agent's exploration metric over this actor's envs now (DQN: mean epsilon), or none."""
        name = self.agent.EXPLORE_METRIC
        if name is None:
            return {}
        return {name: float(self.agent.host_explore(self.run_env_steps(), self.actor_id, self.num_actors).mean())}

    def _discard(self) -> None:
        # envs with leftovers or actions in flight lose steps: their windows end before the gap
        cut = (self.chunker.counts > 0) | self.chunker.pending_mask
        if self.frames:
            self._start |= cut
        else:
            self.n_step.cut(cut)
        super()._discard()

    def _frame_chunk(self, chunk: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The chunk as :data:`~tianji_jax.algos.dqn.agent.FRAME_KEYS` (see the module docstring)."""
        done = np.asarray(chunk["terminated"], bool) | np.asarray(chunk["truncated"], bool)
        start = np.concatenate([self._start[None], done[:-1]], 0)
        self._start = done[-1].copy()
        return {"obs": chunk["obs"], "final_frame": np.asarray(chunk["final_obs"])[:, :, -1],
                "action": np.asarray(chunk["action"], np.int32), "reward": np.asarray(chunk["reward"], np.float32),
                "terminated": np.asarray(chunk["terminated"], bool), "truncated": np.asarray(chunk["truncated"], bool),
                "policy_version": np.asarray(chunk["policy_version"], np.int32), "start": start}

    def _finish(self, chunk: dict[str, np.ndarray]) -> tuple:
        if self.frames:
            stats = {**chunk_episode_stats(chunk), **self._explore_stat()}
            seq, self.chunks_sent = self.chunks_sent, self.chunks_sent + 1
            return (self.to_learner_tree(self._frame_chunk(chunk)), seq, None, stats), None
        items, item_version, mask = self.n_step(chunk)
        stats = {**chunk_episode_stats(chunk), **self._explore_stat()}
        # no actor state for a checkpoint cut: host env state cannot be saved (a resume re-seeds)
        return (*self.to_learner_tree((items, item_version, mask)), stats), None


def replay_host_actor(config: Any, actor_id: int, device: Any, *, seed: int,
                      timer: Callable[[str, float], None], key_folds: tuple[int, ...] = (),
                      run_env_steps: Callable[[], int] | None = None) -> ReplayHostActor:
    """Every replay algorithm's host actor factory (``Algorithm.host_actor``, used by the remote
    Ray worker): a :class:`ReplayHostActor` of the config's agent acting and building its n-step
    transitions (or DQN's frame chunks) on ``device``, whose chunks the learner places on its
    device after ``jax.device_get``. Key: the agent's actor key of ``config.seed`` folded with
    ``key_folds``; envs seeded from ``seed``; ``run_env_steps()`` (the run's env steps, for
    schedules such as DQN's linear epsilon) is read at every env step (a remote actor sees the
    value sent with its newest rollout request)."""
    from tianji_jax.algos.registry import agent_class_for

    agent = agent_class_for(config)(config)  # not the compile key: re-validating would check replay memory here
    build = jax.jit(partial(window_transitions, gamma=agent.config.gamma, n=agent.config.n_step))
    key = fold_key(agent.split_init_key(jax.random.PRNGKey(config.seed))[0], key_folds)
    return ReplayHostActor(config, agent, jax.jit(agent.host_act), build, actor_id, key, device, None,
                           run_env_steps or (lambda: 0), timer, seed=seed)
