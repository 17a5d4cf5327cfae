"""``bcg study sensitivity``: branch against bundle at a landing. Per-branch sensitivities of the pelvis's vertical
velocity to its height across the clip's first touchdown, their bundle mean, and a PCA of the branches' state
gradients with a 95 % ellipse (``sensitivity.json``, ``study_sensitivity.png``).
"""

from __future__ import annotations

import dataclasses
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bcg.evaluation.report import pyplot, save_figure, style_axis
from bcg.evaluation.study_variance import _json_safe

__all__ = ["StudySensitivity", "branch_sensitivities", "landing_start_frames", "sensitivity_plot", "touchdown_frame",
           "touchdown_frames"]


@dataclass(frozen=True)
class StudySensitivity:
    """Branch versus bundle (contact-local averaging, docs/method.md §3.10): per-branch sensitivities of the future
    vertical pelvis velocity to the pelvis height, dv_z(t+T)/dp_z(t), against their mean, and a PCA of the branches'
    full state-gradient vectors with a 95 % ellipse; one panel pair per kappa."""

    clip: str | None = None
    """Clip: run, jump, fight, dance, or a motion file (as bcg train --motion); None: jump, or the policy's own clip
    with --policy."""
    kappas: tuple[float, ...] | None = None
    """Contact stiffnesses [1/m] (one row of panels each); None: 50 and 300, or the policy's own with --policy."""
    policy: Path | None = None
    """A trained policy that acts in every branch (a bcg train run directory, its policy.pt, or a bcg export torch
    file), read through its own action map and dynamics as bcg evaluate replays it; None: the reference-target
    policy. The sensitivities then include the policy's feedback, as the training gradient does."""
    branches: int = 64
    """B, perturbed branches from the start state."""
    window: int = 8
    """T, control steps from the perturbation to the velocity measured."""
    sigma_q: float = 0.02
    """Standard deviation of the hinge-angle perturbation [rad] (the bcg estimator's joint_gaussian law)."""
    sigma_qd: float = 0.05
    """Standard deviation of the hinge-rate perturbation [rad/s]."""
    frame: int | None = None
    """Start frame (control step) of the window (None: window // 2 steps before a touchdown after a flight phase of
    the clip, so that the window spans the landing, for each of --landings; a clip without flight: frame 0)."""
    landings: int = 1
    """Without --frame: how many of the clip's landings to measure, from the first (one row of panels each)."""
    seed: int = 0
    """Seed of the perturbations."""
    out: Path = Path("runs/study_sensitivity")
    """Output folder: sensitivity.json, study_sensitivity.png, sensitivity.md."""

    def run(self) -> int:
        from bcg.errors import UserError
        from bcg.motion.formats import motion_sha256

        try:
            policy = None if self.policy is None else load_torch_policy(self.policy)
            clip, kappas = self._clip_and_kappas(policy)
            if self.branches < 3 or self.window < 1 or self.landings < 1 or not kappas:
                raise UserError(f"need branches >= 3, window >= 1, landings >= 1 and one kappa at least, got "
                                f"{self.branches}, {self.window}, {self.landings}, {list(kappas)}")
            entries = []
            for k in kappas:
                env, actor = _study_env_and_actor(clip, float(k), policy)
                frames = [self.frame] if self.frame is not None else \
                    landing_start_frames(env.motion, self.window, self.landings, env.num_frames)
                entries += [_sensitivities_at(env, actor, float(k), f, self.branches, self.window, self.sigma_q,
                                              self.sigma_qd, self.seed) for f in frames]
        except (UserError, ValueError) as exc:
            print(f"bcg study sensitivity: error: {exc}", file=sys.stderr)
            return 2
        self.out.mkdir(parents=True, exist_ok=True)
        actor = "the reference-target policy" if policy is None else f"the policy {self.policy}"
        data = {"clip": clip, "clip_sha256": motion_sha256(clip), "frame": entries[0]["frame"],
                "frames": list(dict.fromkeys(e["frame"] for e in entries)), "branches": self.branches,
                "window": self.window, "sigma_q": self.sigma_q, "sigma_qd": self.sigma_qd, "seed": self.seed,
                "policy": None if self.policy is None else str(self.policy),
                "entries": [{k: v for k, v in e.items() if k != "grads"} for e in entries]}
        (self.out / "sensitivity.json").write_text(json.dumps(_json_safe(data), indent=1) + "\n")
        png = sensitivity_plot(entries, self.out / "study_sensitivity.png", self.window)
        lines = ["# Branch versus bundle sensitivity", "",
                 f"`{clip}` from frame {', '.join(str(f) for f in data['frames'])}, {self.branches} branches "
                 "perturbed at t (hinges "
                 f"N(0, {self.sigma_q:g}^2) rad, "
                 f"rates N(0, {self.sigma_qd:g}^2) rad/s), each differentiated through T = {self.window} steps of "
                 f"{actor}; s = dv_z(t+T)/dp_z(t) [1/s]. The bundle's (first-order smoothed) "
                 "gradient is the branches' mean. Gradient spread: RMS distance of the branches' full state-gradient "
                 "vectors d v_z(t+T) / d(q, qd) from their mean.", "", "![sensitivity](study_sensitivity.png)", "",
                 "| kappa | frame | nominal s | bundle mean s | branch std | branch min | branch max | "
                 "gradient spread | PC1 share |",
                 "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for e in entries:
            lines.append(f"| {e['kappa']:g} | {e['frame']} | {e['nominal']:.3g} | {e['mean']:.3g} | {e['std']:.3g} | "
                         f"{min(e['branch']):.3g} | {max(e['branch']):.3g} | {e['spread']:.3g} | "
                         f"{e['pc_share'][0]:.2f} |")
        (self.out / "sensitivity.md").write_text("\n".join(lines) + "\n")
        print("\n".join(lines[-len(entries) - 2:]))
        print(f"wrote {self.out / 'sensitivity.json'}, {self.out / 'sensitivity.md'}, {png}")
        return 0

    def _clip_and_kappas(self, policy: Any) -> tuple[str, tuple[float, ...]]:
        """The clip and stiffnesses studied: the options given, else the policy's own (its clip, with the file's
        hash checked, and the kappa it was trained at), else jump at 50 and 300 [1/m]."""
        if policy is None:
            return self.clip or "jump", tuple(self.kappas or (50.0, 300.0))
        from bcg.evaluation.evaluate_cli import policy_motion
        from bcg.evaluation.study_variance import policy_kappa

        return self.clip or policy_motion(policy.motion), tuple(self.kappas or (policy_kappa(policy),))


def load_torch_policy(path: Path) -> Any:
    """The exported torch policy of a run directory (its policy.pt) or a policy file; a missing path, a directory
    without policy.pt and a file that is not a torch policy raise :class:`~bcg.errors.UserError` subclasses."""
    from bcg.agents.export import load_policy
    from bcg.errors import InputNotFoundError
    from bcg.evaluation.study_variance import require_policy_source

    require_policy_source(path)
    if path.is_dir():
        if not (path / "policy.pt").is_file():
            raise InputNotFoundError(f"{path} is a directory without policy.pt (`bcg export RUN` writes it)")
        path = path / "policy.pt"
    return load_policy(path)


def touchdown_frames(motion: Any, min_flight: int = 3) -> list[int]:
    """Every frame with a foot in contact after at least ``min_flight`` frames with neither (the landings of the
    clip's flight phases; a lone contact-free frame is not a flight), in order. Jump: frame 45 first (flight 26-44)."""
    contact = np.asarray(motion.foot_contact()).any(1)
    out, run = [], 0
    for i, c in enumerate(contact):
        if c and run >= min_flight:
            out.append(i)
        run = 0 if c else run + 1
    return out


def touchdown_frame(motion: Any, min_flight: int = 3) -> int | None:
    """The first of :func:`touchdown_frames`, or None for a clip without flight."""
    frames = touchdown_frames(motion, min_flight)
    return frames[0] if frames else None


def landing_start_frames(motion: Any, window: int, count: int, num_frames: int) -> list[int]:
    """Start frames of windows of ``window`` steps across the first ``count`` landings of the clip (``window // 2``
    before each touchdown) that leave the window before the clip's end; ``[0]`` for a clip without flight."""
    starts = [max(0, td - window // 2) for td in touchdown_frames(motion)]
    starts = [f for f in dict.fromkeys(starts) if f < num_frames - window - 1][:count]
    return starts or [0]


def branch_sensitivities(clip: str, kappa: float, branches: int, window: int, sigma_q: float, sigma_qd: float,
                         seed: int, frame: int | None = None, policy: Any = None) -> dict[str, Any]:
    """Per-branch gradients of v_z(t+T) (root linear z velocity, world frame) with respect to the start state.

    The reference pose and velocity at ``frame`` (None: ``window // 2`` before :func:`touchdown_frame`; the start
    rule of the transfer replay, :func:`bcg.evaluation.mujoco_transfer.start_state`), its nominal row plus
    ``branches`` rows with joint-Gaussian hinge offsets (the estimators' ``joint_gaussian_offsets``, clamped to the
    joint limits), rolled out with the reference-target policy (the variance study's TrackingPolicy at theta = 0),
    or with a trained ``policy`` (an exported torch policy, acting through its own action map and dynamics), through
    ``env.transition`` with autograd. Returns ``kappa``, ``nominal`` and ``branch`` (list [B]) of
    s = dv_z(t+T)/dp_z(t) [1/s], their ``mean`` and ``std``, ``grads`` [B, 71] (d v_z / d(q, qd)), and the PCA of
    the gradient vectors: ``pc`` [B, 2] projections, ``pc_share`` (variance shares of the first two components)."""
    env, actor = _study_env_and_actor(clip, kappa, policy)
    if frame is None:
        frame = landing_start_frames(env.motion, window, 1, env.num_frames)[0]
    return _sensitivities_at(env, actor, kappa, frame, branches, window, sigma_q, sigma_qd, seed)


def _sensitivities_at(env: Any, actor: Any, kappa: float, frame: int, branches: int, window: int, sigma_q: float,
                      sigma_qd: float, seed: int) -> dict[str, Any]:
    """:func:`branch_sensitivities` in a built study env with what acts in it (:func:`_study_env_and_actor`)."""
    import torch

    from bcg.estimators.grs import joint_gaussian_offsets
    from bcg.evaluation.mujoco_transfer import start_state

    if not 0 <= frame < env.num_frames - window - 1:
        raise ValueError(f"frame must leave {window} steps before the clip's end, got {frame}")
    start = start_state(env, torch.full((env.num_envs,), int(frame))).map(lambda t: t[:1])
    gen = torch.Generator().manual_seed(int(seed))
    dq, dqd = joint_gaussian_offsets(env.model, start.q, start.qd, branches, sigma_q, sigma_qd, False, gen)
    s = start.repeat_interleave(branches + 1)
    q, qd = s.q.detach().clone(), s.qd.detach().clone()
    q[1:, 7:] += dq[0].to(q)
    qd[1:, 6:] += dqd[0].to(qd)
    q.requires_grad_(True)
    qd.requires_grad_(True)
    s = dataclasses.replace(s, q=q, qd=qd)
    theta = actor.initial_theta(branches + 1).to(env.device)
    for _ in range(window):
        s, *_ = env.transition(s, actor.actions(env, s, theta))
    gq, gqd = torch.autograd.grad(s.qd[:, 2].sum(), (q, qd))  # rows are independent: row r's own gradient
    grads = torch.cat([gq, gqd], 1).double()
    sens = grads[:, 2]  # d v_z(t+T) / d p_z(t)
    g = grads[1:]
    centred = g - g.mean(0)
    _, sv, vt = torch.linalg.svd(centred, full_matrices=False)
    share = (sv**2 / (sv**2).sum()).tolist()
    return {"kappa": kappa, "nominal": float(sens[0]), "branch": sens[1:].tolist(), "mean": float(sens[1:].mean()),
            "std": float(sens[1:].std()), "grads": g,
            "spread": float(centred.pow(2).sum(1).mean().sqrt()), "pc": (centred @ vt[:2].T).tolist(),
            "nominal_pc": ((grads[0] - g.mean(0)) @ vt[:2].T).tolist(), "pc_share": share[:2],
            "frame": int(frame)}


def _study_env_and_actor(clip: str, kappa: float, policy: Any) -> tuple[Any, Any]:
    """An 8-row study env at ``kappa`` and what acts in it: the reference-target policy, or a trained ``policy``
    (:class:`~bcg.evaluation.study_variance.CheckpointPolicy`) in an env with its action map and dynamics."""
    from bcg.evaluation.gradient_variance import TrackingPolicy, make_study_env, observation_normaliser

    if policy is None:
        env = make_study_env(clip, kappa, 8)
        mean, std = observation_normaliser(env)
        return env, TrackingPolicy(env, mean, std)
    from bcg.evaluation.evaluate_cli import policy_env_kwargs
    from bcg.evaluation.study_variance import CheckpointPolicy

    return make_study_env(clip, kappa, 8, **policy_env_kwargs(policy)), CheckpointPolicy(policy)


def sensitivity_plot(entries: list[dict[str, Any]], path: Path, window: int) -> Path:
    """``study_sensitivity.png``: per kappa, the branch sensitivities (dots) with their mean (the bundle, a line) and
    the nominal row (a cross); and the branches' state-gradient vectors on their first two principal components with
    the 95 % ellipse of a normal fit."""
    plt = pyplot()
    fig, axes = plt.subplots(len(entries), 2, figsize=(9, 3.0 * len(entries)), squeeze=False)
    for row, e in zip(axes, entries):
        b = np.array(e["branch"])
        ax = row[0]
        ax.plot(np.arange(len(b)), b, "o", ms=3, color="C0", alpha=0.7, label="branches")
        ax.axhline(e["mean"], color="C3", lw=1.5, label=f"bundle mean {e['mean']:.3g}")
        ax.plot([-2], [e["nominal"]], "kx", ms=7, label=f"nominal {e['nominal']:.3g}")
        ax.set_xlabel("branch", fontsize=8)
        ax.set_ylabel(f"dv_z(t+{window}) / dp_z(t) [1/s]", fontsize=8)
        ax.set_title(f"kappa {e['kappa']:g}, frame {e['frame']}: per-branch sensitivities", fontsize=9)
        ax.legend(fontsize=7)
        ax = row[1]
        pc = np.array(e["pc"])
        ax.plot(pc[:, 0], pc[:, 1], "o", ms=3, color="C0", alpha=0.7)
        ax.plot([0], [0], "o", color="C3", ms=6, label="bundle mean")
        ax.plot([e["nominal_pc"][0]], [e["nominal_pc"][1]], "kx", ms=7, label="nominal")
        cov = np.cov(pc.T)
        w, v = np.linalg.eigh(cov)
        t = np.linspace(0, 2 * np.pi, 200)
        ell = (v @ (np.sqrt(np.maximum(w, 0) * 5.991)[:, None] * np.stack([np.cos(t), np.sin(t)])))
        ax.plot(ell[0], ell[1], color="C3", lw=1, label="95 % ellipse")
        ax.set_xlabel(f"PC1 ({e['pc_share'][0]:.0%})", fontsize=8)
        ax.set_ylabel(f"PC2 ({e['pc_share'][1]:.0%})", fontsize=8)
        ax.set_title(f"kappa {e['kappa']:g}, frame {e['frame']}: state gradients d v_z / d(q, qd)", fontsize=9)
        ax.legend(fontsize=7)
        for a in row:
            style_axis(a)
    return save_figure(fig, path)
