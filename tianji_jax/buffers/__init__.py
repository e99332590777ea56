"""Buffers between actors and learners, all below the algorithms: the rollout queue and the
replay ingress of the async runtime (:mod:`~tianji_jax.buffers.queues`) with its rate limiter,
the device-resident replay buffers as bundles of pure functions (:mod:`~tianji_jax.buffers.replay`
for transitions, uniform or prioritised over a :mod:`~tianji_jax.buffers.sum_tree`;
:mod:`~tianji_jax.buffers.frame_replay` for Atari frames stored once), the transition record,
and the schedule file that records which rollout each learner update consumed."""

from tianji_jax.buffers import frame_replay, replay, sum_tree
from tianji_jax.buffers.frame_replay import FrameReplayState, FrameSample
from tianji_jax.buffers.queues import ReplayIngress, TrajectoryItem, TrajectoryQueue
from tianji_jax.buffers.rate_limiter import RateLimiter
from tianji_jax.buffers.replay import ReplaySample, ReplayState
from tianji_jax.buffers.schedule_file import Schedule, ScheduleRecorder, load_schedule
from tianji_jax.buffers.transition import Transition

__all__ = ["replay", "frame_replay", "sum_tree", "ReplayState", "ReplaySample", "FrameReplayState", "FrameSample",
           "TrajectoryItem", "TrajectoryQueue", "ReplayIngress", "RateLimiter", "Transition", "Schedule",
           "ScheduleRecorder", "load_schedule"]
