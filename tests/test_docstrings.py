"""Every public function, class and method of ``tianji_jax`` has a docstring (the project rule;
what the docstrings must say -- shapes, dtypes, units, errors, sources -- is checked by review).

Public: module-level names without a leading ``_`` (or listed in ``__all__``) defined in the
module itself, and the non-underscore methods and properties of public classes defined in the
class or in a private ``tianji_jax`` base class (whose public methods are the subclass's API).
Dataclass-generated members are dunders and skipped; a dataclass without a docstring of its own
gets its signature as ``__doc__`` and is reported.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

import tianji_jax

pytestmark = pytest.mark.timeout(60)


def _modules():
    yield tianji_jax
    for info in pkgutil.walk_packages(tianji_jax.__path__, "tianji_jax."):
        yield importlib.import_module(info.name)


def _class_members(cls: type):
    own = {}
    for base in reversed(cls.__mro__):  # private tianji_jax bases first, the class's own override them
        if base is cls or (base.__module__.startswith("tianji_jax") and base.__name__.startswith("_")):
            own.update(vars(base))
    for name, member in own.items():
        if name.startswith("_"):
            continue
        if isinstance(member, (staticmethod, classmethod)):
            member = member.__func__
        elif isinstance(member, property):
            member = member.fget
        if inspect.isfunction(member):
            yield name, member


def _undocumented() -> list[str]:
    missing = []
    for module in _modules():
        exported = set(getattr(module, "__all__", ()))
        for name, obj in vars(module).items():
            if (name.startswith("_") and name not in exported) or getattr(obj, "__module__", None) != module.__name__:
                continue
            if inspect.isfunction(obj):
                if not (obj.__doc__ or "").strip():
                    missing.append(f"{module.__name__}.{name}")
            elif inspect.isclass(obj):
                doc = (obj.__dict__.get("__doc__") or "").strip()
                if not doc or doc.startswith(f"{obj.__name__}("):  # dataclass fills in its signature
                    missing.append(f"{module.__name__}.{name}")
                for member_name, member in _class_members(obj):
                    if not (member.__doc__ or "").strip():
                        missing.append(f"{module.__name__}.{name}.{member_name}")
    return missing


def test_every_public_item_has_a_docstring():
    missing = _undocumented()
    assert not missing, "public items without a docstring:\n  " + "\n  ".join(missing)


def test_the_check_sees_a_missing_docstring(monkeypatch):
    """The walk must actually reach methods: blank one out and it is reported."""
    from tianji_jax.buffers.rate_limiter import RateLimiter

    monkeypatch.setattr(RateLimiter.can_sample, "__doc__", None)
    assert _undocumented() == ["tianji_jax.buffers.rate_limiter.RateLimiter.can_sample"]
