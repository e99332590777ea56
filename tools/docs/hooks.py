"""MkDocs hooks of the documentation site (``mkdocs.yml``, ``hooks:``).

* The benchmark plots committed under ``experiments/results/**.png`` are added to the site at build
  time, at the same path (``experiments/results/<name>/<file>.png`` under the site root), so
  ``docs/benchmarks.md`` shows them without a second, committed copy under ``docs/``.
* ``CHANGELOG.md`` (the repository's status log) becomes the site's ``changelog.md`` page.

Both are ordinary files of the build: ``mkdocs build --strict`` validates the links to them like
any other page's or image's.
"""

from __future__ import annotations

from pathlib import Path

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[2]
"""The repository root (this file is ``tools/docs/hooks.py``)."""

PLOTS = "experiments/results"
"""Where the committed benchmark plots are, relative to the root; also their path in the site."""


def on_files(files: Files, config) -> Files:
    """Add every ``experiments/results/**.png`` and ``CHANGELOG.md`` (as ``changelog.md``) to the build.

    Args:
        files: The files MkDocs found under ``docs/``.
        config: The MkDocs config.

    Returns:
        ``files`` with the plots and the changelog added.
    """
    for png in sorted((ROOT / PLOTS).rglob("*.png")):
        files.append(File.generated(config, png.relative_to(ROOT).as_posix(), abs_src_path=str(png)))
    files.append(File.generated(config, "changelog.md", abs_src_path=str(ROOT / "CHANGELOG.md")))
    return files
