"""Tests of the motion library (bcg.motion), the packaged clips and the ``bcg motions`` CLI."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from bcg.evaluation.motion_report import validate_motion
from bcg.motion import (
    PACKAGED_MOTIONS,
    Motion,
    MotionFormatError,
    load_motion,
    packaged_motion_path,
    resample_qpos,
)
from bcg.motion.resample import finite_difference_qvel

G1_MOVES = Path(__file__).resolve().parents[1].parent / "shared" / "motions" / "g1_moves"
CSVS = ["B_HandsUp.csv", "M_ShortMove14.csv", "J_ShortDance16_JazzWalk.csv", "B_SpinKarate.csv"]


def _need_g1_moves() -> None:
    if not G1_MOVES.is_dir():
        pytest.skip(f"G1 Moves test clips not found at {G1_MOVES} (../shared/motions/g1_moves)")


@pytest.fixture(scope="module")
def model():
    from bcg.sim import load_model

    return load_model()


def _write_csv(path: Path, qpos: np.ndarray) -> Path:
    rows = np.concatenate([qpos[:, :3], qpos[:, [4, 5, 6, 3]], qpos[:, 7:]], 1)
    np.savetxt(path, rows, delimiter=",", fmt="%.17g")
    return path


def _synthetic(n: int = 31) -> np.ndarray:
    from bcg.robots.g1 import default_qpos

    q = np.tile(default_qpos(), (n, 1))
    t = np.arange(n) / 30.0
    q[:, 0] = 0.5 * t
    yaw = 0.8 * t
    q[:, 3], q[:, 6] = np.cos(yaw / 2), np.sin(yaw / 2)
    q[:, 7 + 3] = 0.3 + 0.2 * np.sin(3 * t)  # left knee
    return q


# -- real data -------------------------------------------------------------------------------------------------


def test_npz_body_positions_match_our_fk(model):
    _need_g1_moves()
    from bcg.sim.reference import forward_kinematics

    data = np.load(G1_MOVES / "B_HandsUp.npz")
    bp = data["body_pos_w"].astype(np.float64)
    q = np.concatenate([bp[:, 0], data["body_quat_w"][:, 0].astype(np.float64),
                        data["joint_pos"].astype(np.float64)], 1)
    kin = forward_kinematics(model, torch.as_tensor(q))
    err = np.abs(kin.pos.numpy() - bp).max()
    assert err < 1e-4, f"forward kinematics differs from body_pos_w by {err} m"
    m = load_motion(G1_MOVES / "B_HandsUp.npz", control_dt=1 / 60, model=model)  # own rate: no resampling
    assert m.num_frames == len(bp)
    assert np.abs(m.body_pos_w.numpy() - bp).max() < 1e-4


@pytest.mark.parametrize("name", CSVS)
def test_load_real_csv_at_60fps(name, model):
    _need_g1_moves()
    path = G1_MOVES / name
    n_rows = sum(1 for _ in path.open())
    m = load_motion(path, fps=60, model=model)
    assert m.num_frames == int(np.floor((n_rows - 1) / 60 / 0.02 + 1e-9)) + 1
    assert m.qpos.shape == (m.num_frames, 36) and m.qvel.shape == (m.num_frames, 35)
    assert m.body_pos_w.shape == (m.num_frames, 30, 3) and m.key_body_pos_w.shape == (m.num_frames, 5, 3)
    assert torch.allclose(m.qpos[:, 3:7].norm(dim=-1), torch.ones(m.num_frames), atol=1e-5)
    first = np.loadtxt(path, delimiter=",", max_rows=1)
    assert np.allclose(m.qpos[0].numpy(), first[[0, 1, 2, 6, 3, 4, 5] + list(range(7, 36))], atol=1e-6)
    same = load_motion(path, format="g1moves", model=model)
    assert torch.equal(same.qpos, m.qpos)


# -- round trips and resampling -------------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", [".npz", ".csv"])
def test_round_trip(tmp_path, model, suffix):
    m = load_motion("jump", model=model)
    path = m.save(tmp_path / f"clip{suffix}")
    back = load_motion(path, fps=m.fps, model=model)
    assert torch.equal(back.qpos, m.qpos)
    assert torch.equal(back.qvel, m.qvel)
    assert np.array_equal(back._qpos64, m._qpos64)


def test_resample_at_own_rate_is_identity(tmp_path, model):
    q = _synthetic()
    assert np.array_equal(resample_qpos(q, 50.0, 0.02), q)
    path = _write_csv(tmp_path / "a.csv", q)
    m = load_motion(path, fps=50, model=model)
    assert np.array_equal(m._qpos64, np.loadtxt(path, delimiter=",")[:, [0, 1, 2, 6, 3, 4, 5] + list(range(7, 36))])


def test_resample_30_to_50_matches_analytic(tmp_path, model):
    q = _synthetic(31)  # 1 s at 30 FPS: x linear, yaw linear, knee sinusoidal
    m = load_motion(_write_csv(tmp_path / "b.csv", q), fps=30, model=model)
    assert m.num_frames == 51 and m.dt == 0.02
    t = np.arange(51) * 0.02
    out = m._qpos64
    assert np.allclose(out[:, 0], 0.5 * t, atol=1e-12)  # linear interpolation of a linear signal is exact
    yaw = 2 * np.arctan2(out[:, 6], out[:, 3])
    assert np.allclose(yaw, 0.8 * t, atol=1e-9)  # slerp of a constant-rate rotation is exact
    src_t = np.arange(31) / 30.0
    assert np.allclose(out[:, 10], np.interp(t, src_t, q[:, 10]), atol=1e-12)


def test_qvel_integrates_back_to_qpos(model):
    m = load_motion("run", model=model)
    q, v, dt = m._qpos64, m.qvel.double().numpy(), m.dt
    # trapezoidal integration of the central-difference velocities reproduces positions and joints
    pos = q[0, :3] + np.concatenate([[np.zeros(3)], np.cumsum(0.5 * dt * (v[1:, :3] + v[:-1, :3]), 0)])
    assert np.abs(pos - q[:, :3]).max() < 0.02
    jnt = q[0, 7:] + np.concatenate([[np.zeros(29)], np.cumsum(0.5 * dt * (v[1:, 6:] + v[:-1, 6:]), 0)])
    assert np.abs(jnt - q[:, 7:]).max() < 0.05
    # body-frame angular velocity: one step of q <- q (x) exp(omega dt / 2) moves q[k] to about q[k+1]
    from bcg.sim.reference import integrate

    qd = torch.as_tensor(v)
    q_next = integrate(torch.as_tensor(q[:-1]), 0.5 * (qd[:-1] + qd[1:]), dt)
    dots = (q_next[:, 3:7] * torch.as_tensor(q[1:, 3:7])).sum(-1).abs()
    assert float(1 - dots.min()) < 1e-5


def test_lookups_batched_and_clamped(model):
    m = load_motion("dance", model=model)
    times = torch.tensor([[-1.0, 0.0, 0.01], [7.5, m.duration, 99.0]])
    qp = m.qpos_at(times)
    assert qp.shape == (2, 3, 36) and m.qvel_at(times).shape == (2, 3, 35)
    assert m.body_pos_at(times).shape == (2, 3, 30, 3) and m.body_quat_at(times).shape == (2, 3, 30, 4)
    assert m.key_body_pos_at(times).shape == (2, 3, 5, 3)
    assert torch.equal(qp[0, 0], m.qpos[0]) and torch.equal(qp[1, 2], m.qpos[-1])
    assert torch.allclose(qp[0, 2, 7:], 0.5 * (m.qpos[0, 7:] + m.qpos[1, 7:]), atol=1e-6)
    assert torch.allclose(m.qpos_at(m.phase_to_time(torch.tensor(0.5))), m.qpos_at(torch.tensor(7.5)))
    assert m.disc_features_at(times).shape == (2, 3, 233)
    t = torch.tensor([3.333], requires_grad=True)
    m.qpos_at(t)[..., 0].sum().backward()
    assert t.grad is not None and torch.isfinite(t.grad).all()
    moved = m.to("cpu")
    assert isinstance(moved, Motion) and torch.equal(moved.qpos, m.qpos)


# -- bad input -----------------------------------------------------------------------------------------------


def test_wrong_column_count(tmp_path, model):
    q = _synthetic(5)
    path = _write_csv(tmp_path / "cols.csv", q)
    lines = path.read_text().splitlines()
    lines[2] = ",".join(lines[2].split(",")[:35])
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(MotionFormatError, match=r"cols\.csv:3: expected 36 .*got 35"):
        load_motion(path, model=model)


def test_nan(tmp_path, model):
    q = _synthetic(5)
    q[3, 12] = np.nan
    with pytest.raises(MotionFormatError, match=r"nan\.csv:4: non-finite value in column"):
        load_motion(_write_csv(tmp_path / "nan.csv", q), model=model)
    np.savez(tmp_path / "nan.npz", qpos=q, fps=30.0)
    with pytest.raises(MotionFormatError, match=r"nan\.npz: array 'qpos' has non-finite values \(first at frame 3\)"):
        load_motion(tmp_path / "nan.npz", model=model)


def test_non_unit_quaternion(tmp_path, model):
    q = _synthetic(5)
    q[2, 3:7] *= 1.2
    with pytest.raises(MotionFormatError, match=r"quat\.csv:3: root quaternion is not unit"):
        load_motion(_write_csv(tmp_path / "quat.csv", q), model=model)


def test_joint_limits_error_or_clip(tmp_path, model):
    q = _synthetic(10)
    q[4, 7 + 3] = 3.2  # left knee beyond 2.8798
    path = _write_csv(tmp_path / "lim.csv", q)
    with pytest.raises(MotionFormatError, match=r"lim\.csv:5: joint left_knee_joint = 3\.2000 rad is outside"):
        load_motion(path, model=model)
    m = load_motion(path, fps=50, clip_joint_limits=True, model=model)
    assert abs(float(m.qpos[4, 10]) - 2.8798) < 1e-4
    assert validate_motion(m).joint_limit_violations == 0


def test_a_joint_margin_keeps_the_clip_inside_its_ranges_and_leaves_the_rest(model):
    _need_g1_moves()
    m = load_motion(G1_MOVES / "B_SpinKarate.csv", model=model)  # holds its ankle rolls at their stops
    rng = np.asarray(model.dof_range)[6:]
    lo, hi = rng[:, 0], rng[:, 1]
    q = m.qpos[:, 7:].double().numpy()
    assert (np.minimum(q - lo, hi - q) < 1e-6).mean() > 0.01
    inside = m.inside_joint_limits(0.05)
    qi = inside.qpos[:, 7:].double().numpy()
    assert np.minimum(qi - lo, hi - qi).min() >= 0.05 - 1e-6
    moved = np.abs(qi - q) > 1e-6
    assert moved.any() and (np.minimum(q - lo, hi - q)[moved] < 0.05).all()  # only joints nearer than the margin
    assert torch.equal(inside.qpos[:, :7], m.qpos[:, :7])  # the root is the clip's
    # velocities and features are the clamped frames': the ankles' bodies move, the pelvis does not
    fd = finite_difference_qvel(inside.qpos.double().numpy(), m.dt)
    assert np.abs(inside.qvel.double().numpy() - fd).max() < 1e-4
    knee = model.body_names.index("left_knee_link")  # above both ankle joints
    assert torch.equal(inside.body_pos_w[:, knee], m.body_pos_w[:, knee])
    foot_moved = (inside.sphere_pos_w - m.sphere_pos_w).norm(dim=-1).max()
    assert 1e-3 < float(foot_moved) < 0.006  # measured 0.0049 m
    assert torch.equal(inside.body_pos_w[:, 0], m.body_pos_w[:, 0])
    assert m.inside_joint_limits(0.0) is m
    # a margin wider than a quarter of a range stops there: the ankle roll (range 0.52 rad) at +-0.131
    wide = m.inside_joint_limits(0.2).qpos[:, 7:].double().numpy()
    assert np.abs(wide[:, 5]).max() <= (hi[5] - lo[5]) / 4 + 1e-6
    with pytest.raises(ValueError, match="margin must be a finite value >= 0"):
        m.inside_joint_limits(-0.1)


def test_the_report_counts_frames_held_at_a_joint_stop(model):
    from bcg.motion.formats import joint_ranges

    q = _synthetic(20)
    lo = joint_ranges()[5, 0]  # left ankle roll
    q[4:10, 7 + 5] = lo + 0.005  # six of 20 frames within 0.01 rad of the stop
    q[12, 7 + 5] = lo + 0.02  # near, not at it
    report = validate_motion(Motion.from_qpos(q, 1 / 30, model=model))
    assert report.at_stop_fraction == pytest.approx(0.3) and report.at_stop_joint_fraction == pytest.approx(0.3)
    assert report.at_stop_joint == "left_ankle_roll_joint" and "frames at a joint stop" in str(report)
    assert validate_motion(Motion.from_qpos(_synthetic(20), 1 / 30, model=model)).at_stop_fraction == 0.0


def test_too_short(tmp_path, model):
    q = _synthetic(10)
    path = _write_csv(tmp_path / "short.csv", q)
    with pytest.raises(MotionFormatError, match=r"short\.csv: the clip lasts 0\.3000 s .*shorter than"):
        load_motion(path, fps=30, min_duration=1.0, model=model)
    with pytest.raises(MotionFormatError, match="at least 2 frames"):
        load_motion(_write_csv(tmp_path / "one.csv", q[:1]), fps=30, model=model)


def test_bad_npz_layout(tmp_path, model):
    np.savez(tmp_path / "x.npz", foo=np.zeros(3))
    with pytest.raises(MotionFormatError, match=r"x\.npz: unknown NPZ layout"):
        load_motion(tmp_path / "x.npz", model=model)
    np.savez(tmp_path / "y.npz", qpos=np.zeros((5, 35)), fps=30.0)
    with pytest.raises(MotionFormatError, match=r"y\.npz: array 'qpos' has shape \(5, 35\)"):
        load_motion(tmp_path / "y.npz", model=model)


# -- packaged clips ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", PACKAGED_MOTIONS)
def test_packaged_clips_pass_validation(name, model):
    path = packaged_motion_path(name)
    assert path.is_file() and path.stat().st_size < 1_000_000
    m = load_motion(name, model=model)
    assert m.num_frames == 751 and abs(m.duration - 15.0) < 1e-9 and m.dt == 0.02
    r = validate_motion(m)
    assert r.joint_limit_violations == 0, str(r)
    assert r.max_stance_slide < 0.02, str(r)
    assert r.max_penetration < 0.005, str(r)
    assert r.passed
    if name == "run":
        assert 2.0 <= r.mean_horizontal_speed <= 3.0 and r.flight_fraction > 0.2 and r.num_flight_phases > 20
    if name == "jump":
        assert r.num_flight_phases >= 8
        assert 0.15 <= r.pelvis_height_max - float(m.qpos[0, 2]) <= 0.3
    if name in ("fight", "dance"):
        assert r.single_support_fraction > 0.1 and r.flight_fraction == 0.0
    if name == "dance":
        assert r.yaw_travel > np.pi


def test_unknown_packaged_name():
    with pytest.raises(KeyError, match="available: run, jump, fight, dance"):
        packaged_motion_path("walk")


def test_generator_is_deterministic():
    from bcg.robots.g1.motions import generate as gen

    a = gen.run_plan()
    b = gen.run_plan()
    assert np.array_equal(a.foot_pos, b.foot_pos) and np.array_equal(a.upper, b.upper)


@pytest.mark.slow
def test_generator_reproduces_packaged_clips(tmp_path):
    from bcg.robots.g1.motions import generate as gen

    for name in PACKAGED_MOTIONS:
        new = np.load(gen.generate(name, out_dir=tmp_path, verbose=False))["qpos"]
        old = np.load(packaged_motion_path(name))["qpos"]
        assert np.array_equal(new, old), name


# -- CLI -----------------------------------------------------------------------------------------------------


def test_cli_list(capsys):
    from bcg.cli import main

    assert main(["motions", "list"]) == 0
    out = capsys.readouterr().out
    assert all(n in out for n in PACKAGED_MOTIONS)


def test_cli_inspect(capsys):
    from bcg.cli import main

    assert main(["motions", "inspect", "fight"]) == 0
    out = capsys.readouterr().out
    assert "left_knee_joint" in out and "stance-foot sliding" in out and "PASS" in out


def test_cli_plot(tmp_path, capsys):
    from bcg.cli import main

    out = tmp_path / "jump.png"
    assert main(["motions", "plot", "jump", "--out", str(out), "--no-render"]) == 0
    assert out.is_file() and out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_help(capsys):
    from bcg.cli import main

    assert main([]) == 0
    assert "motions" in capsys.readouterr().out


# -- file problems a user hits -------------------------------------------------------------------------------


def test_empty_truncated_and_binary_files_name_the_file(tmp_path, model):
    (tmp_path / "empty.npz").write_bytes(b"")
    with pytest.raises(MotionFormatError, match=r"empty\.npz: the file is empty"):
        load_motion(tmp_path / "empty.npz", model=model)
    good = load_motion("jump", model=model).save(tmp_path / "good.npz").read_bytes()
    (tmp_path / "cut.npz").write_bytes(good[: len(good) // 2])
    with pytest.raises(MotionFormatError, match=r"cut\.npz: .*(truncated|cannot be read)"):
        load_motion(tmp_path / "cut.npz", model=model)
    (tmp_path / "bin.csv").write_bytes(good)  # an NPZ (zip) passed as CSV
    with pytest.raises(MotionFormatError, match=r"bin\.csv: not a (UTF-8 )?text CSV"):
        load_motion(tmp_path / "bin.csv", model=model)
    (tmp_path / "latin.csv").write_bytes(b"\xff\xfe1,2,3\n")
    with pytest.raises(MotionFormatError, match=r"latin\.csv: not a UTF-8 text CSV"):
        load_motion(tmp_path / "latin.csv", model=model)


def test_unknown_name_lists_packaged_clips(model):
    with pytest.raises(FileNotFoundError, match=r"'walk' is neither a packaged clip \(run, jump, fight, dance\)"):
        load_motion("walk", model=model)


def test_csv_rate_from_declaration_name_or_refusal(tmp_path, model):
    q = _synthetic(31)
    plain = _write_csv(tmp_path / "clip.csv", q)
    with pytest.raises(MotionFormatError, match=r"clip\.csv: cannot tell the frame rate.*fps=30 / fps=60"):
        load_motion(plain, model=model)
    assert load_motion(plain, format="lafan1", model=model).num_frames == 51  # 1 s at 30 FPS -> 51 frames
    assert load_motion(plain, format="g1moves", model=model).num_frames == 26  # 0.5 s at 60 FPS
    lafan = _write_csv(tmp_path / "walk1_subject5.csv", q)
    g1moves = _write_csv(tmp_path / "B_Wave.csv", q)
    assert load_motion(lafan, model=model).num_frames == 51
    assert load_motion(g1moves, model=model).num_frames == 26
    declared = tmp_path / "declared.csv"
    declared.write_text("# fps: 60\n" + plain.read_text())
    assert load_motion(declared, model=model).num_frames == 26
    header = tmp_path / "header.csv"
    header.write_text(",".join(f"c{i}" for i in range(36)) + "\n" + plain.read_text())
    assert load_motion(header, fps=30, model=model).num_frames == 51
    # Motion.save writes the rate, so a saved CSV loads back alone
    m = load_motion(plain, fps=30, model=model)
    back = load_motion(m.save(tmp_path / "saved.csv"), model=model)
    assert torch.equal(back.qpos, m.qpos)


def test_real_g1_moves_csv_detected_at_60fps(model):
    _need_g1_moves()
    auto = load_motion(G1_MOVES / "B_HandsUp.csv", model=model)
    assert torch.equal(auto.qpos, load_motion(G1_MOVES / "B_HandsUp.csv", fps=60, model=model).qpos)


# -- rotations, kinematics and features -------------------------------------------------------------------------


def test_matrix_to_quat_matches_scipy_and_round_trips():
    from scipy.spatial.transform import Rotation

    from bcg.motion.rotations import matrix_to_quat_wxyz, quat_to_matrix_wxyz

    R = Rotation.random(500, random_state=0)
    mats = np.concatenate([R.as_matrix(), np.eye(3)[None], np.diag([1.0, -1, -1])[None], np.diag([-1.0, 1, -1])[None]])
    q = matrix_to_quat_wxyz(torch.as_tensor(mats)).numpy()
    ref = Rotation.from_matrix(mats).as_quat()[:, [3, 0, 1, 2]]
    ref *= np.where(ref[:, :1] < 0, -1.0, 1.0)
    assert np.abs(np.abs((q * ref).sum(1)) - 1).max() < 1e-12  # same rotation
    back = quat_to_matrix_wxyz(torch.as_tensor(q)).numpy()
    assert np.abs(back - mats).max() < 1e-12 and (q[:, 0] >= 0).all()


def test_fast_kinematics_matches_reference_oracle(model):
    from bcg.motion.kinematics import KinematicsFn
    from bcg.sim.reference import forward_kinematics

    q = torch.as_tensor(load_motion("dance", model=model)._qpos64[::50])
    q = q + torch.cat([torch.zeros(len(q), 7), 0.3 * torch.randn(len(q), 29, generator=torch.Generator().manual_seed(0),
                                                                    dtype=torch.float64)], 1)
    fast, ref = KinematicsFn(model, torch.float64)(q), forward_kinematics(model, q)
    assert (fast.rot - ref.rot).abs().max() < 1e-12 and (fast.pos - ref.pos).abs().max() < 1e-12


def test_disc_features_match_mujoco_recomputation(model, g1_mj):
    """Every block of the 233-D ADD features against MuJoCo kinematics and scipy rotations (docs/method.md §6.3)."""
    import mujoco
    from scipy.spatial.transform import Rotation

    from bcg.robots.g1 import KEY_BODIES

    m = load_motion("fight", model=model)
    frames = np.array([0, 123, 500])
    phi = m.disc_features_at(torch.as_tensor(frames * m.dt)).double().numpy()
    assert phi.shape == (3, 233)
    d = mujoco.MjData(g1_mj)
    axes = np.array([g1_mj.jnt_axis[g1_mj.body_jntadr[b]] for b in range(2, g1_mj.nbody)])
    for row, f in zip(phi, frames, strict=True):
        qpos, qvel = m._qpos64[f], m.qvel[f].double().numpy()
        d.qpos[:] = qpos
        mujoco.mj_kinematics(g1_mj, d)
        R0 = d.xmat[1].reshape(3, 3)
        jrot = Rotation.from_rotvec(axes * qpos[7:, None]).as_matrix()
        keys = np.stack([d.xpos[g1_mj.body(k.body).id] + d.xmat[g1_mj.body(k.body).id].reshape(3, 3) @ k.offset
                         for k in KEY_BODIES])
        expected = np.concatenate([
            qpos[:3], R0[:, 0], R0[:, 2], np.concatenate([jrot[:, :, 0], jrot[:, :, 2]], 1).ravel(),
            (keys - qpos[:3]).ravel(), qvel[:3], R0 @ qvel[3:6], qvel[6:],
        ])
        assert np.abs(row - expected).max() < 2e-5, np.abs(row - expected).max()


def test_features_at_frames_equal_the_table(model):
    m = load_motion("jump", model=model)
    frames = torch.tensor([0, 17, 400, 750])
    f = m.features_at(frames.double() * m.dt)
    for a, b in zip(f, m.features.rows(frames), strict=True):
        assert torch.allclose(a, b, atol=2e-5)


def test_bytes_that_are_no_archive_are_not_called_a_pickle(tmp_path, model):
    """Random bytes in a .npz were reported as 'pickled (object) data' (numpy's guess for anything not zip / npy)."""
    (tmp_path / "noise.npz").write_bytes(np.random.default_rng(0).bytes(2000))
    with pytest.raises(MotionFormatError, match=r"noise\.npz: not an NPZ archive \(it does not start with the") as e:
        load_motion(tmp_path / "noise.npz", model=model)
    assert "pickle" not in str(e.value)
    np.save(tmp_path / "one.npy", np.zeros((3, 36)))
    (tmp_path / "one.npy").rename(tmp_path / "one.npz")
    with pytest.raises(MotionFormatError, match=r"one\.npz: holds a single \.npy array"):
        load_motion(tmp_path / "one.npz", model=model)


@pytest.mark.parametrize("declared", ["-50", "0", "abc", "nan"])
def test_a_bad_declared_rate_is_named_not_called_missing(tmp_path, model, declared):
    """'# fps: -50' was skipped by the declaration's pattern and reported as 'cannot tell the frame rate'."""
    path = tmp_path / "clip.csv"
    path.write_text(f"# fps: {declared}\n" + _write_csv(tmp_path / "plain.csv", _synthetic(5)).read_text())
    with pytest.raises(MotionFormatError, match=rf"clip\.csv:1: declares fps '{declared}'; expected a frame rate > 0"):
        load_motion(path, model=model)


def test_a_folder_or_a_bad_rate_argument_is_a_user_error(tmp_path, model):
    from bcg.errors import InputNotFoundError, UserError

    (tmp_path / "d.csv").mkdir()
    with pytest.raises(InputNotFoundError, match=r"d\.csv' is a folder; expected a packaged clip"):
        load_motion(tmp_path / "d.csv", model=model)
    with pytest.raises(UserError, match=r"frame rate must be a finite value > 0 \[Hz\], got 0"):
        load_motion(_write_csv(tmp_path / "a.csv", _synthetic(5)), fps=0, model=model)
    with pytest.raises(InputNotFoundError):  # still a FileNotFoundError for callers that catch that
        load_motion("walk", model=model)
