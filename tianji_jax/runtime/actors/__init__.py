"""Actors on the host: the Sebulba actor of any on-policy agent on host envs
(:mod:`~tianji_jax.runtime.actors.host_actor`) with its per-env trajectory assembly
(:mod:`~tianji_jax.runtime.actors.chunker`), the host actor of any replay agent
(:mod:`~tianji_jax.runtime.actors.replay_host`), envpool's compiled rollout blocks
(:mod:`~tianji_jax.runtime.actors.envpool_rollout`), the host actors' shared normalisation
statistics (:mod:`~tianji_jax.runtime.actors.host_normalize`) and remote actor processes on Ray
(:mod:`~tianji_jax.runtime.actors.ray_actors`)."""
