"""Command-line parsing of a command dataclass with tyro, its own checks run after tyro is done.

tyro catches a ``ValueError`` raised while it builds the top-level dataclass (a ``__post_init__`` check) and draws it
in a box of several lines. :func:`parse_command` lets tyro fill a copy of the class whose ``__post_init__`` does
nothing, then builds the real class from the parsed fields: a refused value reaches the ``bcg`` entry point as the
exception itself, which prints it as one line (``bcg COMMAND: error: ...``). A field whose default is itself a
checked dataclass (an option group such as ``bcg evaluate``'s replay protocol, or the dynamics inside it) is parsed
the same way, at any depth, its checks run when the real object is built; a command without checks of its own but
with such a group goes through the same path. tyro's own usage errors (unknown flag, a value of the wrong type) and
the checks of nested dataclasses without such a default (e.g. ``--shac.*``) are still tyro's to report.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Sequence
from typing import Annotated, Any, TypeVar

__all__ = ["parse_command"]

T = TypeVar("T")


def _init_fields(obj: Any) -> dict[str, Any]:
    return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj) if f.init}


def _is_checked_group(field: dataclasses.Field) -> bool:
    """Whether ``field``'s default is a dataclass instance with checks of its own (an option group)."""
    value = field.default
    return (field.init and dataclasses.is_dataclass(value) and not isinstance(value, type)
            and hasattr(type(value), "__post_init__"))


def _unchecked(cls: type) -> type:
    """A dataclass subclass of ``cls`` with the same fields, docstrings and name whose ``__post_init__`` is a no-op;
    fields whose default is a checked dataclass get an unchecked copy of that class (same flags)."""
    params = cls.__dataclass_params__  # type: ignore[attr-defined]
    namespace: dict[str, Any] = {"__post_init__": lambda self: None, "__doc__": cls.__doc__,
                                 "__module__": cls.__module__, "__qualname__": cls.__qualname__,
                                 "_checked_class": cls}
    groups = [f for f in dataclasses.fields(cls) if _is_checked_group(f)]
    namespace["_loose_fields"] = {}
    if groups:
        hints = typing.get_type_hints(cls, include_extras=True)
        namespace["__annotations__"] = {}
        for f in groups:
            loose = _unchecked(type(f.default))
            hint = hints[f.name]
            extras = getattr(hint, "__metadata__", ())
            namespace["__annotations__"][f.name] = Annotated[(loose, *extras)] if extras else loose
            namespace[f.name] = _loosened(f.default, loose)
            namespace["_loose_fields"][f.name] = loose
    return dataclasses.dataclass(frozen=params.frozen)(type(cls.__name__, (cls,), namespace))


def _loosened(value: Any, loose: type) -> Any:
    """``value`` (an instance of a checked dataclass) as an instance of its unchecked copy ``loose``, the option
    groups inside it too: tyro takes a default of another class than the field's for a subcommand."""
    fields = _init_fields(value)
    for name, sub in loose._loose_fields.items():  # type: ignore[attr-defined]
        if isinstance(fields[name], sub._checked_class):
            fields[name] = _loosened(fields[name], sub)
    return loose(**fields)


def _checked(value: Any) -> Any:
    """A parsed value, rebuilt as its real (checked) class when it is an unchecked copy (its checks run now)."""
    real = getattr(type(value), "_checked_class", None)
    if real is None:
        return value
    return real(**{k: _checked(v) for k, v in _init_fields(value).items()})


def parse_command(cls: type[T], args: Sequence[str], *, prog: str, default: T | None = None,
                  config: tuple[Any, ...] = ()) -> T:
    """``tyro.cli(cls, args=args, prog=prog, default=default, config=config)``, with ``cls``'s ``__post_init__``
    run outside tyro (its exceptions propagate unchanged)."""
    import tyro

    if not hasattr(cls, "__post_init__") and not any(_is_checked_group(f) for f in dataclasses.fields(cls)):
        return tyro.cli(cls, args=list(args), prog=prog, default=default, config=config)
    loose = _unchecked(cls)
    loose_default = None if default is None else _loosened(default, loose)
    parsed = tyro.cli(loose, args=list(args), prog=prog, default=loose_default, config=config)
    return _checked(parsed)
