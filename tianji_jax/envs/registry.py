"""Resolve an env spec (``"gymnax:CartPole-v1"`` or an env object) into an :class:`EnvSpec`.

Resolution creates the environment object and reads its spaces; it never steps the env. Reading
gymnax spaces may run (and compile, once per process) a few tiny eager ``jnp`` operations.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any

import numpy as np

from tianji_jax.envs.spaces import Box, Discrete, MultiDiscrete, from_gymnax_space, import_gymnax

__all__ = ["EnvSpec", "resolve_env", "BACKENDS", "HOST_BACKENDS", "DEVICE_BACKENDS", "SUITE_BACKENDS",
           "ATARI_DEFAULTS"]

SUITE_BACKENDS = ("craftax", "jumanji", "xminigrid")
"""The JAX env suites (optional extras, :data:`tianji_jax.envs.suites.SUITES`): device envs like gymnax."""
DEVICE_BACKENDS = ("gymnax", *SUITE_BACKENDS, "brax")
BACKENDS = (*DEVICE_BACKENDS, "envpool", "gymnasium")
"""Env backends known to the resolver. ``gymnax``, the suites and ``brax`` (physics envs, an optional
extra: :mod:`tianji_jax.envs.brax_env`) run on a JAX device (both runtimes);
``envpool`` and ``gymnasium`` run on the host (:mod:`tianji_jax.envs.host`, async runtime only)."""

HOST_BACKENDS = ("envpool", "gymnasium")
ATARI_DEFAULTS = {"episodic_life": True, "reward_clip": True, "repeat_action_probability": 0.0}
"""Training settings of envpool Atari games (CleanRL's envpool agents; envpool's own defaults stack 4
84x84 grey frames with frame skip 4, up to 30 no-op starts and fire reset): a lost life ends the
episode for learning (statistics count whole games), rewards clipped to their sign, no sticky
actions (Machado et al. 2018 recommend 0.25). :meth:`EnvSpec.make_host_env` applies them."""


@dataclass(frozen=True, eq=False)
class EnvSpec:
    """A resolved environment.

    Attributes:
        backend: one of :data:`BACKENDS`.
        name: the registered id, or the class name of a user object, followed by the canonical
            wrappers or host modifiers (``"CartPole-v1|mask=0,2"``, ``"CartPole-v1|latency_ms=5"``);
            :attr:`base_id` is the id without them.
        env: the gymnax-style environment object (None for host backends, whose envs are made
            by each actor: :meth:`make_host_env`).
        env_params: its default params (a pytree; None for host backends).
        observation_space: :class:`Box` of one env's observation.
        action_space: :class:`Discrete`, :class:`~tianji_jax.envs.spaces.MultiDiscrete` (device
            suites only, e.g. ``jumanji:RubiksCube-v0``; PPO only) or :class:`Box` of one env's action.
        episode_limit: host backends: the registered time limit in env steps (None if none).
        latency_ms: host backends: milliseconds each batched step of a training env takes at least
            (``"envpool:<id>|latency_ms=5"``; 0.0: no added latency), see
            :class:`~tianji_jax.envs.latency.LatencyVecEnv` and :meth:`make_host_env`.
        host_wrappers: host backends: the parsed wrapper terms of the id, in order
            (``(("mask", (0, 2)), ("frame_stack", 4))``; :mod:`tianji_jax.envs.host_wrappers`), applied
            to training and evaluation envs; :attr:`observation_space` / :attr:`action_space` are the
            wrapped env's.
        action_mask_size: envs with action masks (Jumanji tasks): the observation's last
            ``action_mask_size`` entries are the allowed actions (1.0 allowed, 0.0 not;
            :func:`tianji_jax.envs.suites.action_mask`); 0: no mask.

    Specs compare by identity (``eq=False``); configs compare by their ``env`` string, so two
    configs with the same ``env`` string (latency included) are equal.
    """

    backend: str
    name: str
    env: Any
    env_params: Any
    observation_space: Box
    action_space: Discrete | MultiDiscrete | Box
    episode_limit: int | None = None
    latency_ms: float = 0.0
    host_wrappers: tuple = ()
    action_mask_size: int = 0

    @property
    def base_id(self) -> str:
        """:attr:`name` without its ``|`` wrappers or modifiers: the id the backend registers
        (``"CartPole-v1"`` for ``"CartPole-v1|latency_ms=5"``)."""
        return self.name.split("|", 1)[0]

    @property
    def is_atari(self) -> bool:
        """An envpool Atari game (image observations, episodic-life option)."""
        if self.backend != "envpool":
            return False
        import envpool

        return "episodic_life" in envpool.make_spec(self.base_id)._config_keys

    @property
    def on_host(self) -> bool:
        """True for the host backends (envpool, gymnasium), which only the async runtime runs."""
        return self.backend in HOST_BACKENDS

    def make_host_env(self, num_envs: int, seed: int, batch_size: int | None = None, evaluation: bool = False,
                      atari: dict | None = None):
        """A new host vectorised env of this spec (:class:`~tianji_jax.envs.host.EnvpoolVecEnv`
        or :class:`~tianji_jax.envs.host.GymnasiumVecEnv`; for a device env, gymnax, a JAX suite or
        brax, a :class:`~tianji_jax.envs.gymnax_host.GymnaxHostVecEnv`: the same env stepped by one
        jitted call per batched step on the CPU, with the host backends' next-step auto-reset, which
        Ray actor processes drive).

        envpool Atari games get the settings of CleanRL's envpool agents for training: 4 stacked
        84x84 grey frames, frame skip 4, up to 30 no-op starts, fire reset (envpool's defaults),
        ``episodic_life=True`` (a lost life ends the episode for learning; statistics still
        count whole games) and ``reward_clip=True`` (rewards clipped to their sign; statistics
        use the raw score), no sticky actions (``repeat_action_probability=0``, unlike Machado et
        al. 2018). ``atari`` overrides these (keys of :data:`ATARI_DEFAULTS`, e.g. a DQN config's
        ``atari_settings``); ``evaluation=True`` turns episodic life and reward clipping off
        (evaluation plays whole games and reports raw scores) and keeps the sticky-action
        probability.

        A spec with :attr:`latency_ms` ``> 0`` wraps its training envs in
        :class:`~tianji_jax.envs.latency.LatencyVecEnv` (each batched step takes at least
        ``latency_ms`` milliseconds, waiting rather than spinning). Evaluation envs
        (``evaluation=True``) get no latency: evaluation measures the policy, and its cost is
        reported apart from training's, so a modelled simulator delay would only slow it down.

        Raises:
            ValueError: ``batch_size`` for gymnasium or a device env (sync only), an unknown key in
                ``atari``, or a device env whose action space is not Discrete / Box.
        """
        from tianji_jax.envs import host

        if self.backend == "envpool":
            kwargs = {}
            if self.is_atari:
                bad = sorted(set(atari or {}) - set(ATARI_DEFAULTS))
                if bad:
                    raise ValueError(f"atari: unknown settings {bad}; allowed: {sorted(ATARI_DEFAULTS)}")
                kwargs = {**ATARI_DEFAULTS, **(atari or {})}
                if evaluation:
                    kwargs.update(episodic_life=False, reward_clip=False)
            return self._with_latency(host.EnvpoolVecEnv(self.base_id, num_envs, batch_size=batch_size,
                                                         seed=seed, **kwargs), evaluation)
        if self.backend == "gymnasium":
            if batch_size not in (None, num_envs):
                raise ValueError(f"env_batch_size={batch_size}: gymnasium vector envs are sync only "
                                 f"(allowed: None or num_envs={num_envs})")
            return self._with_latency(host.GymnasiumVecEnv(self.base_id, num_envs, seed=seed), evaluation)
        if batch_size not in (None, num_envs):
            raise ValueError(f"env_batch_size={batch_size}: device envs stepped on the host are sync only "
                             f"(allowed: None or num_envs={num_envs})")
        from tianji_jax.envs.gymnax_host import GymnaxHostVecEnv  # a device env behind the host API (Ray actors)

        return GymnaxHostVecEnv(self, num_envs, seed=seed)

    def _with_latency(self, env: Any, evaluation: bool) -> Any:
        """``env`` with the training latency (not for evaluation), then the id's host wrappers."""
        if self.latency_ms > 0 and not evaluation:
            from tianji_jax.envs.latency import LatencyVecEnv

            env = LatencyVecEnv(env, self.latency_ms)
        if self.host_wrappers:
            from tianji_jax.envs.host_wrappers import host_wrapper

            for term in self.host_wrappers:
                env = host_wrapper(env, term)
        return env

    @property
    def observation_shape(self) -> tuple[int, ...]:
        """Shape of one env's observation."""
        return self.observation_space.shape

    @property
    def action_kind(self) -> str:
        """``"discrete"`` for Discrete, ``"multi_discrete"`` for MultiDiscrete, ``"continuous"`` for a
        1-D Box, else ``"unsupported"``."""
        if isinstance(self.action_space, Discrete):
            return "discrete"
        if isinstance(self.action_space, MultiDiscrete):
            return "multi_discrete"
        if isinstance(self.action_space, Box) and len(self.action_space.shape) == 1:
            return "continuous"
        return "unsupported"

    @property
    def max_episode_steps(self) -> int:
        """Time limit of one episode in env steps (gymnax ``max_steps_in_episode``; host backends:
        the registered limit).

        Raises:
            ValueError: the env has no such limit (no ``max_steps_in_episode`` in its params, or no
                registered limit on a host backend).
        """
        limit = self.episode_limit if self.on_host else getattr(self.env_params, "max_steps_in_episode", None)
        if limit is None:
            raise ValueError(f"env {self.name}: its params have no max_steps_in_episode, which "
                             "evaluation needs to bound an episode")
        return int(limit)


def _gymnax_ids() -> list[str]:
    return list(import_gymnax().registered_envs)


def resolve_env(env: Any) -> EnvSpec:
    """Resolve ``env`` into an :class:`EnvSpec`.

    Args:
        env: ``"gymnax:<id>"``, ``"envpool:<id>"``, ``"gymnasium:<id>"``, a bare gymnax id such
            as ``"CartPole-v1"``, or a gymnax-style
            environment object (``reset``, ``step``, ``default_params``, ``observation_space``,
            ``action_space``; a :class:`~tianji_jax.envs.suites.SuiteEnv` keeps its
            ``action_mask_size``), or a Jumanji env object of a supported task
            (``jumanji.make("Maze-v0")``: the adapter its id takes,
            :func:`~tianji_jax.envs.suites.suite_env_of`, mask included). A gymnax id may be
            followed by wrappers, ``|``-separated and applied left to right, innermost first
            (:func:`tianji_jax.envs.wrappers.apply_wrappers`):
            ``"gymnax:CartPole-v1|mask=0,2"``, ``"gymnax:Breakout-MinAtar|frame_stack=4"``,
            ``"gymnax:Pendulum-v1|clip_action"``; the spec's spaces are the wrapped env's and its
            ``name`` ends in the canonical wrappers (``"CartPole-v1|mask=0,2"``). A host id may be
            followed by host modifiers (:data:`~tianji_jax.envs.id_syntax.HOST_WRAPPER_SYNTAX`):
            ``"envpool:CartPole-v1|latency_ms=5"`` (a finite number of milliseconds >= 0) sets
            :attr:`EnvSpec.latency_ms`, and the name ends in ``"|latency_ms=5"``. A brax id
            (:mod:`tianji_jax.envs.brax_env`) may carry the modifiers ``backend`` and
            ``episode_length`` among its terms: ``"brax:hopper|backend=positional"``.

    Raises:
        ValueError: unknown backend (allowed: :data:`BACKENDS`), unknown id (the message lists the
            closest registered ids), an object missing part of the gymnax interface, a space
            type other than Discrete/Box, an unknown wrapper or bad wrapper value, a gymnax wrapper
            on a host backend (not supported yet), an unknown host modifier (lists the allowed
            ones) or bad ``latency_ms`` value (negative, not finite, not a number), or
            ``latency_ms`` on a gymnax id (device envs step inside compiled code); an env object whose
            ``action_mask_size`` is not 0 or the ``n`` of its ``Discrete(n)`` actions, a wrapper object
            around a masked env (the mask must stay the observation's last entries), or a Jumanji
            object of a task not offered.
    """
    if isinstance(env, str):
        base, *wrappers = env.split("|")  # "gymnax:<id>|<wrapper>|...": see tianji_jax.envs.wrappers
        backend, sep, env_id = (base.strip() if wrappers else base).partition(":")
        if not sep:
            backend, env_id = "gymnax", backend
        if backend not in BACKENDS:
            raise ValueError(f"env={env!r}: unknown backend {backend!r}; allowed backends: {list(BACKENDS)}")
        if backend in HOST_BACKENDS:
            return _resolve_host(env, backend, env_id, wrappers)
        if backend in SUITE_BACKENDS or backend == "brax":
            return _resolve_suite(env, backend, env_id, wrappers)
        known = _gymnax_ids()
        if env_id not in known:
            close = difflib.get_close_matches(env_id, known, n=5, cutoff=0.4)
            raise ValueError(
                f"env={env!r}: unknown gymnax env id {env_id!r}; closest known ids: "
                f"{close or known[:5]} (all: gymnax.registered_envs)")
        obj, params = import_gymnax().make(env_id)
        name, mask = env_id, 0
        if wrappers:
            from tianji_jax.envs.wrappers import apply_wrappers

            obj, suffix = apply_wrappers(obj, wrappers, env)
            name += suffix
    else:
        from tianji_jax.envs.suites import suite_env_of

        adapted = suite_env_of(env)  # a Jumanji env object: the adapter its id takes
        if adapted is not None:
            return _suite_spec("jumanji", adapted, adapted.name)
        missing = [a for a in ("reset", "step", "default_params", "observation_space", "action_space")
                   if not hasattr(env, a)]
        if missing:
            raise ValueError(
                f"env: object of type {type(env).__name__} is not a gymnax-style environment; missing "
                f"{missing}. Pass 'gymnax:<id>' or an object implementing the gymnax Environment API")
        backend, obj, params, name = "gymnax", env, env.default_params, type(env).__name__
        from tianji_jax.envs.wrappers import Wrapper

        mask = getattr(env, "action_mask_size", 0)  # a SuiteEnv (or any env naming its mask) keeps its mask
        if isinstance(env, Wrapper):
            name = env.name  # e.g. "CounterEnv|frame_stack=2"
            if getattr(env.unwrapped, "action_mask_size", 0):
                raise ValueError(f"env: a wrapper object around an env with an action mask (its observation ends "
                                 f"with the mask) is not supported, got {name!r}; allowed: the masked env "
                                 "object itself, unwrapped")
    try:
        obs_space = from_gymnax_space(obj.observation_space(params))
        act_space = from_gymnax_space(obj.action_space(params))
    except TypeError as err:
        raise ValueError(f"env={name!r}: {err}") from None
    if not isinstance(obs_space, Box):
        raise ValueError(f"env={name!r}: observation space must be a Box, got {obs_space!r}")
    if np.dtype(obs_space.dtype).kind not in "fiub":
        raise ValueError(f"env={name!r}: observation dtype {obs_space.dtype} is not numeric")
    return EnvSpec(backend, name, obj, params, obs_space, act_space,
                   action_mask_size=_check_mask(mask, name, obs_space, act_space))


def _check_mask(mask: Any, name: str, obs_space: Box, act_space: Any) -> int:
    """An env object's ``action_mask_size`` (0: none), checked: a mask of ``n`` entries needs a
    ``Discrete(n)`` action space and a flat observation of more than ``n`` entries ending with it."""
    is_int = isinstance(mask, (int, np.integer)) and not isinstance(mask, bool)
    if is_int and mask == 0:
        return 0
    n = act_space.n if isinstance(act_space, Discrete) else None
    if not is_int or n is None or mask != n or len(obs_space.shape) != 1 or obs_space.shape[0] <= n:
        raise ValueError(f"env={name!r}: action_mask_size={mask!r} with action space {act_space!r} and observation "
                         f"shape {obs_space.shape}; allowed: 0, or n of a Discrete(n) action space whose flat "
                         "observation ends with the n mask entries")
    return int(mask)


def _resolve_suite(env: str, backend: str, env_id: str, wrappers: list[str]) -> EnvSpec:
    """A JAX suite's id (:mod:`tianji_jax.envs.suites`) or a brax id (:mod:`tianji_jax.envs.brax_env`:
    its modifiers, then the wrappers), with the device wrappers; an env with an action mask takes none
    (the mask must stay the observation's last entries)."""
    if backend == "brax":
        from tianji_jax.envs.brax_env import resolve_brax_id

        obj, wrappers = resolve_brax_id(env_id, wrappers, env)
    else:
        from tianji_jax.envs.suites import make_suite_env

        obj = make_suite_env(backend, env_id.strip(), env)
    name = obj.name
    if wrappers:
        if obj.action_mask_size:
            raise ValueError(f"env={env!r}: wrappers on an env with an action mask (its observation ends with the "
                             "mask) are not supported; allowed: the id without |wrappers")
        from tianji_jax.envs.wrappers import apply_wrappers

        obj, suffix = apply_wrappers(obj, wrappers, env)
        name += suffix
    return _suite_spec(backend, obj, name)


def _suite_spec(backend: str, obj: Any, name: str) -> EnvSpec:
    """The spec of a suite's (or brax's) adapted env object ``obj``, its mask included."""
    params = obj.default_params
    obs_space = from_gymnax_space(obj.observation_space(params))
    act_space = from_gymnax_space(obj.action_space(params))
    return EnvSpec(backend, name, obj, params, obs_space, act_space,
                   action_mask_size=getattr(obj, "action_mask_size", 0))


def _resolve_host(env: str, backend: str, env_id: str, modifiers: list[str] | tuple[str, ...] = ()) -> EnvSpec:
    """Spaces and time limit of an envpool/gymnasium id, without stepping (or, for envpool,
    creating) an env, and its ``|`` modifiers (:func:`~tianji_jax.envs.latency.parse_host_modifiers`)."""
    from tianji_jax.envs import host
    from tianji_jax.envs.latency import parse_host_modifiers

    known = host.envpool_ids() if backend == "envpool" else host.gymnasium_ids()
    try:
        host._check_id(env_id, known, backend, "envpool.list_all_envs()" if backend == "envpool"
                       else "gymnasium.registry")
    except ValueError as err:
        raise ValueError(f"env={env!r}: {err}") from None
    from tianji_jax.envs.wrappers import WRAPPER_SYNTAX, parse_wrapper_term, wrapper_tag

    prefix = f"env={env!r}: "
    terms = [parse_wrapper_term(t, prefix) for t in modifiers if t.strip().partition("=")[0].strip() in WRAPPER_SYNTAX]
    values, suffix = parse_host_modifiers([t for t in modifiers if t.strip().partition("=")[0].strip()
                                           not in WRAPPER_SYNTAX], env, backend)
    suffix = "".join(f"|{wrapper_tag(*t)}" for t in terms) + suffix
    if backend == "envpool":
        import envpool

        espec = envpool.make_spec(env_id)
        with host.quiet_envpool_spaces():
            obs, act = espec.gymnasium_observation_space, espec.gymnasium_action_space
        limit = getattr(espec.config, "max_episode_steps", None)
        if "episodic_life" in espec._config_keys and any(name == "frame_stack" for name, _ in terms):
            raise ValueError(f"{prefix}frame_stack on an envpool Atari game: envpool already stacks its frames "
                             "channels-first (stack_num=4); allowed: the id without |frame_stack")
    else:
        import gymnasium

        probe = gymnasium.make(env_id)
        obs, act = probe.observation_space, probe.action_space
        limit = gymnasium.spec(env_id).max_episode_steps
        probe.close()
    try:
        obs_space, act_space = host.observation_space(obs)[0], host.from_gymnasium_space(act)
    except ValueError as err:
        raise ValueError(f"env={env!r}: {err}") from None
    if not isinstance(obs_space, Box):
        raise ValueError(f"env={env!r}: observation space must be a Box, got {obs_space!r}")
    if terms:
        from tianji_jax.envs.host_wrappers import wrapped_spaces

        try:
            obs_space, act_space = wrapped_spaces(obs_space, act_space, terms)
        except ValueError as err:
            raise ValueError(f"{prefix}{err}") from None
    return EnvSpec(backend, env_id + suffix, None, None, obs_space, act_space, None if limit is None else int(limit),
                   latency_ms=values.get("latency_ms", 0.0), host_wrappers=tuple(terms))
