"""Runtimes, below the run loop: Anakin, acting and learning fused in one compiled chunk
(:mod:`~tianji_jax.runtime.anakin`), and the async TianJi runtime: every agent of a data path
wired onto the runner (:mod:`~tianji_jax.runtime.async_on_policy`,
:mod:`~tianji_jax.runtime.async_replay`) from the runner core (:mod:`~tianji_jax.runtime.tianji`),
the actors (:mod:`~tianji_jax.runtime.actors`) and the learner layouts
(:mod:`~tianji_jax.runtime.layouts`); the host side of the non-finite guard
(:mod:`~tianji_jax.runtime.nonfinite`)."""
