"""``python -m tianji_jax.cli``: the ``tianji`` command."""

from tianji_jax.cli.commands import console_main

if __name__ == "__main__":
    console_main()
