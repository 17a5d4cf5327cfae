"""The documentation stands alone: no tracked file points to notes a user of the repository does not have, and every
relative link of the README and the docs leads to a file of the repository."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
"""The pages a user reads: the README and docs/*.md."""

# assembled from parts, so that this file does not match its own patterns
_PRIVATE_NOTES = re.compile("|".join([r"METHOD" + r"\.md", r"DESIGN" + r"\.md", r"SIM_" + r"NOTES",
                                      r"shared/" + r"docs"]))
_LINK = re.compile(r"\]\(([^)\s]+)\)")


def _tracked_files() -> list[Path]:
    """Every file git tracks in this checkout (skips the test outside a git checkout, e.g. in an sdist)."""
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, timeout=60)
    except (OSError, subprocess.CalledProcessError, subprocess.TimeoutExpired):
        pytest.skip("not a git checkout")
    return [ROOT / name for name in out.stdout.decode().split("\0") if name]


def _text(path: Path) -> str | None:
    """The file's text, or None for a binary file (an image, an archive)."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    if b"\0" in data[:4096]:
        return None
    return data.decode("utf-8", errors="replace")


def test_pattern_catches_a_reference():
    """The check can fail: each kind of reference it looks for is found in a sample line."""
    for sample in ["see METHOD" ".md 3.10", "DESIGN" ".md section 2", "SIM_" "NOTES 13.3", "../shared/" "docs/x.md"]:
        assert _PRIVATE_NOTES.search(sample), sample
    assert not _PRIVATE_NOTES.search("see docs/method.md §3.10 and ../shared/motions/g1_moves")


def test_no_reference_to_private_notes():
    hits = []
    for path in _tracked_files():
        text = _text(path)
        if text is None:
            continue
        for i, line in enumerate(text.splitlines(), 1):
            if _PRIVATE_NOTES.search(line):
                hits.append(f"{path.relative_to(ROOT)}:{i}: {line.strip()[:100]}")
    assert not hits, "references to notes that are not in the repository (use docs/method.md):\n" + "\n".join(hits)


def test_relative_links_resolve():
    """Every relative Markdown link of README.md and docs/*.md names a file or folder of the checkout."""
    broken = []
    for page in PAGES:
        for target in _LINK.findall(page.read_text()):
            if re.match(r"^[a-z]+:", target) or target.startswith("#"):
                continue  # a web address or an anchor on the same page
            if not (page.parent / target.split("#", 1)[0]).exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert not broken, "broken links:\n" + "\n".join(broken)


def _heading_anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives the headings of a page: lower case, punctuation dropped, spaces as hyphens, a repeated
    heading numbered -1, -2, ...; headings inside fenced code do not count."""
    anchors: set[str] = set()
    seen: dict[str, int] = {}
    in_code = False
    for line in markdown.splitlines():
        if line.startswith("```"):
            in_code = not in_code
        if in_code or not re.match(r"^#{1,6} ", line):
            continue
        slug = re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


def test_heading_anchors_follow_githubs_rule():
    text = "# bcg — a title\n## At the issue's budget: the run\n```\n# not a heading\n```\n## Tests\n## Tests\n"
    assert _heading_anchors(text) == {"bcg--a-title", "at-the-issues-budget-the-run", "tests", "tests-1"}


def test_anchor_links_name_a_heading():
    """Every link to a heading (``#anchor`` on the same page or ``page.md#anchor``) names one that exists."""
    broken = []
    for page in PAGES:
        for target in _LINK.findall(page.read_text()):
            if re.match(r"^[a-z]+:", target) or "#" not in target:
                continue
            path, anchor = target.split("#", 1)
            dest = page.parent / path if path else page
            if dest.suffix == ".md" and dest.exists() and anchor not in _heading_anchors(dest.read_text()):
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert not broken, "links to headings that do not exist:\n" + "\n".join(broken)
