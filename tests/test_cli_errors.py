"""The ``bcg`` command's handling of user errors: one line ``bcg COMMAND: error: ...`` and status 2, ``--debug`` /
``BCG_DEBUG`` for the traceback, a real bug keeps its traceback, Ctrl-C before a command handles it gives one line and
130. The bad inputs themselves are listed in ``input_cases.py`` (also the source of docs/input_handling.md)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from bcg.cli import COMMANDS, main
from bcg.errors import UserError


def _stderr_lines(capsys: pytest.CaptureFixture[str]) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line.strip()]


@dataclass(frozen=True)
class _Raises:
    """A command whose run raises ``exc`` (set per test)."""

    def run(self) -> int:
        raise _Raises.exc  # type: ignore[attr-defined]


@pytest.fixture
def raising(monkeypatch: pytest.MonkeyPatch):
    def use(exc: BaseException) -> None:
        monkeypatch.setattr(_Raises, "exc", exc, raising=False)
        monkeypatch.setitem(COMMANDS, "raises", _Raises)

    monkeypatch.delenv("BCG_DEBUG", raising=False)
    return use


def test_user_error_is_one_line_and_status_2(raising, capsys):
    raising(UserError("the thing is wrong\n  first detail\n  second detail"))
    assert main(["raises"]) == 2
    assert _stderr_lines(capsys) == ["bcg raises: error: the thing is wrong; first detail; second detail"]


def test_debug_flag_or_variable_shows_the_traceback(raising, monkeypatch, capsys):
    raising(UserError("the thing is wrong"))
    with pytest.raises(UserError, match="the thing is wrong"):
        main(["raises", "--debug"])
    monkeypatch.setenv("BCG_DEBUG", "1")
    with pytest.raises(UserError, match="the thing is wrong"):
        main(["raises"])
    monkeypatch.setenv("BCG_DEBUG", "0")
    assert main(["raises"]) == 2


def test_a_bug_keeps_its_traceback(raising):
    raising(RuntimeError("a bug in bcg"))
    with pytest.raises(RuntimeError, match="a bug in bcg"):
        main(["raises"])
    raising(ValueError("a bug's ValueError is not a user error"))
    with pytest.raises(ValueError, match="not a user error"):
        main(["raises"])


def test_ctrl_c_before_the_command_handles_it_is_one_line_and_130(raising, capsys):
    raising(KeyboardInterrupt())
    assert main(["raises"]) == 130
    assert _stderr_lines(capsys) == ["bcg raises: interrupted (Ctrl-C)"]
    with pytest.raises(KeyboardInterrupt):
        main(["--debug", "raises"])


def test_a_value_refused_while_parsing_exits_2_with_one_line(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["bench", "--sizes", "0"])
    assert exc.value.code == 2
    lines = _stderr_lines(capsys)
    assert len(lines) == 1 and lines[0].startswith("bcg bench: error: sizes must be integers >= 1"), lines
    # a bad estimator spec for the learning bench is refused before anything is timed
    for spec, message in (("bcg:min_branches=0", "min_branches must be an int >= 1, got 0"),
                          ("bogus", "unknown estimator 'bogus'")):
        with pytest.raises(SystemExit) as exc:
            main(["bench", "--learning", "--methods", "bptt", spec])
        assert exc.value.code == 2
        lines = _stderr_lines(capsys)
        assert len(lines) == 1 and lines[0].startswith(f"bcg bench: error: {message}"), lines


def test_usage_names_the_debug_switch(capsys):
    assert main([]) == 0
    assert "--debug" in capsys.readouterr().out
