"""The vocabulary of the env id syntax (``"<backend>:<id>|<term>|<term>..."``): the device wrappers'
names (:data:`WRAPPER_SYNTAX`, applied by :mod:`tianji_jax.envs.wrappers` and, on host envs, by
:mod:`tianji_jax.envs.host_wrappers`) and the host envs' modifiers (:data:`HOST_WRAPPER_SYNTAX`,
:mod:`tianji_jax.envs.latency`), each with the value it takes, as the one-line errors quote them.
Imports nothing: the parsers of both kinds name the other kind's terms in their errors."""

__all__ = ["WRAPPER_SYNTAX", "HOST_WRAPPER_SYNTAX"]

WRAPPER_SYNTAX = {
    "mask": "comma-separated distinct observation indices, e.g. mask=0,2 (ObservationMask)",
    "frame_stack": "an integer >= 1, e.g. frame_stack=4 (FrameStack)",
    "clip_action": "no value, just clip_action (ClipAction)",
}
"""Wrapper names of the id syntax and the value each takes (device envs; on host envs the same
wrappers, :mod:`tianji_jax.envs.host_wrappers`)."""

HOST_WRAPPER_SYNTAX = {
    "latency_ms": "a finite number of milliseconds >= 0 and <= 10000 (10 s), e.g. latency_ms=5 or latency_ms=2.5 "
                  "(LatencyVecEnv)",
}
"""Modifiers of the host env id syntax (``"envpool:<id>|latency_ms=5"``) and the value each takes."""
