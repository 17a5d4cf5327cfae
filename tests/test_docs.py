"""Every python code block of README.md and docs/*.md runs as written (blocks of one file share a namespace, in
order, in a scratch directory). Blocks marked as shell (```bash, ```sh, ```console or unmarked) are not run."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_BLOCK = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)


def python_blocks(path: Path) -> list[str]:
    """The ```python blocks of a markdown file, in order."""
    return [code for lang, code in _BLOCK.findall(path.read_text()) if lang == "python"]


def test_the_docs_have_python_blocks() -> None:
    counts = {p.name: len(python_blocks(p)) for p in DOCS}
    assert counts["README.md"] >= 2 and counts["envs.md"] >= 5 and counts["motions.md"] >= 1, counts


@pytest.mark.parametrize("path", [p for p in DOCS if python_blocks(p)], ids=lambda p: p.name)
def test_python_blocks_run(path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": f"doc_{path.stem}"}
    for i, code in enumerate(python_blocks(path)):
        try:
            exec(compile(code, f"{path.name}[block {i}]", "exec", dont_inherit=True), namespace)
        except Exception as exc:  # name the block in the failure
            raise AssertionError(f"{path.name}, python block {i} fails: {type(exc).__name__}: {exc}") from exc
