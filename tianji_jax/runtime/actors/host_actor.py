"""The Sebulba actor: a host env (envpool or gymnasium) stepped on the CPU, the policy on a JAX device.

Each step the actor sends the observations of the envs awaiting an action to its device, runs the
jitted policy there, brings the actions back and steps the host env; a
:class:`~tianji_jax.runtime.actors.chunker.TrajectoryChunker` turns the stream (reset steps dropped, any
env arrival order in envpool's async mode) into ``(T, N)`` trajectories, which go to the learner's
device. envpool releases the GIL while it steps, so actor threads and the learner overlap
(Hessel et al. 2021, "Podracer architectures for scalable RL", Sebulba).
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from tianji_jax.algos.config_base import AgentConfig
from tianji_jax.envs.host import HostStep
from tianji_jax.envs.spaces import Box
from tianji_jax.runtime.actors.chunker import TrajectoryChunker
from tianji_jax.runtime.actors.envpool_rollout import EnvpoolRollout, compiled_rollout_unsupported
from tianji_jax.runtime.actors.host_normalize import HostNormalizer, MeanStd

__all__ = ["HostActor", "params_to_actor", "host_env_seed", "host_policy", "host_outputs", "make_host_evaluate", "on_policy_host_actor",
           "fold_key"]


def host_env_seed(seed: int, actor_id: int, num_envs: int) -> int:
    """envpool/gymnasium base seed of actor ``actor_id``: disjoint per-env seeds across actors of
    one run (env ``i`` of the actor gets ``base + i``), kept in [0, 2**31): ``(seed + actor_id *
    num_envs) mod 2**31`` with ``num_envs`` the envs per actor."""
    return (int(seed) + actor_id * num_envs) % 2**31


_PUT_LOCK = threading.Lock()


def params_to_actor(params: Any, device: Any) -> Any:
    """``params`` copied to an actor's ``device`` (blocking until there), one actor thread at a time.

    Actor threads fetch the same published params; when these are replicated over several
    data-parallel learner devices, concurrent ``jax.device_put`` calls on the same arrays were seen
    to fail inside JAX (``safe_zip`` length mismatch while gathering the array's shards, 1 run in
    several under load), so the copies are serialised: each is a small host-side copy next to a
    rollout.
    """
    with _PUT_LOCK:
        return jax.block_until_ready(jax.device_put(params, device))


def fold_key(key: jax.Array, folds: tuple[int, ...]) -> jax.Array:
    """``key`` folded with each of ``folds`` in turn (``jax.random.fold_in``)."""
    for f in folds:
        key = jax.random.fold_in(key, int(f))
    return key


def on_policy_host_actor(config: Any, actor_id: int, device: Any, *, seed: int,
                         timer: Callable[[str, float], None], key_folds: tuple[int, ...] = (),
                         run_env_steps: Callable[[], int] | None = None) -> "HostActor":
    """The host actor factory of every on-policy algorithm (``Algorithm.host_actor``, used by the
    remote Ray worker): a :class:`HostActor` with the config's agent's acting step
    (:meth:`~tianji_jax.algos.on_policy.OnPolicyAgent.act`) jitted on ``device``, whose chunks are
    the chunker's ``(T, N)`` trajectories as host numpy arrays. Key: the agent's actor key of
    ``config.seed`` folded with ``key_folds``; envs seeded from ``seed``; ``run_env_steps`` is
    unused."""
    from tianji_jax.runtime.anakin import make_agent

    agent = make_agent(config)
    key = fold_key(agent.split_init_key(jax.random.PRNGKey(config.seed))[0], key_folds)
    return HostActor(config, host_policy(agent), actor_id, key, device, lambda traj: traj, timer, seed=seed,
                     initial_carry=agent.initial_carry if agent.recurrent else None)


def host_policy(agent: Any) -> Callable:
    """The jitted acting step a :class:`HostActor` runs for an on-policy ``agent``:
    :meth:`~tianji_jax.algos.on_policy.OnPolicyAgent.act` with its outputs fetched as host arrays
    (:func:`host_outputs`), or ``act_recurrent`` (jitted, outputs on the device) for a recurrent one."""
    return jax.jit(agent.act_recurrent) if agent.recurrent else host_outputs(agent.act)


def host_outputs(fn: Callable) -> Callable:
    """``fn(*args) -> (*outs, key)`` jitted, returning ``outs`` as host numpy arrays and ``key`` on the device.

    Each ``out`` is ``(B, ...)``; on the device they are cast to float32 and packed side by side into
    one ``(B, F)`` array, so a step costs one device-to-host copy instead of one per output (about 60
    microseconds a step less on a CPU device), and unpacked here to their shapes and dtypes. The
    round trip is exact for float32 outputs and for integer outputs below 2**24 in magnitude (action
    indices); ``fn`` must not return other dtypes. The returned callable's ``fn`` attribute is
    ``fn`` itself (traceable: a compiled rollout, :mod:`tianji_jax.runtime.actors.envpool_rollout`, runs it
    inside its loop).
    """
    layout: list[tuple[tuple[int, ...], Any]] = []  # each out's trailing shape and dtype, from the first call

    def packed(*args):
        *outs, key = fn(*args)
        b = outs[0].shape[0]
        return jnp.concatenate([o.reshape(b, -1).astype(jnp.float32) for o in outs], axis=1), key

    jitted = jax.jit(packed)

    lock = threading.Lock()  # several actor threads share one policy

    def call(*args):
        if not layout:
            *shapes, _ = jax.eval_shape(fn, *args)
            with lock:
                if not layout:
                    layout.extend((tuple(x.shape[1:]), x.dtype) for x in shapes)
        flat, key = jitted(*args)
        flat = np.asarray(flat)
        outs, col = [], 0
        for shape, dtype in layout:
            width = int(np.prod(shape, dtype=np.int64))
            outs.append(flat[:, col:col + width].reshape(flat.shape[0], *shape).astype(dtype))
            col += width
        return (*outs, key)

    call.fn = fn
    return call


class HostActor:
    """One actor thread's env, policy and chunker. Call it as the runtime's ``act(params, version)``.

    Args:
        config: the run's config (any registered algorithm's; ``env`` on a host
            backend; ``num_envs``, ``num_steps``, ``seed``, ``env_batch_size`` are read).
        policy: ``(params, obs (B, *obs), key, version) -> (env_action, action, log_prob, value,
            key)`` with the first four as host numpy arrays (:func:`host_policy`: the agent's
            :meth:`~tianji_jax.algos.on_policy.OnPolicyAgent.act` through :func:`host_outputs`).
        actor_id: index of this actor (seeds its envs and its key).
        key: the actor's PRNG key.
        actor_device: where the policy runs.
        to_learner: ``to_learner(traj) -> traj`` places a finished trajectory on the learner's
            device(s) (sharded over data-parallel learners).
        timer: ``timer(name, t0)`` adds ``perf_counter() - t0`` to the named phase (``rollout_s`` =
            inference + env step, split into ``inference_s`` and ``env_step_s`` when stepped from
            Python; a compiled rollout runs both in one program, so there the split stays 0 and
            ``rollout_s`` holds it all with the host's chunk assembly; ``h2d_s`` = transfers).
        seed: run seed the envs' seeds derive from (:func:`host_env_seed`); default
            ``config.seed`` (a resumed run passes a fresh one: host env state is not checkpointed).

    With ``config.normalize_observations`` / ``config.scale_rewards`` (on-policy configs) the actor
    owns a :class:`~tianji_jax.runtime.actors.host_normalize.HostNormalizer`: the published params are
    then a pair ``(params, statistics)`` (the run's statistics, see
    :mod:`tianji_jax.runtime.actors.host_normalize`), observations are acted on and stored normalised
    (float32), rewards stored scaled, and each trajectory carries the statistics folded in while
    producing it under the key ``"norm_delta"`` (host objects; the runtime takes it out before
    the trajectory goes to the learner's device).

    Attributes:
        chunker: the :class:`TrajectoryChunker`; ``chunker.transitions_discarded`` counts env steps
            dropped because a new rollout started with newer params (see :meth:`__call__`).
        env_steps: every env step taken, reset steps included.
        item_steps: env steps per returned trajectory, ``num_envs * num_steps``.
        compiled_reason: None when the actor steps its env in compiled blocks
            (:class:`~tianji_jax.runtime.actors.envpool_rollout.EnvpoolRollout`: an envpool sync-mode env
            with no host wrapper, a feed-forward policy without host normalisation, on the CPU;
            the trajectories are the Python loop's, step for step), else why it steps from Python.

    Recurrent agents (``initial_carry`` given): ``policy`` is
    :meth:`~tianji_jax.algos.on_policy.OnPolicyAgent.act_recurrent`; the actor keeps every env's
    core state on the host (leaves ``(N, H)``), zeroes it where a row is a reset step (the first
    obs of an episode: ``reset = ~valid``), records each transition's state before acting and its
    reset flag in the chunker, and each trajectory gets ``hidden_init`` (every column's state at its
    first transition, leaves ``(N, H)``) and ``reset`` ``(T, N)`` bool, so the learner's BPTT over a
    column starts from the state the actor had there (acted with the trajectory's policy version).

    Subclasses change what is acted (:meth:`_act`) and what happens when leftovers are dropped
    (:meth:`_discard`); DQN's actor (:class:`~tianji_jax.runtime.actors.replay_host.ReplayHostActor`) does both.
    A subclass whose learner keeps the statistics itself sets :attr:`HOST_STATISTICS` False.
    """

    HOST_STATISTICS: bool = True
    """Whether ``normalize_observations`` / ``scale_rewards`` make this actor keep host statistics
    (the on-policy path); the replay actor sets it False: its learner folds in the raw observations
    it inserts and publishes the statistics with the params."""

    def __init__(self, config: AgentConfig, policy: Callable | None, actor_id: int, key: jax.Array,
                 actor_device: Any, to_learner: Callable[[dict], dict], timer: Callable[[str, float], None],
                 seed: int | None = None, initial_carry: Callable[[int], Any] | None = None):
        spec = config.env_spec
        self.config, self.policy, self.actor_id = config, policy, actor_id
        self.actor_device, self.to_learner, self._time = actor_device, to_learner, timer
        self._add = lambda name, seconds: timer(name, time.perf_counter() - seconds)  # add a duration
        seed = config.seed if seed is None else seed
        self.env = spec.make_host_env(config.num_envs, host_env_seed(seed, actor_id, config.num_envs),
                                      config.env_batch_size, atari=getattr(config, "atari_settings", None))
        self.normalizer = HostNormalizer.for_config(config) if self.HOST_STATISTICS else None
        obs_space = spec.observation_space
        if self.normalizer is not None and self.normalizer.normalize_observations:
            obs_space = Box(obs_space.shape, np.dtype(np.float32), np.full(obs_space.shape, -np.inf),
                            np.full(obs_space.shape, np.inf))  # stored normalised
        extra = {}
        self._carry = self._carry_def = None
        if initial_carry is not None:  # a recurrent policy: every env's core state, kept on the host
            leaves, self._carry_def = jax.tree.flatten(jax.device_get(initial_carry(config.num_envs)))
            self._carry = [np.array(x, np.float32) for x in leaves]
            extra = {"reset": ((), np.bool_), **{f"carry_{i}": (x.shape[1:], np.float32) for i, x in enumerate(leaves)}}
        self._extra: dict | None = None  # the recurrent columns of the rows just acted on
        self.chunker = TrajectoryChunker.from_spaces(config.num_envs, config.num_steps, obs_space, spec.action_space,
                                                     extra=extra)
        self.key = jax.device_put(key, actor_device)
        self.env_steps = 0
        self.item_steps = config.num_envs * config.num_steps
        self._step: HostStep | None = None
        self._version: int | None = None
        self._compiled_act = self._traceable_act()
        self.compiled_reason = compiled_rollout_unsupported(
            self.env, actor_device, self._compiled_act, initial_carry is not None, self.normalizer)
        self._rollout: EnvpoolRollout | None = None  # built on the first call, after the env's reset

    def __call__(self, params: Any, version: int) -> tuple[dict[str, jax.Array], int]:
        """Step until every env has ``T`` transitions acted with ``params`` (stamped ``version``).

        Transitions left over from the previous call (an env that had fewer resets runs ahead) and
        actions still in flight are dropped when ``version`` differs from the previous call's, so
        every step of a trajectory carries ``version`` and the lag gate judges it exactly.

        Returns:
            ``(traj, T * N)``: the trajectory dict of
            :meth:`~tianji_jax.runtime.actors.chunker.TrajectoryChunker.pop` as arrays on the learner's
            device.
        """
        if self.normalizer is not None:  # the published pair: params and the run's statistics
            params, statistics = params
            self.normalizer.sync(statistics)
        t0 = time.perf_counter()
        params = params_to_actor(params, self.actor_device)
        self._time("h2d_s", t0)
        if self._version is not None and version != self._version:
            self._discard()
        self._version = version
        self._version_arg = np.int32(version)
        t0 = time.perf_counter()
        if self._step is None:
            self._step = self._wrap(self.env.reset())
            if self.compiled_reason is None:
                self._rollout = EnvpoolRollout(self.env, self._step, self._compiled_act, self.config.num_steps,
                                               self.actor_device)
        infer_s = env_s = 0.0
        while self._rollout is not None and not self.chunker.ready():
            # fewest steps that can make the chunker ready: a compiled rollout never overshoots
            n = self.config.num_steps - int(self.chunker.counts.min())
            self.key, block = self._rollout(params, self.key, self._block_arg(), n)
            self.chunker.record_block(block, version)
            self.env_steps += n * self.config.num_envs
        while not self.chunker.ready():
            step = self._step
            t1 = time.perf_counter()
            env_action, action, log_prob, value = self._act(params, step)
            t2 = time.perf_counter()
            self.chunker.record_action(step.env_id, step.obs, action, log_prob, value, version, self._extra)
            self._step = self._wrap(self.env.step(np.asarray(env_action), step.env_id))
            self.env_steps += len(self._step)
            self.chunker.record_step(self._step)
            infer_s += t2 - t1
            env_s += time.perf_counter() - t2
        traj = self.chunker.pop()
        if self._carry is not None:  # each column's core state at its first transition
            traj["hidden_init"] = self._carry_def.unflatten(
                [traj.pop(f"carry_{i}")[0] for i in range(len(self._carry))])
        if self.normalizer is not None:
            traj["norm_delta"] = self.normalizer.take_delta()
        self._time("rollout_s", t0)
        self._add("inference_s", infer_s)
        self._add("env_step_s", env_s)
        t0 = time.perf_counter()
        traj = jax.block_until_ready(self.to_learner(traj))
        self._time("h2d_s", t0)
        return traj, self.item_steps

    def _traceable_act(self) -> Callable | None:
        """The acting step a compiled block runs (:class:`EnvpoolRollout`): ``act(params, obs, key,
        arg) -> (env_action, action, log_prob, value, key)`` with ``arg`` = :meth:`_block_arg`;
        here the on-policy policy's traceable function (``policy.fn``, :func:`host_outputs`), or
        None (no compiled blocks)."""
        return getattr(self.policy, "fn", None)

    def _block_arg(self) -> Any:
        """The last argument of :meth:`_traceable_act` for the next block: the policy version (int32)."""
        return self._version_arg

    def _wrap(self, step: HostStep) -> HostStep:
        """``step`` as the policy and the chunker see it: normalised/scaled when configured."""
        return step if self.normalizer is None else self.normalizer(step)

    def _act(self, params: Any, step: HostStep) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``(env_action, action, log_prob, value)`` as host arrays for ``step``'s ``B`` envs:
        the policy of the current version run on the actor device on ``step.obs`` (advances
        ``self.key``)."""
        if self._carry is not None:
            return self._act_recurrent(params, step)
        # ``step.obs`` goes in as numpy: jit's C++ path moves it to the device the committed
        # ``params`` and ``key`` live on, far cheaper per step than ``jax.device_put``.
        env_action, action, log_prob, value, self.key = self.policy(params, step.obs, self.key, self._version_arg)
        return env_action, action, log_prob, value

    def _act_recurrent(self, params: Any, step: HostStep) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`_act` of a recurrent policy: acts from the rows' core states (zeroed on reset
        steps), stores their new states, and keeps the states before acting and the reset flags
        for the chunker (``self._extra``)."""
        ids = step.env_id
        rows = [c[ids] for c in self._carry]
        reset = ~np.asarray(step.valid, bool)
        carry, env_action, action, log_prob, value, self.key = self.policy(
            params, jax.device_put(self._carry_def.unflatten(rows), self.actor_device),
            jax.device_put(step.obs, self.actor_device), jax.device_put(reset, self.actor_device), self.key,
            np.int32(self._version))
        carry, env_action, action, log_prob, value = jax.device_get((carry, env_action, action, log_prob, value))
        for full, new in zip(self._carry, jax.tree.leaves(carry)):
            full[ids] = new
        self._extra = {"reset": reset, **{f"carry_{i}": r for i, r in enumerate(rows)}}
        return env_action, action, log_prob, value

    def _discard(self) -> None:
        """A rollout starts with new params: drop the chunker's leftovers and in-flight actions."""
        self.chunker.discard()

    def close(self) -> None:
        """Close the host env."""
        self.env.close()


def make_host_evaluate(config: AgentConfig, greedy: Callable, num_episodes: int,
                       initial_carry: Callable[[int], Any] | None = None) -> Callable:
    """``evaluate(params, obs_rms, key) -> (returns (M,) float32, lengths (M,) int32)`` on a host env.

    ``M = num_episodes`` envs of a separate host env (seeded from ``key``) each play one episode
    with the deterministic policy ``greedy(params, obs) -> env_action`` (a jitted function);
    with ``config.normalize_observations`` it acts on observations normalised by ``obs_rms`` (a
    :class:`~tianji_jax.algos.normalization.RunningMeanStd`, frozen: read, never updated; an action
    mask's entries raw), else
    ``obs_rms`` is unused. A recurrent policy (``initial_carry(M)`` gives the zero core state) is
    ``greedy(params, carry, obs, reset) -> (carry, env_action)``, its state carried through each
    episode and zeroed on the first obs (``reset = ~valid``). An episode is a full game
    for envpool Atari (:mod:`tianji_jax.envs.host`), played without episodic life or reward
    clipping (sticky actions as ``config.atari_settings``, where the config has them); it is cut
    after the spec's time limit.

    Raises:
        ValueError: ``num_episodes < 1``.
    """
    if num_episodes < 1:
        raise ValueError(f"num_episodes must be >= 1, got {num_episodes}")
    spec = config.env_spec
    limit = spec.episode_limit or 100_000

    def evaluate(params: Any, obs_rms: Any, key: jax.Array):
        seed = int(jax.random.randint(key, (), 0, 2**31 - 1))
        norm = MeanStd.from_running(obs_rms) if getattr(config, "normalize_observations", False) else None
        env = spec.make_host_env(num_episodes, seed, evaluation=True, atari=getattr(config, "atari_settings", None))
        try:
            returns = np.zeros(num_episodes, np.float32)
            lengths = np.zeros(num_episodes, np.int32)
            finished = np.zeros(num_episodes, bool)
            step = env.reset()
            carry = None if initial_carry is None else jax.tree.map(np.array, jax.device_get(initial_carry(num_episodes)))
            for _ in range(2 * limit + 2):  # reset steps after lost lives count too
                obs = step.obs if norm is None else norm.normalize(step.obs, spec.action_mask_size)  # mask raw
                if carry is None:
                    action = np.asarray(greedy(params, obs))
                else:  # the core state of the step's envs, by env id
                    ids = step.env_id
                    new, action = jax.device_get(greedy(params, jax.tree.map(lambda c: c[ids], carry), obs,
                                                        ~np.asarray(step.valid, bool)))
                    jax.tree.map(lambda full, rows: full.__setitem__(ids, rows), carry, new)
                    action = np.asarray(action)
                step = env.step(action, step.env_id)
                ended = (step.episode_length > 0) & ~finished[step.env_id]
                returns[step.env_id[ended]] = step.episode_return[ended]
                lengths[step.env_id[ended]] = step.episode_length[ended]
                finished[step.env_id[ended]] = True
                if finished.all():
                    break
        finally:
            env.close()
        return returns, lengths

    return evaluate
