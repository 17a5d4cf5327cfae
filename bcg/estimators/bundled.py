"""``bcg``: Bundled Contact Gradients (docs/method.md §3). An environment whose contact normal force passes ``tau`` is
expanded into B perturbed branches that run for H control steps with the shared policy actions; the branch mean is
the state the environment sees (observation, reward, next action), and the nominal rollout resumes from the mean
when the bundle closes. Untriggered environments run one branch. Triggered environments are gathered into one batch
with the untriggered ones, so every control step is one call of the inner transition function.

How a bundle lives across control steps: the estimator keeps, per open bundle, every branch's offset from the mean
it returned (``x_i - mean``, with its autograd graph). At the next step the branches restart from the incoming state
plus these offsets, which is each branch's own state again, with its own sensitivity Z_i (docs/method.md §3.6); a push
applied by the environment reaches every branch. A bundle closes after H steps, when its environment's incoming
state is not the mean this estimator returned (a reset, a restored state), or when no branch is usable. When the
incoming state is a detached copy of that mean (``env.detach()`` at a window boundary) the bundle continues with
detached offsets, so no gradient crosses the boundary.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch

import bcg.sim
from bcg.estimators.base import Estimator, EstimatorStats, RowGradMask
from bcg.estimators.grs import average_branches, cartesian_law_offsets, joint_gaussian_offsets
from bcg.estimators.registry import register
from bcg.sim import ContactReport, Physics

__all__ = ["BCG"]


class _Memory:
    """Per-environment bookkeeping of :class:`BCG` (rows indexed by env id)."""

    def __init__(self, size: int, nq: int, nf: int, device: torch.device) -> None:
        self.left = torch.zeros(size, dtype=torch.long, device=device)
        self.peak = torch.full((size, nf), float("nan"), device=device)  # per foot, the last step's trigger force
        self.last_q = torch.full((size, nq), float("nan"), device=device)
        self.open_ids = torch.zeros(0, dtype=torch.long, device=device)
        self.off_q: torch.Tensor | None = None  # [k, B, nq] offsets of the open bundles (graph kept)
        self.off_qd: torch.Tensor | None = None
        self.last_q_out: torch.Tensor | None = None

    def grow(self, size: int) -> None:
        old = self.left.shape[0]
        if size <= old:
            return
        dev, nq = self.left.device, self.last_q.shape[1]
        self.left = torch.cat([self.left, torch.zeros(size - old, dtype=torch.long, device=dev)])
        self.peak = torch.cat([self.peak, torch.full((size - old, self.peak.shape[1]), float("nan"), device=dev)])
        self.last_q = torch.cat([self.last_q, torch.full((size - old, nq), float("nan"), device=dev)])


@register("bcg")
@dataclass(frozen=True)
class BCG(Estimator):
    """Bundled Contact Gradients: B perturbed branches for H steps where a contact's normal force exceeds tau."""

    branches: int = 10
    """B, perturbed branches of a bundle."""
    horizon: int = 2
    """H, control steps a bundle lasts (shared actions; the nominal rollout resumes from the mean)."""
    tau: float = 400.0
    """Trigger threshold on the contact normal force over the control step [N] (the substeps' peak force)."""
    trigger: Literal["force", "always", "never"] = "force"
    """``force`` (bundle where the force exceeds tau), ``always`` (every environment whenever no bundle is open) or
    ``never`` (plain backprop through time, bit-identical to ``bptt``)."""
    aggregation: Literal["per_point", "per_foot"] = "per_point"
    """Trigger quantity: the largest force of one contact sphere, or of the sum over each foot's spheres."""
    timing: Literal["lagged", "rollback"] = "lagged"
    """``lagged``: the trigger of step t uses the forces of step t-1 (no re-simulation); ``rollback``: simulate the
    nominal step and, where it triggers, discard it and simulate the bundle from the same start."""
    law: Literal["joint_gaussian", "cartesian"] = "cartesian"
    """Perturbation law at the bundle start: ``joint_gaussian`` (independent N(0, sigma_q^2), N(0, sigma_qd^2) on every
    hinge angle and rate) or ``cartesian`` (end-point offsets N(0, sigma_p^2), N(0, sigma_v^2) of the chains of the
    feet whose force passed tau, all feet with ``trigger="always"``, through the damped Jacobian pseudoinverse,
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
        for name in ("branches", "horizon"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name} must be an int >= 1, got {v!r}")
        for name in ("sigma_q", "sigma_qd", "tau", "sigma_p", "sigma_v", "damping", "max_joint_offset",
                     "max_joint_rate_offset"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not (v >= 0.0) or v == float("inf"):
                raise ValueError(f"{name} must be a finite number >= 0, got {v!r}")
        choices = {"trigger": ("force", "always", "never"), "aggregation": ("per_point", "per_foot"),
                   "timing": ("lagged", "rollback"), "law": ("joint_gaussian", "cartesian")}
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}")
        if self.antithetic and self.branches % 2:
            raise ValueError(f"antithetic pairs need an even number of branches, got {self.branches}")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or self.seed < 0:
            raise ValueError(f"seed must be an int >= 0, got {self.seed!r}")
        self._rt.memory = None

    def reset(self, seed: int | None = None) -> None:
        """Restart the random draws, clear the counters and close every open bundle."""
        super().reset(seed)
        self._rt.memory = None

    def close_bundles(self, env_ids: torch.Tensor | None = None) -> None:
        """Close the open bundles of ``env_ids`` (all when None) and forget their trigger forces, as a reset does:
        their next step runs from the incoming state, without the branches' offsets, and the lagged trigger does not
        fire on forces of the closed bundle."""
        mem = self._rt.memory
        if mem is None:
            return
        if env_ids is None:
            self._rt.memory = None
            return
        ids = torch.as_tensor(env_ids, dtype=torch.long, device=mem.left.device).flatten()
        ids = ids[ids < mem.left.shape[0]]
        mem.left[ids] = 0
        mem.peak[ids] = float("nan")
        mem.last_q[ids] = float("nan")
        keep = ~torch.isin(mem.open_ids, ids)
        mem.open_ids = mem.open_ids[keep]
        if mem.off_q is not None:
            mem.off_q, mem.off_qd = mem.off_q[keep], mem.off_qd[keep]

    # ---------------------------------------------------------------------------------------- checkpoints

    def state_dict(self) -> dict[str, Any]:
        """:meth:`Estimator.state_dict` plus ``"memory"``: None, or the per-environment bookkeeping as detached
        clones: ``left`` [E] long (control steps an open bundle still runs), ``peak`` [E, nf] (the last step's
        trigger force per foot, for the lagged trigger), ``last_q`` [E, nq] (the state the estimator returned, which
        tells a continuing bundle from a reset), ``open_ids`` [k] long and the open bundles' branch offsets from their
        mean ``off_q`` [k, B, nq], ``off_qd`` [k, B, nv]."""
        out = super().state_dict()
        mem = self._rt.memory
        out["memory"] = None if mem is None else {
            name: (None if getattr(mem, name) is None else getattr(mem, name).detach().clone())
            for name in ("left", "peak", "last_q", "open_ids", "off_q", "off_qd")}
        return out

    def load_state_dict(self, state: dict[str, Any], *, strict: bool = True) -> None:
        """:meth:`Estimator.load_state_dict` plus the open bundles and trigger memory (continued with detached
        offsets: a checkpoint carries no graph)."""
        super().load_state_dict(state, strict=strict)
        saved = state.get("memory")
        if saved is None:
            self._rt.memory = None
            return
        left = saved["left"]
        mem = _Memory(int(left.shape[0]), int(saved["last_q"].shape[1]), int(saved["peak"].shape[1]), left.device)
        for name in ("left", "peak", "last_q", "open_ids", "off_q", "off_qd"):
            t = saved[name]
            setattr(mem, name, None if t is None else t.detach().clone())
        if mem.off_q is not None and int(mem.off_q.shape[0]) != int(mem.open_ids.numel()):
            raise ValueError(f"bcg state: {int(mem.open_ids.numel())} open bundle ids but offsets of "
                             f"{int(mem.off_q.shape[0])} bundles")
        self._rt.memory = mem

    @property
    def stateless(self) -> bool:
        """True when nothing carries over between calls (H = 1 and a trigger that reads only the current step:
        ``always``, or ``force`` with ``rollback``); then rows that repeat an environment (branch batches) are
        accepted, each row on its own."""
        return self.horizon == 1 and (self.trigger == "always"
                                      or (self.trigger == "force" and self.timing == "rollback"))

    @property
    def open_bundles(self) -> torch.Tensor:
        """Env ids whose bundle is open (continues at their next step)."""
        mem = self._rt.memory
        return torch.zeros(0, dtype=torch.long) if mem is None else mem.open_ids.clone()

    # ---------------------------------------------------------------------------------------- helpers

    def foot_forces(self, model, contact: ContactReport) -> torch.Tensor:
        """[N, nf] per contact body (foot, in ``model.foot_body`` order) the force the trigger compares with tau
        (detached): the largest sphere peak force of the foot (``per_point``) or their sum (``per_foot``)."""
        f = contact.peak_force.detach()
        foot = torch.as_tensor(model.sphere_foot, dtype=torch.long, device=f.device)
        nf = len(model.foot_body)
        per = torch.zeros(f.shape[0], nf, dtype=f.dtype, device=f.device)
        if self.aggregation == "per_foot":
            return per.index_add(1, foot, f)
        return per.scatter_reduce(1, foot[None].expand(f.shape[0], -1), f, reduce="amax", include_self=False)

    def trigger_quantity(self, model, contact: ContactReport) -> torch.Tensor:
        """[N] the force the trigger compares with tau (detached): the largest of :meth:`foot_forces`."""
        f = self.foot_forces(model, contact)
        return f.amax(1) if f.shape[1] else torch.zeros(f.shape[0], dtype=f.dtype, device=f.device)

    def _memory(self, size: int, nq: int, nf: int, device: torch.device) -> _Memory:
        mem = self._rt.memory
        if mem is None or mem.left.device != device or mem.last_q.shape[1] != nq or mem.peak.shape[1] != nf:
            mem = self._rt.memory = _Memory(size, nq, nf, device)
        mem.grow(size)
        return mem

    # ---------------------------------------------------------------------------------------- transition

    def _transition(self, model, q, qd, targets, physics, *, env_ids, state):
        n, B, dev = int(q.shape[0]), self.branches, q.device
        if self.trigger == "never" or n == 0:
            q1, qd1, c = self._call_inner(model, q, qd, targets, physics, env_ids, state)
            return q1, qd1, c, EstimatorStats(calls=1, envs=n, branches_simulated=n)
        ids = torch.arange(n, device=dev) if env_ids is None else env_ids.to(device=dev, dtype=torch.long)
        nf = len(model.foot_body)
        if int(torch.unique(ids).numel()) == n:
            mem = self._memory(int(ids.max()) + 1, int(q.shape[1]), nf, dev)
            key = ids  # bookkeeping rows: the environments
        elif self.stateless:
            # rows that repeat an environment (branches of a state, candidate actions): nothing carries over between
            # calls, so a private memory of this call's rows serves and the bundles of the environments stay as they are
            mem = _Memory(n, int(q.shape[1]), nf, dev)
            key = torch.arange(n, device=dev)
        else:
            uniq, counts = torch.unique(ids, return_counts=True)
            raise ValueError(
                f"the bcg estimator got {n} rows for {int(uniq.numel())} environments (env_ids repeat, e.g. "
                f"{uniq[counts > 1][:4].tolist()}): with horizon={self.horizon}, trigger={self.trigger!r}, "
                f"timing={self.timing!r} it keeps open bundles and lagged trigger forces per environment across "
                "calls, which several rows of one environment cannot share. Expected one row per environment; for "
                "branch batches use a configuration that keeps nothing across calls (horizon=1 with "
                "trigger='always' or timing='rollback'), or the grs / bptt estimators")
        with torch.no_grad():
            continues = (mem.last_q[key] == q.detach()).all(1)  # the row is the mean this estimator returned
            steps = getattr(state, "episode_steps", None)
            if steps is not None:  # a row at the start of an episode (a reset) is never inside a bundle
                continues &= steps.to(dev) != 0
            left = torch.where(continues, mem.left[key], torch.zeros_like(ids))
            cont = left > 0
            if self.trigger == "always":
                feet = torch.ones(n, nf, dtype=torch.bool, device=dev)
            elif self.timing == "lagged":
                feet = continues[:, None] & (mem.peak[key] > self.tau)
            else:
                feet = torch.zeros(n, nf, dtype=torch.bool, device=dev)
            trig = ~cont & feet.any(1)
        if not (self.trigger == "force" and self.timing == "rollback") and not bool((cont | trig).any()):
            return self._nominal_only(model, q, qd, targets, physics, ids, state, mem, key)
        simulated = 0
        nominal_out = None
        if self.trigger == "force" and self.timing == "rollback":
            idx_n = (~cont).nonzero().flatten()
            if idx_n.numel():
                out = self._call_inner(model, q[idx_n], qd[idx_n], targets[idx_n], _rows(physics, idx_n),
                                       ids[idx_n], None if state is None else state[idx_n])
                simulated += int(idx_n.numel())
                with torch.no_grad():
                    hit = self.foot_forces(model, out[2]) > self.tau
                feet = feet.index_put((idx_n,), hit)
                trig = trig.index_put((idx_n,), hit.any(1))
                nominal_out = (idx_n, out)

        U = (~cont & ~trig).nonzero().flatten()
        C, T = cont.nonzero().flatten(), trig.nonzero().flatten()
        K = torch.cat([C, T])
        k, u = int(K.numel()), int(U.numel())

        # offsets of the branched rows: stored ones for open bundles, fresh draws for new ones
        nq, nv = int(q.shape[1]), int(qd.shape[1])
        off_q = q.new_zeros(k, B, nq)
        off_qd = qd.new_zeros(k, B, nv)
        if C.numel():
            slot = _positions(mem.open_ids, key[C])
            keep_graph = (torch.is_grad_enabled() and state is not None and mem.last_q_out is not None
                          and state.q is mem.last_q_out)
            oq, oqd = mem.off_q[slot], mem.off_qd[slot]
            if not keep_graph:
                oq, oqd = oq.detach(), oqd.detach()
            off_q = torch.cat([oq, off_q[C.numel():]])
            off_qd = torch.cat([oqd, off_qd[C.numel():]])
        if T.numel():
            if self.law == "cartesian":  # the chains of the feet that passed tau
                chains = tuple(model.body_names[b] for b in model.foot_body)
                dq, dqd = cartesian_law_offsets(self, model, q[T], qd[T], feet[T], chains, self.generator(dev))
            else:
                dq, dqd = joint_gaussian_offsets(model, q[T], qd[T], B, self.sigma_q, self.sigma_qd,
                                                 self.antithetic, self.generator(dev))
            new_q = torch.cat([q.new_zeros(T.numel(), B, 7), dq], -1)
            new_qd = torch.cat([qd.new_zeros(T.numel(), B, 6), dqd], -1)
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
        # bcg.sim.step refuses (it raises): such a branch starts from the nominal row and is dropped from the mean
        with torch.no_grad():
            unusable = ~(torch.isfinite(qb).all(-1) & torch.isfinite(qdb).all(-1)
                         & (qdb.abs() <= float(bcg.sim.MAX_SPEED)).all(-1))
        if bool(unusable.any()):
            qb = torch.where(unusable[:, None], q[base], qb)
            qdb = torch.where(unusable[:, None], qd[base], qdb)
        holder: dict = {}
        if torch.is_grad_enabled():
            qb, qdb, tb = (RowGradMask.apply(x, holder) for x in (qb, qdb, tb))
        q1, qd1, c1 = self._call_inner(model, qb, qdb, tb, _rows(physics, base), ids[base],
                                       None if state is None else state[base])
        simulated += int(base.numel())
        bq, bqd = q1[zeros_u:], qd1[zeros_u:]
        if bool(unusable.any()):  # NaN: average_branches drops the branch (value and gradient)
            bq = torch.where(unusable[zeros_u:, None], torch.nan, bq)
            bqd = torch.where(unusable[zeros_u:, None], torch.nan, bqd)
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

        # bookkeeping: which bundles stay open, their offsets (with graph), the trigger quantity, the returned state
        with torch.no_grad():
            new_left = torch.cat([left[C], torch.full((T.numel(),), self.horizon, dtype=torch.long, device=dev)]) - 1
            alive = keep.any(1)
            stay = (new_left > 0) & alive
            mem.left[key] = 0
            mem.left[key[K]] = torch.where(stay, new_left, torch.zeros_like(new_left))
            mem.peak[key] = self.foot_forces(model, contact)
            mem.last_q[key] = q_out.detach()
        old = ~torch.isin(mem.open_ids, key)
        s_idx = stay.nonzero().flatten()
        new_off_q = bq.reshape(k, B, nq)[s_idx] - mq[s_idx, None]
        new_off_qd = bqd.reshape(k, B, nv)[s_idx] - mqd[s_idx, None]
        if mem.off_q is not None and bool(old.any()):
            new_off_q = torch.cat([mem.off_q[old], new_off_q])
            new_off_qd = torch.cat([mem.off_qd[old], new_off_qd])
        mem.open_ids = torch.cat([mem.open_ids[old], key[K][s_idx]])
        mem.off_q, mem.off_qd = new_off_q, new_off_qd
        mem.last_q_out = q_out
        stats = EstimatorStats(calls=1, envs=n, envs_triggered=int(T.numel()), branches_simulated=simulated,
                               nonfinite_dropped=int((~keep).sum()), envs_all_nonfinite=int((~alive).sum()))
        return q_out, qd_out, contact, stats

    def _nominal_only(self, model, q, qd, targets, physics, ids, state, mem: _Memory, key: torch.Tensor):
        """A step in which no bundle is open or starts: one plain inner call, and the bookkeeping the general path
        would do with no branched rows (the same outputs and gradients, without the gathers and concatenations)."""
        q_out, qd_out, contact = self._call_inner(model, q, qd, targets, physics, ids, state)
        with torch.no_grad():
            mem.left[key] = 0
            mem.peak[key] = self.foot_forces(model, contact)
            mem.last_q[key] = q_out.detach()
        if mem.open_ids.numel():  # bundles of environments outside this call stay open
            old = ~torch.isin(mem.open_ids, key)
            if not bool(old.all()):
                mem.open_ids = mem.open_ids[old]
                mem.off_q, mem.off_qd = mem.off_q[old], mem.off_qd[old]
        mem.last_q_out = q_out
        n = int(q.shape[0])
        return q_out, qd_out, contact, EstimatorStats(calls=1, envs=n, branches_simulated=n)


def _rows(physics: Physics | None, idx: torch.Tensor) -> Physics | None:
    return None if physics is None else Physics(*(t[idx] for t in physics))


def _positions(haystack: torch.Tensor, needles: torch.Tensor) -> torch.Tensor:
    """Index in ``haystack`` (distinct values) of every element of ``needles`` (all present)."""
    eq = haystack[None, :] == needles[:, None]
    return eq.to(torch.int8).argmax(1)
