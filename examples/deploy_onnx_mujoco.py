"""Run an exported ONNX policy in MuJoCo the way a deployment stack would (docs/deploy.md).

    bcg export runs/my-run --format onnx                       # writes runs/my-run/policy.onnx
    python examples/deploy_onnx_mujoco.py runs/my-run/policy.onnx --seconds 5

Everything the loop needs comes from the ONNX file: its metadata (control period, substeps, physics step, MJCF hash,
clip, whether the policy takes the reference joint positions) and its graph (observation -> PD joint targets, the
normaliser and the action map inside). From `bcg` it uses only the observation function
(`bcg.envs.TrackingObservation`), plus the packaged G1 scene and clip it was trained on. The PD law, torque limits
and contacts are MuJoCo's own: the scene's position actuators carry the policy's gains.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

import mujoco
import numpy as np
import onnxruntime as ort
import torch

from bcg.envs import TrackingObservation
from bcg.motion import load_motion
from bcg.robots import g1

FALL_HEIGHT = 0.3
"""Pelvis height [m] below which the robot counts as fallen."""


def start_state(model: mujoco.MjModel, data: mujoco.MjData, qpos: np.ndarray, qvel: np.ndarray) -> None:
    """Put ``data`` at the reference state ``qpos`` [36], ``qvel`` [35], lifted so no foot sphere is below z = 0."""
    mujoco.mj_resetData(model, data)
    data.qpos[:], data.qvel[:] = qpos, qvel
    mujoco.mj_kinematics(model, data)
    spheres = [mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_GEOM, f"{side}_foot_sphere_{k}")
               for side in ("left", "right") for k in range(4)]
    lowest = float(np.min(data.geom_xpos[spheres, 2] - model.geom_size[spheres, 0]))
    data.qpos[2] += max(0.0, -lowest)


def run(policy_path: str | Path, seconds: float = 5.0, start_frame: int = 0) -> dict:
    """One episode of the ONNX policy in MuJoCo from the clip's reference state at ``start_frame``; returns the
    pelvis positions [T + 1, 3], the PD targets [T, 29], how many control steps ran and whether the robot fell."""
    session = ort.InferenceSession(str(policy_path), providers=["CPUExecutionProvider"])
    meta = json.loads(session.get_modelmeta().custom_metadata_map["bcg"])
    if hashlib.sha256(g1.MJCF_PATH.read_bytes()).hexdigest() != meta["mjcf_sha256"]:
        raise SystemExit(f"{policy_path} was trained on another robot model ({meta['mjcf_file']})")
    input_names = [i.name for i in session.get_inputs()]

    model = mujoco.MjModel.from_xml_path(str(g1.SCENE_PATH))  # position actuators: kp, kd, torque limits
    model.opt.timestep = meta["sim_dt"]
    data = mujoco.MjData(model)
    motion = load_motion(meta["motion"]["name"])
    observe = TrackingObservation(motion, meta["ref_steps"])
    ref_qpos = motion.qpos.numpy()
    start_state(model, data, np.float32(ref_qpos[start_frame]), np.float32(motion.qvel.numpy()[start_frame]))

    frame, pelvis, targets_log = start_frame, [data.qpos[:3].copy()], []
    steps = min(int(round(seconds / meta["control_dt"])), motion.num_frames - 1 - start_frame)
    fell = False
    for _ in range(steps):
        obs = observe(data.qpos[None], data.qvel[None], torch.tensor([frame])).numpy()
        feed = {"obs": obs}
        if "reference_joint_pos" in input_names:  # residual policy: the reference at the frame this step lands on
            feed["reference_joint_pos"] = ref_qpos[None, frame + 1, 7:]
        targets = session.run(["joint_pos_targets"], feed)[0][0]
        data.ctrl[:] = targets  # held for the control period
        mujoco.mj_step(model, data, nstep=meta["substeps"])
        frame += 1
        pelvis.append(data.qpos[:3].copy())
        targets_log.append(targets)
        if data.qpos[2] < FALL_HEIGHT:
            fell = True
            break
    return {"pelvis": np.array(pelvis), "targets": np.array(targets_log), "steps": len(targets_log), "fell": fell,
            "control_dt": meta["control_dt"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("policy", help="an ONNX file written by `bcg export RUN --format onnx`")
    ap.add_argument("--seconds", type=float, default=5.0, help="longest episode [s]")
    ap.add_argument("--start-frame", type=int, default=0, help="clip frame the episode starts at")
    args = ap.parse_args()
    out = run(args.policy, args.seconds, args.start_frame)
    end = "fell" if out["fell"] else "still up"
    print(f"ran {out['steps']} control steps ({out['steps'] * out['control_dt']:.2f} s), {end}; "
          f"final pelvis height {out['pelvis'][-1, 2]:.3f} m")


if __name__ == "__main__":
    main()
