"""Command-line parsing of a command dataclass with tyro, its own checks run after tyro is done.

tyro catches a ``ValueError`` raised while it builds the top-level dataclass (a ``__post_init__`` check) and draws it
in a box of several lines. :func:`parse_command` lets tyro fill a copy of the class whose ``__post_init__`` does
nothing, then builds the real class from the parsed fields: a refused value reaches the ``bcg`` entry point as the
exception itself, which prints it as one line (``bcg COMMAND: error: ...``). tyro's own usage errors (unknown flag,
a value of the wrong type) and the checks of nested dataclasses (e.g. ``--shac.*``) are still tyro's to report.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, TypeVar

__all__ = ["parse_command"]

T = TypeVar("T")


def _init_fields(obj: Any) -> dict[str, Any]:
    return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj) if f.init}


def _unchecked(cls: type) -> type:
    """A dataclass subclass of ``cls`` with the same fields, docstrings and name whose ``__post_init__`` is a no-op."""
    params = cls.__dataclass_params__  # type: ignore[attr-defined]
    namespace = {"__post_init__": lambda self: None, "__doc__": cls.__doc__, "__module__": cls.__module__,
                 "__qualname__": cls.__qualname__}
    return dataclasses.dataclass(frozen=params.frozen)(type(cls.__name__, (cls,), namespace))


def parse_command(cls: type[T], args: Sequence[str], *, prog: str, default: T | None = None,
                  config: tuple[Any, ...] = ()) -> T:
    """``tyro.cli(cls, args=args, prog=prog, default=default, config=config)``, with ``cls``'s ``__post_init__``
    run outside tyro (its exceptions propagate unchanged)."""
    import tyro

    if not hasattr(cls, "__post_init__"):
        return tyro.cli(cls, args=list(args), prog=prog, default=default, config=config)
    loose = _unchecked(cls)
    loose_default = None if default is None else loose(**_init_fields(default))
    parsed = tyro.cli(loose, args=list(args), prog=prog, default=loose_default, config=config)
    return cls(**_init_fields(parsed))
