"""Errors a user can fix: a bad option value, a malformed or missing input file, a run that cannot be continued.

:class:`UserError` marks them. The ``bcg`` command prints such an error as one line (``bcg COMMAND: error:
MESSAGE``) and exits with status 2; any other exception is a bug in bcg and keeps its traceback. The message says
what was wrong and what was expected, so that the user needs nothing else.

The classes derive from the built-in exception a caller would catch without knowing bcg (``ValueError``,
``FileNotFoundError``), so library code that catches those keeps working. This module imports nothing: every layer may
use it.
"""

from __future__ import annotations

__all__ = ["InputNotFoundError", "UserError", "one_line"]


class UserError(ValueError):
    """An input the user can fix (an option value, a file, a run directory); its message says what was expected."""


class InputNotFoundError(UserError, FileNotFoundError):
    """A file or folder named by the user does not exist (or is not the kind of thing expected)."""


def one_line(exc: BaseException) -> str:
    """The message of ``exc`` on one line: lines joined by ``"; "``, indentation dropped."""
    lines = [line.strip() for line in str(exc).splitlines()]
    text = "; ".join(line for line in lines if line)
    return text.replace(":;", ":") or type(exc).__name__
