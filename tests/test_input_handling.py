"""Every bad input of docs/input_handling.md (tests/input_cases.py) is refused by ``bcg`` with one line
``bcg COMMAND: error: MESSAGE`` and status 2, in-process (the table itself comes from separate processes)."""

from __future__ import annotations

import pytest
from input_cases import CASES, Case, has_cuda, make_workspace

from bcg.cli import main


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    ws = tmp_path_factory.mktemp("input-cases")
    make_workspace(ws)
    return ws


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.what)
def test_bad_input_is_one_line_and_status_2(case: Case, workspace, monkeypatch, capsys):
    if case.needs_no_gpu and has_cuda():
        pytest.skip("this machine has a CUDA device")
    monkeypatch.chdir(workspace)
    monkeypatch.delenv("BCG_DEBUG", raising=False)
    capsys.readouterr()
    try:
        status = main(case.args(workspace))
    except SystemExit as exc:  # refused while the arguments were parsed
        status = exc.code
    err = [line for line in capsys.readouterr().err.splitlines()
           if line.strip() and not line.startswith("Warp CUDA warning")]  # Warp's own start-up notice
    assert status == 2, err
    assert len(err) == 1 and err[0].startswith(f"bcg {case.argv[0]}") and ": error: " in err[0], err
    assert case.expect in err[0], err
