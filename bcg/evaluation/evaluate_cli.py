"""``bcg evaluate``: replay an exported policy (or the reference-replay baseline) in MuJoCo and in our simulator, write
the tracking metrics to ``<out>/metrics.json`` and ``<out>/metrics.md``, and optionally an MP4 of one MuJoCo episode
beside its reference ghost (protocol and metrics: ``docs/evaluation.md``)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import tyro

__all__ = ["Evaluate", "REFERENCE", "load_source"]

REFERENCE = "reference"
"""The source name of the reference-replay baseline (:class:`~bcg.evaluation.mujoco_transfer.ReferenceReplayPolicy`)."""


def load_source(source: str, motion: str | None) -> tuple[Any, str, dict[str, Any], Path, str]:
    """``(policy, motion, env_kwargs, default_out_dir, label)`` of a run directory (its ``policy.pt``), a policy file
    (torch, ONNX or TorchScript: :mod:`bcg.agents.graph_policy`) or :data:`REFERENCE` (which needs ``motion``). A
    policy file's clip, contact stiffness and action scale are used unless ``motion`` overrides the clip."""
    if source == REFERENCE:
        from bcg.evaluation.mujoco_transfer import ReferenceReplayPolicy

        if motion is None:
            raise ValueError("the reference-replay baseline needs --motion (a packaged clip name or a motion file)")
        return ReferenceReplayPolicy(), motion, {}, Path("eval") / f"reference-{Path(motion).stem}", REFERENCE
    p = Path(source)
    if p.is_dir():
        run_dir, file = p, p / "policy.pt"
        if not file.is_file():
            raise FileNotFoundError(f"{p} is a directory without policy.pt (a run directory holds the exported "
                                    "policy; `bcg export RUN` writes it)")
    elif p.is_file():
        run_dir, file = p.parent, p
    else:
        raise FileNotFoundError(f"{source!r} is neither a run directory, a policy file nor {REFERENCE!r}")
    from bcg.agents.export import load_policy
    from bcg.agents.graph_policy import is_graph_file, load_graph_policy
    from bcg.robots.g1 import MJCF_PATH

    # an ONNX or TorchScript graph runs through onnxruntime / torch.jit behind the same interface
    policy = load_graph_policy(file) if is_graph_file(file) else load_policy(file)
    policy.check_mjcf(MJCF_PATH)
    if motion is None:
        from bcg.motion import PACKAGED_MOTIONS

        meta = policy.motion
        name, src = str(meta.get("name")), str(meta.get("source", ""))
        # a packaged clip by its name (portable across checkouts), any other clip by the file it was loaded from
        motion = name if name in PACKAGED_MOTIONS or not (src and Path(src).is_file()) else src
    env_kwargs: dict[str, Any] = {"action_scale": policy.action_scale.detach().cpu().double().numpy(),
                                  "action_offset": policy.action_offset}
    # the dynamics options the policy was trained with (None: the env's default): contact stiffness for our
    # simulator's replay, and the substep and substep count, hence the control rate, for both simulators
    for key, cast in (("kappa", float), ("substeps", int), ("sim_dt", float)):
        value = policy.meta.get("env", {}).get(key)
        if value is not None:
            env_kwargs[key] = cast(value)
    return policy, motion, env_kwargs, run_dir / "eval", str(file)


@dataclass(frozen=True)
class Evaluate:
    """Replay a policy in MuJoCo and in bcg's simulator; write tracking metrics (JSON, Markdown) and a video."""

    source: tyro.conf.Positional[Annotated[str, tyro.conf.arg(metavar="RUN_OR_POLICY_FILE")]]
    """A run directory (holding policy.pt), a policy file (policy.pt, policy.onnx, policy_jit.pt), or `reference`."""
    motion: str | None = None
    """Clip to track (packaged name or file); default: the policy's own clip (required for `reference`)."""
    video: Path | None = None
    """Also write an MP4 of one MuJoCo episode beside the reference ghost (needs an OpenGL back end)."""
    video_episode: int = 0
    """Which episode the video shows (0: phase 0 of the first seed, the start of the clip)."""
    video_size: tuple[int, int] = (640, 480)
    """Width and height of the video [pixels]."""
    phases: int = 4
    """Start phases per seed, spread evenly over the clip."""
    seeds: tuple[int, ...] = (0, 1)
    """Seeds (each draws the initial joint-angle noise of its episodes)."""
    seconds: float | None = None
    """Longest episode [s] (default: to the clip's end)."""
    joint_noise: float = 0.02
    """Half-width of the uniform initial joint-angle noise [rad]."""
    kappa: float | None = None
    """Contact stiffness of our simulator's replay [1/m] (default: the policy's, else the env's)."""
    out_dir: Path | None = None
    """Where metrics.json and metrics.md go (default: RUN/eval; eval/reference-CLIP for the baseline)."""
    progress: bool = True
    """Show progress bars."""

    def run(self) -> int:
        from bcg.evaluation.mujoco_transfer import TransferOptions, evaluate_transfer, render_video

        try:
            policy, motion, env_kwargs, default_out, label = load_source(self.source, self.motion)
            opts = TransferOptions(phases=self.phases, seeds=tuple(self.seeds), seconds=self.seconds,
                                   joint_noise=self.joint_noise)
        except (FileNotFoundError, ValueError) as exc:  # no such run / file, not a policy file, bad options
            print(f"bcg evaluate: error: {exc}", file=sys.stderr)
            return 2
        if self.kappa is not None:
            env_kwargs["kappa"] = float(self.kappa)
        report, rollout = evaluate_transfer(policy, motion, opts, label=label, progress=self.progress,
                                            env_kwargs=env_kwargs)
        out = self.out_dir or default_out
        out.mkdir(parents=True, exist_ok=True)
        (out / "metrics.json").write_text(report.to_json() + "\n")
        (out / "metrics.md").write_text(report.to_markdown())
        print(report.to_markdown())
        print(f"wrote {out / 'metrics.json'} and {out / 'metrics.md'}")
        if self.video is not None:
            from bcg.envs.rendering import RenderingUnavailableError

            try:
                path = render_video(rollout, motion, self.video, episode=self.video_episode,
                                    width=self.video_size[0], height=self.video_size[1], progress=self.progress)
            except (RenderingUnavailableError, ImportError) as exc:  # no OpenGL context; imageio not installed
                print(f"bcg evaluate: no video: {exc}", file=sys.stderr)
                return 3
            print(f"wrote {path}")
        return 0
