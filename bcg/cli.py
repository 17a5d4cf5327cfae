"""The ``bcg`` command line: one tyro entry point over the package.

Commands are registered in :data:`COMMANDS`: a name maps either to a *command* (a dataclass whose fields are the
options, with a ``run(self) -> int | None`` method) or to a *group* (a dict of such commands, e.g. ``motions``).
``bcg GROUP COMMAND [OPTIONS]`` or ``bcg COMMAND [OPTIONS]``; ``--help`` at every level. To add a command, define the
dataclass and add it to :data:`COMMANDS` (or to a group's dict).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import tyro

from bcg.errors import UserError, one_line
from bcg.evaluation.compare import Compare
from bcg.evaluation.evaluate_cli import Evaluate
from bcg.evaluation.learning_curve import Curve
from bcg.evaluation.studies import STUDY_COMMANDS
from bcg.parsing import parse_command

__all__ = ["COMMANDS", "main", "MOTION_COMMANDS"]


def _load(file: str, fps: float | None, fmt: str, clip: bool) -> Any:
    from bcg.motion import load_motion

    return load_motion(file, fps=fps, format=fmt, clip_joint_limits=clip)  # type: ignore[arg-type]


@dataclass(frozen=True)
class MotionsList:
    """List the packaged reference clips (name, frames, duration, pelvis travel, file)."""

    def run(self) -> int:
        from bcg.motion import PACKAGED_MOTIONS, load_motion, packaged_motion_path

        print(f"{'name':8s} {'frames':>6s} {'duration':>9s} {'travel':>8s}  file")
        for name in PACKAGED_MOTIONS:
            m = load_motion(name)
            travel = float((m.qpos[-1, :2] - m.qpos[0, :2]).norm())
            print(f"{name:8s} {m.num_frames:6d} {m.duration:8.2f}s {travel:7.2f}m  {packaged_motion_path(name)}")
        return 0


@dataclass(frozen=True)
class MotionsInspect:
    """Print a summary table and the kinematic validation report of a motion file or packaged clip."""

    file: tyro.conf.Positional[str]
    """Path (.csv / .npz) or packaged clip name (run, jump, fight, dance)."""
    fps: float | None = None
    """Frame rate of a CSV [Hz] (default: what the file or its name says; 30 = LAFAN1-G1, 60 = G1 Moves)."""
    format: Literal["auto", "lafan1", "g1moves", "npz"] = "auto"
    """File format (auto: by suffix; a CSV's rate from the file or its name)."""
    clip_joint_limits: bool = False
    """Clip out-of-range joint angles instead of failing."""

    def run(self) -> int:
        m = _load(self.file, self.fps, self.format, self.clip_joint_limits)
        q = m.qpos
        print(f"source      {m.source}")
        print(f"frames      {m.num_frames} at {1 / m.dt:g} Hz ({m.duration:.2f} s)")
        print(f"root start  {q[0, :3].tolist()}  quat(wxyz) {[round(v, 4) for v in q[0, 3:7].tolist()]}")
        print(f"root end    {q[-1, :3].tolist()}")
        print(f"{'joint':28s} {'min':>8s} {'max':>8s} {'peak |v|':>9s}")
        from bcg.robots.g1 import JOINT_NAMES

        for j, n in enumerate(JOINT_NAMES):
            print(f"{n:28s} {q[:, 7 + j].min():8.3f} {q[:, 7 + j].max():8.3f} {m.qvel[:, 6 + j].abs().max():9.2f}")
        from bcg.evaluation.motion_report import validate_motion

        report = validate_motion(m)
        print(report)
        return 0 if report.passed else 1


@dataclass(frozen=True)
class MotionsPlot:
    """Plot a motion's contact schedule and pelvis height (and a strip of rendered frames where GL works) to a PNG."""

    file: tyro.conf.Positional[str]
    """Path (.csv / .npz) or packaged clip name."""
    out: str = ""
    """Output PNG (default: <name>.png in the current directory)."""
    fps: float | None = None
    """Frame rate of a CSV [Hz] (default: what the file or its name says; 30 = LAFAN1-G1, 60 = G1 Moves)."""
    format: Literal["auto", "lafan1", "g1moves", "npz"] = "auto"
    """File format."""
    render: bool = True
    """Add a strip of MuJoCo offscreen renders (skipped with a message when no GL backend works)."""

    def run(self) -> int:
        m = _load(self.file, self.fps, self.format, True)
        out = Path(self.out or f"{m.name}.png")
        from bcg.evaluation.motion_plot import plot_motion

        plot_motion(m, out, render=self.render)
        print(f"wrote {out}")
        return 0


@dataclass(frozen=True)
class MotionsValidateAll:
    """Validate the packaged clips and write their reports and pictures into a docs folder."""

    out_dir: str = "docs/motions"
    """Folder for <name>.png and <name>.txt."""
    render: bool = True
    """Add rendered frame strips (needs a GL backend; MUJOCO_GL=egl is tried by default)."""

    def run(self) -> int:
        from bcg.evaluation.motion_plot import plot_motion
        from bcg.evaluation.motion_report import validate_motion
        from bcg.motion import PACKAGED_MOTIONS, load_motion

        out = Path(self.out_dir)
        out.mkdir(parents=True, exist_ok=True)
        ok = True
        for name in PACKAGED_MOTIONS:
            m = load_motion(name)
            rep = validate_motion(m)
            ok &= rep.passed
            (out / f"{name}.txt").write_text(str(rep) + "\n")
            plot_motion(m, out / f"{name}.png", render=self.render)
            print(rep)
            print(f"  -> {out / (name + '.txt')}, {out / (name + '.png')}")
        return 0 if ok else 1


@dataclass(frozen=True)
class Bench:
    """Simulator throughput and its ratios (docs/performance.md): forward and forward+backward against MuJoCo's
    mj_step, first / warm gradient rollout, 2 / 1 threads, env / bare simulator, memory kept with and without
    checkpointing."""

    device: str = "cpu"
    """Simulator device: cpu, cuda or cuda:K."""
    sizes: tuple[int, ...] | None = None
    """Numbers of parallel environments N to time (default 16 64 256 on the CPU, 1024 4096 8192 on CUDA)."""
    steps: int = 32
    """Control steps per rollout (each 4 substeps of 5 ms)."""
    repeats: int = 3
    """Best of this many timings (and rounds of the alternating ratio timings)."""
    no_backward: bool = False
    """Skip the gradient rollouts."""
    ratio_n: int = 64
    """N of the ratios block (threads, checkpointing, env / bare simulator); 0 skips it (CPU only)."""
    no_env: bool = False
    """Skip the env / bare-simulator ratios."""
    max_n: bool = False
    """Also search the largest N whose gradient rollout fits (doubling from the last size; for GPUs)."""
    torch_threads: int = 1
    """torch intra-op threads during the benchmark."""
    markdown: bool = False
    """Also print the README's throughput table in markdown."""
    json: Path | None = None
    """Also write the results to this JSON file."""
    learning: bool = False
    """Time training iterations instead: SHAC (bptt, bcg) and PPO at the cpu-small and paper presets, each part of
    an iteration against the differentiable env's own window (bcg.evaluation.learning_throughput)."""
    presets: tuple[str, ...] = ("cpu-small", "paper")
    """With --learning: the presets to time."""
    methods: tuple[str, ...] = ("bptt", "bcg", "ppo")
    """With --learning: SHAC estimators (names or specs, e.g. bcg:size=sensitivity,min_branches=2) and/or ppo."""
    iterations: int = 5
    """With --learning: timed iterations per method (median reported; PPO half as many)."""
    block: int = 1
    """With --learning: SHAC iterations timed in a row per timing, the critic fit joined only at the block's end (as in
    training, where the fit runs beside the next window's steps); 1 joins it after every iteration."""
    start: Path | None = None
    """With --learning: a SHAC run of the timed preset to start from (the contact forces, hence bcg's trigger rate, of
    a policy that tracks)."""
    critic_fit_worker: Literal["thread", "process"] = "process"
    """With --learning: where SHAC's overlapping critic fit runs (bcg train --critic-fit-worker, the same default);
    with process, its time is not in the critic column but in what the iteration waits for it (other)."""

    def __post_init__(self) -> None:
        from bcg.envs.config import check_count

        # N = 0 or 0 steps would time nothing and print zeros and NaN ratios as if they were measurements
        if self.sizes is not None and any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in self.sizes):
            raise ValueError(f"sizes must be integers >= 1 (numbers of environments), got {list(self.sizes)}")
        check_count("steps", self.steps, 1)
        check_count("repeats", self.repeats, 1)
        check_count("ratio_n", self.ratio_n, 0)
        check_count("torch_threads", self.torch_threads, 1)
        check_count("block", self.block, 1)
        if self.learning:  # a bad estimator spec is refused here, in one line, before anything is timed
            from bcg.evaluation.study_variance import check_estimator_specs

            specs = tuple(m for m in self.methods if m != "ppo")
            if specs:
                check_estimator_specs(specs)

    def run(self) -> int:
        if self.learning:
            from bcg.evaluation.learning_throughput import main as learning_main

            argv = ["--presets", *self.presets, "--methods", *self.methods, "--iterations", str(self.iterations),
                    "--block", str(self.block), "--torch-threads", str(self.torch_threads),
                    "--critic-fit-worker", self.critic_fit_worker]
            if self.json is not None:
                argv += ["--json", str(self.json)]
            if self.start is not None:
                argv += ["--start", str(self.start)]
            learning_main(argv)
            return 0
        from bcg.evaluation.sim_throughput import main as bench_main

        argv = ["--device", self.device, "--steps", str(self.steps), "--repeats", str(self.repeats),
                "--ratio-n", str(self.ratio_n), "--torch-threads", str(self.torch_threads)]
        if self.sizes:
            argv += ["--sizes", *map(str, self.sizes)]
        for flag, on in (("--no-backward", self.no_backward), ("--no-env", self.no_env), ("--max-n", self.max_n),
                         ("--markdown", self.markdown)):
            if on:
                argv.append(flag)
        if self.json is not None:
            argv += ["--json", str(self.json)]
        bench_main(argv)
        return 0


MOTION_COMMANDS: dict[str, type] = {
    "list": MotionsList,
    "inspect": MotionsInspect,
    "plot": MotionsPlot,
    "validate-all": MotionsValidateAll,
}
"""``bcg motions ...`` subcommands."""

@dataclass
class EstimatorsList:
    """List the registered gradient estimators (built-ins and plugins) with their parameters."""

    def run(self) -> int:
        from bcg.estimators import ESTIMATORS, describe

        for name in ESTIMATORS:
            doc = " ".join((ESTIMATORS[name].__doc__ or "").strip().split("\n\n")[0].split())
            print(f"{name}: {doc}")
            for field, typ, default, fdoc in describe(name):
                print(f"    {field}: {typ} = {default!r}  {fdoc}")
        return 0


ESTIMATOR_COMMANDS: dict[str, type] = {"list": EstimatorsList}
"""``bcg estimators ...`` subcommands."""

@dataclass(frozen=True)
class Train:
    """Train SHAC (through a gradient estimator) or PPO on a G1 tracking clip: run directory, metrics, checkpoints."""

    config: Any
    """The run's :class:`bcg.agents.train_config.TrainConfig`."""

    @staticmethod
    def from_cli(prog: str, args: Sequence[str]) -> Train:
        """Parse with bcg.agents.train.parse_train_args (presets first, then field-by-field overrides)."""
        from bcg.agents.train import parse_train_args

        return Train(parse_train_args(args, prog=prog))  # bad values: ValueError / TypeError, a one-line message

    def run(self) -> int:
        """Train with the periodic evaluation (bcg.evaluation.periodic); the exit status is 130 after Ctrl-C and
        143 after SIGTERM (each after a checkpoint). A checkpoint or run directory that cannot be used raises a
        UserError (one line from ``bcg``)."""
        from bcg.evaluation.periodic import train_and_evaluate

        return train_and_evaluate(self.config).status


@dataclass(frozen=True)
class Export:
    """Write a run's policy: a self-contained torch file, or an ONNX / TorchScript graph for deployment stacks."""

    run_dir: tyro.conf.Positional[Path]
    """Run directory (its latest checkpoint), a checkpoint file, or a policy file to convert (onnx, torchscript)."""
    out: Path | None = None
    """Output file (default: RUN/policy.pt, RUN/policy.onnx or RUN/policy_jit.pt)."""
    format: Literal["torch", "onnx", "torchscript"] = "torch"
    """torch: weights, normaliser, action map and MJCF hash for `bcg evaluate`; onnx / torchscript: one graph from
    observation to PD joint targets with the joint names, gains, default pose, action scale, control rate,
    observation layout and MJCF hash as metadata (docs/deploy.md)."""

    def run(self) -> int:
        from bcg.agents.train import export_run

        path = export_run(self.run_dir, self.out, self.format)
        print(f"wrote {path}")
        return 0


COMMANDS: dict[str, type | dict[str, type]] = {
    "bench": Bench,
    "estimators": ESTIMATOR_COMMANDS,
    "motions": MOTION_COMMANDS,
    "train": Train,
    "export": Export,
    "evaluate": Evaluate,
    "curve": Curve,
    "compare": Compare,
    "study": STUDY_COMMANDS,
}
"""Top-level commands: a dataclass (a command) or a dict of them (a group)."""


DEBUG_ENV = "BCG_DEBUG"
"""Environment variable: set (to anything but empty or 0) to show the traceback of a user error, as ``--debug`` does."""


def _usage() -> str:
    lines = ["usage: bcg COMMAND ...", "", "commands:"]
    for name, cmd in COMMANDS.items():
        if isinstance(cmd, dict):
            lines.append(f"  {name} {{{', '.join(cmd)}}}")
        else:
            lines.append(f"  {name}  {(cmd.__doc__ or '').strip().splitlines()[0]}")
    lines += ["", "A bad input prints one line 'bcg COMMAND: error: ...' and exits with 2; --debug (anywhere) or "
              f"{DEBUG_ENV}=1 shows the traceback."]
    return "\n".join(lines)


def _debug_requested(args: list[str]) -> tuple[bool, list[str]]:
    """Whether ``--debug`` (anywhere on the line) or :data:`DEBUG_ENV` asks for tracebacks, and the arguments
    without ``--debug``."""
    rest = [a for a in args if a != "--debug"]
    return len(rest) != len(args) or os.environ.get(DEBUG_ENV, "") not in ("", "0"), rest


def _parse(name: str, rest: list[str]) -> Any:
    """The command object of ``bcg NAME REST...`` (tyro prints usage errors itself and exits with 2)."""
    cmd = COMMANDS[name]
    if isinstance(cmd, dict):
        if rest and rest[0] in cmd:  # the subcommand's own parser: its checks give one-line errors (parse_command)
            return parse_command(cmd[rest[0]], rest[1:], prog=f"bcg {name} {rest[0]}")
        return tyro.extras.subcommand_cli_from_dict(cmd, prog=f"bcg {name}", args=rest)  # the group's help, usage
    if hasattr(cmd, "from_cli"):  # a command that parses its own arguments (e.g. train: presets, then overrides)
        return cmd.from_cli(prog=f"bcg {name}", args=rest)
    return parse_command(cmd, rest, prog=f"bcg {name}")


def _command_name(name: str, rest: list[str]) -> str:
    """``bcg NAME`` or, for a group, ``bcg NAME SUBCOMMAND`` (the prefix of the one-line messages)."""
    if isinstance(COMMANDS[name], dict) and rest and rest[0] in COMMANDS[name]:
        return f"bcg {name} {rest[0]}"
    return f"bcg {name}"


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``bcg`` console script; returns the exit status.

    A user error (:class:`bcg.errors.UserError`, or a value that a config refuses while the arguments are parsed)
    prints one line ``bcg COMMAND: error: MESSAGE`` and gives status 2 (a parse error exits with ``SystemExit(2)``,
    as tyro's own usage errors do); Ctrl-C before a command has its own handler prints one line and gives 130.
    ``--debug`` or ``BCG_DEBUG=1`` shows their tracebacks instead. Any other exception is a bug and keeps its
    traceback."""
    debug, args = _debug_requested(list(sys.argv[1:] if argv is None else argv))
    os.environ.setdefault("MUJOCO_GL", "egl")  # before anything imports mujoco: headless offscreen rendering
    if not args or args[0] in ("-h", "--help"):
        print(_usage())
        return 0
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        print(f"bcg: unknown command {name!r}\n{_usage()}", file=sys.stderr)
        return 2
    prog = _command_name(name, rest)
    try:
        try:
            obj = _parse(name, rest)
        except (ValueError, TypeError) as exc:  # a config's own checks of the values it was given
            if debug:
                raise
            print(f"{prog}: error: {one_line(exc)}", file=sys.stderr)
            raise SystemExit(2) from None
        return int(obj.run() or 0)
    except UserError as exc:
        if debug:
            raise
        print(f"{prog}: error: {one_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        if debug:
            raise
        print(f"{prog}: interrupted (Ctrl-C)", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
