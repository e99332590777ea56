"""Learner layouts: data-parallel learners over a device mesh
(:mod:`~tianji_jax.runtime.layouts.data_parallel`; replay sharded by env,
:mod:`~tianji_jax.runtime.layouts.replay_sharded`), learner groups that average their params
(:mod:`~tianji_jax.runtime.layouts.learner_groups`), the collectives they use
(:mod:`~tianji_jax.runtime.layouts.collectives`) and multi-host learners on jax.distributed
(:mod:`~tianji_jax.runtime.layouts.distributed`)."""
