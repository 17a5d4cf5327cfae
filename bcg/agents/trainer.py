"""The training loop around any :class:`~bcg.agents.base.Agent`: :class:`Trainer` runs iterations, logs metrics.csv
and TensorBoard, evaluates periodically, checkpoints, and stops cleanly on a limit, Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import csv
import io
import json
import math
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from bcg.agents.base import METRIC_NAMES
from bcg.agents.checkpoint import (
    Checkpoint,
    CheckpointError,
    check_compatible,
    save_checkpoint,
    verify_agent_fits,
)
from bcg.agents.run_dir import collect_versions, write_text_atomic
from bcg.agents.train_config import RECORDED_FIELDS, RUN_CONTROL_FIELDS
from bcg.files import remove_stale_temporaries

__all__ = ["EVAL_COLUMNS", "FIXED_COLUMNS", "Trainer"]


FIXED_COLUMNS: tuple[str, ...] = ("iteration", "samples", "wall_time_s")
"""The trainer's own metrics.csv columns, before :data:`~bcg.agents.base.METRIC_NAMES` and the agent's extras."""

EVAL_COLUMNS: dict[str, str] = {
    "eval_tracking_error_cm": "E_track of the deterministic policy on the fixed evaluation episodes [cm]",
    "eval_fall_rate": "fraction of the evaluation episodes that ended in a fall",
    "eval_episode_s": "mean length of the evaluation episodes [s] (at most --eval-seconds)",
}
"""Columns of the periodic evaluation (NaN on iterations without one): the policy's mean action, replayed in our
simulator from fixed start phases with fixed initial noise, so that the numbers of a run are comparable over its
iterations and across methods (the training columns mix exploration noise and the changing episode phases)."""


def _fmt(col: str, v: float) -> str:
    """A metrics.csv cell: integers for iteration / samples, ``repr`` for floats (round-trips exactly)."""
    if col in ("iteration", "samples") and math.isfinite(v):
        return str(int(v))
    return repr(float(v))


def _human(n: float) -> str:
    for unit, div in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= div:
            return f"{n / div:.3g}{unit}"
    return f"{n:.0f}"


# -------------------------------------------------------------------------------------------- the loop


def _signal_label(signum: int) -> str:
    return "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name


class Trainer:
    """Runs any :class:`~bcg.agents.base.Agent` for ``iterations`` in a run directory, logging and checkpointing.

    Args:
        agent: the agent (fresh, or about to continue ``resume_from``).
        run_dir: the run directory (made if missing).
        config: the resolved config as JSON-able values (written to config.json and into every checkpoint).
        iterations: total iterations (the loop runs from ``agent.iteration`` to here); None: until ``max_time_s``
            or a stop signal.
        checkpoint_every: checkpoint period in iterations (0: only at the end and on Ctrl-C or SIGTERM).
        max_time_s: stop once the cumulative training wall time reaches this [s] (None: no limit).
        schedule_over_time: before each iteration, tell an agent with ``set_schedule_progress`` the share of
            ``max_time_s`` spent (its learning-rate schedule then spans the time budget).
        resume_from: a checkpoint to continue: its config must equal ``config`` except :data:`RUN_CONTROL_FIELDS`,
            its agent state must fit ``agent``; the metrics rows are restored from it.
        progress: show the tqdm bar. tensorboard: write event files.
        export: write ``policy.pt`` from ``agent.export_policy()`` at the end.
        evaluator: ``evaluator(agent) -> {column: value}`` for the :data:`EVAL_COLUMNS`
            (:func:`bcg.evaluation.periodic.policy_evaluator`), called after iteration 1, every ``eval_every``
            iterations and after the last; its time is not counted.
    """

    def __init__(self, agent: Any, *, run_dir: str | Path, config: Mapping[str, Any], iterations: int | None,
                 checkpoint_every: int = 50, max_time_s: float | None = None, resume_from: Checkpoint | None = None,
                 schedule_over_time: bool = False, progress: bool = True, tensorboard: bool = True, export: bool = True,
                 evaluator: Callable[[Any], Mapping[str, float]] | None = None, eval_every: int = 0):
        self.agent = agent
        self.evaluator = evaluator
        self.eval_every = int(eval_every) if evaluator is not None else 0
        self.run_dir = Path(run_dir)
        self.config = dict(config)
        self.iterations = None if iterations is None else int(iterations)
        self.checkpoint_every = int(checkpoint_every)
        self.max_time_s = max_time_s
        if schedule_over_time and max_time_s is None:
            raise ValueError("schedule_over_time needs max_time_s (the budget the schedule runs over)")
        self.schedule_over_time = bool(schedule_over_time)
        self.progress = progress
        self.tensorboard = tensorboard
        self.export = export
        self.header: list[str] = []
        self.rows: list[list[float]] = []
        self.resume_from = resume_from
        self._stop = False  # set by the first Ctrl-C / SIGTERM: finish the iteration, checkpoint, stop
        self._stop_signal = signal.SIGINT  # which one (the exit status is 128 + its number)
        self._in_iteration = False
        self._tb_values: dict[str, float] = {}
        self.last_checkpoint: Path | None = None

    # ------------------------------------------------------------------------------------ files

    @property
    def checkpoint_dir(self) -> Path:
        return self.run_dir / "checkpoints"

    @property
    def metrics_path(self) -> Path:
        return self.run_dir / "metrics.csv"

    def _prepare(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.checkpoint_dir.mkdir(exist_ok=True)
        for f in remove_stale_temporaries(self.run_dir, self.checkpoint_dir):
            print(f"[bcg train] removed {f}, left by a write that was killed", file=sys.stderr)
        ck = self.resume_from
        if ck is not None:
            check_compatible(ck, self.config, ignore=RUN_CONTROL_FIELDS + RECORDED_FIELDS)
            verify_agent_fits(ck, self.agent)
            try:
                self.agent.load_state_dict(ck.agent_state)
            except (ValueError, KeyError, RuntimeError, TypeError) as exc:
                raise CheckpointError(f"{ck.path}: the agent refused the state: {exc}") from None
            if int(self.agent.iteration) != ck.iteration:
                raise CheckpointError(f"{ck.path}: the agent state is at iteration {self.agent.iteration}, the "
                                      f"trainer's at {ck.iteration}")
            if self.iterations is not None and ck.iteration > self.iterations:
                raise CheckpointError(f"{ck.path} is at iteration {ck.iteration}, beyond --iterations "
                                      f"{self.iterations}; ask for more iterations to continue")
            self.header = list(ck.metrics_header)
            self.rows = [list(r) for r in ck.metrics_rows]
        write_text_atomic(self.run_dir / "config.json", json.dumps(self.config, indent=2, sort_keys=True) + "\n")
        write_text_atomic(self.run_dir / "versions.json",
                           json.dumps(collect_versions(), indent=2, sort_keys=True) + "\n")
        if self.header:  # rows beyond the checkpoint (a crash after it) are dropped: the run repeats them
            buf = io.StringIO()
            w = csv.writer(buf, lineterminator="\n")
            w.writerow(self.header)
            for r in self.rows:
                w.writerow([_fmt(c, v) for c, v in zip(self.header, r, strict=True)])
            write_text_atomic(self.metrics_path, buf.getvalue())
        elif self.metrics_path.exists():
            self.metrics_path.unlink()

    def _row(self, metrics: Mapping[str, float], wall: float) -> list[float]:
        missing = [k for k in METRIC_NAMES if k not in metrics]
        if missing:
            raise ValueError(f"{type(self.agent).__name__}.train_iteration did not return {missing} (every agent "
                             "returns the scalars of bcg.agents.base.METRIC_NAMES, NaN where one does not apply)")
        values = {"iteration": float(self.agent.iteration), "samples": float(self.agent.samples),
                  "wall_time_s": wall}
        for k, v in metrics.items():
            if k in values:
                continue
            try:
                values[k] = float(v)
            except (TypeError, ValueError):
                raise ValueError(f"metric {k!r} is not a number: {v!r}") from None
        if not self.header:  # fixed at the first row; a later extra key goes to TensorBoard only
            extras = [k for k in metrics if k not in METRIC_NAMES and k not in FIXED_COLUMNS and k not in EVAL_COLUMNS]
            evals = list(EVAL_COLUMNS) if self.eval_every else []
            self.header = [*FIXED_COLUMNS, *METRIC_NAMES, *evals, *extras]
            with open(self.metrics_path, "w", newline="", encoding="utf-8") as f:
                csv.writer(f, lineterminator="\n").writerow(self.header)
        self._tb_values = values
        return [values.get(c, math.nan) for c in self.header]

    def _append_row(self, row: list[float]) -> None:
        self.rows.append(row)
        with open(self.metrics_path, "a", newline="", encoding="utf-8") as f:
            csv.writer(f, lineterminator="\n").writerow([_fmt(c, v) for c, v in zip(self.header, row, strict=True)])
            f.flush()

    def write_checkpoint(self) -> Path:
        """Checkpoint the agent and the trainer's state now (atomically) as ``checkpoints/iter_NNNNNN.pt``."""
        it = int(self.agent.iteration)
        path = self.checkpoint_dir / f"iter_{it:06d}.pt"
        save_checkpoint(path, agent_state=self.agent.state_dict(), iteration=it, run_id=self.run_dir.name,
                        config=self.config, metrics_header=self.header, metrics_rows=self.rows)
        self.last_checkpoint = path
        return path

    # ------------------------------------------------------------------------------------ Ctrl-C, SIGTERM

    def _on_stop_signal(self, signum: int, frame: Any) -> None:
        """Ctrl-C (SIGINT) or SIGTERM: finish the iteration, checkpoint, stop; a second one (or one outside an
        iteration) stops at once through KeyboardInterrupt (the loop still checkpoints between iterations)."""
        if self._stop or not self._in_iteration:
            self._stop_signal = signal.Signals(signum)
            raise KeyboardInterrupt
        self._stop, self._stop_signal = True, signal.Signals(signum)
        print(f"\n[bcg train] {_signal_label(signum)}: finishing iteration {self.agent.iteration + 1}, then writing a "
              f"checkpoint ({_signal_label(signum)} again to stop at once without one)", file=sys.stderr, flush=True)

    # ------------------------------------------------------------------------------------ run

    def run(self) -> int:
        """Train up to ``iterations``; returns 0 when done, 130 when stopped by Ctrl-C and 143 by SIGTERM (after
        checkpointing)."""
        from tqdm import tqdm

        self._prepare()
        start = int(self.agent.iteration)
        wall0 = self.rows[-1][self.header.index("wall_time_s")] if self.rows else 0.0
        writer = None
        if self.tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            # purge_step: a resumed run discards events the interrupted one logged after its checkpoint
            writer = SummaryWriter(log_dir=str(self.run_dir / "tensorboard"),
                                   purge_step=start + 1 if self.resume_from is not None else None)
        old_handlers: dict[int, Any] = {}
        if threading.current_thread() is threading.main_thread():  # only the main thread may set handlers
            for sig in (signal.SIGINT, signal.SIGTERM):
                old_handlers[sig] = signal.signal(sig, self._on_stop_signal)
        bar = tqdm(total=self.iterations, initial=start, desc=self.run_dir.name[:40], unit="it", dynamic_ncols=True,
                   disable=not self.progress, file=sys.stderr)
        status = 0
        wall = float(wall0)
        try:
            while not self._reached(self.agent.iteration) and not self._stop:
                if self.max_time_s is not None and wall >= self.max_time_s:
                    print(f"[bcg train] time limit {self.max_time_s:g} s reached after {self.agent.iteration} "
                          "iterations", file=sys.stderr)
                    break
                if self.schedule_over_time and hasattr(self.agent, "set_schedule_progress"):
                    self.agent.set_schedule_progress(wall / self.max_time_s)
                t0 = time.perf_counter()
                # an iteration and its row are one unit: a Ctrl-C / SIGTERM in here only sets _stop (_on_stop_signal)
                self._in_iteration = True
                metrics = self.agent.train_iteration()
                wall += time.perf_counter() - t0
                done_it = int(self.agent.iteration)
                if self.eval_every and (done_it == 1 or done_it % self.eval_every == 0 or self._reached(done_it)
                                        or (self.max_time_s is not None and wall >= self.max_time_s)):
                    metrics = {**metrics, **{k: float(v) for k, v in self.evaluator(self.agent).items()}}
                row = self._row(metrics, wall)
                self._append_row(row)
                it = int(self.agent.iteration)
                if writer is not None:
                    for k, v in self._tb_values.items():
                        if k != "iteration":
                            writer.add_scalar(k, v, it)
                self._in_iteration = False
                bar.update(it - bar.n)
                bar.set_postfix_str(self._postfix(metrics), refresh=False)
                if self.checkpoint_every and it % self.checkpoint_every == 0 and not self._reached(it):
                    self.write_checkpoint()
                    if writer is not None:
                        writer.flush()
        except KeyboardInterrupt:
            bar.close()
            if self._in_iteration:  # stopped inside train_iteration: the agent's state is half-updated
                print(f"\n[bcg train] stopped inside iteration {self.agent.iteration + 1}; its state is not saved. "
                      f"Last checkpoint: {self.last_checkpoint or 'none'}", file=sys.stderr)
                if writer is not None:
                    writer.close()
                return 128 + int(self._stop_signal)
            self._stop = True
        finally:
            bar.close()
            for sig, handler in old_handlers.items():
                signal.signal(sig, handler)
        path = self.write_checkpoint()
        if writer is not None:
            writer.close()
        if self._stop:
            print(f"[bcg train] stopped by {_signal_label(self._stop_signal)} at iteration {self.agent.iteration}: "
                  f"checkpoint {path}\n[bcg train] continue with: bcg train --resume {self.run_dir}", file=sys.stderr)
            status = 128 + int(self._stop_signal)
        elif self.export:
            from bcg.agents.export import save_policy

            pol = save_policy(self.run_dir / "policy.pt", self.agent.export_policy())
            print(f"[bcg train] done: {self.agent.iteration} iterations, {self.agent.samples} samples; "
                  f"checkpoint {path}; policy {pol}", file=sys.stderr)
        return status

    def _reached(self, iteration: int) -> bool:
        """Whether ``iteration`` is the last one asked for (never, without an iteration limit)."""
        return self.iterations is not None and iteration >= self.iterations

    @staticmethod
    def _postfix(m: Mapping[str, float]) -> str:
        def g(k: str, fmt: str) -> str:
            v = m.get(k, math.nan)
            return format(float(v), fmt) if v is not None else "nan"

        ev = f"eval={g('eval_tracking_error_cm', '.1f')}cm " if "eval_tracking_error_cm" in m else ""
        return (f"reward={g('reward', '.3f')} track={g('tracking_error_cm', '.1f')}cm {ev}"
                f"trig={g('trigger_rate', '.3f')} gnorm={g('grad_norm', '.3g')} skip={g('skipped_updates', '.0f')}")


# -------------------------------------------------------------------------------------------- train / export
