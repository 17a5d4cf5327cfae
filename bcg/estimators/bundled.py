"""``bcg``: Bundled Contact Gradients (docs/method.md §3). An environment whose contact normal force passes ``tau`` (or
whose contact switched, with ``trigger="activation"``: :mod:`bcg.estimators.contact_trigger`) is expanded into B
perturbed branches (B set per bundle from the trigger quantity with ``size="sensitivity"``) that run for H control steps
with the shared policy actions; the branch mean is the state the environment sees (observation, reward, next action),
and the nominal rollout resumes from the mean when the bundle closes. Untriggered environments run one branch. Triggered
environments are gathered into one batch with the untriggered ones, so every control step is one call of the inner
transition function.

How a bundle lives across control steps: a step returns, in the rows' transition memory (:data:`MEMORY_KEYS`), every
open bundle's branch offsets from the mean it returned (``x_i - mean``, with their autograd graph). At the next step
the branches restart from the incoming state plus these offsets, which is each branch's own state again, with its
own sensitivity Z_i (docs/method.md §3.6); a push applied by the environment reaches every branch. A bundle closes
after H steps, when no branch is usable, or when the environment clears the row's memory (a reset, a replaced state).
``env.detach()`` at a window boundary detaches the memory with the state, so the bundle continues with detached
offsets and no gradient crosses the boundary. A restored state carries its rows' bundles with it. Since the memory is
per row, rows that repeat an environment (branch batches) each continue their own bundles.

Estimator states saved before the bundles moved into the environment's state hold them under ``"memory"``; they load,
but those bundles are not restored (the ones open at such a checkpoint close, so the first steps after the resume
differ from the original run's).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import torch

import bcg.sim
from bcg.estimators.base import Estimator, EstimatorStats, RowGradMask
from bcg.estimators.contact_trigger import ACTIVATION_KEY, ActivationTrigger, ForceTrigger, bundle_sizes
from bcg.estimators.grs import average_branches, cartesian_law_offsets, joint_gaussian_offsets
from bcg.estimators.registry import register
from bcg.sim import ContactReport, Physics

__all__ = ["ACTIVATION_KEY", "BCG", "MEMORY_KEYS", "open_rows"]


MEMORY_KEYS = ("bcg.left", "bcg.peak", "bcg.off_q", "bcg.off_qd")
"""The per-row memory a :class:`BCG` step returns (rows of :attr:`bcg.envs.EnvState.memory`): ``bcg.left`` [N] long
(control steps the row's open bundle still runs; 0: none open), ``bcg.peak`` [N, nf] (the step's trigger quantity per
foot, read by the lagged trigger of the next step: its force [N], or its activation change with the ``activation``
trigger), ``bcg.off_q`` [N, B, nq] and ``bcg.off_qd`` [N, B, nv] (the
open bundle's branch offsets from the mean it returned, with their autograd graph; zero where none is open)."""


def open_rows(memory: dict[str, torch.Tensor] | None) -> torch.Tensor:
    """[k] long: the rows of ``memory`` (a :class:`BCG` step's) whose bundle is open (continues at their next step)."""
    if not memory or "bcg.left" not in memory:
        return torch.zeros(0, dtype=torch.long)
    return (memory["bcg.left"] > 0).nonzero().flatten()


@register("bcg")
@dataclass(frozen=True)
class BCG(Estimator):
    """Bundled Contact Gradients: B perturbed branches for H steps where a contact's normal force exceeds tau."""

    added_params: ClassVar[dict[str, Any]] = {"activation_change": 0.5, "size": "fixed", "min_branches": 4}

    branches: int = 10
    """B, perturbed branches of a bundle."""
    horizon: int = 2
    """H, control steps a bundle lasts (shared actions; the nominal rollout resumes from the mean)."""
    tau: float = 400.0
    """Trigger threshold on the contact normal force over the control step [N] (the substeps' peak force)."""
    trigger: Literal["force", "activation", "always", "never"] = "force"
    """``force`` (bundle where the force exceeds tau), ``activation`` (bundle where a contact switched: a sphere's
    activation sigmoid(kappa d) changed by more than ``activation_change`` over the step, docs/estimators.md),
    ``always`` (every environment whenever no bundle is open) or ``never`` (plain backprop through time, bit-identical
    to ``bptt``)."""
    activation_change: float = 0.5
    """``activation`` trigger: the least change of one sphere's contact activation over a control step (0-1). The
    activation's slope kappa s (1 - s) is the smoothed contact's local sensitivity to penetration; a large change
    means the step crossed that steep band (a touchdown or a lift-off). 0.5 triggers about as often as tau = 400 N
    on a trained jump policy."""
    size: Literal["fixed", "sensitivity"] = "fixed"
    """Branches of a new bundle: ``fixed`` (always ``branches``) or ``sensitivity`` (set from how far the trigger
    quantity x passed its threshold: ceil(min_branches (x / threshold)^2), clamped to [min_branches, branches]; the
    mean's sampling variance falls as 1/B while the branches' spread grows with the contact's sensitivity, so B
    follows its square). Branches past a bundle's size are not simulated."""
    min_branches: int = 4
    """``size="sensitivity"``: the branches of a bundle whose trigger quantity just passes its threshold."""
    aggregation: Literal["per_point", "per_foot"] = "per_point"
    """Trigger quantity: the largest force of one contact sphere, or of the sum over each foot's spheres."""
    timing: Literal["lagged", "rollback"] = "lagged"
    """``lagged``: the trigger of step t uses the forces of step t-1 (no re-simulation); ``rollback``: simulate the
    nominal step and, where it triggers, discard it and simulate the bundle from the same start."""
    law: Literal["joint_gaussian", "cartesian"] = "cartesian"
    """Perturbation law at the bundle start: ``joint_gaussian`` (independent N(0, sigma_q^2), N(0, sigma_qd^2) on every
    hinge angle and rate) or ``cartesian`` (end-point offsets N(0, sigma_p^2), N(0, sigma_v^2) of the chains of the
    feet whose force passed tau (whose activation switched, with ``trigger="activation"``), all feet with
    ``trigger="always"``, through the damped Jacobian pseudoinverse,
    :mod:`bcg.estimators.perturb`); clamped to the joint limits. Default: the Cartesian law of docs/method.md §3.4."""
    sigma_p: float = 0.01
    """Cartesian law: standard deviation of the end-link position offset [m]."""
    sigma_v: float = 0.02
    """Cartesian law: standard deviation of the end-link velocity offset [m/s]."""
    damping: float = 1e-4
    """Cartesian law: lambda of the damped pseudoinverse J^T (J J^T + lambda I)^-1 [m^2]."""
    max_joint_offset: float = 0.1
    """Cartesian law: cap of every joint-angle offset [rad]."""
    max_joint_rate_offset: float = 0.2
    """Cartesian law: cap of every joint-rate offset [rad/s]."""
    sigma_q: float = 0.02
    """Standard deviation of the joint-angle perturbation [rad]."""
    sigma_qd: float = 0.05
    """Standard deviation of the joint-rate perturbation [rad/s]."""
    antithetic: bool = False
    """Draw perturbations in pairs (d, -d) (needs an even ``branches``)."""
    seed: int = 0
    """Seed of the estimator's own generator (every perturbation is drawn from it)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("branches", "horizon", "min_branches"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name} must be an int >= 1, got {v!r}")
        for name in ("sigma_q", "sigma_qd", "tau", "activation_change", "sigma_p", "sigma_v", "damping",
                     "max_joint_offset", "max_joint_rate_offset"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not (v >= 0.0) or v == float("inf"):
                raise ValueError(f"{name} must be a finite number >= 0, got {v!r}")
        if self.activation_change > 1.0:
            raise ValueError(f"activation_change must be in [0, 1] (an activation is a sigmoid), got "
                             f"{self.activation_change!r}")
        if self.size == "sensitivity" and self.trigger not in ("force", "activation"):
            raise ValueError(f"size='sensitivity' sets a bundle's branches from the force or activation trigger's "
                             f"quantity; trigger={self.trigger!r} has none")
        if self.size == "sensitivity" and self.min_branches > self.branches:
            raise ValueError(f"min_branches ({self.min_branches}) must be <= branches ({self.branches})")
        choices = {"size": ("fixed", "sensitivity"), "trigger": ("force", "activation", "always", "never"),
                   "aggregation": ("per_point", "per_foot"), "timing": ("lagged", "rollback"),
                   "law": ("joint_gaussian", "cartesian")}
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}")
        if self.antithetic and self.branches % 2:
            raise ValueError(f"antithetic pairs need an even number of branches, got {self.branches}")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or self.seed < 0:
            raise ValueError(f"seed must be an int >= 0, got {self.seed!r}")

    # ---------------------------------------------------------------------------------------- helpers

    @property
    def contact_trigger(self) -> ForceTrigger | ActivationTrigger:
        """The rule that opens bundles (:mod:`bcg.estimators.contact_trigger`): the force or the activation change."""
        if self.trigger == "activation":
            return ActivationTrigger(self.activation_change)
        return ForceTrigger(self.tau, self.aggregation)

    def foot_forces(self, model, contact: ContactReport) -> torch.Tensor:
        """[N, nf] per contact body (foot, in ``model.foot_body`` order) the force the force trigger compares with tau
        (detached): the largest sphere peak force of the foot (``per_point``) or their sum (``per_foot``)."""
        return ForceTrigger(self.tau, self.aggregation).foot_quantity(model, contact)

    def trigger_quantity(self, model, contact: ContactReport) -> torch.Tensor:
        """[N] the force the trigger compares with tau (detached): the largest of :meth:`foot_forces`."""
        f = self.foot_forces(model, contact)
        return f.amax(1) if f.shape[1] else torch.zeros(f.shape[0], dtype=f.dtype, device=f.device)

    def bundle_sizes(self, quantity: torch.Tensor) -> torch.Tensor:
        """[t] long: the branches of t new bundles whose trigger quantity (the largest over their triggered feet) is
        ``quantity`` [t]: ``branches`` with ``size="fixed"``, else :func:`~bcg.estimators.contact_trigger.bundle_sizes`
        from the rule's threshold."""
        if self.size == "fixed":
            return torch.full(quantity.shape, self.branches, dtype=torch.long, device=quantity.device)
        return bundle_sizes(quantity, self.contact_trigger.threshold, self.min_branches, self.branches,
                            self.antithetic)

    @staticmethod
    def _memory_out(rule: ForceTrigger | ActivationTrigger, model, contact: ContactReport,
                    memory: dict[str, torch.Tensor] | None, left: torch.Tensor, off_q: torch.Tensor,
                    off_qd: torch.Tensor) -> dict[str, torch.Tensor]:
        """The rows' memory after a step: :data:`MEMORY_KEYS` (the step's per-foot quantity of the trigger ``rule``,
        read against the incoming ``memory``) and what the rule carries."""
        out = dict(zip(MEMORY_KEYS, (left, rule.foot_quantity(model, contact, memory), off_q, off_qd), strict=True))
        return {**out, **rule.memory(model, contact)}

    def _read_memory(self, memory: dict[str, torch.Tensor] | None, n: int, nq: int, nv: int, nf: int,
                     like: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """``(left [n], peak [n, nf], off_q [n, B, nq], off_qd [n, B, nv])`` of the incoming rows (zeros: nothing
        open, no force recorded)."""
        B = self.branches
        if not memory or "bcg.left" not in memory:
            return (torch.zeros(n, dtype=torch.long, device=like.device), like.new_zeros(n, nf),
                    like.new_zeros(n, B, nq), like.new_zeros(n, B, nv))
        left, peak, off_q, off_qd = (memory[k] for k in MEMORY_KEYS)
        if tuple(off_q.shape) != (n, B, nq) or tuple(peak.shape) != (n, nf):
            raise ValueError(f"bcg: the rows' memory holds bundles of {int(off_q.shape[1])} branches for "
                             f"{int(off_q.shape[0])} rows, this step has {n} rows and {B} branches (was the state made "
                             "with another bcg configuration?)")
        return left, peak, off_q, off_qd

    # ---------------------------------------------------------------------------------------- transition

    def _transition(self, model, q, qd, targets, physics, *, env_ids, memory):
        n, B, dev = int(q.shape[0]), self.branches, q.device
        if self.trigger == "never" or n == 0:
            q1, qd1, c = self._call_inner(model, q, qd, targets, physics, env_ids)
            return q1, qd1, c, {}, EstimatorStats(calls=1, envs=n, branches_simulated=n)
        ids = torch.arange(n, device=dev) if env_ids is None else env_ids.to(device=dev, dtype=torch.long)
        nf, nq, nv = len(model.foot_body), int(q.shape[1]), int(qd.shape[1])
        left, peak, mem_off_q, mem_off_qd = self._read_memory(memory, n, nq, nv, nf, q)
        rule = self.contact_trigger
        with torch.no_grad():
            cont = left > 0
            if self.trigger == "always":
                feet = torch.ones(n, nf, dtype=torch.bool, device=dev)
            elif self.timing == "lagged":
                feet = peak > rule.threshold
            else:
                feet = torch.zeros(n, nf, dtype=torch.bool, device=dev)
            trig = ~cont & feet.any(1)
            quantity = peak
        rollback = self.trigger in ("force", "activation") and self.timing == "rollback"
        if not rollback and not bool((cont | trig).any()):
            return self._nominal_only(rule, model, q, qd, targets, physics, ids, memory)
        simulated = 0
        nominal_out = None
        if rollback:
            idx_n = (~cont).nonzero().flatten()
            if idx_n.numel():
                out = self._call_inner(model, q[idx_n], qd[idx_n], targets[idx_n], _rows(physics, idx_n),
                                       ids[idx_n])
                simulated += int(idx_n.numel())
                with torch.no_grad():
                    q_n = rule.foot_quantity(model, out[2], {k: t[idx_n] for k, t in (memory or {}).items()})
                    hit = q_n > rule.threshold
                    quantity = quantity.index_put((idx_n,), q_n.to(quantity.dtype))
                feet = feet.index_put((idx_n,), hit)
                trig = trig.index_put((idx_n,), hit.any(1))
                nominal_out = (idx_n, out)

        U = (~cont & ~trig).nonzero().flatten()
        C, T = cont.nonzero().flatten(), trig.nonzero().flatten()
        K = torch.cat([C, T])
        k, u = int(K.numel()), int(U.numel())

        # offsets of the branched rows: the memory's for open bundles (with the graph it carries), fresh draws for new
        off_q = q.new_zeros(k, B, nq)
        off_qd = qd.new_zeros(k, B, nv)
        if C.numel():
            off_q = torch.cat([mem_off_q[C].to(q.dtype), off_q[C.numel():]])
            off_qd = torch.cat([mem_off_qd[C].to(qd.dtype), off_qd[C.numel():]])
        if T.numel():
            if self.law == "cartesian":  # the chains of the feet that passed tau
                chains = tuple(model.body_names[b] for b in model.foot_body)
                dq, dqd = cartesian_law_offsets(self, model, q[T], qd[T], feet[T], chains, self.generator(dev))
            else:
                dq, dqd = joint_gaussian_offsets(model, q[T], qd[T], B, self.sigma_q, self.sigma_qd,
                                                 self.antithetic, self.generator(dev))
            new_q = torch.cat([q.new_zeros(T.numel(), B, 7), dq], -1)
            new_qd = torch.cat([qd.new_zeros(T.numel(), B, 6), dqd], -1)
            if self.size != "fixed":  # branches past a bundle's size: NaN offsets, never simulated (below)
                with torch.no_grad():
                    x = torch.where(feet[T], quantity[T], torch.zeros_like(quantity[T])).amax(1)
                    past = torch.arange(B, device=dev)[None] >= self.bundle_sizes(x)[:, None]
                new_q = torch.where(past[..., None], torch.nan, new_q)
                new_qd = torch.where(past[..., None], torch.nan, new_qd)
            off_q = torch.cat([off_q[:C.numel()], new_q])
            off_qd = torch.cat([off_qd[:C.numel()], new_qd])

        # one inner call: the nominal rows (unless rollback already simulated them), then k * B branch rows
        lagged_nominal = nominal_out is None
        base = torch.cat([U, K.repeat_interleave(B)]) if lagged_nominal else K.repeat_interleave(B)
        zeros_u = (u if lagged_nominal else 0)
        oq_all = torch.cat([q.new_zeros(zeros_u, nq), off_q.reshape(k * B, nq)])
        oqd_all = torch.cat([qd.new_zeros(zeros_u, nv), off_qd.reshape(k * B, nv)])
        qb, qdb, tb = q[base] + oq_all, qd[base] + oqd_all, targets[base]
        # an open bundle's stored offset added to a mean that moved can leave the simulator's speed bound, which
        # bcg.sim.step refuses (it raises), and a branch past its bundle's size has NaN offsets: such branch rows are
        # not simulated and are dropped from the mean (value and gradient)
        with torch.no_grad():
            skip = ~(torch.isfinite(qb).all(-1) & torch.isfinite(qdb).all(-1)
                     & (qdb.abs() <= float(bcg.sim.MAX_SPEED)).all(-1))
            skip[:zeros_u] = False  # the nominal rows always run (the env checked their states)
        holder: dict = {}
        if torch.is_grad_enabled():
            qb, qdb, tb = (RowGradMask.apply(x, holder) for x in (qb, qdb, tb))
        if bool(skip.any()):
            run = (~skip).nonzero().flatten()
            q1r, qd1r, c1r = self._call_inner(model, qb[run], qdb[run], tb[run], _rows(physics, base[run]),
                                              ids[base[run]])
            q1 = qb.new_full((int(base.numel()), nq), torch.nan).index_put((run,), q1r)
            qd1 = qdb.new_full((int(base.numel()), nv), torch.nan).index_put((run,), qd1r)
            c1 = ContactReport(*(t.new_zeros(int(base.numel()), *t.shape[1:]).index_put((run,), t) for t in c1r))
            simulated += int(run.numel())
        else:
            q1, qd1, c1 = self._call_inner(model, qb, qdb, tb, _rows(physics, base), ids[base])
            simulated += int(base.numel())
        bq, bqd = q1[zeros_u:], qd1[zeros_u:]  # skipped rows are NaN: average_branches drops them
        bc = ContactReport(*(t[zeros_u:] for t in c1))
        mq, mqd, mc, keep = average_branches(bq, bqd, bc, k, B)
        holder["drop"] = torch.cat([torch.zeros(zeros_u, dtype=torch.bool, device=dev), ~keep.reshape(-1)])

        if lagged_nominal:
            nq_rows, nqd_rows, nc_rows = q1[:u], qd1[:u], ContactReport(*(t[:u] for t in c1))
        else:
            idx_n, (q0n, qd0n, c0n) = nominal_out
            pick = _positions(idx_n, U)
            nq_rows, nqd_rows, nc_rows = q0n[pick], qd0n[pick], ContactReport(*(t[pick] for t in c0n))
        order = torch.cat([U, K])
        inv = torch.empty_like(order)
        inv[order] = torch.arange(n, device=dev)
        q_out = torch.cat([nq_rows, mq])[inv]
        qd_out = torch.cat([nqd_rows, mqd])[inv]
        contact = ContactReport(*(torch.cat([a, b])[inv] for a, b in zip(nc_rows, mc, strict=True)))

        # the rows' memory: which bundles stay open, their offsets (with graph), the trigger quantity
        with torch.no_grad():
            new_left = torch.cat([left[C], torch.full((T.numel(),), self.horizon, dtype=torch.long, device=dev)]) - 1
            alive = keep.any(1)
            stay = (new_left > 0) & alive
            left_out = torch.zeros_like(left).index_put((K,), torch.where(stay, new_left, torch.zeros_like(new_left)))
        s_idx = stay.nonzero().flatten()
        rows = K[s_idx]
        off_q_out = q_out.new_zeros(n, B, nq).index_put((rows,), bq.reshape(k, B, nq)[s_idx] - mq[s_idx, None])
        off_qd_out = qd_out.new_zeros(n, B, nv).index_put((rows,), bqd.reshape(k, B, nv)[s_idx] - mqd[s_idx, None])
        memory_out = self._memory_out(rule, model, contact, memory, left_out, off_q_out, off_qd_out)
        stats = EstimatorStats(calls=1, envs=n, envs_triggered=int(T.numel()), branches_simulated=simulated,
                               nonfinite_dropped=int((~keep.reshape(-1) & ~skip[zeros_u:]).sum()),
                               envs_all_nonfinite=int((~alive).sum()))
        return q_out, qd_out, contact, memory_out, stats

    def _nominal_only(self, rule, model, q, qd, targets, physics, ids, memory):
        """A step in which no bundle is open or starts: one plain inner call, and the memory the general path would
        return with no branched rows (the same outputs and gradients, without the gathers and concatenations)."""
        q_out, qd_out, contact = self._call_inner(model, q, qd, targets, physics, ids)
        n, B = int(q.shape[0]), self.branches
        memory_out = self._memory_out(rule, model, contact, memory, torch.zeros(n, dtype=torch.long, device=q.device),
                                      q_out.new_zeros(n, B, q.shape[1]), qd_out.new_zeros(n, B, qd.shape[1]))
        return q_out, qd_out, contact, memory_out, EstimatorStats(calls=1, envs=n, branches_simulated=n)


def _rows(physics: Physics | None, idx: torch.Tensor) -> Physics | None:
    return None if physics is None else Physics(*(t[idx] for t in physics))


def _positions(haystack: torch.Tensor, needles: torch.Tensor) -> torch.Tensor:
    """Index in ``haystack`` (distinct values) of every element of ``needles`` (all present)."""
    eq = haystack[None, :] == needles[:, None]
    return eq.to(torch.int8).argmax(1)
