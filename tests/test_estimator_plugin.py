"""The estimator plugin path, proved by a fourth estimator that lives outside ``bcg``: the alpha-order batched
gradient of ``plugins/bcg-aobg`` (docs/method.md §4.1 / 4.3). (a) an entry point declared in a temporary distribution
brings it into ``make`` and ``bcg estimators list`` (nothing installed into site-packages); (b) alpha = 1 is ``grs``
with the same perturbations; (c) alpha = 0 is the hand-computed ZoBG; (d) on linear dynamics the ZoBG Jacobian
converges to A at the rate of its standard error; (e) the bias-constrained alpha on hand-made samples (every case
of the rule) and through the estimator; (f) a non-finite branch (or baseline) is dropped; state_dict round trip."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import gymnasium as gym
import pytest
import torch

import bcg  # noqa: F401  (registers the env ids)
from bcg.estimators import ESTIMATORS, make
from bcg.estimators.grs import GRS, joint_gaussian_offsets
from bcg.sim.reference import ContactReport

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[1]
PLUGIN = ROOT / "plugins" / "bcg-aobg"
N = 3


def _forget_plugin() -> None:
    """Unregister ``aobg`` and unload its modules (the next import registers it again)."""
    ESTIMATORS._classes.pop("aobg", None)
    ESTIMATORS._classes.pop("ep-only", None)
    for mod in [m for m in sys.modules if m in ("bcg_aobg", "bcg_ep_only_test") or m.startswith("bcg_aobg.")]:
        del sys.modules[mod]


@pytest.fixture
def aobg(monkeypatch: pytest.MonkeyPatch):
    """The plugin's module, importable from its source folder (as ``pip install -e plugins/bcg-aobg`` would make
    it)."""
    monkeypatch.syspath_prepend(str(PLUGIN / "src"))
    import bcg_aobg.estimator

    return bcg_aobg.estimator


@pytest.fixture(scope="module")
def env():
    e = gym.make_vec("BCG-G1-Jump-v0", num_envs=N, differentiable=True)
    e.reset(seed=0)
    return e


# ------------------------------------------------------------------------------------------------ (a) plugin path


def test_entry_point_of_a_temporary_distribution(tmp_path, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture) -> None:
    """The entry point the plugin's pyproject.toml declares, written into a ``*.dist-info`` on a temporary sys.path
    entry, makes ``make("aobg")`` and ``bcg estimators list`` find the plugin without importing it by hand."""
    _forget_plugin()
    try:
        assert "aobg" not in ESTIMATORS  # nothing installed: the plugin is not there
        eps = tomllib.loads((PLUGIN / "pyproject.toml").read_text())["project"]["entry-points"]["bcg.estimators"]
        assert eps == {"aobg": "bcg_aobg.estimator:AOBG"}
        dist = tmp_path / "bcg_aobg-0.1.0.dist-info"
        dist.mkdir()
        (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: bcg-aobg\nVersion: 0.1.0\n")
        (dist / "entry_points.txt").write_text("[bcg.estimators]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items())
                                               + "ep-only = bcg_ep_only_test:Only\n")
        # a class registered by its entry point alone (no decorator) gets the entry point's name, as checkpoints need
        (tmp_path / "bcg_ep_only_test.py").write_text(
            "from dataclasses import dataclass\nfrom bcg.estimators import BPTT\n\n\n"
            "@dataclass(frozen=True)\nclass Only(BPTT):\n    pass\n")
        monkeypatch.syspath_prepend(str(tmp_path))
        monkeypatch.syspath_prepend(str(PLUGIN / "src"))
        assert "bcg_aobg.estimator" not in sys.modules
        ESTIMATORS.load_entry_points(force=True)
        assert "aobg" in ESTIMATORS and "bcg_aobg.estimator" in sys.modules
        assert make("ep-only").name == "ep-only" and make("ep-only").state_dict()["name"] == "ep-only"
        est = make("aobg", alpha=0.25, branches=4)
        assert type(est).__module__ == "bcg_aobg.estimator" and est.alpha == 0.25 and est.name == "aobg"
        with pytest.raises(TypeError, match="no parameter.*sigma_p.*alpha"):
            make("aobg", sigma_p=0.01)
        from bcg.cli import main

        assert main(["estimators", "list"]) == 0
        out = capsys.readouterr().out
        assert "aobg: Alpha-order batched gradient" in out
        assert "alpha: float | Literal['auto'] = 'auto'  Weight of the first-order estimate" in out
        assert "gamma: float = 10.0" in out and "delta: float = 0.95" in out and "bptt:" in out
    finally:
        _forget_plugin()


# ------------------------------------------------------------------------------------------------ helpers

W = 0.3 * torch.randn(29, 29, generator=torch.Generator().manual_seed(0))


def scripted(model, q, qd, targets, physics=None, *, env_ids=None, memory=None):
    """A smooth inner transition (no simulator) that uses every input: the root quaternion passes through."""
    h, r = q[:, 7:], qd[:, 6:]
    q1 = torch.cat([q[:, :3] + 0.01 * qd[:, :3], q[:, 3:7], h + 0.02 * torch.sin(r) + 0.01 * targets], 1)
    qd1 = torch.cat([0.9 * qd[:, :6] + 0.1 * q[:, :3].sum(1, keepdim=True),
                     torch.tanh(r @ W.T + 0.5 * targets - h)], 1)
    imp = h[:, :8] ** 2
    return q1, qd1, ContactReport(imp, 10.0 * imp, torch.cos(h[:, 8:16])), {}


def _inputs(env, n: int = N):
    g = torch.Generator().manual_seed(1)
    q = env.state.q[:1].repeat(n, 1).clone()
    q[:, 7:] = 0.1 * torch.randn(n, 29, generator=g)  # inside the joint ranges: no clamping of the offsets
    qd = 0.3 * torch.randn(n, 35, generator=g)
    t = 0.2 * torch.randn(n, 29, generator=g)
    cot = [torch.randn(n, 36, generator=g), torch.randn(n, 35, generator=g)] + [torch.randn(n, 8, generator=g)
                                                                               for _ in range(3)]
    cot[0][:, 3:7] = 0.0  # no cotangent on the quaternion (its renormalised mean is not linear)
    return q, qd, t, cot


def _estimate(est, env, q, qd, t, cot):
    leaves = [x.clone().requires_grad_(True) for x in (q, qd, t)]
    q1, qd1, c, _ = est(env.model, *leaves)
    loss = sum((g * y).sum() for g, y in zip(cot, (q1, qd1, *c), strict=True))
    return (q1, qd1, c), torch.autograd.grad(loss, leaves)


def _hand(env, q, qd, t, cot, *, B, sq, sqd, su, seed, alpha, keep=None, inner=scripted):
    """The AoBG by hand: the same draws, per-branch values and exact gradients of the scripted function."""
    n = q.shape[0]
    gen = torch.Generator().manual_seed(seed)
    dq, dqd = joint_gaussian_offsets(env.model, q, qd, B, sq, sqd, False, gen)
    du = torch.randn(n, B, 29, generator=gen) * su if su > 0 else torch.zeros(n, B, 29)
    xs = [(q.repeat_interleave(B, 0) + torch.cat([torch.zeros(n, B, 7), dq], -1).reshape(n * B, -1)).requires_grad_(),
          (qd.repeat_interleave(B, 0) + torch.cat([torch.zeros(n, B, 6), dqd], -1).reshape(n * B, -1)).requires_grad_(),
          (t.repeat_interleave(B, 0) + du.reshape(n * B, -1)).requires_grad_()]
    ys = inner(env.model, *xs)
    F = sum((g.repeat_interleave(B, 0) * y).sum(1) for g, y in zip(cot, (ys[0], ys[1], *ys[2]), strict=True))
    grads = torch.autograd.grad(F.sum(), xs)  # rows are independent: per-branch gradients
    with torch.no_grad():
        F0 = sum((g * y).sum(1) for g, y in zip(cot, (lambda o: (o[0], o[1], *o[2]))(inner(env.model, q, qd, t)),
                                                strict=True))
        F = F.detach().reshape(n, B)
        keep = torch.ones(n, B, dtype=torch.bool) if keep is None else keep
        w = keep / keep.sum(1, keepdim=True)
        F = torch.where(keep, F, 0.0)
        fo = [torch.where(keep[..., None], gr.reshape(n, B, -1), 0.0) for gr in grads]
        fo = [(w[..., None] * f).sum(1) for f in fo]
        zo_q = (w[..., None] * (F - F0[:, None])[..., None] * dq).sum(1) / sq**2 if sq > 0 else None
        zo_qd = (w[..., None] * (F - F0[:, None])[..., None] * dqd).sum(1) / sqd**2 if sqd > 0 else None
        zo_u = (w[..., None] * (F - F0[:, None])[..., None] * du).sum(1) / su**2 if su > 0 else None
        out = [f.clone() for f in fo]
        if zo_q is not None:
            out[0][:, 7:] = alpha * fo[0][:, 7:] + (1 - alpha) * zo_q
        if zo_qd is not None:
            out[1][:, 6:] = alpha * fo[1][:, 6:] + (1 - alpha) * zo_qd
        if zo_u is not None:
            out[2] = alpha * fo[2] + (1 - alpha) * zo_u
    return out, fo


# ------------------------------------------------------------------------------------------------ (b), (c)


def test_alpha_one_is_grs_with_the_same_perturbations(aobg) -> None:
    """Through the real simulator and the env (2 steps, loss on rewards and observations): forward values bit for
    bit, gradients to float rounding; one more row per environment is simulated (the baseline)."""
    from test_estimators import _env, _rollout

    B = 4
    est = make("aobg", alpha=1.0, branches=B, seed=3, sigma_q=0.02, sigma_qd=0.05, sigma_u=0.0)
    got = _rollout(_env(est), steps=2)
    ref = _rollout(_env(GRS(branches=B, seed=3, law="joint_gaussian")), steps=2)
    assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])
    for a, b in zip(got[2], ref[2], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert est.total_stats.branches_simulated == 2 * N * (B + 1) and est.total_stats.envs_triggered == 2 * N
    assert est.alpha_stats.fixed == 2 * N and est.alpha_stats.alpha_sum == 2 * N


@pytest.mark.parametrize("alpha", [0.0, 0.3])
def test_alpha_zero_is_the_hand_computed_zobg(aobg, env, alpha: float) -> None:
    """ZoBG (1/B) sum_i <g, f(x + w_i) - f(x)> w_i / sigma^2 on the perturbed coordinates (hinge angles, rates and
    PD targets), the first-order gradient on the floating base; and the alpha mix."""
    B, seed, sq, sqd, su = 6, 9, 0.03, 0.1, 0.05
    q, qd, t, cot = _inputs(env)
    est = make("aobg", alpha=alpha, branches=B, seed=seed, sigma_q=sq, sigma_qd=sqd, sigma_u=su).set_inner(scripted)
    (q1, _, _), grads = _estimate(est, env, q, qd, t, cot)
    want, fo = _hand(env, q, qd, t, cot, B=B, sq=sq, sqd=sqd, su=su, seed=seed, alpha=alpha)
    for a, b in zip(grads, want, strict=True):
        torch.testing.assert_close(a, b, rtol=2e-5, atol=2e-5)
    assert (grads[0][:, :7] - fo[0][:, :7]).abs().max() < 1e-5           # the base keeps the first-order gradient
    assert (want[0][:, 7:] - fo[0][:, 7:]).abs().max() > 1e-2             # and the hinges do not (the test can fail)
    assert est.last_stats.branches_simulated == N * (B + 1)


def test_zobg_on_linear_dynamics_converges_to_the_jacobian(aobg, env) -> None:
    """qd' = A qd with only the hinge rates perturbed: the ZoBG rows of the Jacobian are unbiased with standard error
    sqrt((|a_k|^2 + a_kj^2) / B) per entry (a_k: row k of A over the perturbed columns). Measured over the 8 x 29
    entries: RMS of the error in standard errors 1.00 / 1.00 / 0.97 and largest 3.0 / 3.0 / 2.7 for B = 64, 512,
    4096; absolute RMS error 0.178 -> 0.063 -> 0.021 (x 1/2.8 per x 8 in B: the 1/sqrt(B) rate)."""
    g = torch.Generator().manual_seed(5)
    A = torch.eye(35) + 0.2 * torch.randn(35, 35, generator=g)

    def linear(model, q, qd, targets, physics=None, *, env_ids=None, memory=None):
        z = q.new_zeros(q.shape[0], 8)
        return q, qd @ A.T, ContactReport(z, z, z), {}

    k = 8  # output rows 6..13 (hinge rates), one row of the batch each
    q = env.state.q[:1].repeat(k, 1)
    q[:, 7:] = 0.0
    qd, t = torch.zeros(k, 35), torch.zeros(k, 29)
    cot_qd = torch.zeros(k, 35)
    cot_qd[torch.arange(k), 6 + torch.arange(k)] = 1.0
    cot = [torch.zeros(k, 36), cot_qd] + [torch.zeros(k, 8)] * 3
    truth = A[6:6 + k, 6:]
    se_unit = torch.sqrt((truth**2).sum(1, keepdim=True) + truth**2)
    errs = []
    for B in (64, 512, 4096):
        est = make("aobg", alpha=0.0, branches=B, sigma_q=0.0, sigma_qd=0.1, seed=B).set_inner(linear)
        _, (_, gqd, _) = _estimate(est, env, q, qd, t, cot)
        z = (gqd[:, 6:] - truth) / (se_unit / math.sqrt(B))
        assert 0.75 < z.pow(2).mean().sqrt() < 1.25 and z.abs().max() < 4.5, (B, z.pow(2).mean().sqrt(), z.abs().max())
        torch.testing.assert_close(gqd[:, :6], A[6:6 + k, :6])  # the unperturbed base rates: first order, exact
        errs.append(float((gqd[:, 6:] - truth).pow(2).mean().sqrt()))
    assert errs[0] > 2.2 * errs[1] and errs[1] > 2.2 * errs[2], errs  # sqrt(8) = 2.83


# ------------------------------------------------------------------------------------------------ (e) alpha rule


def test_bias_constrained_alpha_by_hand(aobg) -> None:
    """Rows: 0 too uncertain (eps > gamma: alpha 0), 1 within the bias budget (alpha-bar), 2 beyond it (clipped)."""
    from bcg_aobg.mix import ALPHA_BAR, ALPHA_CLIPPED, ALPHA_ZOBG, bias_constrained_alpha

    fo = torch.tensor([[[1.0, 0.0], [1.2, 0.1], [0.8, -0.1], [1.0, 0.0]],
                       [[1.0, 1.0], [1.1, 0.9], [0.9, 1.1], [1.0, 1.0]],
                       [[5.0, 0.0], [5.1, 0.1], [4.9, -0.1], [5.0, 0.0]]])
    zo = torch.tensor([[[50.0, -40.0], [-60.0, 30.0], [45.0, 10.0], [-30.0, 0.0]],
                       [[1.5, 0.5], [0.5, 1.5], [1.5, 1.5], [0.5, 0.5]],
                       [[1.5, 0.5], [0.5, 1.5], [1.5, 1.5], [0.5, 0.5]]])
    keep = torch.ones(3, 4, dtype=torch.bool)
    gamma, L, delta = 2.0, 0.1, 0.95
    alpha, case = bias_constrained_alpha(fo, zo, keep, gamma, L, delta)
    want_a, want_c = [], []
    for r in range(3):  # the rule of docs/method.md §4.1, written out with Python floats
        N, d = 4, 2
        m1 = [sum(fo[r, i, j].item() for i in range(N)) / N for j in range(d)]
        m0 = [sum(zo[r, i, j].item() for i in range(N)) / N for j in range(d)]
        v1 = sum((fo[r, i, j].item() - m1[j]) ** 2 for i in range(N) for j in range(d)) / (N - 1)
        v0 = sum((zo[r, i, j].item() - m0[j]) ** 2 for i in range(N) for j in range(d)) / (N - 1)
        lg = math.log((d + 1) / delta)
        eps = math.sqrt(2 * v0 * lg / N) + 2 * L / (3 * N) * lg
        gap = math.dist(m1, m0)
        if eps > gamma:
            want_a.append(0.0), want_c.append(ALPHA_ZOBG)
        elif v0 / (v1 + v0) * gap <= gamma - eps:
            want_a.append(v0 / (v1 + v0)), want_c.append(ALPHA_BAR)
        else:
            want_a.append((gamma - eps) / gap), want_c.append(ALPHA_CLIPPED)
    assert case.tolist() == [ALPHA_ZOBG, ALPHA_BAR, ALPHA_CLIPPED] == want_c
    torch.testing.assert_close(alpha, torch.tensor(want_a), rtol=1e-6, atol=1e-7)
    assert 0.0 < alpha[2] < 1.0 and alpha[1] > 0.5  # row 1: the ZoBG is the noisier one


def test_auto_alpha_through_the_estimator(aobg, env) -> None:
    """gamma = 0: every row falls back to the ZoBG (= alpha 0); a large gamma: alpha-bar in (0, 1), and the
    gradient is the hand-computed mix with those alphas."""
    B, seed = 6, 2
    q, qd, t, cot = _inputs(env)
    kw = {"branches": B, "seed": seed, "sigma_q": 0.02, "sigma_qd": 0.05, "sigma_u": 0.05}
    zero = make("aobg", alpha="auto", gamma=0.0, **kw).set_inner(scripted)
    _, g_auto = _estimate(zero, env, q, qd, t, cot)
    _, g_zero = _estimate(make("aobg", alpha=0.0, **kw).set_inner(scripted), env, q, qd, t, cot)
    assert all(torch.equal(a, b) for a, b in zip(g_auto, g_zero, strict=True))
    assert zero.alpha_stats.zobg == N and zero.last_alpha.tolist() == [0.0] * N
    wide = make("aobg", alpha="auto", gamma=1e6, **kw).set_inner(scripted)
    _, g_wide = _estimate(wide, env, q, qd, t, cot)
    assert wide.alpha_stats.alpha_bar == N and ((wide.last_alpha > 0) & (wide.last_alpha < 1)).all()
    a = wide.last_alpha
    want0, _ = _hand(env, q, qd, t, cot, B=B, sq=0.02, sqd=0.05, su=0.05, seed=seed, alpha=0.0)
    want1, _ = _hand(env, q, qd, t, cot, B=B, sq=0.02, sqd=0.05, su=0.05, seed=seed, alpha=1.0)
    for got, w0, w1 in zip(g_wide, want0, want1, strict=True):
        torch.testing.assert_close(got, a[:, None] * w1 + (1 - a[:, None]) * w0, rtol=1e-4, atol=1e-4)


# ------------------------------------------------------------------------------------------------ (f), state


def test_a_non_finite_branch_is_dropped(aobg, env) -> None:
    """Branch 1 of row 0 diverges: the mean, the FoBG and the ZoBG use the other branches with renormalised weights;
    a row whose baseline diverges falls back to the first-order gradient (alpha = 1)."""
    B, seed, alpha = 5, 4, 0.4
    q, qd, t, cot = _inputs(env)

    def breaking(bad_rows):
        def inner(model, q, qd, targets, physics=None, *, env_ids=None, memory=None):
            q1, qd1, c, mem = scripted(model, q, qd, targets)
            bad = torch.zeros(q.shape[0], dtype=torch.bool)
            bad[[r for r in bad_rows if r < q.shape[0]]] = True
            return q1, torch.where(bad[:, None], float("nan"), qd1), c, mem
        return inner

    kw = {"alpha": alpha, "branches": B, "seed": seed, "sigma_q": 0.02, "sigma_qd": 0.05, "sigma_u": 0.0}
    est = make("aobg", **kw).set_inner(breaking([N + 1]))  # N baseline rows first
    (q1, qd1, _), grads = _estimate(est, env, q, qd, t, cot)
    assert est.last_stats.nonfinite_dropped == 1 and est.last_stats.envs_all_nonfinite == 0
    assert torch.isfinite(q1).all() and torch.isfinite(qd1).all() and all(torch.isfinite(g).all() for g in grads)
    keep = torch.ones(N, B, dtype=torch.bool)
    keep[0, 1] = False
    want, _ = _hand(env, q, qd, t, cot, B=B, sq=0.02, sqd=0.05, su=0.0, seed=seed, alpha=alpha, keep=keep)
    for a, b in zip(grads, want, strict=True):
        torch.testing.assert_close(a, b, rtol=2e-5, atol=2e-5)

    base = make("aobg", **kw).set_inner(breaking([1]))  # row 1's baseline
    _, grads = _estimate(base, env, q, qd, t, cot)
    assert base.alpha_stats.nominal_nonfinite == 1 and base.last_alpha.tolist() == pytest.approx([alpha, 1.0, alpha])
    _, fo = _hand(env, q, qd, t, cot, B=B, sq=0.02, sqd=0.05, su=0.0, seed=seed, alpha=1.0)
    torch.testing.assert_close(grads[1][1], fo[1][1], rtol=2e-5, atol=2e-5)


def test_state_dict_round_trip(aobg, env) -> None:
    q, qd, t, cot = _inputs(env)
    est = make("aobg", branches=3, sigma_q=0.02, sigma_u=0.05, seed=1).set_inner(scripted)
    _estimate(est, env, q, qd, t, cot)
    import io

    buf = io.BytesIO()
    torch.save(est.state_dict(), buf)
    buf.seek(0)
    sd = torch.load(buf, weights_only=True)
    (ref, _, _), g_ref = _estimate(est, env, q, qd, t, cot)
    fresh = make("aobg", branches=3, sigma_q=0.02, sigma_u=0.05, seed=1).set_inner(scripted)
    fresh.load_state_dict(sd)
    assert fresh.alpha_stats == make("aobg").alpha_stats.__class__(**sd["alpha_stats"])
    (got, _, _), g_got = _estimate(fresh, env, q, qd, t, cot)
    assert torch.equal(ref, got) and all(torch.equal(a, b) for a, b in zip(g_ref, g_got, strict=True))
    assert fresh.total_stats == est.total_stats and fresh.alpha_stats == est.alpha_stats


def test_parameters_are_checked(aobg) -> None:
    for bad in ({"branches": 0}, {"alpha": 1.5}, {"alpha": "sometimes"}, {"gamma": -1.0}, {"delta": 0.0},
                {"sigma_u": float("nan")}, {"antithetic": True, "branches": 3}, {"seed": -1}):
        with pytest.raises(ValueError):
            make("aobg", **bad)
    assert make("aobg") == aobg.AOBG() and make("aobg").alpha == "auto"
