"""Does a train state belong to a config? Compares the state's params tree (paths and shapes)
with what the config's network initialises (``jax.eval_shape``: nothing is computed), so a
mismatch is one ``ValueError`` naming the differing leaf and the likely config field instead of
an error from deep inside flax."""

from __future__ import annotations

from typing import Any

import jax

__all__ = ["expected_params", "check_state_kind", "check_params_match"]

_SHOWN = 3  # differing leaves named in a message


def expected_params(config: Any) -> Any:
    """The params of ``config``'s network as ``jax.ShapeDtypeStruct`` leaves (PPO: actor and
    critic; DQN: the online Q-network)."""
    from tianji_jax.runtime.anakin import make_agent

    agent = make_agent(config)  # every registered algorithm's agent
    return jax.eval_shape(lambda k: agent.init_learner(agent.split_init_key(k)[1]).params, jax.random.PRNGKey(0))


def _leaves(tree: Any) -> dict[str, tuple[int, ...]]:
    flat, _ = jax.tree_util.tree_flatten_with_path(tree)
    return {jax.tree_util.keystr(path, simple=True, separator="/"): tuple(getattr(x, "shape", ())) for path, x in flat}


def _likely_field(config: Any, want: tuple[int, ...], got: tuple[int, ...]) -> str:
    """The config field a shape difference most likely comes from: a layer width of
    ``hidden_sizes`` when a differing dimension is one, else the env (observation / action shapes)."""
    differing = [w for w, g in zip(want, got) if w != g] if len(want) == len(got) else list(want)
    if any(d in config.hidden_sizes for d in differing):
        return f"hidden_sizes (this config has hidden_sizes={config.hidden_sizes})"
    return f"env (this config has env={config.env!r}: its observation or action shape)"


def check_state_kind(config: Any, state: Any) -> None:
    """Check that ``state`` is a train state of ``config``'s data path (an on-policy algorithm's
    ``OnPolicyTrainState`` or a replay algorithm's ``ReplayTrainState``); other objects pass (their
    params are checked by :func:`check_params_match`).

    Raises:
        ValueError: one line naming both data paths and their registered algorithms.
    """
    from tianji_jax.algos.registry import algorithm_for, algorithm_names, get_algorithm
    from tianji_jax.runtime.anakin import OnPolicyTrainState, ReplayTrainState

    path = algorithm_for(config).data_path
    state_path = ("on_policy" if isinstance(state, OnPolicyTrainState) else
                  "replay" if isinstance(state, ReplayTrainState) else path)
    if state_path != path:
        def algos(p: str) -> str:
            return ", ".join(n for n in algorithm_names() if get_algorithm(n).data_path == p)

        label = {"on_policy": "an on-policy", "replay": "a replay"}
        raise ValueError(f"the state does not match the config: it is {label[state_path]} algorithm's train state "
                         f"({algos(state_path)}) and the config a {type(config).__name__} ({label[path]} algorithm: "
                         f"{algos(path)}); "
                         "evaluate with the config the state was trained with (tianji_jax.load(run_dir).config)")


def check_params_match(config: Any, params: Any) -> None:
    """Check that ``params`` (a train state's) have the tree and shapes of ``config``'s network.

    Raises:
        ValueError: they differ; the message names the first differing leaves with both shapes,
            the likely config field (``hidden_sizes``, ``env``; ``dueling`` for DQN when the tree
            differs) and how to get the right config (``tianji_jax.load(run_dir).config``).
    """
    want, got = _leaves(expected_params(config)), _leaves(params)
    if want == got:
        return
    advice = "; evaluate with the config the state was trained with (tianji_jax.load(run_dir).config)"
    if set(want) != set(got):
        missing, extra = sorted(set(want) - set(got)), sorted(set(got) - set(want))
        fields = f"hidden_sizes (this config has hidden_sizes={config.hidden_sizes}: {len(config.hidden_sizes)} hidden layer(s))"
        if hasattr(config, "dueling"):
            fields += f" or dueling (this config has dueling={config.dueling})"
        fields += f", or the algorithm (this config is a {type(config).__name__})"
        raise ValueError(f"the state does not match the config: its params tree differs from this config's network "
                         f"(leaves the state lacks: {missing[:_SHOWN]}; leaves it has in addition: {extra[:_SHOWN]}); "
                         f"likely config field: {fields}" + advice)
    diffs = [(k, want[k], got[k]) for k in want if want[k] != got[k]]
    shown = ", ".join(f"{k!r} has shape {g} in the state but {w} for this config" for k, w, g in diffs[:_SHOWN])
    raise ValueError(f"the state does not match the config: params leaves differ ({shown}); likely config field: "
                     f"{_likely_field(config, diffs[0][1], diffs[0][2])}" + advice)
