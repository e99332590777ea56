"""The TianJi runner, the async runtime's core without any math: actor and learner threads, the
schedules and the lag contract (:mod:`~tianji_jax.runtime.tianji.async_runtime`: ``AsyncRunner``
and its hooks), the replay data path's runner (:mod:`~tianji_jax.runtime.tianji.replay_runner`),
the replay of a recorded schedule (:mod:`~tianji_jax.runtime.tianji.scheduled`), the ``auto``
schedule's controller (:mod:`~tianji_jax.runtime.tianji.auto_schedule`) and the latest-wins
params store (:mod:`~tianji_jax.runtime.tianji.param_store`)."""
