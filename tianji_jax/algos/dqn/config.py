"""The DQN-family run configuration, :class:`DQNConfig` (also importable from :mod:`tianji_jax.config`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from tianji_jax.algos.replay_config import ReplayConfig
from tianji_jax.algos.config_base import check_bool, check_float, check_int, torso_text
from tianji_jax.algos.config_checks import check_atari, check_distributional
from tianji_jax.envs.registry import ATARI_DEFAULTS, EnvSpec

__all__ = ["DQNConfig"]

_ATARI_FIELD_DEFAULTS = ATARI_DEFAULTS  # the DQNConfig fields' defaults are the env layer's
_EPSILON_SCHEDULES = ("linear", "apex")


@dataclass(frozen=True)
class DQNConfig(ReplayConfig):
    """Configuration of a DQN-family run on Discrete actions.

    The family: DQN (Mnih et al. 2015, "Human-level control through deep reinforcement
    learning"), Double DQN (van Hasselt et al. 2016, ``double_q``), dueling heads (Wang et al.
    2016, "Dueling Network Architectures for Deep RL", ``dueling``), proportional prioritised
    replay (Schaul et al. 2016, "Prioritized Experience Replay", ``prioritized``) and n-step
    targets (Hessel et al. 2018, "Rainbow", ``n_step``).

    Defaults: CartPole-v1 settings of CleanRL's ``dqn.py`` / PureJaxRL's DQN (10 envs, 10k buffer,
    batch 128, learning starts at 10k env steps, one gradient step per 10 env steps (8 steps per env
    per iteration, then a block of 8 updates), lr 2.5e-4,
    epsilon 1 -> 0.05 over half the run, MLP 120-84 relu, squared TD loss), plus Double DQN and
    3-step targets, with which the default job reaches an evaluation return of 475 within 500k env
    steps (``tests/learning/test_dqn_learning.py``; measured on seeds 0-3: 200k-250k env steps, against
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
    (:mod:`tianji_jax.runtime.actors.replay_host`).

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
            free memory (checked with :func:`tianji_jax.buffers.replay.check_fits` before anything is
            allocated).
    """

    ALGO: ClassVar[str] = "dqn"

    num_steps: int = 8
    """Rollout length T per iteration: env steps per env between two learner blocks. 8 (a block of
    ``8 * num_envs * replay_ratio`` updates every ``8 * num_envs`` env steps; the same replay ratio
    as 1) is the fast choice in both runtimes: on gymnax CartPole-v1 it reached 475 in 0.84x the
    wall time of 1 in Anakin and 0.41x on the async runtime, at about the same env steps
    (experiments/results/async_dqn_chunk)."""
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

    def _check_fields(self) -> None:
        for name in ("epsilon_start", "epsilon_end", "epsilon_decay_fraction", "per_beta_start"):
            check_float(name, getattr(self, name), low=0.0, high=1.0)
        if self.epsilon_end > self.epsilon_start:
            raise ValueError(f"epsilon_end={self.epsilon_end} must be <= epsilon_start={self.epsilon_start} "
                             "(epsilon decays from start to end)")
        if self.epsilon_schedule not in _EPSILON_SCHEDULES:
            raise ValueError(f"epsilon_schedule must be one of {_EPSILON_SCHEDULES}, got {self.epsilon_schedule!r}")
        check_float("apex_epsilon", self.apex_epsilon, low=0.0, high=1.0)
        check_float("apex_alpha", self.apex_alpha, low=0.0)
        check_float("per_alpha", self.per_alpha, low=0.0)
        if self.huber_delta is not None:
            check_float("huber_delta", self.huber_delta, low=0.0, low_open=True)
        for name in ("double_q", "dueling", "prioritized"):
            check_bool(name, getattr(self, name))

    def _check_target(self) -> None:  # exactly one of the two target-network rules
        if self.tau is not None:
            check_float("tau", self.tau, low=0.0, high=1.0, low_open=True)
        if (self.target_update_period is None) == (self.tau is None):
            raise ValueError(
                "set exactly one of target_update_period (hard copy every K gradient updates) and tau "
                f"(Polyak update every gradient update); got target_update_period={self.target_update_period!r}, "
                f"tau={self.tau!r} (on the command line: --tau 0.005 --target-update-period None)")
        if self.target_update_period is not None:
            check_int("target_update_period", self.target_update_period, minimum=1)

    def _check_action_space(self, spec: EnvSpec) -> None:
        if spec.action_kind != "discrete":
            raise ValueError(f"env: DQN needs a Discrete action space, got {spec.action_space!r}")

    def _check_env(self, spec: EnvSpec) -> bool:
        return check_atari(self, spec, _ATARI_FIELD_DEFAULTS)

    def _check_head(self) -> None:
        check_distributional(self)

    def derived_extra(self) -> dict[str, Any]:
        """``epsilon_decay_steps`` for ``config.json``."""
        return {"epsilon_decay_steps": self.epsilon_decay_steps}

    # ---- derived quantities -------------------------------------------------------------------
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
    def replay_bytes(self) -> int:
        """Bytes the replay buffer allocates: :func:`tianji_jax.buffers.frame_replay.frame_replay_bytes`
        (one ring per env of all actors) when :attr:`frame_replay`, else :attr:`stacked_replay_bytes`."""
        if self.frame_replay:
            from tianji_jax.buffers import frame_replay  # noqa: PLC0415

            shape = tuple(self.env_spec.observation_shape)
            return frame_replay.frame_replay_bytes(self.num_actors * self.num_envs, self.buffer_capacity, shape[1:],
                                                   self.env_spec.observation_space.dtype)
        return self.stacked_replay_bytes

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
            f"{torso_text(self)}, action {spec.action_space!r}): {self._describe_iterations()}; "
            f"{'prioritised' if self.prioritized else 'uniform'} replay of "
            f"{self.buffer_capacity} transitions ({self._describe_replay()}); {target}; {explore}"
            + self._describe_runtime("greedy")
        )
