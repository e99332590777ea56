"""Does a train state belong to a config? Compares the state's params tree (paths and shapes)
with what the config's network initialises (``jax.eval_shape``: nothing is computed), so a
mismatch is one ``ValueError`` naming the differing leaf and the likely config field instead of
an error from deep inside flax."""

from __future__ import annotations

from typing import Any

import jax

__all__ = ["expected_params", "check_params_match"]

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
        raise ValueError(f"the state does not match the config: its params tree differs from this config's network "
                         f"(leaves the state lacks: {missing[:_SHOWN]}; leaves it has in addition: {extra[:_SHOWN]}); "
                         f"likely config field: {fields}" + advice)
    diffs = [(k, want[k], got[k]) for k in want if want[k] != got[k]]
    shown = ", ".join(f"{k!r} has shape {g} in the state but {w} for this config" for k, w, g in diffs[:_SHOWN])
    raise ValueError(f"the state does not match the config: params leaves differ ({shown}); likely config field: "
                     f"{_likely_field(config, diffs[0][1], diffs[0][2])}" + advice)
