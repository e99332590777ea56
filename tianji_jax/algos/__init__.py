"""Algorithms, one package each holding its config and its math (:mod:`tianji_jax.algos.ppo`,
:mod:`tianji_jax.algos.dqn`), plus the pure math they share (distributions, normalisation, the
non-finite step guard)."""
