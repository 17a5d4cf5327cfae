"""Deviation termination (bcg.envs.termination): each rule fires just above its threshold and not below, None turns
it off, the env composes the rules with its own fall and distance rules, and SHAC bootstraps a row terminated by a
rule with a zero value and no critic term in the actor loss."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from test_env_common import write_synthetic_motion

from bcg.agents.shac import SHAC, SHACConfig
from bcg.envs.config import EnvConfig
from bcg.envs.termination import END_EFFECTORS, DeviationTermination, projected_gravity_z
from bcg.envs.vector_env import G1TrackingVectorEnv


@pytest.fixture(scope="module")
def motion_path(tmp_path_factory: pytest.TempPathFactory):
    return write_synthetic_motion(tmp_path_factory.mktemp("motion") / "syn.npz", seconds=1.0)


@pytest.fixture(scope="module")
def ref(motion_path):
    env = G1TrackingVectorEnv(1, str(motion_path))
    return env.ref_features(torch.arange(env.num_frames))


def rot_x(angle: float) -> torch.Tensor:
    c, s = math.cos(angle), math.sin(angle)
    return torch.tensor([[1.0, 0.0, 0.0], [0.0, c, -s], [0.0, s, c]])


def shifted(ref, frame: torch.Tensor, root_dz=0.0, tilt=0.0, ee: int | None = None, ee_dz=0.0):
    """The reference features at ``frame`` with the pelvis raised by ``root_dz``, tilted by ``tilt`` [rad] about
    the world x axis, and key point ``ee`` raised by ``ee_dz``."""
    f = ref.rows(frame)
    key = f.key_pos_w.clone()
    if ee is not None:
        key[:, ee, 2] += ee_dz
    return f._replace(root_pos_w=f.root_pos_w + torch.tensor([0.0, 0.0, root_dz]),
                      root_rot_w=rot_x(tilt) @ f.root_rot_w, key_pos_w=key)


def test_end_effectors_are_the_ankles_and_wrists(ref) -> None:
    from bcg.robots.g1 import KEY_BODIES

    rules = DeviationTermination(ref, end_effector_height=0.25)
    assert [KEY_BODIES[i].name for i in rules.end_effectors.tolist()] == list(END_EFFECTORS)
    assert "head" not in END_EFFECTORS


def test_each_rule_fires_just_above_its_threshold(ref) -> None:
    frame = torch.tensor([3, 17, 40])
    off = DeviationTermination(ref)
    assert not off.active and not off(shifted(ref, frame, root_dz=5.0, tilt=3.0), frame).any()
    anchor = DeviationTermination(ref, anchor_height=0.25)
    assert anchor.active
    assert anchor(shifted(ref, frame, root_dz=0.26), frame).all()
    assert not anchor(shifted(ref, frame, root_dz=-0.24), frame).any()
    assert not anchor(shifted(ref, frame, tilt=2.0, ee=0, ee_dz=1.0), frame).any()  # other deviations: not its rule
    # gravity: the synthetic reference stands upright, so a tilt t changes the projected gravity's z by 1 - cos t
    assert torch.allclose(projected_gravity_z(ref.root_rot_w[frame]), torch.full((3,), -1.0), atol=1e-6)
    gravity = DeviationTermination(ref, gravity_z=0.8)
    t_edge = math.acos(1.0 - 0.8)
    assert gravity(shifted(ref, frame, tilt=t_edge + 0.01), frame).all()
    assert not gravity(shifted(ref, frame, tilt=t_edge - 0.01), frame).any()
    assert not gravity(shifted(ref, frame, root_dz=1.0), frame).any()
    ee = DeviationTermination(ref, end_effector_height=0.25)
    for k in range(5):  # every ankle and wrist, never the head (key point 2)
        hit = ee(shifted(ref, frame, ee=k, ee_dz=-0.26), frame)
        assert hit.all() if k != 2 else not hit.any()
        assert not ee(shifted(ref, frame, ee=k, ee_dz=0.24), frame).any()
    both = DeviationTermination(ref, anchor_height=0.25, end_effector_height=0.25)
    rows = shifted(ref, frame, root_dz=0.3)
    rows = rows._replace(root_pos_w=torch.where(torch.tensor([[True], [False], [False]]), rows.root_pos_w,
                                                ref.root_pos_w[frame]))
    rows.key_pos_w[1, 3, 2] += 0.3
    assert both(rows, frame).tolist() == [True, True, False]


@pytest.mark.parametrize("name", ["anchor_height", "gravity_z", "end_effector_height"])
def test_bad_thresholds_are_refused(ref, name: str) -> None:
    for bad in (0.0, -0.1, float("nan"), True):
        with pytest.raises(ValueError, match=name):
            DeviationTermination(ref, **{name: bad})
    with pytest.raises(ValueError, match="termination_gravity_z"):
        EnvConfig.from_kwargs(termination_gravity_z=-1.0)


def test_env_terminates_a_deviating_row_with_its_other_rules(motion_path) -> None:
    """The pelvis 0.3 m above the reference: no fall and no key body 1 m away, so only the anchor rule ends it."""
    def run(**kw):
        env = G1TrackingVectorEnv(3, str(motion_path), action_offset="reference", **kw)
        env.reset(seed=0)
        s = env.state
        frame = torch.tensor([5, 10, 15])
        q = env.starts.table()[0][frame].clone()
        q[1, 2] += 0.3
        q[2, 2] = 0.1  # a fall
        env.load_state(dataclasses.replace(s, q=q, qd=env.starts.table()[1][frame], frame=frame))
        return env.step(torch.zeros(3, 29))

    _, _, term, _, info = run(termination_anchor_height=0.25)
    assert term.tolist() == [False, True, True] and info["fell"].tolist() == [False, False, True]
    _, _, term, _, _ = run()  # without the rule only the fall ends an episode (the one-launch path)
    assert term.tolist() == [False, False, True]


def test_shac_bootstraps_deviation_terminations_with_zero() -> None:
    """An anchor-height rule of 1 mm ends every episode at every step (no fall, no time-out): every next value is 0
    and the actor loss is the discounted rewards alone (no critic is asked for a bootstrap). Without the rule the
    window end bootstraps from the critics."""
    from test_shac import standing_motion

    def window(**env_kw):
        cfg = SHACConfig(num_envs=3, horizon=4, actor_hidden=(16,), critic_hidden=(16,), critic_iterations=1,
                         init_action_std=0.02)
        agent = SHAC(cfg, EnvConfig.from_kwargs(motion_file=standing_motion(1.0), action_offset="reference", **env_kw),
                     seed=1)
        asked = []
        mean = agent.target_critics.mean
        agent.target_critics.mean = lambda x: asked.append(x.shape[0]) or mean(x)
        step = agent.env.step
        seen = []
        agent.env.step = lambda a: seen.append(step(a)) or seen[-1]
        w = agent._rollout(*agent._begin_window())
        return agent, w, seen, asked

    _, w, seen, asked = window(termination_anchor_height=1e-3)
    assert all(s[2].all() and not s[4]["fell"].any() and not s[3].any() for s in seen)  # terminated by the rule
    assert torch.equal(w.next_values, torch.zeros(4, 3)) and asked == []
    raw = torch.stack([s[1] for s in seen]).detach()  # [N, E] (the return normalisation is undone in the loss)
    assert torch.allclose(w.actor_loss.detach(), -raw.sum() / 12, rtol=1e-5)  # one-step segments, no bootstrap
    _, w_off, seen_off, asked_off = window()
    assert not any(s[2].any() for s in seen_off)
    assert asked_off == [3] and (w_off.next_values != 0).all()
