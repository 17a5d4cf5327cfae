"""benchmarks/transfer_tables.py: a run's settings column names every option that sets it apart from the defaults, in
the flags that reproduce it."""

from __future__ import annotations

from pathlib import Path

from conftest import load_script

from bcg.agents.train_config import config_to_dict, default_config

tables = load_script(Path(__file__).resolve().parents[1] / "benchmarks" / "transfer_tables.py")


def test_default_run_has_only_its_estimator() -> None:
    assert tables.settings(config_to_dict(default_config("shac"))) == "--estimator bptt"


def test_randomisation_flags_and_friction_range_are_named_as_typed() -> None:
    cfg = default_config("shac", contact_randomization=False, torque_limit_randomization=False,
                         friction_range=(0.2, 0.8))
    assert tables.settings(config_to_dict(cfg)) == (
        "--estimator bptt --no-contact-randomization --no-torque-limit-randomization --friction-range 0.2 0.8")


def test_the_torque_limit_range_and_the_pd_law_are_named_as_typed() -> None:
    from bcg.envs import Dynamics

    cfg = default_config("shac", torque_limit_range=(1.0, 1.4), dynamics=Dynamics(pd_lookahead=False))
    assert tables.settings(config_to_dict(cfg)) == "--estimator bptt --torque-limit-range 1.0 1.4 --pd-lookahead False"


def test_the_contact_dropout_is_named_as_typed() -> None:
    from bcg.envs import Dynamics

    cfg = default_config("shac", contact_dropout_range=(0.0, 1.0), dynamics=Dynamics(contact_dropout=0.5))
    assert tables.settings(config_to_dict(cfg)) == (
        "--estimator bptt --contact-dropout-range 0.0 1.0 --contact-dropout 0.5")


def test_a_run_written_before_the_randomisations_were_on_by_default_names_them_off() -> None:
    d = config_to_dict(default_config("shac"))
    for key in ("contact_randomization", "torque_limit_randomization"):
        del d[key]
    assert tables.settings(d) == "--estimator bptt --no-contact-randomization --no-torque-limit-randomization"
