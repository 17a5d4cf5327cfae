"""Finite-difference checks of every Warp kernel's adjoint, and regression tests for the Warp autodiff traps.

Each kernel is checked on its own: its float inputs (produced by a real substep with the feet in contact) are
perturbed along a random direction, and the tape's directional derivative of a random linear functional of all
its outputs is compared with central differences (docs/simulator.md's Warp autodiff rules say why this is mandatory: the
traps give finite but wrong gradients).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import warp as wp
from sim_launch import run_control_step, sum_squares_reloaded

from bcg.robots import g1
from bcg.sim.bridge import unpack_tree
from bcg.sim.engine import StepArrays, substep_launches

KERNELS = ["fk_rnea", "composite", "mass_tau", "factor_free", "contact_setup", "pgs", "apply_contact",
           "limit_guard_integrate"]
EPS = (3e-3, 1e-3, 3e-4, 1e-4)
"""Finite-difference steps (relative, per entry); the smallest error counts. 3e-3 was added with the per-foot normal
regulariser and beta 0.5: the larger impulses put apply_contact's float32 rounding at 3.0e-3 for eps <= 1e-3 (seed
0), 1.6e-5 at 3e-3."""
KERNEL_TOLERANCE = {  # about 2-3x the largest relative error measured over seeds 0-3
    "fk_rnea": 5e-3, "composite": 2e-3, "mass_tau": 3e-4, "factor_free": 1.5e-3,
    # contact_setup: 1.0e-4 - 6.3e-4 over seeds 0-5 except seed 3, 3.0e-3; the random directions moved when the soft
    # contact's start velocity became an input. In that direction the saturated float32 logistic s_act (s = 0.997)
    # alone is off by 1.1 %; every other output by at most 2.2e-4, and the whole-rollout gradient through this kernel
    # equals the float64 oracle's (tests/test_sim_rollout_grads.py)
    "contact_setup": 5e-3,
    # pgs: 2.0e-3 at seed 1 (the other seeds 4e-5 - 1.1e-4), flat over eps 1e-4 - 1e-3: float32 rounding of a foot
    # whose spheres are near-hard (weights 0.99 - 0.998, a near rank-deficient block); the adjoint itself agrees
    # with float64 autograd to 2e-7 on the same data (test_pgs_adjoint_equals_float64_autograd)
    "pgs": 2.5e-3, "apply_contact": 2e-3,
    # limit_guard_integrate on the contact fixture (no row binding) and on limit_substep (seeds 0-3: 1.5e-4 - 1.4e-3)
    "limit_guard_integrate": 2e-3,
}


def _contact_arrays(model):
    """Arrays of one control step from a perturbed standing state with the feet loaded and sliding slightly."""
    rng = np.random.default_rng(0)
    n = 2
    q = np.tile(g1.default_qpos(), (n, 1))
    q[:, 2] -= 0.0025  # 2.5 mm into the ground (no sphere within 0.3 mm of the Baumgarte kink at d = 0)
    q[:, 7:] += rng.normal(scale=0.05, size=(n, 29))
    qd = rng.normal(scale=0.2, size=(n, model.nv))
    targets = np.tile(g1.DEFAULT_JOINT_POS, (n, 1)) + rng.normal(scale=0.1, size=(n, 29))
    arrs = StepArrays(model, n, requires_grad=True)
    for dst, src in ((arrs.q[0], q), (arrs.qd[0], qd), (arrs.targets, targets)):
        wp.copy(dst, wp.array(src.astype(np.float32), dtype=float))
    run_control_step(model, arrs)
    # the finite differences below must not straddle the kink of max(d, 0) in the Baumgarte term
    assert np.abs(arrs.sub[0]["depth"].numpy()).min() > 3e-4
    return arrs


@pytest.fixture(scope="module")
def contact_substep(g1_model):
    """:func:`_contact_arrays` of the default model."""
    return _contact_arrays(g1_model)


@pytest.fixture(scope="module")
def soft_model(g1_model):
    """The G1 with the soft normal contact (MuJoCo's 20 ms time constant), whose bias reads the start velocity."""
    return g1_model.with_params(soft_timeconst=0.02)


@pytest.fixture(scope="module")
def soft_contact_substep(soft_model):
    """:func:`_contact_arrays` stepped with the soft normal contact."""
    return _contact_arrays(soft_model)


@pytest.mark.parametrize("name", ["contact_setup", "pgs", "apply_contact"])
@pytest.mark.parametrize("seed", [0, 1])
def test_soft_contact_kernel_adjoints_match_finite_differences(soft_model, soft_contact_substep, name, seed):
    """The soft contact's bias also reads the substep's start velocity qd (a new input of contact_setup)."""
    err = _check_kernel(soft_model, soft_contact_substep, name, seed)
    print(f"{name} seed {seed}: {err:.2e}")


@pytest.fixture(scope="module")
def limit_substep(g1_model):
    """Arrays of one control step in the air: every limited joint starts within 10 % of its range from a limit,
    moving towards it at 5-20 rad/s, and is driven 0.5 rad past it, so the joint-limit guard stops many joints in
    every substep, some fully (gate near 1), some partly."""
    gen = torch.Generator().manual_seed(0)
    n = 2
    limited = np.nonzero(g1_model.dof_limited)[0]
    lo, hi = (torch.tensor(g1_model.dof_range[limited, i], dtype=torch.float32) for i in (0, 1))
    upper = torch.rand(n, len(limited), generator=gen) > 0.5
    inset = 0.1 * (hi - lo) * torch.rand(n, len(limited), generator=gen)
    q = torch.tensor(g1.default_qpos(), dtype=torch.float32)[None].repeat(n, 1)
    q[:, 2] += 1.0
    q[:, 7:] = torch.where(upper, hi - inset, lo + inset)
    qd = torch.zeros(n, g1_model.nv)
    qd[:, limited] = (5 + 15 * torch.rand(n, len(limited), generator=gen)) * torch.where(upper, 1.0, -1.0)
    targets = torch.where(upper, hi + 0.5, lo - 0.5)
    arrs = StepArrays(g1_model, n, requires_grad=True)
    for dst, src in ((arrs.q[0], q), (arrs.qd[0], qd), (arrs.targets, targets)):
        wp.copy(dst, wp.from_torch(src.contiguous()))
    run_control_step(g1_model, arrs)
    return arrs


def _step_arrays(arrs: StepArrays) -> set[int]:
    ids = {id(a) for a in arrs.q + arrs.qd + [arrs.targets, arrs.impulse, arrs.depth]}
    for s in arrs.sub:
        ids |= {id(a) for a in s.values()}
    return ids


def _as_np(a: wp.array) -> np.ndarray:
    return a.numpy().astype(np.float64)


def _rebuild(a: wp.array, values: np.ndarray, requires_grad: bool) -> wp.array:
    return wp.array(values.astype(np.float32), dtype=a.dtype, shape=a.shape, device=a.device,
                    requires_grad=requires_grad)


def _check_kernel(model, arrs, name: str, seed: int, substep: int = 0, eps_list: tuple = EPS,
                  unweighted: tuple[int, ...] = ()) -> float:
    """Relative FD error of the kernel's adjoint along a random direction (the smallest over ``eps_list``);
    ``unweighted``: indices of outputs left out of the functional."""
    launch = next(lc for lc in substep_launches(model, arrs, substep) if lc.kernel.key.endswith(name))
    owned = _step_arrays(arrs)
    rng = np.random.default_rng(seed)
    var_idx = [i for i, a in enumerate(launch.inputs) if isinstance(a, wp.array) and id(a) in owned]
    base = {i: _as_np(launch.inputs[i]) for i in var_idx}
    # element-wise relative directions keep H and L positive definite and respect each entry's own scale
    dirs = {i: rng.normal(size=base[i].shape) * (np.abs(base[i]) + 1e-3 * np.abs(base[i]).max() + 1e-9)
            for i in var_idx}
    weights: list[np.ndarray] = []

    def run(delta: float, with_tape: bool):
        inputs = list(launch.inputs)
        for i in var_idx:
            inputs[i] = _rebuild(launch.inputs[i], base[i] + delta * dirs[i], with_tape)
        outputs = [wp.zeros(o.shape, dtype=o.dtype, device=o.device, requires_grad=with_tape)
                   for o in launch.outputs]
        tape = wp.Tape() if with_tape else None
        if tape is not None:
            with tape:
                wp.launch(launch.kernel, dim=arrs.n, inputs=inputs, outputs=outputs, device=model.device)
        else:
            wp.launch(launch.kernel, dim=arrs.n, inputs=inputs, outputs=outputs, device=model.device)
        value = sum(float((_as_np(o) * w).sum()) for o, w in zip(outputs, weights))
        return value, tape, inputs, outputs

    _, tape, inputs, outputs = run(0.0, True)
    # each output array weighted by the inverse of its own scale (from zero-initialised outputs: the step's own
    # scratch holds garbage where a kernel does not write), so that float32 rounding of the largest outputs does
    # not drown the finite differences of the small ones
    weights += [rng.normal(size=_as_np(o).shape) / (np.abs(_as_np(o)).max() + 1e-9) for o in outputs]
    for i in unweighted:
        weights[i] = np.zeros_like(weights[i])
    tape.backward(grads={o: wp.array(w.astype(np.float32), dtype=o.dtype, shape=o.shape)
                         for o, w in zip(outputs, weights)})
    analytic = sum(float((_as_np(inputs[i].grad) * dirs[i]).sum()) for i in var_idx)
    errors = []
    for eps in eps_list:
        fd = (run(eps, False)[0] - run(-eps, False)[0]) / (2 * eps)
        errors.append(abs(fd - analytic) / max(abs(analytic), 1e-6))
    assert min(errors) < KERNEL_TOLERANCE[name], f"{name}: analytic {analytic:.6g}, relative FD errors {errors}"
    return min(errors)


@pytest.mark.parametrize("name", KERNELS)
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_kernel_adjoint_matches_finite_differences(g1_model, contact_substep, name, seed):
    _check_kernel(g1_model, contact_substep, name, seed, unweighted=UNWEIGHTED.get(name, ()))


UNWEIGHTED = {"limit_guard_integrate": (0, 1, 3, 4, 6)}
"""Outputs left out of the contact fixture's functional: the guard's side and excess of a joint whose predicted
position is at mid-range switch to the other limit there (nothing depends on them: such a row is far from both
limits, its gate 0), and its per-row scratch (GUARD_SCRATCH below)."""
GUARD_EPS = (1e-3, 3e-4, 1e-4, 3e-5)
"""Smaller steps than EPS as well: the guard's allowance rounds the corner at the limit over 2 mrad, and joints the
guard stopped in the substep before sit inside that corner."""
GUARD_SCRATCH = (3, 4, 6)
"""Outputs left out of the guard's FD functional: Yl, Dl and residual_l are written only for rows in the guard's
window, so they appear when a perturbation moves a row into it (what they feed, the impulses and the velocity, is
continuous there and stays in)."""
GUARD_SUBSTEP = 3
"""The fixture's substep of the FD check: 53 of the 58 rows in the guard's window (9 of them partly, 0 < gate < 1),
24 binding (impulse > 0)."""
GUARD_SEEDS = 8
GUARD_MEDIAN = 2e-3
GUARD_WORST = 5e-2
"""A binding row starts at a kink (lambda = max(., 0)), and in some random directions a row crosses its kink within
the FD steps: errors of 1e-3 - 1.4e-2 that do not shrink with the step. Over seeds 0-7 at substeps 1, 2, 3: median
4e-4, 6e-4, 5e-4, worst 1.5e-3, 1.4e-2, 1.6e-3 (with the dense L before the depth-indexed rows: median 7e-4, 5e-4,
6e-4, worst 4.2e-3, 5.6e-3, 4.4e-3; the directions differ with the layout). So the check is on the median over the
directions (a wrong adjoint is off by O(1) in nearly every direction) and a bound on the worst; the float64
comparison below checks the adjoint exactly at substeps 1-3."""


def test_limit_guard_adjoint_matches_finite_differences(g1_model, limit_substep):
    """The guard kernel with rows active (the contact fixture above has none: its joints are far from the limits)."""
    gate = limit_substep.sub[GUARD_SUBSTEP]["gate"].numpy()
    binding = (limit_substep.sub[GUARD_SUBSTEP]["lam_l"].numpy()[:, -1] > 0) & (gate > 0)
    assert ((gate > 0) & (gate < 1)).sum() >= 4 and binding.sum() >= 12, (gate, binding)
    tolerance = KERNEL_TOLERANCE["limit_guard_integrate"]
    KERNEL_TOLERANCE["limit_guard_integrate"] = GUARD_WORST  # _check_kernel's own bound, per direction
    try:
        errors = [_check_kernel(g1_model, limit_substep, "limit_guard_integrate", seed, substep=GUARD_SUBSTEP,
                                eps_list=GUARD_EPS, unweighted=GUARD_SCRATCH) for seed in range(GUARD_SEEDS)]
    finally:
        KERNEL_TOLERANCE["limit_guard_integrate"] = tolerance
    print("guard kernel, relative FD errors by seed:", " ".join(f"{e:.1e}" for e in errors))
    assert float(np.median(errors)) < GUARD_MEDIAN, errors


@pytest.mark.parametrize("substep", [1, 2, 3])
def test_limit_guard_equals_float64_reference(g1_model, limit_substep, substep):
    """The guard kernel against reference.limit_guard in float64 on the fixture's inputs (the reference factors
    H = L^T L rebuilt from the kernel's tree factor): the velocity and its gradients with respect to the incoming
    velocity and the joint positions."""
    from bcg.sim import reference

    launch = next(lc for lc in substep_launches(g1_model, limit_substep, substep)
                  if lc.kernel.key.endswith("limit_guard_integrate"))
    q_np, L_np, v_np = (_as_np(launch.inputs[i]) for i in range(3))
    inputs = list(launch.inputs)
    inputs[0], inputs[2] = _rebuild(launch.inputs[0], q_np, True), _rebuild(launch.inputs[2], v_np, True)
    outputs = [wp.zeros(o.shape, dtype=o.dtype, device=o.device, requires_grad=True) for o in launch.outputs]
    tape = wp.Tape()
    with tape:
        wp.launch(launch.kernel, dim=limit_substep.n, inputs=inputs, outputs=outputs, device=g1_model.device)
    qd_out = outputs[-1]
    weights = np.random.default_rng(0).normal(size=qd_out.shape)
    tape.backward(grads={qd_out: wp.array(weights.astype(np.float32), dtype=float, shape=qd_out.shape)})
    q_t = torch.tensor(q_np, requires_grad=True)
    v_t = torch.tensor(v_np, requires_grad=True)
    L_t = unpack_tree(g1_model, torch.tensor(L_np), symmetric=False)  # L is depth-indexed
    chol = torch.linalg.cholesky(L_t.transpose(1, 2) @ L_t)
    ref = reference.limit_guard(g1_model, q_t, v_t, chol)
    scale = float(ref.detach().abs().max())
    moved = float((ref.detach() - v_t.detach()).abs().max())
    assert moved > 1.0, moved  # the guard changed the velocity
    value_err = float(np.abs(_as_np(qd_out) - ref.detach().numpy()).max()) / scale
    print(f"guard vs float64: value {value_err:.2e}")
    assert value_err < GUARD_VALUE, value_err
    (ref * torch.tensor(weights)).sum().backward()
    for name, g_wp, g_ref in (("v", _as_np(inputs[2].grad), v_t.grad.numpy()),
                              ("q", _as_np(inputs[0].grad), q_t.grad.numpy())):
        rel = np.linalg.norm(g_wp - g_ref) / np.linalg.norm(g_ref)
        print(f"guard vs float64: gradient wrt {name} {rel:.2e}")
        assert rel < GUARD_GRAD, f"{name}: relative gradient error {rel:.2e}"


GUARD_VALUE = 1.5e-6
"""|Warp - float64| velocity after the guard / max |velocity|: measured 4.1e-7 - 7.5e-7 (substeps 1-3)."""
GUARD_GRAD = 2.5e-5
"""Relative gradient error against float64 autograd, substeps 1-3: measured 6.6e-8 - 1.3e-7 (incoming velocity),
5.2e-6 - 1.4e-5 (joint positions, through the allowance's rounded corner)."""


def test_loop_carried_value_is_reloaded_before_nonlinear_use():
    """Loop-carried sums: y = (sum x)^2 with a run-time trip count; the store-and-reload pattern gives dy/dx = 2 sum."""
    x = wp.array([1.0, 2.0, 3.0], dtype=float, requires_grad=True)
    tmp = wp.zeros(1, dtype=float, requires_grad=True)
    y = wp.zeros(1, dtype=float, requires_grad=True)
    tape = wp.Tape()
    with tape:
        wp.launch(sum_squares_reloaded, dim=1, inputs=[x, 3, tmp, y])
    tape.backward(grads={y: wp.array([1.0], dtype=float)})
    np.testing.assert_allclose(x.grad.numpy(), [12.0, 12.0, 12.0])


def test_off_diagonal_mass_matrix_gradient_through_ancestor_table(g1_model):
    """No `while` loops: a `while` walk up the tree silently drops the off-diagonal dH/dq terms. Our ancestor-table
    walk must give the gradient of an off-diagonal entry (hip pitch / knee coupling) of the float64 oracle."""
    from bcg.sim import reference
    from bcg.sim.engine import StepArrays as SA

    q = torch.tensor(g1.default_qpos())[None]
    q[0, 7:] += 0.3
    a, b = 9, 6  # left knee dof, left hip pitch dof
    qr = q.clone().requires_grad_(True)
    reference.mass_matrix(g1_model, qr)[0, a, b].backward()
    arrs = SA(g1_model, 1, requires_grad=True)
    wp.copy(arrs.q[0], wp.from_torch(q.float()))
    wp.copy(arrs.qd[0], wp.zeros((1, g1_model.nv), dtype=float))
    wp.copy(arrs.targets, wp.from_torch(torch.tensor(g1.DEFAULT_JOINT_POS, dtype=torch.float32)[None]))
    tape = wp.Tape()
    with tape:
        for launch in substep_launches(g1_model, arrs, 0)[:3]:
            wp.launch(launch.kernel, dim=1, inputs=launch.inputs, outputs=launch.outputs)
    H = arrs.sub[0]["H"]  # depth-indexed: (a, b) at [:, a, depth(b)]
    seed = np.zeros(H.shape, np.float32)
    seed[0, a, g1_model.dof_ancestor_count[b]] = 1.0
    tape.backward(grads={H: wp.array(seed, dtype=float)})
    g_wp = arrs.q[0].grad.numpy()[0, 7:]
    g_ref = qr.grad[0, 7:].numpy()
    assert np.abs(g_ref).max() > 1e-3
    np.testing.assert_allclose(g_wp, g_ref, atol=2e-4 * np.abs(g_ref).max() + 1e-6)


def test_gradients_finite_far_from_contact(g1_model):
    """Overflow-free logistic, friction-disc sqrt: with every sphere 2 m above the ground (kappa d = -600) and all
    impulses exactly zero, the backward pass must stay finite."""
    from bcg.sim import step

    q = torch.tensor(g1.default_qpos(), dtype=torch.float32)[None]
    q[0, 2] += 2.0
    q.requires_grad_(True)
    targets = torch.tensor(g1.DEFAULT_JOINT_POS, dtype=torch.float32)[None].requires_grad_(True)
    qd = torch.zeros(1, g1_model.nv, requires_grad=True)
    q1, qd1, rep = step(g1_model, q, qd, targets)
    assert float(rep.impulse.detach().abs().max()) == 0.0
    (q1.sum() + qd1.sum() + rep.impulse.sum()).backward()
    for t in (q, qd, targets):
        assert torch.isfinite(t.grad).all()


def _pgs_float64(A, w, s_act, s_norm, mu: float, iterations: int) -> torch.Tensor:
    """The pgs kernel's sweeps in float64 torch: lambda after every sweep [N, iterations, 3 nc]."""
    n, nc = s_act.shape
    nr = 3 * nc
    lam = [torch.zeros(n, dtype=A.dtype) for _ in range(nr)]
    sweeps = []
    for _ in range(iterations):
        for c in range(nc):
            i = 3 * c
            r = w[:, i] + sum(A[:, i, j] * lam[j] for j in range(nr))
            lam[i] = torch.clamp(s_norm[:, c] * (lam[i] - r / A[:, i, i]), min=0.0)
            r1 = w[:, i + 1] + sum(A[:, i + 1, j] * lam[j] for j in range(nr))
            r2 = w[:, i + 2] + sum(A[:, i + 2, j] * lam[j] for j in range(nr))
            a11, a12, a22 = A[:, i + 1, i + 1], A[:, i + 1, i + 2], A[:, i + 2, i + 2]
            det = a11 * a22 - a12 * a12
            t1 = s_act[:, c] * (lam[i + 1] - (a22 * r1 - a12 * r2) / det)
            t2 = s_act[:, c] * (lam[i + 2] - (a11 * r2 - a12 * r1) / det)
            limit = mu * lam[i]
            n2 = t1 * t1 + t2 * t2
            out = n2 > limit * limit
            scale = torch.where(out, limit / torch.sqrt(torch.where(out, n2, torch.ones_like(n2))),
                                torch.ones_like(n2))
            lam[i + 1], lam[i + 2] = t1 * scale, t2 * scale
        sweeps.append(torch.stack(lam, 1))
    return torch.stack(sweeps, 1)


def test_pgs_adjoint_equals_float64_autograd(g1_model, contact_substep):
    """The pgs adjoint against torch autograd of the same sweeps in float64, on the fixture's data (exact, unlike
    the float32 finite differences above): measured 2e-7 relative on every input."""
    launch = next(lc for lc in substep_launches(g1_model, contact_substep, 0) if lc.kernel.key.endswith("pgs"))
    base = [_as_np(a) for a in launch.inputs[:4]]  # A, w, s_act, s_norm
    mu = float(_as_np(launch.inputs[5])[0])
    iterations = launch.inputs[6]
    inputs = list(launch.inputs)
    for k in range(4):
        inputs[k] = _rebuild(launch.inputs[k], base[k], True)
    outputs = [wp.zeros(o.shape, dtype=o.dtype, device=o.device, requires_grad=True) for o in launch.outputs]
    tape = wp.Tape()
    with tape:
        wp.launch(launch.kernel, dim=contact_substep.n, inputs=inputs, outputs=outputs, device=g1_model.device)
    weights = np.random.default_rng(0).normal(size=outputs[0].shape)
    weights[:, 0] = 0.0  # slot 0 is the zero start, never written
    tape.backward(grads={outputs[0]: wp.array(weights.astype(np.float32), dtype=float, shape=outputs[0].shape)})
    ref_in = [torch.tensor(b, requires_grad=True) for b in base]
    lam = _pgs_float64(*ref_in, mu, iterations)
    np.testing.assert_allclose(_as_np(outputs[0])[:, 1:], lam.detach().numpy(), rtol=0, atol=2e-6)
    (lam * torch.tensor(weights[:, 1:])).sum().backward()
    for k, name in enumerate(("A", "w", "s_act", "s_norm")):
        g_wp, g_ref = _as_np(inputs[k].grad), ref_in[k].grad.numpy()
        rel = np.linalg.norm(g_wp - g_ref) / np.linalg.norm(g_ref)
        assert rel < 2e-6, f"{name}: relative adjoint error {rel:.2e}"


@pytest.fixture(scope="module")
def dropout_model(g1_model):
    """The G1 with every sphere less than 2.2 mm deep dropped (dropout 1: the draws do not matter, so the finite
    differences see the same spheres dropped). In the contact fixture's first substep that is 9 of 16 spheres, 5 of
    them touching; the nearest depths are 1.3 and 3.0 mm."""
    return g1_model.with_params(dropout=1.0, dropout_depth=0.0022)


@pytest.mark.parametrize("name", ["contact_setup", "pgs", "apply_contact"])
@pytest.mark.parametrize("seed", [0, 1])
def test_contact_dropout_kernel_adjoints_match_finite_differences(dropout_model, name, seed):
    """A dropped sphere's activation is 0 in the forward and in the adjoint; the others keep their gradients."""
    arrs = _contact_arrays(dropout_model)
    s_act = arrs.sub[0]["s_act"].numpy()
    depth = arrs.sub[0]["depth"].numpy()
    dropped = depth < dropout_model.params.dropout_depth
    assert dropped.any() and (~dropped).any()
    assert (s_act[dropped] == 0).all() and (s_act[~dropped] > 0.5).all()
    assert np.abs(depth - dropout_model.params.dropout_depth).min() > 3e-4  # FD steps stay on one side
    err = _check_kernel(dropout_model, arrs, name, seed)
    print(f"{name} seed {seed}: {err:.2e}")
