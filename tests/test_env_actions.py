"""The action map's two offsets: absolute targets around the default pose, and residuals on the reference."""

import pytest
import torch

from bcg.envs import EnvConfig, G1TrackingVectorEnv


def _env(offset: str, n: int = 4) -> G1TrackingVectorEnv:
    env = G1TrackingVectorEnv(n, "jump", action_offset=offset)
    env.reset(seed=3)
    return env


def test_zero_residual_targets_the_next_reference_frame():
    env = _env("reference")
    ref_next = env.ref_features(env.state.frame + 1).joint_pos
    targets = env.action_to_target(torch.zeros(env.num_envs, 29))
    assert (targets - ref_next).abs().max() < 1e-6  # q_default + (q_ref - q_default): float32 rounding only
    # after a reset the previous action is the one that holds the reference: zero (no randomised offsets)
    assert env.state.prev_actions.abs().max() < 1e-6
    a = torch.randn(env.num_envs, 29, generator=torch.Generator().manual_seed(0))
    assert torch.allclose(env.target_to_action(env.action_to_target(a)), a, atol=1e-4)


def test_residual_step_equals_the_default_map_with_the_same_targets():
    res, dflt = _env("reference"), _env("default")
    assert torch.equal(res.state.q, dflt.state.q) and torch.equal(res.state.frame, dflt.state.frame)
    # small residuals, so that the default map (whose reach is the joint range) reaches the same targets
    a = 0.1 * torch.randn(res.num_envs, 29, generator=torch.Generator().manual_seed(1))
    targets = res.action_to_target(a)
    a_default = dflt.target_to_action(targets)
    assert (dflt.action_to_target(a_default) - targets).abs().max() < 1e-5
    res.step(a)
    dflt.step(a_default)
    # same PD targets up to float32 rounding of the two maps (measured 1.2e-7 in q after one control step)
    assert (res.state.q - dflt.state.q).abs().max() < 1e-6


def test_action_offset_is_checked():
    with pytest.raises(ValueError, match="action_offset must be 'default' or 'reference'"):
        EnvConfig(action_offset="residual")


def test_torque_action_scale_asks_the_same_torque_fraction_of_every_joint():
    import numpy as np

    from bcg.agents.train import TrainConfig
    from bcg.envs.actions import torque_action_scale
    from bcg.robots import g1

    s = torque_action_scale(g1.KP, g1.TORQUE_LIMITS, 0.5)
    np.testing.assert_allclose(g1.KP * s, 0.5 * g1.TORQUE_LIMITS)  # a full action: half the limit from the PD
    knee = g1.JOINT_NAMES.index("left_knee_joint")
    assert s[knee] == pytest.approx(0.5 * 139.0 / 200.0)
    with pytest.raises(ValueError, match="fraction"):
        torque_action_scale(g1.KP, g1.TORQUE_LIMITS, 0.0)
    with pytest.raises(ValueError, match="positive"):
        torque_action_scale(-g1.KP, g1.TORQUE_LIMITS, 0.5)
    cfg = TrainConfig(action_scale_torque=0.5).env_config()
    np.testing.assert_allclose(cfg.action_scale, s)
    with pytest.raises(ValueError, match="action_scale_torque"):
        TrainConfig(action_scale_torque=-1.0)


def test_clip_action_map_offsets_and_inverse():
    """ClipActionMap alone: a zero action holds the default pose plus the joint offset, or (reference) the clip's
    joints at the frame the step lands on (clamped at the clip's end); to_action inverts to_target; a bad offset is
    refused."""
    from bcg.envs.actions import ActionMap, ClipActionMap

    g = torch.Generator().manual_seed(0)
    default, scale = torch.randn(29, generator=g), torch.full((29,), 0.5)
    ref = torch.randn(10, 29, generator=g)  # a 10-frame clip
    offset = 0.01 * torch.randn(3, 29, generator=g)
    frame = torch.tensor([0, 4, 9])
    zero = torch.zeros(3, 29)
    default_map = ClipActionMap(ActionMap(default, scale), "default", ref)
    assert torch.allclose(default_map.to_target(zero, offset, frame), default + offset)
    residual = ClipActionMap(ActionMap(default, scale), "reference", ref)
    want = ref[torch.tensor([1, 5, 9])] + offset  # frame + 1, the last one clamped to the clip
    assert torch.allclose(residual.to_target(zero, offset, frame), want, atol=1e-6)
    a = 0.7 * torch.randn(3, 29, generator=g)
    for m in (default_map, residual):
        assert torch.allclose(m.to_action(m.to_target(a, offset, frame), offset, frame), a, atol=1e-4)
    with pytest.raises(ValueError, match="'default' or 'reference'"):
        ClipActionMap(ActionMap(default, scale), "absolute", ref)
