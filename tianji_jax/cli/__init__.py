"""The ``tianji`` command: ``train``, ``sweep``, ``eval`` and ``plot``
(:mod:`~tianji_jax.cli.commands`; the arguments of ``tianji train`` built from the configs in
:mod:`~tianji_jax.cli.argv`, ``tianji sweep`` in :mod:`~tianji_jax.cli.sweep`)."""

from tianji_jax.cli.commands import DQNTrainArgs, EvalArgs, PlotArgs, TrainArgs, console_main, main

__all__ = ["main", "console_main", "TrainArgs", "DQNTrainArgs", "EvalArgs", "PlotArgs"]
