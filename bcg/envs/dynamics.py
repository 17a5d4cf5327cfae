"""The simulator's dynamics options of a run or an environment, declared once: :class:`Dynamics`. Imports nothing heavy,
so that command-line parsers can embed it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from bcg.envs.checks import check_count, is_real

__all__ = ["DYNAMICS_FIELDS", "DYNAMICS_PARAMS", "Dynamics"]

DYNAMICS_PARAMS: dict[str, tuple[str, type]] = {
    "kappa": ("kappa", float), "substeps": ("substeps", int), "sim_dt": ("dt", float),
    "soft_contact_timeconst": ("soft_timeconst", float), "contact_beta": ("beta", float),
    "pd_lookahead": ("pd_lookahead", bool), "contact_dropout": ("dropout", float)}
"""Each field of :class:`Dynamics`: its :func:`bcg.sim.load_model` parameter and type."""

DYNAMICS_FIELDS: tuple[str, ...] = tuple(DYNAMICS_PARAMS)
"""The fields of :class:`Dynamics`. Policy files record them (flat, in ``meta["env"]``), and a replay of a policy uses
them."""


@dataclass(frozen=True)
class Dynamics:
    """The simulator's dynamics options of a run or an environment: the one place they are declared. Each None keeps
    the simulator's default (:class:`bcg.sim.ContactParams`); :meth:`sim_params` maps the set ones onto
    :func:`bcg.sim.load_model`. ``EnvConfig.dynamics``, ``bcg train``, ``bcg compare`` and the replay options of
    ``bcg evaluate`` hold one (on their command lines as ``--kappa``, ``--substeps``, ...)."""

    kappa: float | None = None
    """Contact stiffness of the simulator [1/m] (None: the simulator's default, 300)."""
    soft_contact_timeconst: float | None = None
    """Time constant [s] of the soft normal contact (MuJoCo's solref[0]; 0.02 is MuJoCo's default): impacts are
    braked over several substeps as in MuJoCo; None: stopped within one (bcg.sim.ContactParams.soft_timeconst)."""
    contact_beta: float | None = None
    """Baumgarte factor of the contacts in [0, 1] (None: the simulator's 0.5); lower is a softer ground."""
    substeps: int | None = None
    """Physics substeps per control step (None: 4)."""
    sim_dt: float | None = None
    """Physics substep [s] (None: 0.005); the control period is substeps * sim_dt."""
    pd_lookahead: bool | None = None
    """Whether the PD actuators read the position predicted at the end of the substep (True, the simulator's default:
    an extra damping h kp) or its start, as MuJoCo's position actuators do (False) (bcg.sim.ContactParams)."""

    contact_dropout: float | None = None
    """Probability in [0, 1] that a foot sphere near the ground (less than 2 mm deep) has no contact in a substep, as
    MuJoCo's contacts, found once per 5 ms step, sometimes miss a toe (None: 0, never; bcg.sim.ContactParams.dropout,
    docs/simulator.md)."""

    def __post_init__(self) -> None:
        if self.contact_dropout is not None and not (is_real(self.contact_dropout) and 0 <= self.contact_dropout <= 1):
            raise ValueError(f"contact_dropout must be a number in [0, 1] or None, got {self.contact_dropout!r}")
        if self.substeps is not None:
            object.__setattr__(self, "substeps", check_count("substeps", self.substeps))
        if self.pd_lookahead is not None and not isinstance(self.pd_lookahead, bool):
            raise ValueError(f"pd_lookahead must be True, False or None, got {self.pd_lookahead!r}")
        if self.contact_beta is not None and not (is_real(self.contact_beta) and 0 <= self.contact_beta <= 1):
            raise ValueError(f"contact_beta must be a number in [0, 1] or None, got {self.contact_beta!r}")
        for name, unit in (("kappa", "1/m"), ("sim_dt", "s"), ("soft_contact_timeconst", "s")):
            v = getattr(self, name)
            if v is not None and not (is_real(v) and v > 0):
                raise ValueError(f"{name} must be a finite number > 0 [{unit}] or None, got {v!r}")
        if self.soft_contact_timeconst is None:
            return
        from bcg.sim import ContactParams  # here only: the simulator's package imports torch

        h = ContactParams.dt if self.sim_dt is None else float(self.sim_dt)
        if self.soft_contact_timeconst < 2 * h:
            raise ValueError(f"soft_contact_timeconst must be at least twice the physics substep ({2 * h:g} s), got "
                             f"{self.soft_contact_timeconst!r}")

    def chosen(self) -> dict[str, Any]:
        """``{field: value}`` of the fields that are set (not None)."""
        return {name: value for name, value in self.as_dict().items() if value is not None}

    def sim_params(self) -> dict[str, Any]:
        """The :func:`bcg.sim.load_model` parameters of the fields that are set (the others keep the simulator's
        defaults)."""
        return {DYNAMICS_PARAMS[name][0]: DYNAMICS_PARAMS[name][1](value) for name, value in self.chosen().items()}

    def as_dict(self) -> dict[str, Any]:
        """``{field: value}``, None where unset (the layout of a policy file's ``meta["env"]``)."""
        return {name: getattr(self, name) for name in DYNAMICS_FIELDS}

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> Dynamics:
        """The dynamics named in ``values`` (a policy file's ``meta["env"]``, a run's flat config, keyword options):
        its :data:`DYNAMICS_FIELDS` entries, cast, None or absent meaning the default; other keys are ignored."""
        return cls(**{name: cast(values[name]) for name, (_, cast) in DYNAMICS_PARAMS.items()
                      if values.get(name) is not None})
