"""Pure algorithm math (losses, advantage estimators, distributions, normalisation)."""
