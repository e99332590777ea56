"""A griffe extension for the API reference (``mkdocs.yml``, mkdocstrings' ``extensions``).

tianji_jax's docstrings are Google style with reStructuredText inline markup. Before mkdocstrings
renders them, this extension adapts what griffe's Google parser would show wrongly or drop,
without changing the words:

* Sphinx roles (``:class:`Cell```, ``:func:`~tianji_jax.train```) become code spans of their
  target (Markdown renders the double-backquoted literals as code already);
* a parameter line naming several parameters (``mean, var: ...``, ``a / b: ...``) becomes one
  line per parameter with the shared description, so each is checked against the signature;
* a section whose items are prose rather than ``name: description`` pairs (a ``Raises:`` that
  says "whatever the inner env raises", an ``Attributes:`` line listing several names) would be
  dropped item by item by the parser: such a section becomes a bold title and its text.

Whatever still makes griffe warn (a parameter missing from the signature) is left alone, so
``mkdocs build --strict`` fails on it.
"""

from __future__ import annotations

import re
from contextlib import contextmanager

import griffe

ROLE = re.compile(r":(?:py:)?(?:mod|class|func|meth|data|attr|exc|obj|const|ref|term):`~?([^`]+)`")
"""A Sphinx cross-reference role with its backquoted target."""

SECTION = re.compile(r"^(\s*)([A-Z][A-Za-z ]*):\s*$")
"""A Google-style section title line (``Args:``, ``Raises:``, ...)."""

GROUPED = re.compile(r"^(\s*)(\*{0,2}\w+(?:\s*(?:,|/)\s*\*{0,2}\w+)+)(\s*\([^)]*\))?:(.*)$")
"""A parameter line naming several parameters: ``a, b: description`` or ``a / b (type): description``."""

PARSE_OPTIONS = {"warn_missing_types": False, "warn_unknown_params": True, "returns_multiple_items": False}
"""The Google parser options of ``mkdocs.yml`` that decide which items griffe warns about."""


def strip_roles(text: str) -> str:
    """Rewrite every Sphinx role of ``text`` into a Markdown code span of its target.

    Args:
        text: A docstring.

    Returns:
        The docstring with ``:role:`~target``` replaced by `` `target` ``.
    """
    return ROLE.sub(lambda m: f"`{m.group(1)}`", text)


def split_grouped(lines: list[str]) -> list[str]:
    """One parameter line per name where a line of an ``Args:`` section names several.

    Args:
        lines: The docstring's lines.

    Returns:
        The lines, ``a, b: desc`` replaced by ``a: desc`` and ``b: desc`` (continuation lines
        repeated under each) inside ``Args`` / ``Arguments`` / ``Parameters`` sections.
    """
    out: list[str] = []
    section, indent, i = None, 0, 0
    while i < len(lines):
        line = lines[i]
        title = SECTION.match(line)
        if title:
            section, indent = title.group(2), len(title.group(1))
            out.append(line)
            i += 1
            continue
        grouped = GROUPED.match(line) if section in ("Args", "Arguments", "Parameters") else None
        if grouped and len(grouped.group(1)) > indent:
            item_indent = len(grouped.group(1))
            cont = []
            while i + 1 < len(lines) and lines[i + 1].strip() and len(lines[i + 1]) - len(lines[i + 1].lstrip()) > item_indent:
                i += 1
                cont.append(lines[i])
            for name in re.split(r"\s*(?:,|/)\s*", grouped.group(2)):
                out.append(f"{grouped.group(1)}{name}{grouped.group(3) or ''}:{grouped.group(4)}")
                out.extend(cont)
        else:
            out.append(line)
        i += 1
    return out


def as_text(lines: list[str], title: int) -> list[str]:
    """Turn the section starting at line ``title`` into a bold title and its text as paragraphs.

    Args:
        lines: The docstring's lines.
        title: The index of the section's title line.

    Returns:
        The lines with that section rewritten: the same words, dedented to the title's indentation
        (Markdown joins the lines of each paragraph).
    """
    indent = len(lines[title]) - len(lines[title].lstrip())
    end = title + 1
    while end < len(lines) and (not lines[end].strip() or len(lines[end]) - len(lines[end].lstrip()) > indent):
        end += 1
    pad = " " * indent
    body = [pad + ln.strip() if ln.strip() else "" for ln in lines[title + 1:end]]
    name = lines[title].strip().rstrip(":")
    return [*lines[:title], f"{pad}**{name}:**", "", *body, "", *lines[end:]]


@contextmanager
def _warnings_caught(found: list[tuple[int, str]]):
    """Collect griffe's docstring warnings as (offset, message) instead of logging them."""
    from griffe._internal.docstrings import google  # the parser's own warning function

    original = google.docstring_warning
    google.docstring_warning = lambda docstring, offset, message, *a, **k: found.append((offset, message))
    try:
        yield
    finally:
        google.docstring_warning = original


def _unparsed_sections(docstring: griffe.Docstring) -> list[int]:
    """The title lines of the sections in which griffe drops an item (no ``name: description`` pair)."""
    found: list[tuple[int, str]] = []
    try:
        with _warnings_caught(found):
            docstring.parse("google", **PARSE_OPTIONS)
    except ImportError:  # another griffe layout: no rewriting, the build shows griffe's own warnings
        return []
    titles = set()
    lines = docstring.value.split("\n")
    for offset, message in found:
        if not message.startswith("Failed to get"):
            continue
        for j in range(min(offset, len(lines) - 1), -1, -1):
            if SECTION.match(lines[j]):
                titles.add(j)
                break
    return sorted(titles, reverse=True)


def adapt(docstring: griffe.Docstring) -> None:
    """Apply every rewrite of this module to one docstring, in place.

    Args:
        docstring: A docstring griffe loaded (its ``value`` is replaced).
    """
    docstring.value = "\n".join(split_grouped(strip_roles(docstring.value).split("\n")))
    for title in _unparsed_sections(docstring):
        docstring.value = "\n".join(as_text(docstring.value.split("\n"), title))
    docstring.__dict__.pop("parsed", None)  # a cached parse of the old text


def _objects(obj: griffe.Object):
    """``obj`` and every object defined under it (aliases, i.e. imported names, skipped)."""
    yield obj
    for member in obj.members.values():
        if not member.is_alias:
            yield from _objects(member)


class AdaptDocstrings(griffe.Extension):
    """Applies :func:`adapt` to every docstring of a package once griffe has loaded it."""

    def on_package(self, *, pkg: griffe.Module, **kwargs) -> None:
        """Adapt every docstring of the loaded package.

        Args:
            pkg: The package griffe has just loaded, with all its modules.
            **kwargs: The event's other arguments (unused).
        """
        for obj in _objects(pkg):
            if obj.docstring is not None:
                adapt(obj.docstring)
