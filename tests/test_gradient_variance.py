"""The gradient-variance study (docs/method.md §3.10): the machinery (per-environment gradients from the batched
parameters, the statistics, the zeroth-order reference) and the measured claim on a stiff-contact window."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from bcg.agents.threads import torch_threads
from bcg.envs.dynamics import Dynamics
from bcg.estimators import parse_spec
from bcg.evaluation.gradient_variance import (
    EstimatorRun,
    TrackingPolicy,
    VarianceStudy,
    bootstrap_summed_variance,
    estimator_gradients,
    jittered_copies,
    make_estimator,
    make_study_env,
    observation_normaliser,
    run_study,
    start_states,
    summarize,
    summed_variance,
    zeroth_order_reference,
)


@pytest.fixture(scope="module")
def jump():
    """The jump clip at kappa 300 with 16 rows, its normaliser and the tracking policy."""
    env = make_study_env("jump", 300.0, 16)
    mean, std = observation_normaliser(env, count=32)
    return env, TrackingPolicy(env, mean, std)


def test_per_env_gradients_equal_the_gradients_computed_env_by_env(jump) -> None:
    """One backward of sum_e R_e with one parameter copy per row gives each row's own dR_e/dtheta_e: the gradient of
    R_e alone is zero on the other rows' copies and equals row e of the batched gradient, and rolling a row out alone
    gives the same gradient up to float32 rounding on a 2-step window (measured: row 0 bit-identical, the others
    within 1e-4 of the largest entry; by 6 steps rounding differences of 1e-7 in the state have grown into a 12 %
    gradient difference on one row, which is how sensitive these gradients are)."""
    # bit for bit across batch sizes on one torch thread: with two, MKL may split a product another way when the
    # machine is loaded
    with torch_threads(1):
        env, policy = jump
        start = start_states(env, 0, 3, 6)
        theta0 = policy.initial_theta(3, std=0.01, seed=1)
        batched = estimator_gradients(env, make_estimator("bptt"), policy, theta0, start, 2, seed=0)
        assert batched.grads.shape == (3, (policy.obs_dim + 1) * 29)
        for e in range(3):
            alone = estimator_gradients(env, make_estimator("bptt"), policy, theta0[e:e + 1], start[e:e + 1], 2, seed=0)
            scale = float(alone.grads.abs().max())
            torch.testing.assert_close(alone.grads[0], batched.grads[e], rtol=0, atol=1e-3 * scale)
            torch.testing.assert_close(alone.returns[0], batched.returns[e])
        first = estimator_gradients(env, make_estimator("bptt"), policy, theta0[:1], start[:1], 2, 0)
        assert torch.equal(first.grads[0], batched.grads[0])
        # the gradient of one row's return reaches its own copy of theta only (two rollouts: the Warp tape supports one
        # backward per step)
        from bcg.evaluation.gradient_variance import _rollout_return

        full = estimator_gradients(env, make_estimator("bptt"), policy, theta0, start, 6, seed=0).grads
        theta = theta0.clone().requires_grad_(True)
        ret, _ = _rollout_return(env, policy, theta, start, 6)
        one = torch.autograd.grad(ret[1], theta)[0].reshape(3, -1).double()
        assert one[0].abs().max() == 0 and one[2].abs().max() == 0
        torch.testing.assert_close(one[1], full[1], rtol=1e-6, atol=1e-6 * float(full[1].abs().max()))


def test_identical_environments_have_zero_variance_and_estimator_noise_shows(jump) -> None:
    """Copies of one start state without jitter: bptt gives the same gradient on every copy up to float32 rounding
    (V / |mean g|^2 = 1.2e-14, rows within 2.5e-7 of the largest entry, measured on an AVX-512 CPU: torch computes
    the last few entries of an element-wise ``atanh`` on its scalar path, the others on its vector path, so the last
    row's action differs from the first's in the last bit; earlier CI machines gave bit-for-bit equal copies);
    grs draws its own perturbations per copy, so its V is of the order of the gradient itself (the statistic sees
    estimator noise; measured V / |mean g|^2 = 0.14 with B = 2 over 4 steps)."""
    env, policy = jump
    start = jittered_copies(start_states(env, 3, 1, 4), 4, 0.0, seed=3)
    theta0 = policy.initial_theta(4)
    plain = estimator_gradients(env, make_estimator("bptt"), policy, theta0, start, 4, seed=0)
    g = plain.grads
    assert summed_variance(g) <= 1e-13 * float((g.mean(0) ** 2).sum())
    torch.testing.assert_close(g, g[:1].expand_as(g), rtol=0, atol=1e-6 * float(g[0].abs().max()))
    # the contact forces of the alive rows in contact, per step: the four copies touch the ground together
    f = plain.peak_forces
    assert f.numel() > 0 and f.numel() % 4 == 0 and bool((f > 0).all())
    torch.testing.assert_close(f.reshape(-1, 4), f.reshape(-1, 4)[:, :1].expand(-1, 4), rtol=1e-5, atol=1e-3)
    noisy = estimator_gradients(env, make_estimator("grs:branches=2"), policy, theta0, start, 4, seed=0)
    assert summed_variance(noisy.grads) > 0.02 * float((noisy.grads.mean(0) ** 2).sum())
    assert noisy.stats["envs_triggered"] == 16 and noisy.stats["branches_simulated"] == 32


def test_statistics() -> None:
    g = torch.randn(10, 7, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    assert summed_variance(g) == pytest.approx(float(g.var(0).sum()), rel=1e-12)
    uniform = torch.full((1, 10), 0.1, dtype=torch.float64)  # the "resample" that keeps every row once
    assert float(bootstrap_summed_variance(g, uniform)[0]) == pytest.approx(summed_variance(g), rel=1e-12)
    run = lambda x: EstimatorRun(x, torch.zeros(10), torch.ones(10, dtype=torch.bool), 1.0, 1,  # noqa: E731
                                 {"envs": 10, "envs_triggered": 0, "branches_simulated": 10, "nonfinite_dropped": 0})
    s = summarize({"a": {0: run(g), 1: run(2 * g)}, "b": {0: run(0.5 * g), 1: run(g)}}, "a", bootstrap=200)
    assert s["a"]["ratio"] == 1.0 and s["a"]["ratio_ci"] == [1.0, 1.0]
    assert s["b"]["ratio"] == pytest.approx(0.25) and s["b"]["ratio_ci"] == pytest.approx([0.25, 0.25])
    assert s["b"]["consistency"] == pytest.approx(1.0)  # 2 g and g point the same way
    assert s["a"]["V_ci"][0] < s["a"]["V"] * 1.3 and s["a"]["V_ci"][1] > s["a"]["V"] * 0.5
    assert s["a"]["peak_force_q50_q90_q99_max"] is None  # no forces recorded
    forced = EstimatorRun(g, torch.zeros(10), torch.ones(10, dtype=torch.bool), 1.0, 1, run(g).stats,
                          peak_forces=torch.arange(1.0, 102.0, dtype=torch.float64))
    q = summarize({"a": {0: forced}}, "a", bootstrap=10)["a"]["peak_force_q50_q90_q99_max"]
    assert q == pytest.approx([51.0, 91.0, 100.0, 101.0])
    assert parse_spec("bcg:tau=200.0,aggregation=per_foot,antithetic=True") == (
        "bcg", {"tau": 200.0, "aggregation": "per_foot", "antithetic": True})
    with pytest.raises(ValueError, match="motion 'walk' is neither a packaged clip"):
        make_study_env("walk", 300.0, 2)
    with pytest.raises(ValueError, match="num_envs"):
        VarianceStudy(num_envs=1)
    with pytest.raises(ValueError, match="its dynamics may set kappa only"):
        VarianceStudy(dynamics=Dynamics(kappa=100.0, substeps=2))  # the study's env would ignore the substeps


def test_zeroth_order_reference_points_along_the_autograd_gradient(jump) -> None:
    """On a short smooth window (copies of one state, T = 3) the antithetic zeroth-order estimate of the bias-row
    gradient agrees in direction with autograd's (measured cosine 0.90 with 16 x 8 samples, sigma 0.005;
    a random direction in 29 dimensions gives |cos| ~ 0.19)."""
    env, policy = jump
    start = jittered_copies(start_states(env, 5, 1, 3), 16, 0.0, seed=5)
    theta0 = policy.initial_theta(16)
    g = estimator_gradients(env, make_estimator("bptt"), policy, theta0, start, 3, seed=0).grads[0]
    bias = g[policy.bias_row * 29:(policy.bias_row + 1) * 29]
    zo = zeroth_order_reference(env, policy, theta0, start, 3, sigma=0.005, rounds=8, seed=0).mean((0, 1))
    cos = float(zo @ bias / (zo.norm() * bias.norm()))
    assert cos > 0.8, cos


# measured (jump, kappa 300, 16 environments x 2 seeds, T = 16, reference-target policy; 6 s of CPU): V_bcg / V_bptt
# = 1.018 [0.997, 1.041] (90 % bootstrap), trigger rate 1.8 % of environment-steps. With 32 environments: 1.001
# [0.996, 1.006]; bcg with trigger="always" 1.029 [1.008, 1.053], grs 1.015 [0.999, 1.033] (docs/estimators.md,
# "Variance", where the 64-environment, 32-step benchmark is reported).
CLAIM = dict(clip="jump", dynamics=Dynamics(kappa=300.0), num_envs=16, window=16, seeds=(0, 1), zo_rounds=0,
             bootstrap=500)
REASON = ("measured: on today's simulator bcg leaves the summed per-environment policy-gradient variance at bptt's "
          "(ratio 1.018 [0.997, 1.041] here, 1.00 in the 64-env 32-step benchmark; trigger rate 1-2 %); the variance "
          "across environments comes from their different clip phases, not from contact noise (docs/estimators.md, "
          "Variance)")


@pytest.fixture(scope="module")
def claim_window():
    return run_study(VarianceStudy(**CLAIM), ("bptt", "bcg"))


@pytest.mark.xfail(strict=True, reason=REASON)
def test_bcg_lowers_the_policy_gradient_variance_on_a_stiff_contact_window(claim_window) -> None:
    """The issue's claim: V(bcg) < V(bptt), with the whole 90 % bootstrap interval of the ratio below 0.9."""
    assert claim_window.summary["bcg"]["ratio_ci"][1] < 0.9


def test_measured_variance_ratio_on_the_stiff_contact_window(claim_window) -> None:
    """What is measured instead (the suite notices a change either way): the ratio stays within 10 % of 1 (measured
    1.018), bcg does branch (a trigger rate of 0.5-10 %, measured 1.8 %) and its mean gradient points where bptt's
    does (measured cosine 0.9996 per seed)."""
    s = claim_window.summary
    assert 0.9 < s["bcg"]["ratio"] < 1.1, s["bcg"]["ratio"]
    assert 0.005 < s["bcg"]["trigger_rate"] < 0.1, s["bcg"]["trigger_rate"]
    b = claim_window.runs
    cos = [float(torch.nn.functional.cosine_similarity(b["bcg"][k].grads.mean(0), b["bptt"][k].grads.mean(0), 0))
           for k in CLAIM["seeds"]]
    assert min(cos) > 0.99, cos


@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason=REASON)
def test_bcg_lowers_the_variance_at_the_benchmark_size() -> None:
    """The claim at the benchmark's size (64 environments, T = 32, 3 seeds; minutes of CPU)."""
    ws = run_study(VarianceStudy(clip="jump", dynamics=Dynamics(kappa=300.0), num_envs=64, window=32, seeds=(0, 1, 2),
                                 zo_rounds=0, bootstrap=500), ("bptt", "bcg"))
    assert ws.summary["bcg"]["ratio_ci"][1] < 0.9


# ------------------------------------------------------------------------------------- at a policy that stands

# The final policy of `bcg train --motion run --estimator bcg --max-time-s 1200 --adaptive-start-credit end --seed 2`
# (1856 iterations, 1.66 M samples; `bcg evaluate`: 0 of 8 falls in MuJoCo, E_track 6.2 cm), written by `bcg export`.
STANDING_POLICY = Path(__file__).parent / "data" / "policy_run_shac_bcg.pt"
STANDING = dict(num_envs=16, window=16, seeds=(0, 1), zo_rounds=0, bootstrap=500, confidence=0.9)
STANDING_REASON = ("measured: at a SHAC+BCG policy that runs the whole run clip in MuJoCo, bcg's bundles (on 12 % of "
                   "the environment-steps) leave V where bptt has it: ratio 1.011 [0.988, 1.033] here (90 % "
                   "bootstrap), 1.036 [1.024, 1.046] with 32 environments x 3 seeds, 1.088 [1.030, 1.145] at T = 32; "
                   "every per-environment gradient within 1.5x of the median norm (docs/estimators.md)")


@pytest.fixture(scope="module")
def standing_window():
    """The trained policy's window-return gradients under bptt and bcg, on its own clip, kappa and action map."""
    from bcg.agents.export import load_policy
    from bcg.evaluation.study_variance import CheckpointPolicy, policy_gradients, policy_study_env

    policy = load_policy(STANDING_POLICY)
    env, clip, kappa = policy_study_env(policy, 2 * STANDING["num_envs"])
    study = VarianceStudy(clip=clip, dynamics=Dynamics(kappa=kappa), **STANDING)
    runs = policy_gradients(env, {"bptt": make_estimator("bptt"), "bcg": make_estimator("bcg")},
                            CheckpointPolicy(policy), study)
    return env, policy, runs, summarize(runs, "bptt", bootstrap=study.bootstrap, confidence=study.confidence)


def test_a_trained_policy_is_studied_through_its_own_action_map(standing_window) -> None:
    """The study's env reads the policy's outputs as training did (residuals around the reference, its scale), so
    the policy stays up through every window (through the env's default map, 34-38 % of the windows fell and V was
    5000x larger)."""
    env, policy, _, s = standing_window
    assert env.action_offset == policy.action_offset == "reference"
    assert torch.allclose(torch.as_tensor(env.action_scale, dtype=torch.float64),
                          policy.action_scale.detach().double())
    assert s["bptt"]["fell"] == 0.0 and s["bcg"]["fell"] == 0.0


@pytest.mark.xfail(strict=True, reason=STANDING_REASON)
def test_bcg_lowers_the_variance_at_a_policy_that_stands(standing_window) -> None:
    """The paper's claim at a policy that stands: V(bcg) < V(bptt), the whole 90 % interval of the ratio below 0.9."""
    assert standing_window[3]["bcg"]["ratio_ci"][1] < 0.9


def test_measured_variance_at_a_policy_that_stands(standing_window) -> None:
    """What is measured there: the ratio within 10 % of 1 (measured 1.011), bundles on 10-15 % of the
    environment-steps (measured 11.9 %), no exploding environment (largest per-environment gradient norm 1.42x the
    median for bptt, 1.53x for bcg) and the two mean gradients pointing the same way (cosine > 0.99)."""
    _, _, runs, s = standing_window
    assert 0.9 < s["bcg"]["ratio"] < 1.1, s["bcg"]["ratio"]
    assert 0.10 < s["bcg"]["trigger_rate"] < 0.15, s["bcg"]["trigger_rate"]
    for e in ("bptt", "bcg"):
        q50, _, top = s[e]["grad_norm_q50_q90_max"]
        assert top < 2.0 * q50, (e, q50, top)
    cos = [float(torch.nn.functional.cosine_similarity(runs["bcg"][k].grads.mean(0), runs["bptt"][k].grads.mean(0),
                                                       0)) for k in STANDING["seeds"]]
    assert min(cos) > 0.99, cos  # measured 0.9994, 0.9979


# The final policy of `bcg train --motion jump --estimator bcg --max-time-s 3600 --seed 1` (the default; 7093
# iterations, 3.76 M samples; `bcg evaluate`: 0 of 8 falls in MuJoCo, E_track 8.4 cm), written by `bcg export`.
STANDING_JUMP_POLICY = Path(__file__).parent / "data" / "policy_jump_shac_bcg.pt"


@pytest.mark.slow
def test_bcg_lowers_the_variance_at_the_jump_policy_that_stands() -> None:
    """The paper's claim where it holds here: at a SHAC+BCG policy that stands through the whole jump, 32-step
    windows over 128 environments, bundles cut the heavy tail of bptt's per-environment gradients (the largest 12.7x
    the median, 632 against 49.7; with bundles 269) and V with it: the whole 90 % interval of the ratio below 0.9
    (measured 0.43 [0.30, 0.85] on this seed; 0.35 over two seeds, docs/estimators.md), the median gradient
    untouched (49.4 against 49.7). Bundles sized from the force (2 to 10 branches) cut V as much with well under half
    the fixed bundles' extra simulated rows (over two seeds: 0.35 at 0.36 extra rows per step against 0.95; on this
    seed alone their 90 % interval reaches 0.92, so only the ratio is held to the fixed bundles')."""
    from bcg.agents.export import load_policy
    from bcg.evaluation.study_variance import CheckpointPolicy, policy_gradients, policy_study_env

    policy = load_policy(STANDING_JUMP_POLICY)
    env, clip, kappa = policy_study_env(policy, 256)
    study = VarianceStudy(clip=clip, dynamics=Dynamics(kappa=kappa), num_envs=128, window=32, seeds=(0,),
                          zo_rounds=0, bootstrap=1000, confidence=0.9)
    sized = "bcg:size=sensitivity,min_branches=2"
    runs = policy_gradients(env, {e: make_estimator(e) for e in ("bptt", "bcg", sized)}, CheckpointPolicy(policy),
                            study)
    s = summarize(runs, "bptt", bootstrap=study.bootstrap, confidence=study.confidence)
    print({e: (s[e]["V"], s[e]["ratio"], s[e]["ratio_ci"], s[e]["grad_norm_q50_q90_max"]) for e in s})
    assert s["bcg"]["ratio_ci"][1] < 0.9, s["bcg"]["ratio_ci"]
    (q50_p, _, top_p), (q50_b, _, top_b) = s["bptt"]["grad_norm_q50_q90_max"], s["bcg"]["grad_norm_q50_q90_max"]
    assert top_p > 10 * q50_p and top_b < 0.5 * top_p and abs(q50_b / q50_p - 1) < 0.05
    # sized: measured ratio 0.39 [0.22, 0.92] against the fixed bundles' 0.43 [0.30, 0.85], largest gradient 189
    assert s[sized]["ratio"] < 1.05 * s["bcg"]["ratio"] and s[sized]["grad_norm_q50_q90_max"][2] < 0.5 * top_p
    assert s[sized]["rows_per_step"] - 1 < 0.5 * (s["bcg"]["rows_per_step"] - 1), (s[sized], s["bcg"])
