"""Everything the vector env computes from the simulated state after the physics, in one Warp launch (CPU, no
gradient): the instability check, the features, the default reward, the tracking metrics, the termination flags and
the next observation.

Why one launch: right after a physics step every distinct torch operation and Python path runs cold (the step's
28 kernel launches have evicted the interpreter's and torch's code and data from the caches). Measured at N = 64
on this machine: the first ``x + 1`` after the step took 50 us, a repeat 7 us, each further distinct operation 20-50
us; the same operations in a warm loop take 3-5 us. Without gradients the env's own step was about 60 such
operations and five launches; here it is one launch on the caller's tensors (:class:`bcg.sim.replay.TensorLaunch`:
views of the simulated ``q`` and ``qd``, fresh outputs) and a few views.

The launch calls the same row functions as the separate launches (:func:`bcg.envs.warp_features._fk_row`,
``warp_reward._reward_row`` and ``_metrics_row``, ``warp_observation._obs_row``, ``warp_checks._unstable_row``),
so its values are those launches' bits (``tests/test_env_warp_features.py``). A step with an unstable row takes the
general path (the row is replaced by its reference pose before the features), which the caller detects from
``bad``.
"""

from __future__ import annotations

import math
import threading
from typing import Any, NamedTuple

import torch
import warp as wp

from bcg.envs.warp_checks import _unstable_row
from bcg.envs.warp_features import WarpKinematics, _fk_row, _Kin, bucket
from bcg.envs.warp_observation import WarpObservation, _obs_row, _ObsTable
from bcg.envs.warp_reward import _W, WarpTrackingReward, _metrics_row, _Ref, _reward_row, _Weights

__all__ = ["StepOutputs", "WarpStepOutputs"]

wp.set_module_options({"enable_backward": False})


@wp.kernel
def _step_outputs(
    q: wp.array2d(dtype=wp.float32),  # [N, nq] the simulated state
    qd: wp.array2d(dtype=wp.float32),  # [N, nv]
    joint_pos: wp.array2d(dtype=wp.float32),  # [N, nj] view of q
    joint_vel: wp.array2d(dtype=wp.float32),  # [N, nj] view of qd
    root_pos: wp.array(dtype=wp.vec3),  # [N] view of q
    lin_vel: wp.array(dtype=wp.vec3),  # [N] view of qd
    ang_vel: wp.array(dtype=wp.vec3),  # [N] view of qd
    actions: wp.array2d(dtype=wp.float32),  # [N, nu]
    prev_actions: wp.array2d(dtype=wp.float32),  # [N, nu]
    frame0: wp.array(dtype=wp.int64),  # [N] the frame at the start of the step
    steps0: wp.array(dtype=wp.int64),  # [N] episode steps at the start of the step
    kc: _Kin,  # the kinematics constants (WarpKinematics.consts)
    ref: _Ref,  # the reward's reference table
    W: _Weights,
    tb: _ObsTable,  # the observation's reference table and sizes (WarpObservation.table)
    nb: int,
    nj: int,
    nk: int,
    nu: int,
    nq: int,
    nv: int,
    limit: float,  # the instability bounds (UnstableCheck)
    max_pos: float,
    max_qd: float,
    check_finite: int,
    term_height: float,  # termination below this root height [m]
    term_distance: float,  # termination beyond this key-point distance [m]
    max_steps: wp.int64,  # truncation after this many episode steps (-1: none)
    num_frames: wp.int64,
    rot: wp.array2d(dtype=wp.mat33),  # [M >= N, nb] scratch: body rotations
    pos: wp.array2d(dtype=wp.vec3),  # [M, nb] scratch: body origins
    key: wp.array2d(dtype=wp.vec3),  # [M, nk] scratch: key points
    root_rot: wp.array(dtype=wp.mat33),  # [M] scratch: view of rot[:, 0]
    terms: wp.array2d(dtype=wp.float32),  # [M, 6] scratch
    fut: wp.array2d(dtype=wp.int32),  # [M, K] scratch: the observation's reference frames
    reward: wp.array(dtype=wp.float32),  # [N] out
    obs: wp.array2d(dtype=wp.float32),  # [N, D] out
    track: wp.array(dtype=wp.float32),  # [N] out: mean body-origin distance to the reference [m]
    frame: wp.array(dtype=wp.int64),  # [N] out: frame0 + 1
    steps: wp.array(dtype=wp.int64),  # [N] out: steps0 + 1
    bad: wp.array(dtype=wp.bool),  # [N] out: unstable after the physics
    fell: wp.array(dtype=wp.bool),  # [N] out
    terminated: wp.array(dtype=wp.bool),  # [N] out
    truncated: wp.array(dtype=wp.bool),  # [N] out
    done: wp.array(dtype=wp.bool),  # [N] out: terminated or truncated
    counts: wp.array(dtype=wp.int32),  # [2] out, zeroed by the caller: rows unstable, rows done
):
    i = wp.tid()
    unstable = _unstable_row(q, qd, i, limit, max_pos, max_qd, check_finite, nq, nv) != 0
    fr = frame0[i] + wp.int64(1)
    st = steps0[i] + wp.int64(1)
    last = num_frames - wp.int64(1)
    fc = int(wp.clamp(fr, wp.int64(0), last))
    _fk_row(q, i, kc, nb, nk, rot, pos, key)
    reward[i] = _reward_row(joint_pos, joint_vel, key, root_pos, root_rot, lin_vel, ang_vel, actions, prev_actions,
                            i, fc, ref, W, nj, nk, nu, terms)
    m = _metrics_row(key, pos, i, fc, ref, nk, nb)
    for r in range(tb.nref):
        fut[i, r] = int(wp.clamp(fr + wp.int64(1 + r), wp.int64(0), last))
    _obs_row(root_pos, root_rot, lin_vel, ang_vel, joint_vel, rot, key, fut, i, tb, obs)
    down = q[i, 2] < term_height
    term = down or m[0] > term_distance or unstable
    trunc = fr >= last or (max_steps >= wp.int64(0) and st >= max_steps)
    track[i] = m[1]
    frame[i] = fr
    steps[i] = st
    bad[i] = unstable
    fell[i] = down
    terminated[i] = term
    truncated[i] = trunc and not term
    done[i] = term or trunc
    if unstable:
        wp.atomic_add(counts, 0, 1)
    if term or trunc:
        wp.atomic_add(counts, 1, 1)


class StepOutputs(NamedTuple):
    """What :class:`WarpStepOutputs` returns for N rows (fresh tensors)."""

    reward: torch.Tensor  # [N]
    obs: torch.Tensor  # [N, D]
    track: torch.Tensor  # [N] mean body-origin distance to the reference [m]
    frame: torch.Tensor  # [N] long
    steps: torch.Tensor  # [N] long
    bad: torch.Tensor  # [N] bool
    fell: torch.Tensor  # [N] bool
    terminated: torch.Tensor  # [N] bool
    truncated: torch.Tensor  # [N] bool
    done: torch.Tensor  # [N] bool: terminated | truncated
    num_bad: int  # rows unstable after the physics
    num_done: int  # rows terminated or truncated


_BOUND = ("q", "qd", "actions", "prev_actions", "frame0", "steps0", "reward", "obs", "track", "frame", "steps", "bad",
          "fell", "terminated", "truncated", "done")
_OUTPUTS = _BOUND[6:]
_VIEWS = (("joint_pos", "q", 7), ("joint_vel", "qd", 6), ("root_pos", "q", 0), ("lin_vel", "qd", 0),
          ("ang_vel", "qd", 3))  # (argument, the state it is a column range of, first column)


class WarpStepOutputs:
    """``(q1, qd1, actions, prev_actions, frame0, steps0) -> StepOutputs`` of the default reward, in one launch.

    Args:
        kin, obs, reward: the env's :class:`WarpKinematics`, :class:`WarpObservation` and
            :class:`WarpTrackingReward` (their constants and reference tables are shared, not copied).
        num_frames: F, frames of the clip.
    """

    def __init__(self, kin: WarpKinematics, obs: WarpObservation, reward: WarpTrackingReward, num_frames: int):
        self.kin, self.wo, self.wr, self.num_frames = kin, obs, reward, int(num_frames)
        self._launches: dict[tuple, Any] = {}
        self._scratch: dict[int, list] = {}
        self._weights: dict[int, tuple] = {}  # id(reward_fn) -> (reward_fn, its weights)
        self._counts = wp.zeros(2, dtype=wp.int32, device="cpu")
        self._counts_np = self._counts.numpy()  # the same memory: read and zeroed without a torch operation
        self.lock = threading.Lock()

    @staticmethod
    def accepts(*xs: torch.Tensor) -> bool:
        """Whether the tensors can take this path (float32 or int64 CPU tensors, at least one row, the last
        dimension contiguous)."""
        return all(x.is_cpu and (x.dtype == torch.float32 or x.dtype == torch.int64) and x.stride(-1) == 1
                   for x in xs) and xs[0].shape[0] > 0

    def _launch(self, n: int, weights: tuple, bounds: tuple, terms: tuple) -> Any:
        from bcg.sim import TensorLaunch

        m = bucket(n)
        key = (m, weights, bounds, terms)
        run = self._launches.get(key)
        if run is not None:
            return run
        kin, wo, wr, dev = self.kin, self.wo, self.wr, "cpu"
        nb, nk, nj, nu, k, nq = kin.nb, kin.nk, wr.nj, wr.nu, wo.ref_steps, kin.nq
        nv = nj + 6

        def z(shape: tuple, dtype: Any) -> wp.array:
            return wp.zeros(shape, dtype=dtype, device=dev)

        scratch = self._scratch.get(m)
        if scratch is None:
            rot = z((m, nb), wp.mat33)
            root_rot = wp.array(ptr=rot.ptr, dtype=wp.mat33, shape=(m,), strides=(rot.strides[0],), device=dev)
            scratch = self._scratch[m] = [rot, z((m, nb), wp.vec3), z((m, nk), wp.vec3), root_rot,
                                          z((m, 6), wp.float32), z((m, k), wp.int32)]
        templates = {"q": z((m, nq), wp.float32), "qd": z((m, nv), wp.float32), "joint_pos": z((m, nj), wp.float32),
                     "joint_vel": z((m, nj), wp.float32), "root_pos": z(m, wp.vec3), "lin_vel": z(m, wp.vec3),
                     "ang_vel": z(m, wp.vec3), "actions": z((m, nu), wp.float32),
                     "prev_actions": z((m, nu), wp.float32), "frame0": z(m, wp.int64), "steps0": z(m, wp.int64),
                     "reward": z(m, wp.float32), "obs": z((m, wo.dim), wp.float32), "track": z(m, wp.float32),
                     "frame": z(m, wp.int64), "steps": z(m, wp.int64), "bad": z(m, wp.bool), "fell": z(m, wp.bool),
                     "terminated": z(m, wp.bool), "truncated": z(m, wp.bool), "done": z(m, wp.bool)}
        W = _Weights()
        for name, v in zip(_W, weights, strict=True):
            setattr(W, name, v)
        limit, max_pos, max_qd = (float(b) for b in bounds)
        height, distance, max_steps = float(terms[0]), float(terms[1]), int(terms[2])
        t = templates
        cmd = wp.launch(
            _step_outputs, dim=m,
            inputs=[t["q"], t["qd"], t["joint_pos"], t["joint_vel"], t["root_pos"], t["lin_vel"], t["ang_vel"],
                    t["actions"], t["prev_actions"], t["frame0"], t["steps0"], kin.consts, wr.ref, W, wo.table,
                    nb, nj, nk, nu, nq, nv, limit, max_pos, max_qd, int(not math.isfinite(limit)), height,
                    distance, wp.int64(max_steps), wp.int64(self.num_frames), *scratch],
            outputs=[*(t[x] for x in _OUTPUTS), self._counts], device=dev, record_cmd=True)
        run = self._launches[key] = TensorLaunch(cmd, [(x, t[x]) for x in _BOUND], rows=True,
                                                 views=[(x, t[x], src, col) for x, src, col in _VIEWS])
        return run  # the templates are only layouts: every call points the launch at its own tensors

    def __call__(self, q: torch.Tensor, qd: torch.Tensor, actions: torch.Tensor, prev_actions: torch.Tensor,
                 frame0: torch.Tensor, steps0: torch.Tensor, reward_fn: Any, bounds: tuple[float, float, float],
                 height: float, distance: float, max_steps: int | None) -> StepOutputs:
        """The step's outputs for the simulated ``q`` [N, nq], ``qd`` [N, nv] after ``actions`` [N, nu] (previous
        ``prev_actions``) from frames ``frame0`` [N] and episode steps ``steps0`` [N]; ``reward_fn`` a plain
        :class:`~bcg.envs.rewards.TrackingReward`; ``bounds`` (state_limit, largest |root position|, largest
        |qd|) of the instability check; termination below root ``height`` [m] or beyond key-point ``distance``
        [m]; truncation at the clip's end or after ``max_steps`` (None: no limit)."""
        n = q.shape[0]
        weights = self._weights.get(id(reward_fn))
        if weights is None or weights[0] is not reward_fn:  # TrackingReward is frozen: its weights never change
            weights = self._weights[id(reward_fn)] = (reward_fn, tuple(float(getattr(reward_fn, k)) for k in _W))
        weights = weights[1]
        new = q.new_empty
        reward, obs, track = new(n), new(n, self.wo.dim), new(n)
        frame, steps = frame0.new_empty(n), frame0.new_empty(n)
        bad, fell, terminated, truncated, done = (torch.empty(n, dtype=torch.bool) for _ in range(5))
        with self.lock:
            run = self._launch(n, weights, bounds, (height, distance, -1 if max_steps is None else max_steps))
            self._counts_np[:] = 0
            run(q, qd, actions, prev_actions, frame0, steps0, reward, obs, track, frame, steps, bad, fell, terminated,
                truncated, done)
            num_bad, num_done = int(self._counts_np[0]), int(self._counts_np[1])
        return StepOutputs(reward, obs, track, frame, steps, bad, fell, terminated, truncated, done, num_bad, num_done)
