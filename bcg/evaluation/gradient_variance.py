"""Policy-gradient variance of the gradient estimators (docs/method.md §3.10).

What is measured, for one clip, contact stiffness kappa, window length T and a list of estimators:

* **A fixed policy that tracks** (:class:`TrackingPolicy`): the reference-target action of the next frame
  (``env.target_to_action(reference joint angles)``) plus a linear residual ``[o_norm, 1] @ theta_e`` on the
  normalised observation. ``theta`` [E, D + 1, 29] holds one copy per environment (identical values), so one
  backward pass of ``sum_e R_e`` gives every environment's own policy gradient ``g_e = dR_e / dtheta_e``
  (environments do not interact).
* **Paired windows** (:func:`start_states`): per seed, E start states drawn by ``env.reset(seed)`` at random clip
  frames that leave T steps before the clip's end; every estimator gets the same start states and its generator is
  reset to the same seed. The window is rolled out with the pure ``env.transition`` (no autoreset); ``R_e`` sums the
  rewards of environment e until it terminates (a fall ends its return, later steps add nothing).
* **Statistics** (:func:`summarize`): V = sum over parameters of the across-environment sample variance of g_e, the
  relative variance V / |mean g|^2, bootstrap intervals of V (resampling environments) and of V_est / V_ref (paired:
  the same resampled environments for both estimators), the cosine between the mean gradients of different seeds
  (direction consistency), the trigger rate and rows simulated per environment-step (``est.total_stats``), the
  wall-clock of forward + backward and the peak resident-memory increase (VmHWM after ``/proc/self/clear_refs``,
  Linux; on CUDA the peak of ``torch.cuda.max_memory_allocated``).
* **A zeroth-order reference** (:func:`zeroth_order_reference`): the gradient of the Gaussian-smoothed return with
  respect to the residual's bias row (the constant action offset, 29 parameters), from antithetic pairs
  ``(R(theta + w) - R(theta - w)) w / (2 sigma^2)`` on the same start states, without autograd. Its cosine with each
  estimator's mean bias gradient checks that low variance is not bought with a wrong direction. Only the bias block
  is compared: the full parameter vector (24 650 entries) would need far more samples than a check can afford.

Used by ``benchmarks/estimators.py`` and ``tests/test_gradient_variance.py``.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from bcg.envs.dynamics import Dynamics
from bcg.sim import ContactParams

__all__ = ["EstimatorRun", "PeakMemory", "TrackingPolicy", "VarianceStudy", "WindowSet", "bootstrap_summed_variance",
           "estimator_gradients", "jittered_copies", "make_estimator", "make_study_env", "observation_normaliser",
           "run_study", "start_states", "study_dict", "summarize", "summed_variance",
           "zeroth_order_reference"]


@dataclass(frozen=True)
class VarianceStudy:
    """One measurement configuration (a clip, a stiffness, a window length, environments and seeds)."""

    clip: str = "jump"
    """Reference clip of the environment: ``run``, ``jump``, ``fight``, ``dance`` (``BCG-G1-<Clip>-v0``) or the path
    of a motion file (``.npz`` / ``.csv``, as ``bcg train --motion``)."""
    dynamics: Dynamics = Dynamics()
    """The simulator's dynamics (:class:`bcg.envs.Dynamics`; :attr:`kappa` is its contact stiffness, default 300)."""
    num_envs: int = 64
    """E, environments (start states) per seed; the variance is taken across them."""
    window: int = 32
    """T, control steps of the differentiable window."""
    seeds: tuple[int, ...] = (0, 1, 2, 3)
    """Seeds: each gives its own start states (``env.reset(seed)``) and estimator draws, shared by all estimators."""
    theta_std: float = 0.0
    """Standard deviation of the residual's initial parameters (0: exactly the reference-target policy)."""
    theta_seed: int = 0
    """Seed of the initial parameter draw (the same theta for every estimator and seed)."""
    bootstrap: int = 1000
    """Bootstrap resamples of the environments (intervals of V and of the variance ratios)."""
    confidence: float = 0.9
    """Coverage of the bootstrap percentile intervals."""
    shared_start: bool = False
    """Diagnostic: every environment of a seed starts from the seed's first start state plus independent
    N(0, start_jitter^2) offsets of the hinge angles, so that V measures how much the gradient changes under tiny
    state changes (the contact sensitivity smoothing is meant to tame) instead of across different clip phases."""
    start_jitter: float = 1e-3
    """Standard deviation of the hinge-angle offsets of ``shared_start`` [rad]."""
    zo_sigma: float = 0.02
    """Zeroth-order reference: standard deviation of the Gaussian perturbation of the bias row (action units)."""
    zo_rounds: int = 8
    """Zeroth-order reference: antithetic pairs per environment and seed (0: no reference)."""
    device: str = "cpu"
    """Torch / Warp device."""

    def __post_init__(self) -> None:
        for name in ("num_envs", "window", "bootstrap"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name} must be an int >= 1, got {v!r}")
        if self.num_envs < 2:
            raise ValueError(f"num_envs must be >= 2 (a variance across environments), got {self.num_envs}")
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"seeds must be a non-empty tuple of distinct ints, got {self.seeds!r}")
        if not (0.0 < self.confidence < 1.0):
            raise ValueError(f"confidence must lie in (0, 1), got {self.confidence!r}")
        if set(self.dynamics.chosen()) - {"kappa"}:
            raise ValueError("a variance study is measured at a contact stiffness: its dynamics may set kappa only, "
                             f"got {self.dynamics}")
        if self.zo_sigma <= 0 or self.zo_rounds < 0 or self.theta_std < 0:
            raise ValueError("zo_sigma must be > 0, zo_rounds and theta_std >= 0; got "
                             f"{self.zo_sigma!r}, {self.zo_rounds!r}, {self.theta_std!r}")

    @property
    def kappa(self) -> float:
        """The contact stiffness of the study [1/m]: ``dynamics.kappa``, else the simulator's default."""
        return float(self.dynamics.kappa if self.dynamics.kappa is not None else ContactParams.kappa)


# -------------------------------------------------------------------------------------------- environment, policy


def make_study_env(clip: str, kappa: float, num_envs: int, device: str = "cpu", **env_kwargs: Any) -> Any:
    """The differentiable batched env of ``clip`` (a packaged name, as ``BCG-G1-<Clip>-v0``, or a motion file, as
    ``bcg train --motion`` takes) with ``num_envs`` rows at stiffness kappa. ``env_kwargs``: further env options, e.g.
    a trained policy's action map and dynamics (:func:`bcg.evaluation.evaluate_cli.policy_env_kwargs`; kappa wins
    over theirs). An unknown name or a missing or malformed file raises :class:`~bcg.errors.UserError`."""
    from bcg.envs.vector_env import G1TrackingVectorEnv
    from bcg.motion.formats import resolve_motion_path

    resolve_motion_path(clip)  # a wrong name or path: one line that says what is accepted
    return G1TrackingVectorEnv(num_envs, clip, differentiable=True, device=device, **{**env_kwargs,
                                                                                      "kappa": float(kappa)})


def start_states(env: Any, seed: int, count: int, window: int) -> Any:
    """``count`` start states (an :class:`bcg.envs.EnvState`) of ``env.reset(seed=seed)`` whose frame leaves
    ``window`` steps before the clip's end. ``env.num_envs`` must be large enough to hold them (the function resets
    ``env`` once and keeps the first rows that qualify)."""
    env.reset(seed=int(seed))
    s = env.state
    ok = (s.frame + window < env.num_frames - 1).nonzero().flatten()
    if ok.numel() < count:
        raise ValueError(f"only {ok.numel()} of {env.num_envs} reset rows leave {window} steps before the clip's end; "
                         f"need {count}: make the env with more rows")
    return s[ok[:count]]


def jittered_copies(state: Any, count: int, jitter: float, seed: int) -> Any:
    """``count`` copies of the one-row ``state`` with distinct env ids 0..count-1 and independent N(0, jitter^2)
    offsets on the hinge angles (row 0 unchanged); velocities, frame and everything else are shared; the copies
    carry no transition memory."""
    if state.num_envs != 1:
        raise ValueError(f"jittered_copies expects a one-row state, got {state.num_envs} rows")
    rows = state.repeat_interleave(count)
    g = torch.Generator(device=rows.q.device).manual_seed(int(seed) + 104729)
    off = jitter * torch.randn(count, rows.q.shape[1] - 7, generator=g, device=rows.q.device)
    off[0] = 0.0
    q = torch.cat([rows.q[:, :7], rows.q[:, 7:] + off], 1)
    return dataclasses.replace(rows, q=q, env_id=torch.arange(count, device=rows.q.device), memory={})


def observation_normaliser(env: Any, count: int = 256, seed: int = 1_000_003, floor: float = 0.1
                           ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(mean [D], std [D])`` of the noise-free observations of reset states (the reference at random frames), std
    floored at ``floor`` so that nearly constant entries do not blow up small deviations. Fixed per env (seed)."""
    rows = []
    with torch.no_grad():
        while sum(r.shape[0] for r in rows) < count:
            env.reset(seed=seed + len(rows))
            rows.append(env.observe())
    obs = torch.cat(rows)[:count]
    return obs.mean(0), obs.std(0).clamp(min=floor)


class TrackingPolicy:
    """Reference-target action plus a linear residual on the normalised observation, one parameter copy per row.

    ``actions(env, state, theta)`` -> [n, 29]: ``target_to_action(qpos_ref[frame + 1, 7:]) + [o_norm, 1] @ theta``
    with ``theta`` [n, D + 1, 29] (row e of the state uses ``theta[e]``); ``o_norm = (obs - mean) / std``.
    """

    def __init__(self, env: Any, mean: torch.Tensor, std: torch.Tensor) -> None:
        self.mean, self.std = mean.detach(), std.detach()
        self.ref_joints = torch.as_tensor(env.motion.qpos, dtype=torch.float32, device=env.device)[:, 7:]
        self.num_frames = int(env.num_frames)
        self.obs_dim = int(mean.shape[0])
        self.num_actions = int(self.ref_joints.shape[1])

    @property
    def bias_row(self) -> int:
        """Index of the bias row of theta (the constant action offset)."""
        return self.obs_dim

    def initial_theta(self, n: int, std: float = 0.0, seed: int = 0, device: str | torch.device = "cpu"
                      ) -> torch.Tensor:
        """[n, D + 1, 29] identical copies of one parameter draw N(0, std^2) (zeros for std 0)."""
        g = torch.Generator().manual_seed(int(seed))
        one = std * torch.randn(self.obs_dim + 1, self.num_actions, generator=g)
        return one[None].repeat(n, 1, 1).to(device)

    def actions(self, env: Any, state: Any, theta: torch.Tensor) -> torch.Tensor:
        frame = (state.frame + 1).clamp(max=self.num_frames - 1)
        base = env.target_to_action(self.ref_joints[frame], joint_offset=state.joint_offset)
        o = (env.observe(state) - self.mean) / self.std
        x = torch.cat([o, torch.ones_like(o[:, :1])], 1)
        return base + torch.einsum("nd,nda->na", x, theta)


# -------------------------------------------------------------------------------------------- estimators


def make_estimator(spec: str) -> Any:
    """The estimator of a spec (``name[:key=value,...]``, :func:`bcg.estimators.parse_spec`) from the registry,
    plugins included."""
    from bcg.estimators import make_spec

    return make_spec(spec)


class PeakMemory:
    """Peak memory increase over a block: on CUDA ``torch.cuda.max_memory_allocated`` minus the allocation at the
    start; on the CPU the process' resident high-water mark (VmHWM, reset through ``/proc/self/clear_refs``) minus
    the resident size at the start (Linux; ``bytes`` is -1 where /proc is not available)."""

    def __init__(self, device: str | torch.device) -> None:
        self.device = torch.device(device)
        self.bytes = -1

    @staticmethod
    def _status(key: str) -> int:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
        return -1

    def __enter__(self) -> PeakMemory:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._start = torch.cuda.memory_allocated(self.device)
        else:
            _trim_heap()  # hand freed heap pages back, so that the start level is not an earlier run's high water
            try:
                with open("/proc/self/clear_refs", "w") as f:
                    f.write("5")
                self._start = self._status("VmRSS")
            except OSError:
                self._start = None
        return self

    def __exit__(self, *exc: object) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.bytes = int(torch.cuda.max_memory_allocated(self.device) - self._start)
        elif self._start is not None and self._start >= 0:
            self.bytes = max(self._status("VmHWM") - self._start, 0)


def _trim_heap() -> None:
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


@dataclass
class EstimatorRun:
    """One estimator on one seed's window."""

    grads: torch.Tensor
    """[E, P] per-environment policy gradients dR_e/dtheta_e (float64, P = (D + 1) * 29)."""
    returns: torch.Tensor
    """[E] window returns R_e."""
    alive: torch.Tensor
    """[E] bool: the environment did not terminate inside the window."""
    seconds: float
    """Wall-clock of the forward rollout plus the backward pass [s]."""
    peak_bytes: int
    """Peak memory increase during forward + backward (see :class:`PeakMemory`)."""
    stats: dict[str, int]
    """``est.total_stats`` of the window (calls, envs, envs_triggered, branches_simulated, ...)."""
    peak_forces: torch.Tensor | None = None
    """[K] the largest foot-sphere contact force [N] of every (environment, step) of the window that was alive and
    in contact: the quantity a force-triggered bundle compares with its threshold tau."""


def _rollout_return(env: Any, policy: TrackingPolicy, theta: torch.Tensor, start: Any, window: int,
                    forces: list[torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    # forces: when given, the step's largest sphere force [N] of the alive rows in contact is appended each step
    s, ret = start, torch.zeros(start.num_envs, device=theta.device)
    alive = torch.ones(start.num_envs, dtype=torch.bool, device=theta.device)
    for _ in range(window):
        s, r, terminated, truncated, contact = env.transition(s, policy.actions(env, s, theta))
        if forces is not None:
            f = contact.peak_force.detach().amax(1)
            forces.append(f[alive & (f > 0)].to(torch.float64).cpu())
        ret = ret + torch.where(alive, r, torch.zeros_like(r))
        alive = alive & ~(terminated | truncated)
    return ret, alive


def estimator_gradients(env: Any, estimator: Any, policy: TrackingPolicy, theta0: torch.Tensor, start: Any,
                        window: int, seed: int) -> EstimatorRun:
    """Roll out ``window`` steps from ``start`` (E rows) with ``estimator`` as the env's transition function (its
    generator reset to ``seed``), back-propagate ``sum_e R_e`` to the per-row parameters and return the per-row
    gradients. The env's transition function is restored afterwards; the env's own state is not touched."""
    old = env.transition_fn
    estimator.reset(seed=int(seed))
    estimator.attach(env)
    theta = theta0.detach().clone().requires_grad_(True)
    try:
        sync = torch.cuda.synchronize if theta.device.type == "cuda" else (lambda: None)
        with PeakMemory(theta.device) as mem:
            sync()
            t0 = time.perf_counter()
            forces: list[torch.Tensor] = []
            ret, alive = _rollout_return(env, policy, theta, start, window, forces)
            ret.sum().backward()
            sync()
            seconds = time.perf_counter() - t0
    finally:
        env.transition_fn = old
    grads = theta.grad.reshape(theta.shape[0], -1).to(torch.float64).cpu()
    return EstimatorRun(grads=grads, returns=ret.detach().cpu(), alive=alive.cpu(), seconds=seconds,
                        peak_bytes=mem.bytes, stats=estimator.total_stats.as_dict(),
                        peak_forces=torch.cat(forces) if forces else torch.zeros(0, dtype=torch.float64))


def zeroth_order_reference(env: Any, policy: TrackingPolicy, theta0: torch.Tensor, start: Any, window: int,
                           sigma: float, rounds: int, seed: int) -> torch.Tensor:
    """[rounds, E, 29] antithetic zeroth-order samples of the gradient of the smoothed return with respect to the
    bias row: ``(R_e(theta + w) - R_e(theta - w)) w / (2 sigma^2)``, w ~ N(0, sigma^2 I) per row and round, plain
    simulator (no estimator), no autograd. Their mean estimates d/dbias E_w[R(bias + w)]."""
    from bcg.envs import simulator_step

    old = env.transition_fn
    env.transition_fn = simulator_step
    g = torch.Generator(device=theta0.device).manual_seed(int(seed) + 7919)
    n, na = theta0.shape[0], policy.num_actions
    out = []
    try:
        with torch.no_grad():
            for _ in range(rounds):
                w = sigma * torch.randn(n, na, generator=g, device=theta0.device)
                r = []
                for sign in (1.0, -1.0):
                    th = theta0.clone()
                    th[:, policy.bias_row] += sign * w
                    r.append(_rollout_return(env, policy, th, start, window)[0])
                out.append(((r[0] - r[1]) / (2 * sigma**2))[:, None] * w)
    finally:
        env.transition_fn = old
    return torch.stack(out).to(torch.float64).cpu()


# -------------------------------------------------------------------------------------------- statistics


def _force_quantiles(forces: list[torch.Tensor | None]) -> list[float] | None:
    """Median, 90 %, 99 % and largest [N] of the recorded contact forces (None when none was recorded)."""
    got = [f for f in forces if f is not None and f.numel()]
    if not got:
        return None
    f = torch.cat(got).to(torch.float64)
    return [float(x) for x in torch.quantile(f, torch.tensor([0.5, 0.9, 0.99, 1.0], dtype=f.dtype))]


def summed_variance(g: torch.Tensor) -> float:
    """V = sum over the columns of ``g`` [E, P] of the unbiased across-row variance (docs/method.md §3.10)."""
    return float(g.to(torch.float64).var(0, unbiased=True).sum())


def _resample_weights(n: int, count: int, generator: torch.Generator) -> torch.Tensor:
    """[count, n] bootstrap weights: multinomial counts of n draws with replacement, divided by n."""
    idx = torch.randint(0, n, (count, n), generator=generator)
    ones = torch.ones(count, n, dtype=torch.float64)
    return torch.zeros(count, n, dtype=torch.float64).scatter_add_(1, idx, ones) / n


def bootstrap_summed_variance(g: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """[K] V of each bootstrap resample of the rows of ``g`` [E, P], given as ``weights`` [K, E] (counts / E)."""
    g = g.to(torch.float64)
    n = g.shape[0]
    m1 = weights @ g
    m2 = weights @ (g * g)
    return (m2 - m1 * m1).sum(1) * (n / (n - 1))


def _cos(a: torch.Tensor, b: torch.Tensor) -> float:
    den = float(a.norm() * b.norm())
    return float(a @ b) / den if den > 0 else float("nan")


def _interval(x: torch.Tensor, confidence: float) -> list[float]:
    lo = (1 - confidence) / 2
    return [float(torch.quantile(x, lo)), float(torch.quantile(x, 1 - lo))]


def summarize(runs: dict[str, dict[int, EstimatorRun]], reference: str, *, bias_slice: slice | None = None,
              zo: dict[int, torch.Tensor] | None = None, bootstrap: int = 1000, confidence: float = 0.9,
              seed: int = 0) -> dict[str, dict[str, Any]]:
    """Statistics per estimator of ``runs[label][seed]`` (all labels on the same seeds and start states).

    Per label: ``V`` (mean over seeds of the summed variance), ``V_ci`` (bootstrap interval, environments resampled
    within every seed), ``V_per_seed``, ``rel_var`` (V / |mean g|^2, means over seeds), ``ratio`` = V / V_reference
    with ``ratio_ci`` (paired bootstrap: the same resampled environments for both) and ``ratio_per_seed``,
    ``consistency`` (mean cosine between the mean gradients of two different seeds; NaN with one seed),
    ``trigger_rate`` (rows branched per environment-step), ``rows_per_step`` (rows simulated per environment-step),
    ``seconds`` and ``peak_bytes`` (means over seeds) with ``time_ratio`` and ``mem_ratio`` to the reference,
    ``fell`` (fraction of environments that terminated), ``mean_return`` and, with ``zo`` (seed -> [rounds, E, k]
    samples of :func:`zeroth_order_reference`) and ``bias_slice`` (the columns of g they refer to), ``cos_zo``
    (cosine between the label's mean gradient over all seeds on those columns and the mean of the zeroth-order
    samples) and, for the reference itself, ``zo_split_cos`` (cosine between two halves of the zeroth-order samples:
    how precise the reference direction is).
    """
    if reference not in runs:
        raise ValueError(f"reference estimator {reference!r} is not among the runs {sorted(runs)}")
    seeds = sorted(runs[reference])
    for label, per_seed in runs.items():
        if sorted(per_seed) != seeds:
            raise ValueError(f"{label!r} ran on seeds {sorted(per_seed)}, the reference on {seeds}")
    gen = torch.Generator().manual_seed(int(seed))
    weights = {s: _resample_weights(runs[reference][s].grads.shape[0], bootstrap, gen) for s in seeds}
    boot = {label: torch.stack([bootstrap_summed_variance(per_seed[s].grads, weights[s]) for s in seeds]).mean(0)
            for label, per_seed in runs.items()}
    ref_v = {s: summed_variance(runs[reference][s].grads) for s in seeds}
    zo_mean = None
    if zo is not None and bias_slice is not None:
        zo_mean = torch.cat([zo[s].mean(0) for s in seeds]).mean(0)  # the mean over all rows of all seeds
    out: dict[str, dict[str, Any]] = {}
    for label, per_seed in runs.items():
        v = {s: summed_variance(per_seed[s].grads) for s in seeds}
        means = {s: per_seed[s].grads.mean(0) for s in seeds}
        rel = [v[s] / float(means[s] @ means[s]) if float(means[s] @ means[s]) > 0 else float("inf") for s in seeds]
        pairs = list(itertools.combinations(seeds, 2))
        stats = [per_seed[s].stats for s in seeds]
        envs = sum(st["envs"] for st in stats)
        norms = torch.cat([per_seed[s].grads.norm(dim=1) for s in seeds])
        res: dict[str, Any] = {
            "V": sum(v.values()) / len(seeds),
            "V_ci": _interval(boot[label], confidence),
            "V_per_seed": [v[s] for s in seeds],
            "rel_var": sum(rel) / len(rel),
            "rel_var_per_seed": rel,
            "ratio": sum(v.values()) / sum(ref_v.values()),
            "ratio_ci": _interval(boot[label] / boot[reference], confidence),
            "ratio_per_seed": [v[s] / ref_v[s] for s in seeds],
            "consistency": (sum(_cos(means[a], means[b]) for a, b in pairs) / len(pairs)) if pairs else float("nan"),
            "trigger_rate": sum(st["envs_triggered"] for st in stats) / max(envs, 1),
            "rows_per_step": sum(st["branches_simulated"] for st in stats) / max(envs, 1),
            "nonfinite_dropped": sum(st["nonfinite_dropped"] for st in stats),
            "seconds": sum(per_seed[s].seconds for s in seeds) / len(seeds),
            "peak_bytes": sum(per_seed[s].peak_bytes for s in seeds) / len(seeds),
            "grad_norm_q50_q90_max": [float(x) for x in torch.quantile(norms, torch.tensor([0.5, 0.9, 1.0],
                                                                                          dtype=norms.dtype))],
            "fell": sum(float((~per_seed[s].alive).float().mean()) for s in seeds) / len(seeds),
            "peak_force_q50_q90_q99_max": _force_quantiles([per_seed[s].peak_forces for s in seeds]),
            "mean_return": sum(float(per_seed[s].returns.mean()) for s in seeds) / len(seeds),
        }
        if zo_mean is not None:
            est_mean = torch.cat([per_seed[s].grads[:, bias_slice] for s in seeds]).mean(0)
            res["cos_zo"] = _cos(est_mean, zo_mean)
        out[label] = res
    base = out[reference]
    for res in out.values():
        res["time_ratio"] = res["seconds"] / base["seconds"] if base["seconds"] > 0 else float("nan")
        res["mem_ratio"] = res["peak_bytes"] / base["peak_bytes"] if base["peak_bytes"] > 0 else float("nan")
    if zo_mean is not None:
        all_zo = torch.cat([zo[s] for s in seeds], 1)  # [rounds, S E, k]
        half = all_zo.shape[0] // 2
        base["zo_split_cos"] = (_cos(all_zo[:half].mean((0, 1)), all_zo[half:].mean((0, 1)))
                                if half else float("nan"))
        base["zo_samples"] = int(all_zo.shape[0] * all_zo.shape[1])
    return out


# -------------------------------------------------------------------------------------------- the study


@dataclass(frozen=True)
class WindowSet:
    """What :func:`run_study` measured: the configuration, the runs and the summary."""

    study: VarianceStudy
    runs: dict[str, dict[int, EstimatorRun]]
    zo: dict[int, torch.Tensor] | None
    summary: dict[str, dict[str, Any]]


def run_study(study: VarianceStudy, estimators: Sequence[str] = ("bptt", "grs", "bcg"), *, env: Any = None,
              progress: Callable[[str], None] | None = None) -> WindowSet:
    """Measure every estimator spec of ``estimators`` (the first is the reference of the ratios) on the study's
    seeds (paired start states and draws) and summarise (:func:`summarize`). ``env``: an env from
    :func:`make_study_env` with at least ``2 * num_envs`` rows (one is made otherwise); ``progress`` is called with a
    short label before every rollout (e.g. a progress bar's update)."""
    if len(set(estimators)) != len(estimators) or not estimators:
        raise ValueError(f"estimators must be distinct specs, got {list(estimators)}")
    built = {spec: make_estimator(spec) for spec in estimators}  # fail early on a bad spec
    if env is None:
        env = make_study_env(study.clip, study.kappa, 2 * study.num_envs, study.device)
    mean, std = observation_normaliser(env)
    policy = TrackingPolicy(env, mean, std)
    theta0 = policy.initial_theta(study.num_envs, study.theta_std, study.theta_seed, env.device)
    runs: dict[str, dict[int, EstimatorRun]] = {spec: {} for spec in estimators}
    zo: dict[int, torch.Tensor] | None = {} if study.zo_rounds else None
    for seed in study.seeds:
        if study.shared_start:
            start = jittered_copies(start_states(env, seed, 1, study.window), study.num_envs, study.start_jitter, seed)
        else:
            start = start_states(env, seed, study.num_envs, study.window)
        for spec, est in built.items():
            if progress is not None:
                progress(f"{spec} seed {seed}")
            runs[spec][seed] = estimator_gradients(env, est, policy, theta0, start, study.window, seed)
        if zo is not None:
            if progress is not None:
                progress(f"zeroth-order seed {seed}")
            zo[seed] = zeroth_order_reference(env, policy, theta0, start, study.window, study.zo_sigma,
                                              study.zo_rounds, seed)
    na = policy.num_actions
    bias = slice(policy.bias_row * na, (policy.bias_row + 1) * na)
    summary = summarize(runs, estimators[0], bias_slice=bias, zo=zo, bootstrap=study.bootstrap,
                        confidence=study.confidence, seed=study.theta_seed)
    return WindowSet(study=study, runs=runs, zo=zo, summary=summary)


def study_dict(study: VarianceStudy) -> dict[str, Any]:
    """The study's fields as a JSON-ready dict (the stiffness as ``kappa``), with the sha256 of the clip's file
    (``clip_sha256``)."""
    from bcg.motion.formats import motion_sha256

    d = dataclasses.asdict(study)
    d.pop("dynamics")
    d["kappa"] = study.kappa  # the layout of studies written before the dynamics were one option group
    d["seeds"] = list(study.seeds)
    d["clip_sha256"] = motion_sha256(study.clip)
    return d
