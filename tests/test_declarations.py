"""Each option of the simulator's dynamics is declared once, in :class:`bcg.envs.Dynamics`, and each option of the
episode layers once, in :class:`bcg.envs.EpisodeLayers`; they reach every command and file through them (read from
the source, and through the parsers and the stored configs). Frozen configs are changed only while validated."""

from __future__ import annotations

import ast
from pathlib import Path

from bcg.envs.dynamics import DYNAMICS_FIELDS, Dynamics
from bcg.envs.episode_layers import LAYER_FIELDS, EpisodeLayers

PACKAGE = Path(__file__).resolve().parents[1] / "bcg"

RANGES = {("DomainRandomization", "contact_beta")}
"""Fields of the same name that are something else: domain randomisation's contact_beta is the range U(lo, hi) of the
per-environment draw, not a value of the simulator."""


def _declarations(root: Path, names: tuple[str, ...] = DYNAMICS_FIELDS) -> list[tuple[str, str, str]]:
    """(file, class, field) of every class-level annotated field named like one of ``names``, outside bcg/sim (the
    simulator's own ContactParams holds the physical values the dynamics options override)."""
    out = []
    for path in sorted(root.rglob("*.py")):
        if path.relative_to(root).parts[0] == "sim":
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ClassDef):
                out.extend((path.relative_to(root).as_posix(), node.name, st.target.id) for st in node.body
                           if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name)
                           and st.target.id in names and (node.name, st.target.id) not in RANGES)
    return out


def test_the_dynamics_are_declared_once() -> None:
    assert sorted(_declarations(PACKAGE)) == sorted(("envs/dynamics.py", "Dynamics", f) for f in DYNAMICS_FIELDS)


def test_the_episode_layers_are_declared_once() -> None:
    assert sorted(_declarations(PACKAGE, LAYER_FIELDS)) == sorted(("envs/episode_layers.py", "EpisodeLayers", f)
                                                                  for f in LAYER_FIELDS)


def test_the_layers_take_flat_flags_and_keywords_and_old_runs_read_back() -> None:
    from bcg.agents.train_config import config_from_dict, config_to_dict, parse_train_args
    from bcg.envs.config import EnvConfig

    cfg = parse_train_args(["--no-adaptive-start", "--replay-threshold", "0.3", "--termination-gravity-z", "None"])
    assert cfg.env_config().layers == EpisodeLayers(
        termination_anchor_height=0.25, termination_end_effector_height=0.25, replay_threshold=0.3)
    assert config_from_dict(config_to_dict(cfg)) == cfg
    # a run written when the layers were flat options of its config
    plain = config_to_dict(cfg)
    flat = {k: v for k, v in plain.items() if k != "layers"}
    assert config_from_dict({**flat, **plain["layers"]}) == cfg
    assert EnvConfig.from_kwargs(adaptive_start=True).layers == EpisodeLayers(adaptive_start=True)
    assert EnvConfig().layers == EpisodeLayers() and not EpisodeLayers().adaptive_start


def test_the_rule_catches_a_second_declaration(tmp_path: Path) -> None:
    (tmp_path / "envs").mkdir()
    (tmp_path / "envs" / "dynamics.py").write_text("class Dynamics:\n    kappa: float = 1.0\n")
    (tmp_path / "evaluation.py").write_text("class Options:\n    kappa: float | None = None\n")
    assert ("evaluation.py", "Options", "kappa") in _declarations(tmp_path)


def test_every_command_takes_the_flat_flags_and_old_runs_read_back() -> None:
    from bcg.agents.train_config import config_from_dict, config_to_dict, parse_train_args
    from bcg.cli import COMMANDS
    from bcg.parsing import parse_command

    cfg = parse_train_args(["--kappa", "150", "--substeps", "2", "--sim-dt", "0.01", "--contact-beta", "0.3"])
    assert cfg.env_config().dynamics == Dynamics(kappa=150.0, substeps=2, sim_dt=0.01, contact_beta=0.3)
    assert config_from_dict(config_to_dict(cfg)) == cfg
    # a run written when the dynamics were flat options of its config
    flat = {k: v for k, v in config_to_dict(cfg).items() if k != "dynamics"}
    assert config_from_dict({**flat, "kappa": 150.0, "substeps": 2, "sim_dt": 0.01, "contact_beta": 0.3}) == cfg
    evaluate = parse_command(COMMANDS["evaluate"], ["RUN", "--kappa", "500"], prog="bcg evaluate")
    assert evaluate.protocol.dynamics == Dynamics(kappa=500.0)
    compare = parse_command(COMMANDS["compare"], ["--kappa", "50"], prog="bcg compare")
    assert {job.dynamics for job in compare.jobs()} == {Dynamics(kappa=50.0)}


def _setattr_outside_validation(root: Path) -> list[tuple[str, str, int]]:
    """(file, function, line) of every ``object.__setattr__`` call that is not inside a ``__post_init__`` (frozen
    dataclasses are changed only while their values are checked and normalised)."""
    out = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        inside: set[int] = set()
        for fn in ast.walk(tree):
            if isinstance(fn, ast.FunctionDef) and fn.name == "__post_init__":
                inside.update(id(n) for n in ast.walk(fn))
        for fn in ast.walk(tree):
            if not isinstance(fn, ast.FunctionDef):
                continue
            for n in ast.walk(fn):
                if (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "__setattr__"
                        and isinstance(n.func.value, ast.Name) and n.func.value.id == "object"
                        and id(n) not in inside):
                    out.append((path.relative_to(root).as_posix(), fn.name, n.lineno))
    return sorted(set(out))


def test_frozen_configs_change_only_while_validating(tmp_path: Path) -> None:
    assert _setattr_outside_validation(PACKAGE) == []
    (tmp_path / "m.py").write_text("class A:\n    def __post_init__(self):\n        object.__setattr__(self, 'x', 1)\n"
                                   "    def later(self):\n        object.__setattr__(self, 'x', 2)\n")
    assert _setattr_outside_validation(tmp_path) == [("m.py", "later", 5)]
