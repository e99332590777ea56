"""Frame-deduplicated replay for Atari-style stacked observations, as a small pure API.

A DQN replay item for Atari is ``(obs, action, n-step reward, discount, next_obs)`` where ``obs``
and ``next_obs`` are stacks of ``S = 4`` frames of ``84 x 84`` uint8. Stored naively every frame
is kept ``2 S = 8`` times (in four ``obs`` stacks and four ``next_obs`` stacks). This buffer
stores every frame once, per env, in a ring of single frames, and rebuilds both stacks at sample
time by index arithmetic (as Dopamine's circular replay buffer and Mnih et al. 2015's replay
memory do), so a 1M-transition Pong buffer takes about 6.6 GiB instead of 52.6 GiB (see
:func:`frame_replay_bytes`)::

    state = frame_replay.init(num_envs=8, capacity=1_000_000, frame_shape=(84, 84),
                              stack=4, n_step=3, gamma=0.99, prioritised=True)
    add = jax.jit(frame_replay.add, donate_argnums=0)
    sample = jax.jit(frame_replay.sample, static_argnames="batch_size")
    update = jax.jit(frame_replay.update_priorities, donate_argnums=0)

    state = add(state, frame, action, reward, terminated, truncated, first, version)  # per env step
    if frame_replay.can_sample(state, min_size=50_000):
        s = sample(state, key, batch_size=32, beta=beta)   # s.transition: a dqn.Transition
        ...
        state = update(state, s.indices, s.step, td, alpha=0.6)

Input: one call per env step, a batch over envs (rows ``B``, env ids ``env_id``) of
    ``frame`` ``(B, H, W)`` -- the newest frame of the env's stacked observation (envpool:
    ``obs[:, -1]``); ``action`` ``(B,)`` -- the action whose step produced ``frame``;
    ``reward``, ``terminated``, ``truncated`` ``(B,)`` of that step; ``first`` ``(B,)`` -- True
    where ``frame`` is the first frame of a new episode (its action/reward/flags are ignored);
    ``version`` -- the policy version that chose ``action``; optional ``final_frame`` for
    same-step auto-reset envs. Mapping for the actors of this library:

    * envpool / gymnasium via :class:`tianji_jax.envs.host.HostStep` (next-step auto-reset): pass
      ``frame=step.obs[:, -1]``, ``first=~step.valid`` (the reset step after a done, and the first
      obs after :meth:`reset`), ``terminated``/``truncated`` from the step, ``env_id=step.env_id``
      (async envpool batches hold a subset of envs), the actions sent for those envs, no
      ``final_frame``. On a done step ``obs`` is already the true final observation. With
      ``episodic_life=True`` also pass ``stack_reset`` (see :func:`add`).
    * same-step auto-reset envs (gymnax, :class:`tianji_jax.envs.core.Timestep`): pass
      ``frame=`` the newest frame of ``ts.obs`` (the next episode's first frame on done steps)
      and ``final_frame=`` the newest frame of ``ts.final_obs``; done rows then write two slots
      (the final frame, then the new episode's first frame). Pass ``first=True`` for the initial
      reset frames.

Episode boundaries: a stack that would reach back before its episode's first frame repeats that
first frame, which is what envpool's frame stacking does at reset (checked with envpool 1.2.5
Pong-v5 in ``tests/buffers/test_frame_replay.py``: the reset observation is four copies of the reset
frame and each step shifts in one new frame). No frame of an earlier episode ever enters a stack
-- except where the env itself keeps stacking across a reset (envpool's ``episodic_life``: see
``stack_reset`` in :func:`add`); the rebuilt stacks always equal what the env showed the agent.

Which transitions can be sampled: a start ``t`` (absolute step of env ``e``, whose frame is the
newest of ``obs``) is *valid* iff (i) its frame is not an episode's final frame, (ii) the frames
its ``obs`` stack needs (back to ``t - S + 1`` or the stack's start frame) are still held, i.e.
not overwritten by the ring, and (iii) its lookahead is complete: the next ``m`` frames are
written and in the same episode, ``m = n`` or fewer where the episode ended (terminated or
truncated) at ``t + m``. Validity is kept per slot and every change of it (a write completes
lookaheads of the ``n`` previous starts, and overwrites the history of the oldest ``S - 1``) is
pushed into one sum-tree (:mod:`tianji_jax.buffers.sum_tree`) whose leaf is ``valid * priority`` (or
``valid * 1`` for a uniform buffer), so sampling never returns an invalid start and costs
``O(B log C)``.

n-step transitions (Hessel et al. 2018, as :func:`tianji_jax.algos.dqn.n_step_transitions`):
``reward = sum_{j<m} gamma^j r_{t+j}``, ``discount = gamma^m`` or 0 where the episode terminated
at ``t + m``, ``next_obs`` = the stack ending at frame ``t + m`` (the true final frame at a
truncation).

Stamps: each transition carries the policy version that chose its action (``policy_version``)
and its identity ``(env_id, step)`` so priority updates skip starts overwritten since sampling.
Counters are int32 per env (``2^31`` steps per env).
"""

from tianji_jax.buffers.frame_replay.sampling import FrameSample, can_sample, sample, update_priorities
from tianji_jax.buffers.frame_replay.state import FrameReplayState, add, frame_replay_bytes, init, slots_per_env

__all__ = ["FrameReplayState", "FrameSample", "init", "add", "can_sample", "sample", "update_priorities",
           "frame_replay_bytes", "slots_per_env"]
