"""Compile an Anakin run's last, shorter chunk in the background, just before it is needed.

An Anakin run of ``n`` updates (or DQN iterations) in chunks of ``U`` ends with a chunk of
``n mod U``: a second compiled function. Compiling it in line stalls the end of the run for as
long as the first chunk's compilation (about 5 s of a 24 s default CartPole PPO run on 2 CPU
cores). :class:`TailCompile` compiles it in a background thread instead, started when the full
chunks still to run would take about as long as that compilation did, so that it overlaps them
and, in a long run, is not in flight for most of the run (an interrupted run waits for an
in-flight compilation before it exits: XLA cannot cancel one).
"""

from __future__ import annotations

import threading
from typing import Any, Callable

import jax

from tianji_jax.caches import register

__all__ = ["TailCompile"]

_COMPILED: dict[tuple[Any, Any], Any] = register({})
"""(jitted function, abstract argument spec) -> its ahead-of-time compiled executable."""
_LOCK = threading.Lock()


def _spec(tree: Any) -> Any:
    """A hashable abstract spec of ``tree``: its structure and each leaf's shape, dtype, sharding."""
    leaves, treedef = jax.tree.flatten(tree)
    return treedef, tuple((x.shape, x.dtype, x.sharding) for x in leaves)


class TailCompile:
    """The last chunk's jitted function, compiled ahead of time in a background thread.

    Usage in a training loop (every exit path must reach :meth:`close`)::

        tail = TailCompile(tail_trainer.chunk)
        try:
            while left:
                fn = trainer if full chunk else tail
                state, metrics = fn(state)
                tail.after_chunk(state, seconds, full_chunks_left)
        finally:
            tail.close()

    Args:
        jitted: the ``jax.jit``-wrapped chunk of the run's last chunk, called with one argument
            (the train state pytree; donation as the jitted function declares it).
        timeout_s: longest wait, in seconds, for an in-flight compilation (in :meth:`__call__`
            and :meth:`close`); after it the call compiles in line.

    Attributes:
        compile_s: the estimate of the compilation time in seconds (the first chunk's wall time,
            which includes compiling the full chunk), or None before the first chunk.
    """

    def __init__(self, jitted: Callable[[Any], Any], timeout_s: float = 600.0):
        self._jitted = jitted
        self._timeout_s = timeout_s
        self._thread: threading.Thread | None = None
        self.compile_s: float | None = None

    def after_chunk(self, state: Any, seconds: float, full_chunks_left: int) -> None:
        """Report a finished chunk: its wall time in seconds, the state it returned and the number
        of full chunks still to run; starts the background compilation once
        ``full_chunks_left * seconds <= compile_s`` (at once if nothing is cached)."""
        if self.compile_s is None:
            self.compile_s = seconds
            return
        if self._thread is None and full_chunks_left * seconds <= self.compile_s:
            self._start(state)

    def _start(self, state: Any) -> None:
        key = (self._jitted, _spec(state))  # abstract now: a donating chunk may free ``state``
        with _LOCK:
            if key in _COMPILED:
                return
        args = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state)

        def compile_now() -> None:
            try:
                compiled = self._jitted.lower(args).compile()
            except Exception:  # noqa: BLE001 - the call compiles in line and raises with its own traceback
                return
            with _LOCK:
                _COMPILED[key] = compiled

        self._thread = threading.Thread(target=compile_now, name="tianji-tail-compile", daemon=True)
        self._thread.start()

    def __call__(self, state: Any) -> Any:
        """Run the last chunk on ``state``: the ahead-of-time executable when it is ready (after
        waiting for an in-flight compilation), else the jitted function (compiling in line)."""
        self.close()
        with _LOCK:
            compiled = _COMPILED.get((self._jitted, _spec(state)))
        return (compiled or self._jitted)(state)

    def close(self) -> None:
        """Wait (at most ``timeout_s``) for an in-flight compilation to finish."""
        if self._thread is not None:
            self._thread.join(self._timeout_s)
