"""Gradient estimators: how one control step of a batched environment becomes a differentiable transition.

``ESTIMATORS`` maps names to estimator classes (frozen dataclasses of hyperparameters); ``make(name, **params)``
builds one, ``make_spec("name:key=value,...")`` from the spec syntax of every command; ``register`` and the
``bcg.estimators`` entry-point group let other packages add their own. An estimator is used as the env's transition
function (``est.attach(env)`` or ``env.transition_fn = est``) and reports per call how many environments it
branched, how many branches it simulated and how many non-finite ones it dropped (``est.last_stats``). Built in:
``bptt`` (plain autograd, one branch), ``grs`` (global randomized smoothing) and ``bcg`` (Bundled Contact
Gradients). See ``docs/estimators.md``.
"""

from __future__ import annotations

from bcg.estimators.base import Estimator, EstimatorStats
from bcg.estimators.registry import ENTRY_POINT_GROUP, ESTIMATORS, describe, make, make_spec, parse_spec, register

__all__ = ["BCG", "BPTT", "ENTRY_POINT_GROUP", "ESTIMATORS", "Estimator", "EstimatorStats", "GRS", "describe", "make",
           "make_spec", "parse_spec", "register"]


def __getattr__(name: str):
    if name == "BPTT":
        from bcg.estimators.bptt import BPTT

        return BPTT
    if name == "BCG":
        from bcg.estimators.bundled import BCG

        return BCG
    if name == "GRS":
        from bcg.estimators.grs import GRS

        return GRS
    raise AttributeError(f"module 'bcg.estimators' has no attribute {name!r}")
