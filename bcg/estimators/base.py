"""The estimator protocol: how a gradient estimator plugs into an environment's transition function, and the
batched branch utilities (repeat, NaN-robust quaternion-safe mean, per-row gradient mask) the estimators share.

An estimator is a frozen dataclass of its hyperparameters (one docstring per field) deriving from
:class:`Estimator`. An instance *is* a :class:`bcg.envs.TransitionFn`: ``env.transition_fn = est`` (or
``est.attach(env)``) makes every control step of the env go through it. It turns one control step of a batch of
rows into a differentiable transition by calling an *inner* transition function (default
:func:`bcg.envs.simulator_step`, i.e. :func:`bcg.sim.step`) on branches of those rows, and records per call an
:class:`EstimatorStats` (``est.last_stats``, and their sum ``est.total_stats``). Estimators never launch Warp kernels
themselves; all physics goes through the inner function. Mutable run-time data (random generators, counters) lives
beside the frozen fields, so two estimators with the same fields compare equal; what an estimator carries per row
from one step to the next (BCG's open bundles) is returned as the rows' transition memory and lives in the
environment's state. :meth:`Estimator.state_dict` and :meth:`Estimator.load_state_dict` save and restore the
run-time data (tensors and plain Python values only, so ``torch.load(..., weights_only=True)`` reads a checkpoint)
for exact restarts.
"""

from __future__ import annotations

import abc
import ast
import dataclasses
import inspect
import textwrap
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from bcg.envs.grad_mask import RowGradMask
from bcg.sim import ContactReport, Physics

__all__ = ["STATE_VERSION", "Estimator", "EstimatorStats", "RowGradMask", "branch_mean", "field_docs", "first_kept",
           "quat_mean_wxyz", "repeat_physics"]

STATE_VERSION = 1
"""Version of the layout of :meth:`Estimator.state_dict` (checked by :meth:`Estimator.load_state_dict`)."""


@dataclass(frozen=True)
class EstimatorStats:
    """What one estimator call did (or, summed, many calls)."""

    calls: int = 0
    """Transition calls."""
    envs: int = 0
    """Rows (environments) the calls received."""
    envs_triggered: int = 0
    """Rows that were expanded into perturbed branches."""
    branches_simulated: int = 0
    """Rows the inner transition function simulated (branches of triggered rows plus the untriggered rows)."""
    nonfinite_dropped: int = 0
    """Branches dropped from a mean because their next state was non-finite or too fast."""
    envs_all_nonfinite: int = 0
    """Rows all of whose branches were dropped: returned as NaN, so the environment terminates and resets them."""

    def __add__(self, other: EstimatorStats) -> EstimatorStats:
        return EstimatorStats(*(getattr(self, f.name) + getattr(other, f.name) for f in dataclasses.fields(self)))

    def as_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)


class _Runtime:
    """Mutable companion of a frozen estimator: inner transition function, generators, counters."""

    def __init__(self) -> None:
        self.inner: Any = None
        self.generators: dict[str, torch.Generator] = {}
        self.last_stats = EstimatorStats()
        self.total_stats = EstimatorStats()
        self.seed_override: int | None = None


@dataclass(frozen=True)
class Estimator(abc.ABC):
    """Base of every gradient estimator (subclasses are frozen dataclasses of hyperparameters).

    Subclasses implement :meth:`_transition`; callers use the instance as the env's transition function.
    """

    name = ""  # set by bcg.estimators.register (a class attribute, not a field)
    added_params: ClassVar[dict[str, Any]] = {}
    """Hyperparameters added after states were first saved, each with the value that does what the estimator did
    before it existed: a saved state without one of them is read as having that value (so that checkpoints of older
    runs still load, and are refused only when this estimator's value differs)."""

    _rt: _Runtime = dataclasses.field(default_factory=_Runtime, init=False, repr=False, compare=False)
    """The mutable companion (inner transition function, generators, counters): not a hyperparameter, so not in
    ``__init__``, the repr, comparisons or :meth:`spec`; a copy (``dataclasses.replace``) gets a fresh one."""

    def __post_init__(self) -> None:  # noqa: B027 -- deliberately empty: the hook subclasses extend via super()
        """Subclasses check their hyperparameters here (calling ``super().__post_init__()`` first)."""

    # ---------------------------------------------------------------------------------------- plugging in

    def __call__(self, model: Any, q: torch.Tensor, qd: torch.Tensor, targets: torch.Tensor,
                 physics: Physics | None = None, *, env_ids: torch.Tensor | None = None,
                 memory: dict[str, torch.Tensor] | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor, ContactReport, dict[str, torch.Tensor]]:
        """One control step of ``q.shape[0]`` rows (the :class:`bcg.envs.TransitionFn` signature): ``(q_next,
        qd_next, contact, memory_next)``. ``memory``: what the previous step returned for these rows (None or {}:
        nothing carried over); pass ``memory_next`` back to continue, e.g. an open bundle."""
        q1, qd1, contact, mem, stats = self._transition(model, q, qd, targets, physics, env_ids=env_ids,
                                                        memory=memory)
        rt = self._rt
        rt.last_stats = stats
        rt.total_stats = rt.total_stats + stats
        return q1, qd1, contact, mem

    @abc.abstractmethod
    def _transition(self, model: Any, q: torch.Tensor, qd: torch.Tensor, targets: torch.Tensor,
                    physics: Physics | None, *, env_ids: torch.Tensor | None,
                    memory: dict[str, torch.Tensor] | None
                    ) -> tuple[torch.Tensor, torch.Tensor, ContactReport, dict[str, torch.Tensor], EstimatorStats]:
        """``(q_next, qd_next, contact, memory_next, stats)`` of one control step (differentiable as torch's grad
        mode says); ``memory_next`` holds the rows' state the estimator needs at their next step ({}: none)."""

    def attach(self, env: Any) -> Any:
        """Make ``env`` (a vector env with a ``transition_fn`` attribute) step through this estimator; returns env."""
        if not hasattr(env, "transition_fn"):
            raise TypeError(f"{type(env).__name__} has no transition_fn to replace (expected a bcg vector env)")
        env.transition_fn = self
        return env

    @property
    def inner(self) -> Any:
        """The transition function that simulates the branches (default :func:`bcg.envs.simulator_step`)."""
        if self._rt.inner is None:
            from bcg.envs.transition import simulator_step

            return simulator_step
        return self._rt.inner

    def set_inner(self, fn: Any) -> Estimator:
        """Simulate branches with ``fn`` (a :class:`bcg.envs.TransitionFn`; None restores the default); returns self."""
        if fn is not None and not callable(fn):
            raise TypeError(f"inner transition function must be callable, got {type(fn).__name__}")
        self._rt.inner = fn
        return self

    def _call_inner(self, model: Any, q: torch.Tensor, qd: torch.Tensor, targets: torch.Tensor,
                    physics: Physics | None, env_ids: torch.Tensor | None
                    ) -> tuple[torch.Tensor, torch.Tensor, ContactReport]:
        """The inner function on rows that carry no memory of their own (branches, a fresh step): ``(q_next, qd_next,
        contact)``."""
        return self.inner(model, q, qd, targets, physics, env_ids=env_ids, memory=None)[:3]

    # ---------------------------------------------------------------------------------------- randomness, stats

    def generator(self, device: torch.device | str) -> torch.Generator:
        """The estimator's dedicated generator on ``device`` (seeded from the ``seed`` field, or :meth:`reset`'s)."""
        device = torch.device(device)
        key = str(device)
        gens = self._rt.generators
        if key not in gens:
            seed = self._rt.seed_override if self._rt.seed_override is not None else int(getattr(self, "seed", 0))
            gens[key] = torch.Generator(device=device).manual_seed(seed)
        return gens[key]

    def reset(self, seed: int | None = None) -> None:
        """Restart the random draws (from ``seed``, default the ``seed`` field) and clear the counters."""
        rt = self._rt
        rt.seed_override = seed
        rt.generators.clear()
        rt.last_stats = EstimatorStats()
        rt.total_stats = EstimatorStats()

    # ---------------------------------------------------------------------------------------- checkpoints

    def params(self) -> dict[str, Any]:
        """The hyperparameters (every init field) as ``{name: value}``."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.init}

    def state_dict(self) -> dict[str, Any]:
        """Every run-time datum of the estimator, for an exact restart: a dict of tensors (cloned, detached, on the
        device they live on) and plain Python values, readable by ``torch.load(..., weights_only=True)``.

        Holds the layout version, the registered name and the hyperparameters (checked on load), the seed override of
        :meth:`reset`, the state of the dedicated generator of every device used so far (``{"cpu": ByteTensor, ...}``)
        and the statistics (``last_stats``, ``total_stats`` as dicts of ints). Subclasses that carry more (open
        bundles, trigger memory) extend the dict in an override that calls this one. The inner transition function
        and derived caches are not part of it (they are code, or recomputed).
        """
        rt = self._rt
        return {
            "version": STATE_VERSION,
            "name": type(self).name or type(self).__qualname__,
            "params": self.params(),
            "seed_override": rt.seed_override,
            "generators": {key: g.get_state().clone() for key, g in rt.generators.items()},
            "last_stats": rt.last_stats.as_dict(),
            "total_stats": rt.total_stats.as_dict(),
        }

    def load_state_dict(self, state: dict[str, Any], *, strict: bool = True) -> None:
        """Restore what :meth:`state_dict` saved, so the estimator continues bit for bit (the same draws, the same
        counters, the same open bundles). Saved graphs are not restored: an open bundle continues with detached
        offsets, as across ``env.detach()``.

        Raises ValueError when ``state`` is not such a dict, when its layout version differs, or (``strict``, the
        default) when it was saved by another estimator or with other hyperparameters.
        """
        if not isinstance(state, dict) or "version" not in state or "generators" not in state:
            raise ValueError("load_state_dict expects a dict made by Estimator.state_dict() (keys 'version', "
                             f"'generators', ...), got {type(state).__name__}"
                             + (f" with keys {sorted(state)}" if isinstance(state, dict) else ""))
        if state["version"] != STATE_VERSION:
            raise ValueError(f"estimator state layout version {state['version']!r} is not {STATE_VERSION} (this "
                             "version of bcg)")
        if strict:
            mine = type(self).name or type(self).__qualname__
            if state.get("name") != mine:
                raise ValueError(f"the state was saved by estimator {state.get('name')!r}, this one is {mine!r} "
                                 "(pass strict=False to load it anyway)")
            saved, own = {**type(self).added_params, **state.get("params", {})}, self.params()
            diff = sorted(k for k in set(saved) | set(own) if saved.get(k, "<missing>") != own.get(k, "<missing>"))
            if diff:
                raise ValueError("the state was saved with other hyperparameters: "
                                 + ", ".join(f"{k}={saved.get(k, '<missing>')!r} (here {own.get(k, '<missing>')!r})"
                                             for k in diff) + " (pass strict=False to load it anyway)")
        rt = self._rt
        rt.seed_override = state.get("seed_override")
        rt.generators = {}
        for key, gstate in state["generators"].items():
            g = torch.Generator(device=torch.device(key))
            g.set_state(gstate.detach().to("cpu", torch.uint8).clone())
            rt.generators[key] = g
        rt.last_stats = EstimatorStats(**state.get("last_stats", {}))
        rt.total_stats = EstimatorStats(**state.get("total_stats", {}))

    @property
    def last_stats(self) -> EstimatorStats:
        """Statistics of the most recent call."""
        return self._rt.last_stats

    @property
    def total_stats(self) -> EstimatorStats:
        """Statistics summed over all calls since construction or :meth:`reset`."""
        return self._rt.total_stats


# -------------------------------------------------------------------------------------------- branch utilities


def repeat_physics(physics: Physics | None, repeats: int) -> Physics | None:
    """Every environment's Physics row repeated ``repeats`` times (rows ``[0, 0, ..., 1, 1, ...]``)."""
    if physics is None:
        return None
    return Physics(*(t.repeat_interleave(repeats, dim=0) for t in physics))


def first_kept(keep: torch.Tensor) -> torch.Tensor:
    """[n] index of the first kept branch of every row of ``keep`` [n, B] (0 where none is kept)."""
    return keep.to(torch.int8).argmax(1)


def branch_mean(x: torch.Tensor, weights: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Weighted mean over the branch dimension of ``x`` [n, B, d] with ``weights`` [n, B] (summing to 1 over the
    kept branches) and ``keep`` [n, B]; dropped branches contribute neither value nor gradient, even when
    non-finite.

    Computed as ``x_r + sum_i w_i (x_i - x_r)`` about the first kept branch r, which equals the arithmetic mean and
    returns ``x_r`` bit for bit when all kept branches are equal (zero perturbations reproduce the nominal step
    exactly instead of up to the rounding of a sum and a division).
    """
    zero = torch.zeros((), dtype=x.dtype, device=x.device)
    xz = torch.where(keep[..., None], x, zero)
    r = first_kept(keep)
    ref = xz.gather(1, r[:, None, None].expand(-1, 1, x.shape[-1]))  # [n, 1, d]
    diff = torch.where(keep[..., None], xz - ref, zero)
    return ref[:, 0] + (weights[..., None].to(x.dtype) * diff).sum(1)


def quat_mean_wxyz(quat: torch.Tensor, weights: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Sign-aligned, renormalised weighted mean [n, 4] of quaternions ``quat`` [n, B, 4] (w, x, y, z): every branch is
    flipped into the hemisphere of the first kept branch r, averaged (:func:`branch_mean`) and scaled to the norm of
    branch r (unit for unit inputs), so equal branches return branch r bit for bit."""
    r = first_kept(keep)
    with torch.no_grad():
        ref = torch.nan_to_num(quat.gather(1, r[:, None, None].expand(-1, 1, 4)))
        sign = torch.where((quat.nan_to_num() * ref).sum(-1, keepdim=True) < 0, -1.0, 1.0).to(quat.dtype)
    qs = quat * sign
    m = branch_mean(qs, weights, keep)
    ref_norm = torch.linalg.norm(qs.gather(1, r[:, None, None].expand(-1, 1, 4))[:, 0].nan_to_num(), dim=-1,
                                 keepdim=True)
    return m * (ref_norm / torch.linalg.norm(m, dim=-1, keepdim=True).clamp(min=1e-12))


def field_docs(cls: type) -> dict[str, str]:
    """Attribute docstrings (the string literal under each field) of a dataclass and its bases."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if klass is object or not dataclasses.is_dataclass(klass):
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError, SyntaxError):
            continue
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for a, b in zip(body, body[1:]):
            if (isinstance(a, ast.AnnAssign) and isinstance(a.target, ast.Name) and isinstance(b, ast.Expr)
                    and isinstance(b.value, ast.Constant) and isinstance(b.value.value, str)):
                docs[a.target.id] = " ".join(b.value.value.split())
    return docs
