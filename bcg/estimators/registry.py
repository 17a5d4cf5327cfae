"""The estimator registry: ``name -> estimator class``, filled by the :func:`register` decorator and, lazily, by the
``bcg.estimators`` entry-point group of installed distributions.

A third-party package adds an estimator without editing ``bcg``, in either of two ways:

* decorate its class with ``@bcg.estimators.register("my_name")`` and import the module, or
* declare an entry point (``setup.cfg``: ``[options.entry_points]`` with
  ``bcg.estimators = my_name = my_pkg.module:MyEstimator``; ``pyproject.toml``:
  ``[project.entry-points."bcg.estimators"]``). The group is read the first time the registry is listed or asked for
  a name it does not hold; the entry point may name the class (registered under the entry point's name) or a module
  whose import registers it.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.metadata
import re
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

__all__ = ["ENTRY_POINT_GROUP", "ESTIMATORS", "describe", "make", "register"]

ENTRY_POINT_GROUP = "bcg.estimators"
"""The entry-point group whose entries are loaded into :data:`ESTIMATORS`."""

_NAME = re.compile(r"^[a-z][a-z0-9_\-]*$")
_BUILTIN_MODULES = ("bcg.estimators.bptt", "bcg.estimators.grs", "bcg.estimators.bundled")

T = TypeVar("T", bound=type)


class _Registry(Mapping[str, type]):
    """Read-only mapping ``name -> estimator class``; built-ins and entry points are loaded on first use."""

    def __init__(self) -> None:
        self._classes: dict[str, type] = {}
        self._builtins_loaded = False
        self._entry_points_loaded = False

    # ---------------------------------------------------------------------------------------- loading

    def _load_builtins(self) -> None:
        if not self._builtins_loaded:
            self._builtins_loaded = True
            import importlib

            for mod in _BUILTIN_MODULES:
                importlib.import_module(mod)

    def load_entry_points(self, force: bool = False) -> None:
        """Import the ``bcg.estimators`` entry points (once; ``force=True`` scans the installed distributions
        again, e.g. after installing a plugin in the running process). A plugin that fails to load is skipped with a
        warning, so a broken third-party package does not hide the others."""
        if self._entry_points_loaded and not force:
            return
        self._entry_points_loaded = True
        self._load_builtins()
        for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
            if ep.name in self._classes and not force:
                continue
            try:
                obj = ep.load()
            except Exception as exc:  # a broken plugin must not break the registry
                warnings.warn(f"bcg.estimators: entry point {ep.name!r} ({ep.value}) failed to load: "
                              f"{type(exc).__name__}: {exc}", RuntimeWarning, stacklevel=2)
                continue
            if isinstance(obj, type) and ep.name not in self._classes:
                self._add(ep.name, obj)
                if "name" not in vars(obj):  # as the decorator does (not inherited): checkpoints record it
                    obj.name = ep.name

    def _add(self, name: str, cls: type, replace: bool = False) -> None:
        from bcg.estimators.base import Estimator

        if not isinstance(name, str) or not _NAME.match(name):
            raise ValueError(f"estimator names are lower-case identifiers ([a-z][a-z0-9_-]*), got {name!r}")
        if not (isinstance(cls, type) and issubclass(cls, Estimator) and dataclasses.is_dataclass(cls)):
            raise TypeError(f"estimator {name!r}: expected a dataclass subclass of bcg.estimators.Estimator, "
                            f"got {cls!r}")
        old = self._classes.get(name)
        if old is not None and old is not cls and not replace:
            raise ValueError(f"estimator name {name!r} is already registered to {old.__module__}.{old.__qualname__}"
                             " (pass replace=True to override it)")
        self._classes[name] = cls

    # ---------------------------------------------------------------------------------------- Mapping

    def __getitem__(self, name: str) -> type:
        self._load_builtins()
        if name not in self._classes:
            self.load_entry_points()
        try:
            return self._classes[name]
        except KeyError:
            raise KeyError(f"unknown estimator {name!r}; registered: {', '.join(sorted(self._classes))}") from None

    def __iter__(self) -> Iterator[str]:
        self.load_entry_points()
        return iter(sorted(self._classes))

    def __len__(self) -> int:
        self.load_entry_points()
        return len(self._classes)

    def __contains__(self, name: object) -> bool:
        self._load_builtins()
        if name not in self._classes:
            self.load_entry_points()
        return name in self._classes

    def __repr__(self) -> str:
        return f"ESTIMATORS({', '.join(self)})"


ESTIMATORS = _Registry()
"""All registered estimators, ``name -> class`` (read-only; add with :func:`register` or an entry point)."""


def register(name: str, *, replace: bool = False) -> Callable[[T], T]:
    """Class decorator: register a frozen-dataclass :class:`~bcg.estimators.Estimator` under ``name``.

    ``@register("mine")`` on ``class Mine(Estimator)`` makes ``make("mine", ...)`` build it. Registering another
    class under a taken name raises unless ``replace=True``.
    """

    def deco(cls: T) -> T:
        ESTIMATORS._add(name, cls, replace=replace)
        cls.name = name  # type: ignore[attr-defined]
        return cls

    return deco


def make(name: str, **params: Any) -> Any:
    """Build the estimator registered under ``name`` with hyperparameters ``params`` (its dataclass fields)."""
    if not isinstance(name, str):
        raise TypeError(f"estimator name must be a str, got {type(name).__name__}")
    try:
        cls = ESTIMATORS[name]
    except KeyError as exc:
        raise ValueError(exc.args[0]) from None
    fields = {f.name for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(params) - fields)
    if unknown:
        raise TypeError(f"estimator {name!r} has no parameter(s) {', '.join(unknown)}; its parameters: "
                        f"{', '.join(sorted(fields)) or '(none)'}")
    return cls(**params)


def parse_spec(spec: str) -> tuple[str, dict[str, Any]]:
    """``"name"`` or ``"name:key=value,key=value"`` -> (name, params), the one estimator syntax of every command
    (``bcg train --estimator``, ``bcg compare --methods shac:SPEC``, the studies' ``--estimators``); values are Python
    literals (numbers, strings, booleans) or bare words (taken as strings), e.g.
    ``"bcg:tau=200.0,aggregation=per_foot"``."""
    name, _, rest = spec.partition(":")
    params: dict[str, Any] = {}
    for item in filter(None, (s.strip() for s in rest.split(","))):
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise ValueError(f"estimator spec {spec!r}: expected name:key=value,..., got item {item!r}")
        try:
            params[key.strip()] = ast.literal_eval(value.strip())
        except (ValueError, SyntaxError):
            params[key.strip()] = value.strip()
    return name.strip(), params


def make_spec(spec: str) -> Any:
    """The estimator of a spec (:func:`parse_spec`): ``make(name, **params)``."""
    name, params = parse_spec(spec)
    return make(name, **params)


def describe(name: str) -> list[tuple[str, str, Any, str]]:
    """``(field, type, default, docstring)`` of every hyperparameter of estimator ``name`` (for listings)."""
    from bcg.estimators.base import field_docs

    cls = ESTIMATORS[name]
    docs = field_docs(cls)
    out = []
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        default = f.default if f.default is not dataclasses.MISSING else None
        typ = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
        out.append((f.name, typ, default, docs.get(f.name, "")))
    return out
