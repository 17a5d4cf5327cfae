"""The paper's studies as ``bcg study`` subcommands, one module each:

* ``bcg study variance`` (Q2): :mod:`bcg.evaluation.study_variance`;
* ``bcg study stiffness`` (Q1): :mod:`bcg.evaluation.study_stiffness`;
* ``bcg study methods`` (Q3 and Q4, SHAC+BCG, SHAC and PPO on finished runs): :mod:`bcg.evaluation.study_methods`;
* ``bcg study sensitivity`` (branch against bundle at a landing): :mod:`bcg.evaluation.study_sensitivity`.
"""

from __future__ import annotations

from bcg.evaluation.study_methods import StudyMethods
from bcg.evaluation.study_sensitivity import StudySensitivity, branch_sensitivities, sensitivity_plot
from bcg.evaluation.study_stiffness import PAPER_STIFFNESS, StudyStiffness, stiffness_rows
from bcg.evaluation.study_variance import (
    CheckpointPolicy,
    StudyVariance,
    check_estimator_specs,
    run_checkpoints,
    variance_plot,
)

__all__ = ["PAPER_STIFFNESS", "STUDY_COMMANDS", "CheckpointPolicy", "StudyMethods", "StudySensitivity",
           "StudyStiffness", "StudyVariance", "branch_sensitivities", "check_estimator_specs", "run_checkpoints",
           "sensitivity_plot", "stiffness_rows", "variance_plot"]

STUDY_COMMANDS: dict[str, type] = {"variance": StudyVariance, "stiffness": StudyStiffness,
                                   "methods": StudyMethods, "sensitivity": StudySensitivity}
"""``bcg study ...`` subcommands."""
