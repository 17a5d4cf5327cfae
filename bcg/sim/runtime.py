"""The simulator's runtime: everything :func:`bcg.sim.step` keeps between calls, in one object.

A :class:`Runtime` owns

* the execution options (CPU threads, checkpointing; :class:`bcg.sim.execution.ExecutionOptions`) and the thread
  pool the row blocks of a step run on;
* one :class:`ModelWorkspace` per model: the model's device arrays, the reused no-grad array sets, the pool of
  released gradient-step sets, the idle gradient sets and the launch templates. A workspace lives as long as its
  model (they are held by weak reference to the model), so a model that goes out of scope frees its arrays;
* the bounds the input checks compare against, and the count of bytes held for pending backward passes.

The functional API (:func:`bcg.sim.step`, :func:`bcg.sim.set_execution_options`, ...) uses the process's runtime,
:func:`default_runtime`, which is the only runtime state at module level. Code that wants its own (an isolated
benchmark, a test that must start from empty pools) makes a ``Runtime()`` and passes it as ``runtime=``: nothing in
one runtime is seen by another.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from bcg.sim.execution import ExecutionOptions, options_from_environment

if TYPE_CHECKING:
    from bcg.sim.model import SimModel

__all__ = [
    "ModelWorkspace",
    "Runtime",
    "clear_pool",
    "default_runtime",
    "execution_options",
    "execution_options_set",
    "kept_bytes",
    "parallel",
    "set_execution_options",
]

T = TypeVar("T")


@dataclass
class ModelWorkspace:
    """What a runtime keeps for one model (keys ``(N, per-env physics)`` unless stated)."""

    arrays: Any = None
    """The model's device arrays (:class:`bcg.sim.engine.ModelArrays`), built on first use."""
    layouts: dict = field(default_factory=dict)
    """Buffer layouts of a step's array set (:class:`bcg.sim.engine.SetLayout`)."""
    workspaces: dict = field(default_factory=dict)
    """One reused no-grad array set per shape (the dynamics terms)."""
    block_workspaces: dict = field(default_factory=dict)
    """Reused no-grad array sets of a threaded step, by (block index, rows, per-env physics): two equal blocks
    running at once need two."""
    grad_pool: dict = field(default_factory=dict)
    """Released gradient-step value sets: reusing them avoids page-faulting hundreds of MiB per rollout."""
    pool_bytes: int = 0
    grad_sets: dict = field(default_factory=dict)
    """Idle :class:`bcg.sim.engine.GradArrays`: the gradients of a step are needed only while its backward runs,
    so a few serve every pending step of that shape."""
    templates: dict = field(default_factory=dict)
    """Launch templates by (direction, N, per-env physics), packed once and relocated per array set."""

    def take_released(self, n: int, per_env_physics: bool) -> Any:
        """A released gradient-step value set of ``n`` rows (None when the pool has none); the caller re-zeroes it."""
        pool = self.grad_pool.get((n, per_env_physics))
        if not pool:
            return None
        arrs = pool.pop()
        self.pool_bytes -= arrs.nbytes
        return arrs

    def release(self, arrs: Any, limit_bytes: int) -> None:
        """Keep a gradient-step value set whose backward has run for reuse, unless the pool would exceed
        ``limit_bytes`` (then it is freed with its last reference)."""
        if self.pool_bytes + arrs.nbytes <= limit_bytes:
            self.grad_pool.setdefault((arrs.n, arrs.per_env_physics), []).append(arrs)
            self.pool_bytes += arrs.nbytes

    def clear_pool(self) -> None:
        """Drop the released sets, idle gradient sets and templates (the next gradient step of each shape starts
        as in a fresh process)."""
        self.grad_pool.clear()
        self.pool_bytes = 0
        self.grad_sets.clear()
        self.templates.clear()


class Runtime:
    """Execution options, thread pool, per-model workspaces and counters of the simulator (see the module)."""

    def __init__(self, options: ExecutionOptions | None = None) -> None:
        if options is not None and not isinstance(options, ExecutionOptions):
            raise TypeError(f"options must be an ExecutionOptions, got {type(options).__name__}")
        self._options = options if options is not None else ExecutionOptions()
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._pool_size = 0
        self._workspaces: weakref.WeakKeyDictionary[SimModel, ModelWorkspace] = weakref.WeakKeyDictionary()
        self.value_bounds: dict = {}
        """Per-column bounds of the input checks, by (widths, has qd, speed bounded, device)."""
        self._kept = 0
        self._kept_peak = 0
        self.timer: Callable[[str, float], None] | None = None
        """Called as ``timer("forward" | "backward", seconds)`` after each step's autograd forward and backward pass
        when set (profiling: ``bcg bench --learning`` times the simulator's share of an iteration with it)."""

    # -- execution options -------------------------------------------------------------------------------------

    @property
    def options(self) -> ExecutionOptions:
        """The options the next step run by this runtime uses."""
        return self._options

    def set_options(self, options: ExecutionOptions | None = None, **changes: object) -> ExecutionOptions:
        """Replace the options (``options``, then keyword changes of its fields); returns the previous ones."""
        with self._lock:
            previous = self._options
            base = previous if options is None else options
            if not isinstance(base, ExecutionOptions):
                raise TypeError(f"options must be an ExecutionOptions, got {type(base).__name__}")
            self._options = dataclasses.replace(base, **changes) if changes else base  # type: ignore[arg-type]
        return previous

    @contextlib.contextmanager
    def options_set(self, **changes: object) -> Iterator[ExecutionOptions]:
        """Context manager: the options with ``changes`` inside the block, the previous ones after it."""
        previous = self.set_options(**changes)
        try:
            yield self._options
        finally:
            self.set_options(previous)

    def parallel(self, fns: Sequence[Callable[[], T]]) -> list[T]:
        """Run ``fns`` concurrently (the first in the calling thread, the others on this runtime's pool) and return
        their results in order; the first exception raised by any of them is re-raised after all have finished."""
        if len(fns) == 1:
            return [fns[0]()]
        with self._lock:
            if self._pool is None or self._pool_size < len(fns) - 1:
                if self._pool is not None:
                    self._pool.shutdown(wait=True)
                self._pool_size = len(fns) - 1
                self._pool = ThreadPoolExecutor(max_workers=self._pool_size, thread_name_prefix="bcg-sim")
            pool = self._pool
        futures = [pool.submit(fn) for fn in fns[1:]]
        first: list[T] = []
        error: BaseException | None = None
        try:
            first.append(fns[0]())
        except BaseException as exc:  # noqa: BLE001 -- re-raised below, after the other blocks have finished
            error = exc
        rest = []
        for f in futures:
            try:
                rest.append(f.result())
            except BaseException as exc:  # noqa: BLE001
                error = error or exc
        if error is not None:
            raise error
        return first + rest

    # -- per-model state ---------------------------------------------------------------------------------------

    def workspace(self, model: SimModel) -> ModelWorkspace:
        """The workspace of ``model`` in this runtime (created empty on first use)."""
        ws = self._workspaces.get(model)
        if ws is None:
            with self._lock:
                ws = self._workspaces.setdefault(model, ModelWorkspace())
        return ws

    def clear_pool(self, model: SimModel) -> None:
        """Free ``model``'s released gradient-step arrays, idle gradient sets and launch templates."""
        ws = self._workspaces.get(model)
        if ws is not None:
            ws.clear_pool()

    # -- memory held for pending backward passes ---------------------------------------------------------------

    def keep(self, nbytes: int) -> None:
        """Count ``nbytes`` more (negative: fewer) held for backward passes still to come."""
        self._kept += nbytes
        self._kept_peak = max(self._kept_peak, self._kept)

    def kept_bytes(self, reset_peak: bool = False) -> tuple[int, int]:
        """``(now, peak)``: bytes held for backward passes still to come by steps of this runtime (the Warp arrays'
        values of stored-forward steps; the saved input tensors of checkpointed ones). Not counted: the pooled
        scratch a backward runs on, the same for any number of pending steps (one gradient set per thread block,
        plus for checkpointed steps one value set per block: 4.4 MiB each per 32 environments). ``reset_peak``
        restarts the peak at the current value (call it before a rollout to measure that rollout)."""
        if reset_peak:
            self._kept_peak = self._kept
        return self._kept, self._kept_peak

    def close(self) -> None:
        """Shut the thread pool down (a later parallel step starts a new one)."""
        with self._lock:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
            self._pool, self._pool_size = None, 0


_PROCESS_RUNTIME = Runtime(options_from_environment())


def default_runtime() -> Runtime:
    """The process's runtime: what :func:`bcg.sim.step` and the other functions use unless given ``runtime=``. Its
    options start from the environment variables ``BCG_SIM_THREADS`` and ``BCG_SIM_CHECKPOINT``."""
    return _PROCESS_RUNTIME


def execution_options() -> ExecutionOptions:
    """The options the next :func:`bcg.sim.step` call of the process's runtime uses."""
    return _PROCESS_RUNTIME.options


def set_execution_options(options: ExecutionOptions | None = None, **changes: object) -> ExecutionOptions:
    """Replace the process runtime's options (``options``, then keyword changes of its fields); returns the previous
    ones."""
    return _PROCESS_RUNTIME.set_options(options, **changes)


def execution_options_set(**changes: object) -> contextlib.AbstractContextManager[ExecutionOptions]:
    """Context manager: the process runtime's options with ``changes`` inside the block, the previous ones after."""
    return _PROCESS_RUNTIME.options_set(**changes)


def parallel(fns: Sequence[Callable[[], T]]) -> list[T]:
    """:meth:`Runtime.parallel` of the process's runtime."""
    return _PROCESS_RUNTIME.parallel(fns)


def kept_bytes(reset_peak: bool = False) -> tuple[int, int]:
    """:meth:`Runtime.kept_bytes` of the process's runtime."""
    return _PROCESS_RUNTIME.kept_bytes(reset_peak)


def clear_pool(model: SimModel) -> None:
    """:meth:`Runtime.clear_pool` of the process's runtime."""
    _PROCESS_RUNTIME.clear_pool(model)
