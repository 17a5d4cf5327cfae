"""``bcg evaluate``: replay an exported policy (or the reference-replay baseline) in MuJoCo and in our simulator, write
the tracking metrics to ``<out>/metrics.json`` and ``<out>/metrics.md``, and optionally an MP4 of one MuJoCo episode
beside its reference ghost (protocol and metrics: ``docs/evaluation.md``).

The default ``<out>`` is named after the clip and the options (``RUN/eval/CLIP/`` with the default options,
``RUN/eval/CLIP-HASH/`` otherwise; ``eval/reference-CLIP[-HASH]/`` for the baseline), so evaluating another clip or
with other options never replaces earlier results; an existing ``metrics.json`` is replaced only with ``--force``."""

from __future__ import annotations

import hashlib
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import tyro

from bcg.errors import InputNotFoundError, UserError
from bcg.evaluation.transfer_protocol import TransferOptions

__all__ = ["Evaluate", "REFERENCE", "load_source", "policy_env_kwargs", "policy_motion"]

REFERENCE = "reference"
"""The source name of the reference-replay baseline (:class:`~bcg.evaluation.mujoco_transfer.ReferenceReplayPolicy`)."""


def load_source(source: str, motion: str | None) -> tuple[Any, str, dict[str, Any], Path, str]:
    """``(policy, motion, env_kwargs, eval_dir, label)`` of a run directory (its ``policy.pt``), a policy file
    (torch, ONNX or TorchScript: :mod:`bcg.agents.graph_policy`) or :data:`REFERENCE` (which needs ``motion``). A
    policy file's clip (:func:`policy_motion`), contact stiffness and action scale are used unless ``motion``
    overrides the clip. ``eval_dir`` is ``RUN/eval`` (``eval`` for the baseline). A missing source or clip raises
    :class:`~bcg.errors.InputNotFoundError`."""
    from bcg.motion.formats import resolve_motion_path

    if motion is not None:
        resolve_motion_path(motion)  # a wrong name or path is refused before anything is replayed
    if source == REFERENCE:
        from bcg.evaluation.mujoco_transfer import ReferenceReplayPolicy

        if motion is None:
            raise UserError("the reference-replay baseline needs --motion (a packaged clip name or a motion file)")
        return ReferenceReplayPolicy(), motion, {}, Path("eval"), REFERENCE
    p = Path(source)
    if p.is_dir():
        run_dir, file = p, p / "policy.pt"
        if not file.is_file():
            raise InputNotFoundError(f"{p} is a directory without policy.pt (a run directory holds the exported "
                                     "policy; `bcg export RUN` writes it)")
    elif p.is_file():
        run_dir, file = p.parent, p
    else:
        raise InputNotFoundError(f"{source!r} is neither a run directory, a policy file nor {REFERENCE!r}")
    from bcg.agents.export import load_policy
    from bcg.agents.graph_policy import is_graph_file, load_graph_policy
    from bcg.robots.g1 import MJCF_PATH

    # an ONNX or TorchScript graph runs through onnxruntime / torch.jit behind the same interface
    policy = load_graph_policy(file) if is_graph_file(file) else load_policy(file)
    policy.check_mjcf(MJCF_PATH)
    if motion is None:
        motion = policy_motion(policy.motion)
    return policy, motion, policy_env_kwargs(policy), run_dir / "eval", str(file)


def policy_env_kwargs(policy: Any) -> dict[str, Any]:
    """The replay env's keyword arguments that a policy file fixes: its action map, and the dynamics options it was
    trained with (None: the env's default), i.e. the contact parameters of our simulator's replay and the substep and
    substep count, hence the control rate, of both simulators, and the reference it tracked (its joint margin)."""
    from bcg.envs.config import REFERENCE_FIELDS, Dynamics

    env_kwargs: dict[str, Any] = {"action_scale": policy.action_scale.detach().cpu().double().numpy(),
                                  "action_offset": policy.action_offset}
    recorded = policy.meta.get("env", {})
    env_kwargs["dynamics"] = Dynamics.from_mapping(recorded)
    env_kwargs.update({key: float(recorded[key]) for key in REFERENCE_FIELDS if recorded.get(key) is not None})
    return env_kwargs


def policy_motion(meta: dict[str, Any]) -> str:
    """The clip a policy was trained on, from its metadata ``motion`` entry: a packaged clip by its name (portable
    across checkouts), any other clip by the file it was loaded from. Raises :class:`~bcg.errors.UserError` when
    that file is gone, or when it (or the packaged clip) no longer has the sha256 recorded at export."""
    from bcg.motion import PACKAGED_MOTIONS
    from bcg.motion.formats import motion_sha256, resolve_motion_path

    name, src = str(meta.get("name")), str(meta.get("source", ""))
    if name in PACKAGED_MOTIONS:
        motion = name
    elif src and Path(src).is_file():
        motion = src
    else:
        raise InputNotFoundError(f"the policy's clip {src or name!r} no longer exists; pass --motion (a packaged clip "
                                 "or a motion file) to choose the clip to track")
    recorded = meta.get("sha256")
    if recorded and motion_sha256(motion) != recorded:
        raise UserError(f"the policy's clip {resolve_motion_path(motion)} has changed since the policy was trained "
                        f"(sha256 {str(recorded)[:12]}..., now {motion_sha256(motion)[:12]}...); pass --motion to "
                        "evaluate on it anyway")
    return motion


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
    protocol: Annotated[TransferOptions, tyro.conf.OmitArgPrefixes] = TransferOptions()
    """The replay: start phases, seeds, episode length, initial joint noise, our simulator's kappa (default: the
    policy's)."""
    out_dir: Path | None = None
    """Where metrics.json and metrics.md go (default: RUN/eval/CLIP, or RUN/eval/CLIP-HASH with options other than
    the defaults; eval/reference-CLIP[-HASH] for the baseline)."""
    gap: bool = False
    """Also measure where our simulator and MuJoCo part on this policy's own states: one control step of ours from
    each state MuJoCo visited, split by foot contact, actuator saturation and joint limits (gap.json, gap.md;
    docs/evaluation.md)."""
    gap_window: tuple[float, float] | None = None
    """With --gap: measure it only on the steps that start in this stretch of the clip (START END [s]), e.g. where
    a policy falls (gap.json records the stretch)."""
    force: bool = False
    """Replace the metrics.json and metrics.md of an earlier evaluation in the output folder (else refused)."""
    progress: bool = True
    """Show progress bars."""

    def __post_init__(self) -> None:
        if isinstance(self.video_episode, bool) or self.video_episode < 0:
            raise ValueError(f"video_episode must be an integer >= 0, got {self.video_episode!r}")
        if len(self.video_size) != 2 or min(self.video_size) < 1:
            raise ValueError(f"video_size must be two integers >= 1 (width height), got {self.video_size!r}")
        if self.gap_window is not None:
            start, end = self.gap_window
            if not self.gap:
                raise ValueError("gap_window restricts the one-step gap: give --gap too")
            if not (math.isfinite(start) and math.isfinite(end) and 0 <= start < end):
                raise ValueError(f"gap_window must be START END [s] with 0 <= START < END, got {self.gap_window!r}")

    def default_out_dir(self, eval_dir: Path, motion: str) -> Path:
        """``eval_dir/CLIP`` with the default options, ``eval_dir/CLIP-HASH`` (8 hex digits of the options and the
        clip) otherwise; ``reference-`` before CLIP for the baseline."""
        name = ("reference-" if self.source == REFERENCE else "") + Path(motion).stem
        if self.protocol != TransferOptions():
            chosen = self.protocol.digest_fields()
            digest = hashlib.sha256(json.dumps({**chosen, "motion": motion}, sort_keys=True).encode()).hexdigest()
            name += f"-{digest[:8]}"
        return eval_dir / name

    def run(self) -> int:
        from bcg.evaluation.mujoco_transfer import evaluate_transfer, render_video

        policy, motion, env_kwargs, eval_dir, label = load_source(self.source, self.motion)
        out = self.out_dir or self.default_out_dir(eval_dir, motion)
        _check_out_dir(out, self.force)
        report, rollout = evaluate_transfer(policy, motion, self.protocol, label=label, progress=self.progress,
                                            env_kwargs=env_kwargs)
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
        if self.gap:
            self._write_gap(policy, motion, env_kwargs, label, out)
        return 0

    def _write_gap(self, policy: Any, motion: str, env_kwargs: dict[str, Any], label: str, out: Path) -> None:
        from bcg.evaluation.sim_gap import one_step_gap, record_transitions

        # the steps carry the replay env's own model: our simulator re-steps them with the policy's dynamics
        steps = record_transitions(policy, motion, self.protocol, env_kwargs=env_kwargs, progress=self.progress)
        if self.gap_window is not None:
            start, end = self.gap_window
            steps = steps.within(start, end)
            if len(steps) == 0:
                raise UserError(f"no replayed step starts in {start:g}-{end:g} s of the clip (the episodes start at "
                                 f"--phases' frames and last --seconds)")
            label = f"{label}, {start:g}-{end:g} s of the clip"
        report = one_step_gap(steps, label=label)
        (out / "gap.json").write_text(report.to_json() + "\n")
        (out / "gap.md").write_text(report.to_markdown())
        print(report.to_markdown())
        print(f"wrote {out / 'gap.json'} and {out / 'gap.md'}")


def _check_out_dir(out: Path, force: bool) -> None:
    """Refuse an output folder that is a file, cannot be made, or holds an earlier evaluation (unless ``force``)."""
    if out.exists() and not out.is_dir():
        raise UserError(f"--out-dir {out} is a file; expected a folder for metrics.json and metrics.md")
    if not force and (out / "metrics.json").exists():
        raise UserError(f"{out / 'metrics.json'} exists (an earlier evaluation with this clip and these options); "
                        "pass --force to replace it, or --out-dir another folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"cannot create the output folder {out}: {exc.strerror or exc}") from None
