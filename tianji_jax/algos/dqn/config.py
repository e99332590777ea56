"""The DQN-family run configuration, :class:`DQNConfig` (also importable from :mod:`tianji_jax.config`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

import tyro

from tianji_jax.config_base import (_ACTIVATIONS, _AgentConfig, _check_bool, _check_float, _check_int,
                                    _check_torso, _plain_numbers, _torso_text, fields_in, layout, run, tianji)
from tianji_jax import capabilities
from tianji_jax.config_checks import (_check_async_only, _check_atari, _check_distributional, _check_host_fields,
                                      _check_ray, _check_replay_layout)
from tianji_jax.envs.registry import ATARI_DEFAULTS, EnvSpec, resolve_env

__all__ = ["DQNConfig"]

_DQN_RUNTIMES = ("anakin", "async")
_ATARI_FIELD_DEFAULTS = ATARI_DEFAULTS  # the DQNConfig fields' defaults are the env layer's
_EPSILON_SCHEDULES = ("linear", "apex")


@dataclass(frozen=True)
class DQNConfig(_AgentConfig):
    """Configuration of a DQN-family run on Discrete actions.

    The family: DQN (Mnih et al. 2015, "Human-level control through deep reinforcement
    learning"), Double DQN (van Hasselt et al. 2016, ``double_q``), dueling heads (Wang et al.
    2016, "Dueling Network Architectures for Deep RL", ``dueling``), proportional prioritised
    replay (Schaul et al. 2016, "Prioritized Experience Replay", ``prioritized``) and n-step
    targets (Hessel et al. 2018, "Rainbow", ``n_step``).

    Defaults: CartPole-v1 settings of CleanRL's ``dqn.py`` / PureJaxRL's DQN (10 envs, 10k buffer,
    batch 128, learning starts at 10k env steps, one gradient step per 10 env steps, lr 2.5e-4,
    epsilon 1 -> 0.05 over half the run, MLP 120-84 relu, squared TD loss), plus Double DQN and
    3-step targets, with which the default job reaches an evaluation return of 475 within 500k env
    steps (``tests/test_dqn_learning.py``; measured on seeds 0-3: 200k-250k env steps, against
    300k-400k for CleanRL's one-step DQN). The Huber loss (``huber_delta=1``, Mnih et al.'s error
    clipping) diverged on CartPole with these settings (Q-values growing past 1e5), so it is opt-in.

    One **iteration** = the actor steps its ``num_envs`` envs ``num_steps`` times with
    epsilon-greedy actions (``num_envs * num_steps`` env steps, inserted into replay as n-step
    transitions), then, once more than ``learning_starts`` env steps have been taken, the learner
    runs a block of ``updates_per_step`` gradient steps and publishes its params (policy version
    += 1). ``updates_per_step = num_envs * num_steps * replay_ratio`` must be a whole number, so
    the replay ratio (gradient updates per env step) holds exactly, with no credit accumulator.
    With ``runtime='async'`` actor threads produce such iterations concurrently with the learner
    (the rate limiter holds the replay ratio); on host envs (envpool, gymnasium) each actor steps
    its envs on the host and acts with the Q-network on the actor device
    (:mod:`tianji_jax.runtime.dqn_host`).

    All step counts are env steps (one transition of one environment) unless the field says
    "gradient updates". Derived quantities are properties: ``iteration_env_steps``,
    ``updates_per_step``, ``num_iterations``, ``env_steps``, ``iterations_per_chunk``,
    ``num_gradient_steps``, ``epsilon_decay_steps``, ``replay_bytes``, plus ``describe()``.

    Raises:
        ValueError: a value outside its allowed range (the message names the field, the value and
            what is allowed), a non-Discrete action space, a runtime other than ``"anakin"`` /
            ``"async"``, a host env (envpool, gymnasium) with ``runtime="anakin"`` (host envs run
            on the async runtime only), ``epsilon_end > epsilon_start``, an unknown
            ``epsilon_schedule``, both or neither of ``target_update_period``
            and ``tau``, a replay ratio that does not give a whole number of gradient updates per
            iteration, or ``learning_starts`` too small to fill one batch.
        TypeError: a scalar of the wrong type.
        MemoryError: the replay buffer (``replay_bytes``) would not fit in the default device's
            free memory (checked with :func:`tianji_jax.replay.check_fits` before anything is
            allocated).
    """

    env: Annotated[Any, tyro.conf.arg(constructor=str, metavar="STR",
                                       help_behavior_hint="(default: gymnax:CartPole-v1)")] = "gymnax:CartPole-v1"
    """Environment with a Discrete action space: ``"gymnax:<id>"`` (or a bare gymnax id),
    ``"envpool:<id>"`` or ``"gymnasium:<id>"`` (host envs, runtime='async' only), or a gymnax-style
    environment object (see PPOConfig.env)."""
    seed: int = run(0)
    """Seed of the run's PRNG key; in [0, 2**32)."""
    total_env_steps: int = 500_000
    """Training budget in env steps (rounded down to a whole number of iterations)."""
    num_envs: int = 10
    """Number of parallel training environments N."""
    num_steps: int = 1
    """Rollout length T per iteration: env steps per env between two learner blocks."""
    buffer_capacity: int = 10_000
    """Replay capacity C in transitions (circular FIFO); in [1, 2**30] (the prioritised sum-tree's int32
    heap indices)."""
    learning_starts: int = 10_000
    """Learner blocks run only in iterations that end with more than this many env steps taken."""
    batch_size: int = 128
    """Transitions per gradient update."""
    replay_ratio: float = 0.1
    """Gradient updates per env step; ``num_envs * num_steps * replay_ratio`` must be a whole number >= 1."""
    learning_rate: float = 2.5e-4
    """Adam step size."""
    max_grad_norm: float = 10.0
    """Global-norm gradient clipping threshold, > 0."""
    gamma: float = 0.99
    """Discount factor, in [0, 1]."""
    n_step: int = 3
    """Steps of the n-step return (1 = one-step TD target)."""
    double_q: bool = True
    """Double DQN target (van Hasselt et al. 2016): the online net picks the argmax, the target net evaluates it."""
    dueling: bool = False
    """Dueling head (Wang et al. 2016): Q = V + A - mean(A)."""
    huber_delta: float | None = None
    """Huber threshold of the TD loss (Mnih et al.'s error clipping, 1.0); None for the squared loss (CleanRL)."""
    distributional: Literal["none", "c51", "qr"] = "none"
    """'none' (Q-values), 'c51' (Bellemare et al. 2017: categorical over num_atoms atoms in
    [v_min, v_max], cross-entropy loss) or 'qr' (Dabney et al. 2018: num_atoms quantiles, quantile
    Huber loss with kappa 1); priorities come from the per-item loss."""
    num_atoms: int = 51
    """Atoms (C51) or quantiles (QR-DQN) per action, >= 2; unused with distributional='none'."""
    v_min: float = -10.0
    """C51: lowest atom of the support (returns below it are clipped)."""
    v_max: float = 10.0
    """C51: highest atom of the support, > v_min."""
    target_update_period: int | None = 50
    """Hard target update: copy the online params every this many gradient updates. Set it to None to use tau."""
    tau: float | None = None
    """Polyak target update after every gradient update, in (0, 1]; needs target_update_period None."""
    epsilon_start: float = 1.0
    """Exploration epsilon at env step 0, in [0, 1]."""
    epsilon_end: float = 0.05
    """Final exploration epsilon, in [0, 1]."""
    epsilon_decay_fraction: float = 0.5
    """Fraction of the env steps over which epsilon decays linearly from start to end, in [0, 1]."""
    epsilon_schedule: Literal["linear", "apex"] = "linear"
    """'linear': every env uses epsilon_start -> epsilon_end over epsilon_decay_fraction of the run
    (Mnih et al. 2015). 'apex': fixed per-env epsilons of Ape-X (Horgan et al. 2018, sec. 4),
    eps_i = apex_epsilon^(1 + apex_alpha * i / (N - 1)), where i counts envs across all actors
    (env e of actor a is i = a * num_envs + e) and N = num_actors * num_envs (one env: apex_epsilon);
    epsilon_start/end/decay_fraction are then unused."""
    apex_epsilon: float = 0.4
    """Ape-X base epsilon (the paper's 0.4), in [0, 1]; used by epsilon_schedule='apex'."""
    apex_alpha: float = 7.0
    """Ape-X exponent spread alpha (the paper's 7), >= 0; used by epsilon_schedule='apex'."""
    prioritized: bool = False
    """Proportional prioritised replay (Schaul et al. 2016) with importance weights."""
    per_alpha: float = 0.6
    """Priority exponent alpha, >= 0."""
    per_beta_start: float = 0.4
    """Importance-sampling exponent beta at step 0, in [0, 1]; annealed linearly to 1 over the run."""
    hidden_sizes: tuple[int, ...] = (120, 84)
    """Hidden layer widths of the Q-network MLP."""
    activation: Literal["tanh", "relu"] = "relu"
    """Hidden activation."""
    torso: Annotated[Any, tyro.conf.arg(constructor=str, metavar="STR",
                                         help_behavior_hint="(default: auto)")] = "auto"
    """The network's torso: 'auto', 'mlp', 'nature_cnn', 'small_cnn' or a user torso
    'package.module:factory' (see PPOConfig.torso); the Q-heads sit on its features."""
    eval_every_env_steps: int = 25_000
    """Evaluate every this many env steps (rounded to whole iterations); also the logging interval."""
    eval_episodes: int = 10
    """Episodes per evaluation with the greedy policy; 0 disables evaluation."""
    stop_at_return: float | None = run(None)
    """Stop early once ``eval_return_mean`` reaches this value (needs ``eval_episodes > 0``)."""
    runtime: Literal["anakin", "async"] = "anakin"
    """'anakin': acting and learning fused on one device; 'async': actor threads on one device
    feed the learner's replay buffer on another through a rate limiter (TianJi mode)."""
    max_policy_lag: int = tianji(4)
    """Async: the lag gate at insert: a rollout acted with params more than this many versions
    behind the learner when it reaches the replay buffer is dropped (docs/runtime.md, "The lag contract")."""
    schedule: Literal["sync", "relaxed"] = tianji("relaxed")
    """Async: 'relaxed' (actors act with the newest params whenever the rate limiter admits a
    chunk; the TianJi mode) or 'sync' (one actor; chunk k is acted with the params published after
    the learner processed chunk k-1, exactly as an Anakin iteration: lag 0, bit-reproducible;
    max_policy_lag is then unused)."""
    num_actors: int = tianji(1)
    """Async: actor threads, each with its own num_envs envs."""
    stall_timeout_s: float = tianji(60.0)
    """Async: stop with an error when the learner gets no fresh data this long (seconds; 300 s more
    until the other side's first result, which includes its compilation)."""
    max_nonfinite_updates: int = run(5)
    """Consecutive updates with a skipped gradient step (a non-finite loss or gradient: the step
    is not applied and is counted in ``nonfinite_skips``) that stop the run with an error, >= 1."""
    actor_backend: Literal["threads", "ray"] = layout("threads")
    """Async, host envs: where actors run. 'threads': actor threads in this process; 'ray': remote
    actor processes on Ray Core (any node of a Ray cluster), each with its own num_envs envs and a
    CPU copy of the Q-network, building its n-step transitions (or Atari frame chunks) itself and
    feeding this learner's replay through the same lag gate at insert and rate limiter (needs
    ``pip install tianji-jax[ray]``). The linear epsilon schedule reads the run's env steps as of
    each chunk's request."""
    ray_address: str | None = layout(None)
    """actor_backend='ray': the cluster to join ('auto' or 'HOST:PORT'); None reuses this
    process's Ray connection or starts a private local instance on 127.0.0.1."""
    ray_max_restarts: int = layout(3)
    """actor_backend='ray': times Ray restarts each dead actor (its lost chunk is counted in
    ``lost_chunks``); one more death stops the run with an error."""
    num_learner_devices: int = layout(1)
    """Async: data-parallel learner replicas L (the last L devices; the actors keep the first). The
    replay is sharded by env over them (each holds buffer_capacity / L transitions of num_envs / L
    env columns of every actor, with its own priorities); every gradient update each replica
    samples batch_size / L items from its shard and the gradients are averaged. L must divide
    num_envs, batch_size and buffer_capacity. Not with frame replay (envpool Atari) yet."""
    num_learner_groups: int = layout(1)
    """Async: independent learner groups G (TianJi's parallel learners). Each group is one learner
    device with its own replay of buffer_capacity / G transitions, rate limiter, optimizer state
    and policy version, fed by num_actors / G of the actors (actor i feeds group i % G and acts
    with that group's params); each starts learning after learning_starts / G of its own env
    steps, and every sync_every blocks of their own the groups average their online and target
    params. The run's learner blocks (learning_iterations) are split evenly over the groups. Not
    combined with num_learner_devices > 1, frame replay (Atari) or resume yet."""
    sync_every: int = layout(1)
    """Learner groups: each group's learner blocks between param averagings (and always at its
    last block). Needs ``num_learner_groups > 1``."""
    env_batch_size: int | None = layout(None)
    """envpool only (async runtime): envs per received batch; below ``num_envs`` envpool runs in async
    mode (the actor acts on whichever envs finished first). None: sync mode (all envs every step)."""
    episodic_life: bool = True
    """envpool Atari only: a lost life ends the episode for learning (terminal, no bootstrap; the
    frame stack carries on); episode statistics still count whole games and evaluation always plays
    whole games. The stack of 4 84x84 grey frames, frame skip 4, up to 30 no-op starts and fire
    reset are envpool's defaults (fixed)."""
    reward_clip: bool = True
    """envpool Atari only: train on rewards clipped to their sign (statistics and evaluation use the raw score)."""
    repeat_action_probability: float = 0.0
    """envpool Atari only: sticky actions, in [0, 1]; 0 as CleanRL and Mnih et al. 2015, 0.25 as
    Machado et al. 2018 recommend. Applies to training and evaluation envs."""

    @classmethod
    def atari(cls, env: str = "envpool:Pong-v5", **overrides: Any) -> "DQNConfig":
        """A DQN config for an envpool Atari game with the settings of CleanRL's ``dqn_atari.py``
        (itself Mnih et al. 2015's, with Adam): Nature CNN (chosen for image observations), 10M env
        steps, 1M-transition frame-deduplicated replay, batch 32, learning starts at 80k env steps,
        one gradient update per 4 env steps, lr 1e-4, one-step DQN with the squared TD loss, hard
        target copy every 250 gradient updates (1000 env steps), epsilon 1 -> 0.01 over the first
        10% of the run; 8 envs per actor (CleanRL: 1), async runtime. ``overrides`` replace any field.

        Raises:
            ValueError / TypeError / MemoryError: as the constructor.
        """
        fields = dict(env=env, runtime="async", total_env_steps=10_000_000, num_envs=8, num_steps=1,
                      buffer_capacity=1_000_000, learning_starts=80_000, batch_size=32, replay_ratio=0.25,
                      learning_rate=1e-4, n_step=1, double_q=False, huber_delta=None, target_update_period=250,
                      epsilon_start=1.0, epsilon_end=0.01, epsilon_decay_fraction=0.1,
                      eval_every_env_steps=250_000, eval_episodes=10)
        return cls(**{**fields, **overrides})

    def __post_init__(self) -> None:
        _plain_numbers(self)
        _check_int("seed", self.seed, minimum=0, maximum=2**32 - 1)
        for name in ("total_env_steps", "num_envs", "num_steps", "buffer_capacity", "batch_size", "n_step",
                     "eval_every_env_steps"):
            _check_int(name, getattr(self, name), minimum=1)
        _check_int("total_env_steps", self.total_env_steps, maximum=2**31 - 1)  # int32 step counters
        # the prioritised sum-tree indexes its heap nodes in int32 (tianji_jax.sum_tree.MAX_CAPACITY)
        _check_int("buffer_capacity", self.buffer_capacity, maximum=2**30)
        _check_int("learning_starts", self.learning_starts, minimum=0)
        _check_int("eval_episodes", self.eval_episodes, minimum=0)
        _check_int("max_nonfinite_updates", self.max_nonfinite_updates, minimum=1)
        _check_float("replay_ratio", self.replay_ratio, low=0.0, low_open=True)
        _check_float("learning_rate", self.learning_rate, low=0.0, low_open=True)
        _check_float("max_grad_norm", self.max_grad_norm, low=0.0, low_open=True)
        _check_float("gamma", self.gamma, low=0.0, high=1.0)
        for name in ("epsilon_start", "epsilon_end", "epsilon_decay_fraction", "per_beta_start"):
            _check_float(name, getattr(self, name), low=0.0, high=1.0)
        if self.epsilon_end > self.epsilon_start:
            raise ValueError(f"epsilon_end={self.epsilon_end} must be <= epsilon_start={self.epsilon_start} "
                             "(epsilon decays from start to end)")
        if self.epsilon_schedule not in _EPSILON_SCHEDULES:
            raise ValueError(f"epsilon_schedule must be one of {_EPSILON_SCHEDULES}, got {self.epsilon_schedule!r}")
        _check_float("apex_epsilon", self.apex_epsilon, low=0.0, high=1.0)
        _check_float("apex_alpha", self.apex_alpha, low=0.0)
        _check_float("per_alpha", self.per_alpha, low=0.0)
        if self.huber_delta is not None:
            _check_float("huber_delta", self.huber_delta, low=0.0, low_open=True)
        for name in ("double_q", "dueling", "prioritized"):
            _check_bool(name, getattr(self, name))
        if (not isinstance(self.hidden_sizes, tuple) or len(self.hidden_sizes) == 0
                or any(isinstance(h, bool) or not isinstance(h, int) or h < 1 for h in self.hidden_sizes)):
            raise ValueError(
                f"hidden_sizes must be a non-empty tuple of positive ints, got {self.hidden_sizes!r}")
        if self.activation not in _ACTIVATIONS:
            raise ValueError(f"activation must be one of {_ACTIVATIONS}, got {self.activation!r}")
        if self.stop_at_return is not None:
            _check_float("stop_at_return", self.stop_at_return)
            if self.eval_episodes == 0:
                raise ValueError("stop_at_return needs evaluation: eval_episodes must be >= 1, got 0")
        _check_int("max_policy_lag", self.max_policy_lag, minimum=0)
        _check_int("num_actors", self.num_actors, minimum=1)
        _check_float("stall_timeout_s", self.stall_timeout_s, low=0.0, low_open=True)
        if self.runtime not in _DQN_RUNTIMES:
            raise ValueError(f"runtime must be one of {_DQN_RUNTIMES}, got {self.runtime!r}")
        if self.schedule not in ("sync", "relaxed"):
            raise ValueError(f"schedule must be one of ('sync', 'relaxed'), got {self.schedule!r}")
        _check_int("num_learner_groups", self.num_learner_groups, minimum=1)
        groups = self.num_learner_groups
        if self.runtime == "async" and self.schedule == "sync" and self.num_actors != groups:
            raise ValueError(f"num_actors must be {groups} (one per learner group) for schedule 'sync', got "
                             f"{self.num_actors}; use schedule 'relaxed' for several actors")
        # target network: exactly one of the two rules
        if self.tau is not None:
            _check_float("tau", self.tau, low=0.0, high=1.0, low_open=True)
        if (self.target_update_period is None) == (self.tau is None):
            raise ValueError(
                "set exactly one of target_update_period (hard copy every K gradient updates) and tau "
                f"(Polyak update every gradient update); got target_update_period={self.target_update_period!r}, "
                f"tau={self.tau!r} (on the command line: --tau 0.005 --target-update-period None)")
        if self.target_update_period is not None:
            _check_int("target_update_period", self.target_update_period, minimum=1)
        if self.tau is not None:
            _check_float("tau", self.tau, low=0.0, high=1.0, low_open=True)
        # replay ratio: a whole number of gradient updates per iteration
        per_iter = self.iteration_env_steps * self.replay_ratio
        u = round(per_iter)
        if u < 1 or abs(per_iter - u) > 1e-9 * max(1.0, per_iter):
            raise ValueError(
                f"replay_ratio={self.replay_ratio} must make num_envs * num_steps * replay_ratio = "
                f"{self.num_envs} * {self.num_steps} * {self.replay_ratio} = {per_iter:.6g} a whole number >= 1 "
                f"(gradient updates per iteration); allowed values: k / {self.iteration_env_steps} for ints k >= 1")
        object.__setattr__(self, "_updates_per_step", int(u))
        if self.total_env_steps < self.iteration_env_steps:
            raise ValueError(f"total_env_steps={self.total_env_steps} must be >= num_envs * num_steps = "
                             f"{self.iteration_env_steps} (one iteration)")
        # the buffer must hold one batch when learning starts (n-step transitions lag n - 1 steps)
        lag_items = (self.n_step - 1) * self.num_envs
        need = self.batch_size + lag_items
        if self.learning_starts < need:
            raise ValueError(
                f"learning_starts={self.learning_starts} must be >= batch_size + (n_step - 1) * num_envs = "
                f"{self.batch_size} + {lag_items} = {need}, so replay holds a batch when learning starts")
        if self.buffer_capacity < self.batch_size:
            raise ValueError(f"buffer_capacity={self.buffer_capacity} must be >= batch_size={self.batch_size}")
        if self.learning_iterations == 0:
            raise ValueError(
                f"learning_starts={self.learning_starts} leaves no gradient update within total_env_steps="
                f"{self.total_env_steps} ({self.num_iterations} iterations of {self.iteration_env_steps} env steps); "
                f"allowed: learning_starts < {self.num_iterations * self.iteration_env_steps}")
        spec = resolve_env(self.env)  # raises ValueError for unknown ids / unsupported spaces
        if isinstance(self.env, str) and ":" not in self.env:
            object.__setattr__(self, "env", f"{spec.backend}:{self.env}")
        if spec.action_kind != "discrete":
            raise ValueError(f"env: DQN needs a Discrete action space, got {spec.action_space!r}")
        if self.actor_backend not in ("threads", "ray"):
            raise ValueError(f"actor_backend must be one of ('threads', 'ray'), got {self.actor_backend!r}")
        _check_int("num_learner_devices", self.num_learner_devices, minimum=1)
        capabilities.check("dqn", self, spec.backend)  # the (runtime, actors, learners, env) cell
        _check_host_fields(self, spec)
        _check_ray(self, spec)
        _check_async_only(self, fields_in(self, "tianji"))
        object.__setattr__(self, "_env_spec", spec)
        frames = _check_atari(self, spec, _ATARI_FIELD_DEFAULTS)
        _check_torso(self, tuple(spec.observation_shape))
        object.__setattr__(self, "_frame_replay", frames)
        _check_replay_layout(self, frames)
        _check_distributional(self)
        from tianji_jax import replay  # noqa: PLC0415 - jax-heavy, only once the fields are valid

        try:
            replay.check_fits(self.replay_bytes)  # MemoryError before anything is allocated
        except MemoryError as err:
            raise MemoryError(f"buffer_capacity={self.buffer_capacity}: {err}") from None

    # ---- derived quantities -------------------------------------------------------------------
    @property
    def env_spec(self) -> EnvSpec:
        """The resolved environment (backend, id, env object, params, spaces)."""
        return self._env_spec  # type: ignore[attr-defined]

    @property
    def iteration_env_steps(self) -> int:
        """Env steps per iteration: ``num_envs * num_steps``."""
        return self.num_envs * self.num_steps

    @property
    def updates_per_step(self) -> int:
        """Gradient updates in one learner block (one per iteration once learning started):
        ``num_envs * num_steps * replay_ratio``, exact."""
        return self._updates_per_step  # type: ignore[attr-defined]

    @property
    def num_iterations(self) -> int:
        """Iterations in the run: ``total_env_steps // iteration_env_steps``."""
        return self.total_env_steps // self.iteration_env_steps

    @property
    def env_steps(self) -> int:
        """Env steps that will actually be taken: ``num_iterations * iteration_env_steps``."""
        return self.num_iterations * self.iteration_env_steps

    @property
    def learning_iterations(self) -> int:
        """Iterations that run a learner block: those ending with more than ``learning_starts`` env steps."""
        first = self.learning_starts // self.iteration_env_steps + 1  # 1-based index of the first one
        return max(0, self.num_iterations - first + 1)

    @property
    def num_gradient_steps(self) -> int:
        """Gradient updates in the whole run: ``learning_iterations * updates_per_step``."""
        return self.learning_iterations * self.updates_per_step

    @property
    def iterations_per_chunk(self) -> int:
        """Iterations fused into one compiled chunk: ``max(1, eval_every_env_steps // iteration_env_steps)``,
        at most ``num_iterations``."""
        return min(self.num_iterations, max(1, self.eval_every_env_steps // self.iteration_env_steps))

    @property
    def epsilon_decay_steps(self) -> int:
        """Env steps over which epsilon decays: ``max(1, round(epsilon_decay_fraction * env_steps))``."""
        return max(1, round(self.epsilon_decay_fraction * self.env_steps))

    def _atari_fields(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in _ATARI_FIELD_DEFAULTS}

    @property
    def atari_settings(self) -> dict[str, Any] | None:
        """envpool settings of an Atari game (``episodic_life``, ``reward_clip``,
        ``repeat_action_probability``; see :data:`tianji_jax.envs.registry.ATARI_DEFAULTS`), None
        for other envs."""
        return self._atari_fields() if self.env_spec.is_atari else None

    @property
    def frame_replay(self) -> bool:
        """Replay stores frames once (:mod:`tianji_jax.frame_replay`): envpool Atari games, whose
        observations are stacks of uint8 frames. Otherwise whole ``obs`` / ``next_obs`` per
        transition (:mod:`tianji_jax.replay`)."""
        return self._frame_replay  # type: ignore[attr-defined]

    @property
    def replay_bytes(self) -> int:
        """Bytes the replay buffer allocates: :func:`tianji_jax.frame_replay.frame_replay_bytes`
        (one ring per env of all actors) when :attr:`frame_replay`, else :attr:`stacked_replay_bytes`."""
        if self.frame_replay:
            from tianji_jax import frame_replay  # noqa: PLC0415

            shape = tuple(self.env_spec.observation_shape)
            return frame_replay.frame_replay_bytes(self.num_actors * self.num_envs, self.buffer_capacity, shape[1:],
                                                   self.env_spec.observation_space.dtype)
        return self.stacked_replay_bytes

    @property
    def stacked_replay_bytes(self) -> int:
        """Bytes of :mod:`tianji_jax.replay` holding ``buffer_capacity`` whole n-step transitions
        (:func:`tianji_jax.replay.replay_bytes`: obs and next obs in the observation dtype, action,
        reward, discount); for Atari, the naive footprint the frame replay avoids."""
        import jax  # noqa: PLC0415
        import numpy as np  # noqa: PLC0415

        from tianji_jax import replay  # noqa: PLC0415

        spec = self.env_spec
        obs = jax.ShapeDtypeStruct(spec.observation_shape,
                                   jax.dtypes.canonicalize_dtype(np.dtype(spec.observation_space.dtype)))
        item = {"obs": obs, "next_obs": obs, "action": jax.ShapeDtypeStruct((), np.int32),
                "reward": jax.ShapeDtypeStruct((), np.float32), "discount": jax.ShapeDtypeStruct((), np.float32)}
        return replay.replay_bytes(item, self.buffer_capacity)

    def _describe_replay(self) -> str:
        if not self.frame_replay:
            return f"{self.replay_bytes / 2**20:.1f} MiB"
        a = self.atari_settings
        return (f"frames stored once: {self.replay_bytes / 2**30:.2f} GiB, against "
                f"{self.stacked_replay_bytes / 2**30:.2f} GiB for obs/next_obs stacks; Atari: episodic_life="
                f"{a['episodic_life']}, reward_clip={a['reward_clip']}, repeat_action_probability="
                f"{a['repeat_action_probability']}")

    def describe(self) -> str:
        """One paragraph saying what will run: env, iterations, replay ratio, buffer (and its
        footprint in memory), target updates."""
        spec = self.env_spec
        variant = "Double DQN" if self.double_q else "DQN"
        if self.dueling:
            variant = f"dueling {variant}"
        variant += {"c51": f" with C51 ({self.num_atoms} atoms in [{self.v_min}, {self.v_max}])",
                    "qr": f" with QR-DQN ({self.num_atoms} quantiles)"}.get(self.distributional, "")
        target = (f"hard target copy every {self.target_update_period} gradient updates"
                  if self.target_update_period is not None else f"Polyak target update tau={self.tau}")
        explore = (f"epsilon {self.epsilon_start} -> {self.epsilon_end} over {self.epsilon_decay_steps} env steps"
                   if self.epsilon_schedule == "linear" else
                   f"Ape-X epsilons {self.apex_epsilon}^(1 + {self.apex_alpha} i/(N-1)) over the "
                   f"N = {self.num_actors * self.num_envs} envs of all actors")
        return (
            f"{variant} ({self.n_step}-step) on {spec.name} ({spec.backend}; obs {spec.observation_shape} -> "
            f"{_torso_text(self)}, "
            f"action {spec.action_space!r}): {self.num_iterations} iterations x {self.iteration_env_steps} env "
            f"steps (num_envs={self.num_envs} x num_steps={self.num_steps}) = {self.env_steps} env steps; "
            f"after {self.learning_starts} env steps, {self.updates_per_step} gradient update(s) of batch "
            f"{self.batch_size} per iteration (replay ratio {self.replay_ratio}) = {self.num_gradient_steps} "
            f"gradient updates; {'prioritised' if self.prioritized else 'uniform'} replay of "
            f"{self.buffer_capacity} transitions ({self._describe_replay()}); {target}; {explore}; chunks of "
            f"{self.iterations_per_chunk} iterations"
            + (f"; evaluation of {self.eval_episodes} greedy episodes after each chunk" if self.eval_episodes else "")
            + ("; async runtime, schedule sync (one actor per learner group, lag 0, the Anakin iteration order)"
               if self.runtime == "async" and self.schedule == "sync" else
               f"; async runtime, {self.num_actors} actor(s), lag gate at insert K={self.max_policy_lag}, "
               "replay ratio held by the rate limiter, which also sets the exact env steps (the same to within "
               "its band)" if self.runtime == "async" else "; Anakin runtime")
            + (f"; actors on Ray ({self.ray_address or 'local instance'}, max_restarts {self.ray_max_restarts})"
               if self.actor_backend == "ray" else "")
            + (f"; {self.num_learner_groups} learner groups (replay of {self.buffer_capacity // self.num_learner_groups} "
               f"transitions and {self.learning_iterations // self.num_learner_groups} learner blocks each), params "
               f"averaged every {self.sync_every} blocks" if self.num_learner_groups > 1 else "")
            + (f"; {self.num_learner_devices} data-parallel learners, the replay sharded by env over them "
               f"({self.buffer_capacity // self.num_learner_devices} transitions and "
               f"{self.batch_size // self.num_learner_devices} samples per update each)"
               if self.num_learner_devices > 1 else "")
        )
