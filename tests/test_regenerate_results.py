"""benchmarks/regenerate_results.py: the study tables the pages quote are copied from the studies' ``methods.md``
into the marked places, and nothing else of a page changes."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from conftest import load_script

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))  # regenerate_results imports its sibling transfer_tables
regenerate = load_script(BENCHMARKS / "regenerate_results.py")

METHODS_MD = """# SHAC+BCG, SHAC and PPO in MuJoCo

## Tracking after transfer (Q4)

| clip | method | falls |
| --- | --- | --- |
| run | PPO | 6 of 16 |

## Samples to reach PPO's final point (Q3)

Target: PPO's final point.

| clip | method | ratio |
| --- | --- | --- |
| run | SHAC+BCG | 7.7 |
| fight | SHAC+BCG | 16.9 |

## Samples to reach any of PPO's checkpoints (Q3, worst case)

| clip | method | ratio |
| --- | --- | --- |
| run | SHAC+BCG | 3.7 |

![figure](study_methods.png)
"""


def test_section_table_is_the_first_table_under_its_heading() -> None:
    q3 = regenerate.section_table(METHODS_MD, "Samples to reach PPO's final point (Q3)")
    assert q3.splitlines() == ["| clip | method | ratio |", "| --- | --- | --- |", "| run | SHAC+BCG | 7.7 |",
                               "| fight | SHAC+BCG | 16.9 |"]
    assert regenerate.section_table(METHODS_MD, "Tracking after transfer (Q4)").endswith("| run | PPO | 6 of 16 |")
    with pytest.raises(SystemExit, match="no heading 'Q5'"):
        regenerate.section_table(METHODS_MD, "Q5")
    with pytest.raises(SystemExit, match="no table under 'Empty'"):
        regenerate.section_table("## Empty\n\ntext\n\n## Next\n\n| a |\n", "Empty")


def test_quoted_tables_replace_only_their_markers(tmp_path: Path) -> None:
    for study in ("study_methods", "study_methods_3600"):
        (tmp_path / study).mkdir()
        text = METHODS_MD if study == "study_methods" else METHODS_MD.replace("16.9", "26.4")
        (tmp_path / study / "methods.md").write_text(text)
    page = tmp_path / "page.md"
    page.write_text("Intro.\n\n  <!-- study_tables:methods_3600_q3 -->\n  | stale |\n"
                    "  <!-- /study_tables:methods_3600_q3 -->\n\n"
                    "Outro: <!-- transfer_tables:methods_3600_q3 --> stays.\n")
    plain = tmp_path / "plain.md"
    plain.write_text("No markers.\n")
    assert regenerate.quote_study_tables(tmp_path, (page, plain)) == {str(page): ["methods_3600_q3"],
                                                                       str(plain): []}
    text = page.read_text()
    assert "| stale |" not in text and "  | fight | SHAC+BCG | 26.4 |\n  <!-- /study_tables:methods_3600_q3 -->" in text
    assert text.startswith("Intro.\n\n  <!-- study_tables:methods_3600_q3 -->\n  | clip | method | ratio |\n")
    assert text.endswith("Outro: <!-- transfer_tables:methods_3600_q3 --> stays.\n")
    assert plain.read_text() == "No markers.\n"


def test_the_pages_quote_what_the_kept_studies_hold() -> None:
    """The README and docs/studies.md carry the kept studies' tables as they are (regenerate_results wrote them)."""
    root = BENCHMARKS.parent
    for page in regenerate.QUOTING_PAGES:
        text = (root / page).read_text()
        for name, (study, heading) in regenerate.STUDY_TABLES.items():
            if f"<!-- study_tables:{name} -->" in text:
                table = regenerate.section_table((BENCHMARKS / "results" / study / "methods.md").read_text(), heading)
                assert f"<!-- study_tables:{name} -->\n{table}\n<!-- /study_tables:{name} -->" in text, (page, name)


def test_study_command_lists_every_run_once_and_wraps() -> None:
    runs = tuple(f"run-number-{i}-s0" for i in range(9))
    block = regenerate.study_command(runs, "out/study", width=60)
    lines = block.splitlines()
    assert lines[:2] == ["```bash", "K=benchmarks/results/stay_up"] and lines[-1] == "```"
    assert lines[2].startswith("bcg study methods --runs $K/run-number-0-s0")
    assert all(len(line) <= 60 for line in lines[:-2])
    assert " ".join(lines[2:-2]).split().count("$K/run-number-4-s0") == 1
    assert [w for w in block.split() if w.startswith("$K/")] == [f"$K/{r}" for r in runs]
    assert lines[-2].startswith("    --out out/study")


def test_docs_show_the_study_commands_the_script_runs() -> None:
    """docs/studies.md's 60-minute study command is the one regenerate_results runs (written by it, not by hand)."""
    text = (BENCHMARKS.parent / regenerate.COMMAND_PAGE).read_text()
    for name, (runs, out) in regenerate.STUDY_COMMANDS.items():
        assert (f"<!-- study_command:{name} -->\n{regenerate.study_command(regenerate.kept_names(runs), out)}\n"
                f"<!-- /study_command:{name} -->") in text, name


def test_kept_names_keeps_order_and_drops_runs_not_kept() -> None:
    assert regenerate.kept_names(("d60-bcg-dance-s0", "no-such-run-s0", "d60-bcg-run-s0")) == (
        "d60-bcg-dance-s0", "d60-bcg-run-s0")
