"""A latency wrapper for host vector envs: model an external simulator whose step costs time.

:class:`LatencyVecEnv` wraps a host vector env (:class:`~tianji_jax.envs.host.EnvpoolVecEnv` or
:class:`~tianji_jax.envs.host.GymnasiumVecEnv`) so that a batched step takes at least ``latency_ms``
milliseconds: the regime where acting costs as much as learning (a slow simulator, a robot, a
remote env farm). The wrapper *waits* (``time.sleep``, which releases the GIL): it uses no CPU
core while it waits, so the learner's cores stay free, as they would with a simulator running
elsewhere.

Id syntax (:data:`~tianji_jax.envs.id_syntax.HOST_WRAPPER_SYNTAX`, parsed by :func:`parse_host_modifiers` where
:func:`~tianji_jax.envs.registry.resolve_env` resolves host ids): ``"envpool:CartPole-v1|latency_ms=5"``,
``"gymnasium:CartPole-v1|latency_ms=2.5"``. The resolved spec carries the value
(:attr:`~tianji_jax.envs.registry.EnvSpec.latency_ms`) and its ``name`` shows the modifier
(``"CartPole-v1|latency_ms=5"``); :meth:`~tianji_jax.envs.registry.EnvSpec.make_host_env` wraps
training envs (not evaluation envs). Device (gymnax) envs step inside compiled code and take no
latency.
"""

from __future__ import annotations

import math
import re
import time
from typing import Any, Callable, Sequence

import numpy as np

from tianji_jax.envs.host_wrappers import _HostWrapper
from tianji_jax.envs.id_syntax import HOST_WRAPPER_SYNTAX, WRAPPER_SYNTAX

__all__ = ["LatencyVecEnv", "HOST_WRAPPER_SYNTAX", "MAX_LATENCY_MS", "parse_host_modifiers"]

MAX_LATENCY_MS = 10_000.0
"""The largest ``latency_ms`` accepted (10 s a batched step): beyond it a value is far more likely a
typo or a unit slip (seconds or microseconds for milliseconds) than a simulator, and a run would
sleep for hours without a sign of why."""

_NUMBER = re.compile(r"\+?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")


def _canonical(value: float) -> str:
    """``5.0 -> "5"``, ``2.5 -> "2.5"`` (``repr``: exact, shortest round-trip spelling)."""
    text = repr(float(value))
    return text[:-2] if text.endswith(".0") else text


def _device_wrapper_names() -> tuple[str, ...]:
    return tuple(WRAPPER_SYNTAX)


def parse_host_modifiers(terms: Sequence[str], env_text: str = "", backend: str = "envpool") -> tuple[dict, str]:
    """Parse the ``|``-separated modifiers of a host env id (the parts after the base id).

    Terms (:data:`~tianji_jax.envs.id_syntax.HOST_WRAPPER_SYNTAX`): ``latency_ms=<ms>``, a finite number of milliseconds,
    ``0 <= ms <=`` :data:`MAX_LATENCY_MS` (``latency_ms=0`` is accepted and adds no latency). Whitespace around terms and values is
    ignored; each modifier may appear once.

    Args:
        terms: e.g. ``["latency_ms=5"]``.
        env_text: the whole env id, quoted at the start of error messages.
        backend: the host backend, named in error messages.

    Returns:
        ``(values, suffix)``: ``values`` maps modifier names to parsed values (``{"latency_ms":
        5.0}``; empty for no terms) and ``suffix`` is the canonical spelling appended to the spec's
        name, e.g. ``"|latency_ms=5"``.

    Raises:
        ValueError: one line: an unknown modifier (lists the allowed modifiers and wrappers; the
            wrappers themselves are parsed by the caller, :func:`~tianji_jax.envs.wrappers.parse_wrapper_term`),
            a modifier given twice, or a value
            that is not a finite number in ``[0, MAX_LATENCY_MS]`` (negative, above 10000, ``nan``,
            ``inf``, not a number, missing).
    """
    prefix = f"env={env_text!r}: " if env_text else ""
    allowed = (f"allowed on host envs ({backend}): modifiers {list(HOST_WRAPPER_SYNTAX)} and wrappers "
               f"{list(_device_wrapper_names())}")
    values: dict[str, Any] = {}
    suffix = ""
    for term in terms:
        name, eq, value = (s.strip() for s in term.strip().partition("="))
        if name not in HOST_WRAPPER_SYNTAX:
            raise ValueError(f"{prefix}unknown host env modifier {name!r} (in {term.strip()!r}); {allowed}")
        if name in values:
            raise ValueError(f"{prefix}modifier {name!r} given twice; give it once")
        number = float(value) if eq and _NUMBER.fullmatch(value) else math.nan
        if not (math.isfinite(number) and number <= MAX_LATENCY_MS):
            got = f"value {value!r}" if eq else "no value"
            raise ValueError(f"{prefix}modifier {name!r} got {got}; allowed: {HOST_WRAPPER_SYNTAX[name]}")
        values[name] = number
        suffix += f"|{name}={_canonical(number)}"
    return values, suffix


class LatencyVecEnv(_HostWrapper):
    """A host vector env whose steps take at least ``latency_ms`` milliseconds (a slow simulator).

    Each :meth:`step` (and :meth:`reset`) calls the inner env, then waits for whatever is left of
    ``d = latency_ms`` since the call began: a step takes ``max(inner time, d)``, as a simulator
    whose batched step costs ``d`` would. The wait is one ``sleep(remainder)``, not a spin, so it
    leaves the CPU cores to the learner.

    Precisely, the wrapper keeps, per env, the time its last action was sent (or its reset was
    asked for), and returns a batch no earlier than ``d`` after the latest of those times over the
    envs in the batch. In sync mode (gymnasium; envpool with ``batch_size == num_envs``) every call
    sends and receives all ``N`` envs, so this is exactly "each call returns no earlier than ``d``
    after it was called". In envpool's async mode (``batch_size < num_envs``) a call returns envs
    whose actions were sent by earlier calls; their steps have been running since then, so the
    wait is shorter (possibly none) and up to ``N`` env steps are in flight per ``d``, as in an
    asynchronous env farm. No env's result is ever returned earlier than ``d`` after its action
    was sent.

    Everything else (``observation_space``, ``action_space``, ``num_envs``, ``batch_size``,
    ``is_async``, ``env_id``, ``check_actions``, ...) is the inner env's, read through; the wrapper
    is a context manager that closes the inner env.

    Args:
        env: a host vector env (the ``reset()``, ``step(actions, env_id=None)``, ``close()`` and
            ``num_envs`` interface of :class:`~tianji_jax.envs.host.EnvpoolVecEnv`).
        latency_ms: ``d``, milliseconds, a finite number, ``0 <= d <=`` :data:`MAX_LATENCY_MS` (0: no
            wait, the inner env as is).
        clock: seconds, monotonic (default ``time.perf_counter``).
        sleep: ``sleep(seconds)`` waits at least that long (default ``time.sleep``).

    Attributes:
        env: the wrapped env.
        latency_ms: ``d`` in milliseconds (float).
        waited_s: total seconds slept so far (the latency the inner env did not cover).

    Raises:
        ValueError: ``latency_ms`` negative, above :data:`MAX_LATENCY_MS`, not finite or not a number.
    """

    def __init__(self, env: Any, latency_ms: float, clock: Callable[[], float] = time.perf_counter,
                 sleep: Callable[[float], Any] = time.sleep):
        if (isinstance(latency_ms, (bool, np.bool_)) or not isinstance(latency_ms, (int, float, np.integer, np.floating))
                or not math.isfinite(latency_ms) or not 0 <= latency_ms <= MAX_LATENCY_MS):
            raise ValueError(f"latency_ms={latency_ms!r}: allowed: {HOST_WRAPPER_SYNTAX['latency_ms']}")
        super().__init__(env)
        self.latency_ms = float(latency_ms)
        self._delay_s = self.latency_ms / 1000.0
        self._clock, self._sleep = clock, sleep
        self._sent = np.full((int(env.num_envs),), -math.inf)  # per env: when its action was sent
        self.waited_s = 0.0

    @property
    def unwrapped(self) -> Any:
        """The innermost env, below every latency wrapper."""
        env = self.env
        while isinstance(env, LatencyVecEnv):
            env = env.env
        return env

    def _wait(self, env_id: Any) -> None:
        if self._delay_s <= 0.0:
            return
        ids = np.asarray(env_id, np.int64)
        if ids.size == 0:
            return
        remainder = float(self._sent[ids].max()) + self._delay_s - self._clock()
        if remainder > 0.0:
            self._sleep(remainder)
            self.waited_s += remainder

    def reset(self) -> Any:
        """The inner :meth:`reset`, returned no earlier than ``latency_ms`` after the call.

        Raises:
            whatever the inner env raises (before any wait).
        """
        t0 = self._clock()
        out = self.env.reset()
        self._sent[:] = t0  # every env's reset was asked for now
        self._wait(out.env_id)
        return out

    def step(self, actions: Any, env_id: Any = None) -> Any:
        """The inner :meth:`step`, returned no earlier than ``latency_ms`` after the actions of the
        returned envs were sent (sync mode: after this call began).

        Args:
            actions, env_id: as the inner env's ``step``.

        Raises:
            whatever the inner env raises (before any wait; nothing is recorded then).
        """
        t0 = self._clock()
        out = self.env.step(actions, env_id)
        sent = np.arange(self._sent.shape[0]) if env_id is None else np.asarray(env_id, np.int64)
        self._sent[sent] = t0
        self._wait(out.env_id)
        return out

    def __repr__(self) -> str:
        return f"<LatencyVecEnv latency_ms={_canonical(self.latency_ms)} {self.env!r}>"
