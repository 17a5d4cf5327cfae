"""The default tracking reward and the per-step tracking metrics in Warp launches (CPU, float32).

:class:`WarpTrackingReward` evaluates :class:`bcg.envs.rewards.TrackingReward` of the simulated features against
the reference at motion frames ``frame`` in one launch, reading the reference from a per-frame table instead of
gathering nine reference fields per step; its backward (one more launch, the explicit chain rule: Warp's autodiff
is not used) gives the gradients w.r.t. the simulated features, the actions and the previous actions, checked
against finite differences and torch autograd in ``tests/test_env_warp_features.py``.
:func:`WarpTrackingReward.metrics` gives, for the termination test and ``info["tracking_error"]``, the largest
key-point distance to the reference and the mean body-origin distance [m] (no gradient).

Same formulas as the torch code; values agree to float32 rounding (sums in another order), not bit for bit.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import warp as wp
from torch.autograd.function import once_differentiable

from bcg.envs.rewards import StepContext, TrackingReward
from bcg.envs.warp_features import BucketPool, cpu_array, head, struct_of
from bcg.motion.features import Features

__all__ = ["WarpTrackingReward"]

wp.set_module_options({"enable_backward": False})

_W = ("w_pose", "k_pose", "w_vel", "k_vel", "w_key", "k_key", "w_root", "k_root_pos", "k_root_rot", "w_root_vel",
      "k_root_lin", "k_root_ang", "w_smooth", "k_smooth")


@wp.struct
class _Weights:
    w_pose: float
    k_pose: float
    w_vel: float
    k_vel: float
    w_key: float
    k_key: float
    w_root: float
    k_root_pos: float
    k_root_rot: float
    w_root_vel: float
    k_root_lin: float
    k_root_ang: float
    w_smooth: float
    k_smooth: float


@wp.struct
class _Ref:
    """The reference at every frame (F rows)."""

    joint_pos: wp.array2d(dtype=wp.float32)  # [F, nj]
    joint_vel: wp.array2d(dtype=wp.float32)  # [F, nj]
    key_pos: wp.array2d(dtype=wp.vec3)  # [F, nk]
    body_pos: wp.array2d(dtype=wp.vec3)  # [F, nb]
    root_pos: wp.array(dtype=wp.vec3)  # [F]
    root_rot: wp.array(dtype=wp.mat33)  # [F]
    lin_vel: wp.array(dtype=wp.vec3)  # [F]
    ang_vel: wp.array(dtype=wp.vec3)  # [F]


@wp.func
def _sq_col(A: wp.mat33, B: wp.mat33, c: int) -> float:
    d = wp.vec3(A[0, c] - B[0, c], A[1, c] - B[1, c], A[2, c] - B[2, c])
    return wp.dot(d, d)


@wp.func
def _reward_row(
    joint_pos: wp.array2d(dtype=wp.float32),  # [N, nj]
    joint_vel: wp.array2d(dtype=wp.float32),  # [N, nj]
    key_pos: wp.array2d(dtype=wp.vec3),  # [N, nk]
    root_pos: wp.array(dtype=wp.vec3),  # [N]
    root_rot: wp.array(dtype=wp.mat33),  # [N]
    lin_vel: wp.array(dtype=wp.vec3),  # [N]
    ang_vel: wp.array(dtype=wp.vec3),  # [N]
    actions: wp.array2d(dtype=wp.float32),  # [N, nu]
    prev_actions: wp.array2d(dtype=wp.float32),  # [N, nu]
    i: int,  # the row
    f: int,  # its reference frame (already clamped)
    ref: _Ref,
    W: _Weights,
    nj: int,
    nk: int,
    nu: int,
    terms: wp.array2d(dtype=wp.float32),  # [N, 6] out: the six weighted exponentials (kept for the adjoint)
) -> float:
    """The reward of row ``i`` (also called by the fused step outputs, bcg.envs.warp_step)."""
    pose = float(0.0)  # noqa: UP018 (Warp: a mutable loop-carried variable)
    vel = float(0.0)  # noqa: UP018 (Warp: a mutable loop-carried variable)
    for j in range(nj):
        d = joint_pos[i, j] - ref.joint_pos[f, j]
        pose = pose + d * d
        e = joint_vel[i, j] - ref.joint_vel[f, j]
        vel = vel + e * e
    rp = root_pos[i]
    rrp = ref.root_pos[f]
    key = float(0.0)  # noqa: UP018 (Warp: a mutable loop-carried variable)
    for k in range(nk):
        dk = (key_pos[i, k] - rp) - (ref.key_pos[f, k] - rrp)
        key = key + wp.dot(dk, dk)
    dp = rp - rrp
    root_p = wp.dot(dp, dp)
    R = root_rot[i]
    Rr = ref.root_rot[f]
    root_r = _sq_col(R, Rr, 0) + _sq_col(R, Rr, 2)
    dl = lin_vel[i] - ref.lin_vel[f]
    da = ang_vel[i] - ref.ang_vel[f]
    rate = float(0.0)  # noqa: UP018 (Warp: a mutable loop-carried variable)
    for j in range(nu):
        r = actions[i, j] - prev_actions[i, j]
        rate = rate + r * r
    rate = rate / float(nu)
    e0 = W.w_pose * wp.exp(-W.k_pose * pose)
    e1 = W.w_vel * wp.exp(-W.k_vel * vel)
    e2 = W.w_key * wp.exp(-W.k_key * key)
    e3 = W.w_root * wp.exp(-W.k_root_pos * root_p - W.k_root_rot * root_r)
    e4 = W.w_root_vel * wp.exp(-W.k_root_lin * wp.dot(dl, dl) - W.k_root_ang * wp.dot(da, da))
    e5 = W.w_smooth * wp.exp(-W.k_smooth * rate)
    terms[i, 0] = e0
    terms[i, 1] = e1
    terms[i, 2] = e2
    terms[i, 3] = e3
    terms[i, 4] = e4
    terms[i, 5] = e5
    return e0 + e1 + e2 + e3 + e4 + e5


@wp.struct
class _RewardRows:
    """The reward's per-row inputs (N rows): the simulated features and the actions, or their gradients."""

    joint_pos: wp.array2d(dtype=wp.float32)  # [N, nj] [rad]
    joint_vel: wp.array2d(dtype=wp.float32)  # [N, nj] [rad/s]
    key_pos: wp.array2d(dtype=wp.vec3)  # [N, nk] world [m]
    root_pos: wp.array(dtype=wp.vec3)  # [N] [m]
    root_rot: wp.array(dtype=wp.mat33)  # [N]
    lin_vel: wp.array(dtype=wp.vec3)  # [N] world [m/s]
    ang_vel: wp.array(dtype=wp.vec3)  # [N] body [rad/s]
    actions: wp.array2d(dtype=wp.float32)  # [N, nu]
    prev_actions: wp.array2d(dtype=wp.float32)  # [N, nu]


@wp.kernel
def _reward_forward(
    rows: _RewardRows,
    frame: wp.array(dtype=wp.int32),  # [N] reference frame (already clamped)
    ref: _Ref,
    W: _Weights,
    nj: int,
    nk: int,
    nu: int,
    terms: wp.array2d(dtype=wp.float32),  # [N, 6] out
    reward: wp.array(dtype=wp.float32),  # [N] out
):
    i = wp.tid()
    reward[i] = _reward_row(rows.joint_pos, rows.joint_vel, rows.key_pos, rows.root_pos, rows.root_rot, rows.lin_vel,
                            rows.ang_vel, rows.actions, rows.prev_actions, i, frame[i], ref, W, nj, nk, nu, terms)


@wp.kernel
def _reward_adjoint(
    rows: _RewardRows,
    frame: wp.array(dtype=wp.int32),
    ref: _Ref,
    W: _Weights,
    nj: int,
    nk: int,
    nu: int,
    terms: wp.array2d(dtype=wp.float32),  # [N, 6] the forward's weighted exponentials
    g_reward: wp.array(dtype=wp.float32),  # [N] dL/dreward
    g_rows: _RewardRows,  # out: the gradients of every input
):
    i = wp.tid()
    f = frame[i]
    g = g_reward[i]
    # d(w exp(-k s))/ds = -k w exp(-k s); each squared error s = sum d^2 has ds/dd = 2 d
    c0 = -2.0 * W.k_pose * terms[i, 0] * g
    c1 = -2.0 * W.k_vel * terms[i, 1] * g
    for j in range(nj):
        g_rows.joint_pos[i, j] = c0 * (rows.joint_pos[i, j] - ref.joint_pos[f, j])
        g_rows.joint_vel[i, j] = c1 * (rows.joint_vel[i, j] - ref.joint_vel[f, j])
    rp = rows.root_pos[i]
    rrp = ref.root_pos[f]
    c2 = -2.0 * W.k_key * terms[i, 2] * g
    grp = wp.vec3(0.0)
    for k in range(nk):
        gk = c2 * ((rows.key_pos[i, k] - rp) - (ref.key_pos[f, k] - rrp))
        g_rows.key_pos[i, k] = gk
        grp = grp - gk
    c3 = -2.0 * terms[i, 3] * g
    grp = grp + (c3 * W.k_root_pos) * (rp - rrp)
    g_rows.root_pos[i] = grp
    R = rows.root_rot[i]
    Rr = ref.root_rot[f]
    cr = c3 * W.k_root_rot
    g_rows.root_rot[i] = wp.mat33(cr * (R[0, 0] - Rr[0, 0]), 0.0, cr * (R[0, 2] - Rr[0, 2]),
                                  cr * (R[1, 0] - Rr[1, 0]), 0.0, cr * (R[1, 2] - Rr[1, 2]),
                                  cr * (R[2, 0] - Rr[2, 0]), 0.0, cr * (R[2, 2] - Rr[2, 2]))
    c4 = -2.0 * terms[i, 4] * g
    g_rows.lin_vel[i] = (c4 * W.k_root_lin) * (rows.lin_vel[i] - ref.lin_vel[f])
    g_rows.ang_vel[i] = (c4 * W.k_root_ang) * (rows.ang_vel[i] - ref.ang_vel[f])
    c5 = -2.0 * W.k_smooth * terms[i, 5] * g / float(nu)
    for j in range(nu):
        ga = c5 * (rows.actions[i, j] - rows.prev_actions[i, j])
        g_rows.actions[i, j] = ga
        g_rows.prev_actions[i, j] = -ga


@wp.func
def _metrics_row(
    key_pos: wp.array2d(dtype=wp.vec3),  # [N, nk]
    body_pos: wp.array2d(dtype=wp.vec3),  # [N, nb]
    i: int,
    f: int,  # the reference frame (already clamped)
    ref: _Ref,
    nk: int,
    nb: int,
) -> wp.vec2:
    """(largest key-point distance, mean body-origin distance) [m] of row ``i``."""
    far = float(0.0)  # noqa: UP018 (Warp: a mutable loop-carried variable)
    for k in range(nk):
        dist = wp.length(key_pos[i, k] - ref.key_pos[f, k])
        if not (dist <= far):  # NaN propagates, as in torch's amax
            far = dist
    s = float(0.0)  # noqa: UP018 (Warp: a mutable loop-carried variable)
    for b in range(nb):
        s = s + wp.length(body_pos[i, b] - ref.body_pos[f, b])
    return wp.vec2(far, s / float(nb))


@wp.kernel
def _metrics(
    key_pos: wp.array2d(dtype=wp.vec3),  # [N, nk]
    body_pos: wp.array2d(dtype=wp.vec3),  # [N, nb]
    frame: wp.array(dtype=wp.int32),  # [N]
    ref: _Ref,
    nk: int,
    nb: int,
    out: wp.array2d(dtype=wp.float32),  # [N, 2] out: largest key-point distance, mean body-origin distance [m]
):
    i = wp.tid()
    m = _metrics_row(key_pos, body_pos, i, frame[i], ref, nk, nb)
    out[i, 0] = m[0]
    out[i, 1] = m[1]


_IN = ("joint_pos", "joint_vel", "key_pos", "root_pos", "root_rot", "lin_vel", "ang_vel", "actions", "prev_actions")


class _Buffers:
    def __init__(self, wr: WarpTrackingReward, n: int):
        dev, nj, nk, nb, nu = wr.wp_device, wr.nj, wr.nk, wr.nb, wr.nu
        shapes = {"joint_pos": ((n, nj), wp.float32), "joint_vel": ((n, nj), wp.float32),
                  "key_pos": ((n, nk), wp.vec3), "root_pos": ((n,), wp.vec3), "root_rot": ((n,), wp.mat33),
                  "lin_vel": ((n,), wp.vec3), "ang_vel": ((n,), wp.vec3), "actions": ((n, nu), wp.float32),
                  "prev_actions": ((n, nu), wp.float32)}
        self.w = {k: wp.zeros(s, dtype=d, device=dev) for k, (s, d) in shapes.items()}
        self.gw = {k: wp.zeros(s, dtype=d, device=dev) for k, (s, d) in shapes.items()}
        self.body_pos = wp.zeros((n, nb), dtype=wp.vec3, device=dev)
        self.frame = wp.zeros(n, dtype=wp.int32, device=dev)
        self.terms = wp.zeros((n, 6), dtype=wp.float32, device=dev)
        self.reward = wp.zeros(n, dtype=wp.float32, device=dev)
        self.g_reward = wp.zeros(n, dtype=wp.float32, device=dev)
        self.out = wp.zeros((n, 2), dtype=wp.float32, device=dev)
        self.t = {k: wp.to_torch(a) for k, a in self.w.items()}
        self.gt = {k: wp.to_torch(a) for k, a in self.gw.items()}
        for name in ("body_pos", "frame", "terms", "reward", "g_reward", "out"):
            setattr(self, "t_" + name, wp.to_torch(getattr(self, name)))
        self.launches: dict[tuple, tuple] = {}  # weights -> (forward, backward), packed on first use
        from bcg.sim import TensorLaunch

        cmd = wp.launch(_metrics, dim=n, inputs=[self.w["key_pos"], self.body_pos, self.frame, wr.ref, nk, nb],
                        outputs=[self.out], device=dev, record_cmd=True)
        self.metrics = TensorLaunch(cmd, [("key_pos", self.w["key_pos"]), ("body_pos", self.body_pos),
                                          ("frame", self.frame), ("out", self.out)], rows=True)

    def reward_launches(self, wr: WarpTrackingReward, weights: tuple) -> tuple:
        run = self.launches.get(weights)
        if run is None:
            from bcg.sim import TensorLaunch, prepack

            W = _Weights()
            for name, v in zip(_W, weights, strict=True):
                setattr(W, name, v)
            n, common = self.frame.shape[0], [self.frame, wr.ref, W, wr.nj, wr.nk, wr.nu]
            fwd = wp.launch(_reward_forward, dim=n, inputs=[struct_of(_RewardRows, self.w), *common],
                            outputs=[self.terms, self.reward], device=wr.wp_device, record_cmd=True)
            # the forward reads and writes the caller's tensors (no copies in or out)
            fwd = TensorLaunch(fwd, [*(("rows." + k, self.w[k]) for k in _IN), ("frame", self.frame),
                                     ("terms", self.terms), ("reward", self.reward)], rows=True)
            bwd = wp.launch(_reward_adjoint, dim=n, inputs=[struct_of(_RewardRows, self.w), *common, self.terms,
                                                             self.g_reward],
                            outputs=[struct_of(_RewardRows, self.gw)], device=wr.wp_device, record_cmd=True)
            run = self.launches[weights] = (fwd, prepack(bwd))
        return run


def _reward(wr: WarpTrackingReward, weights: tuple, frame: torch.Tensor, inputs: tuple[torch.Tensor, ...],
            terms: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The forward launch: a fresh reward [n] and, with ``terms``, the six weighted exponentials [n, 6]."""
    n = frame.shape[0]
    reward, out_terms = inputs[0].new_empty(n), inputs[0].new_empty(n, 6)
    with wr.lock:
        fwd, _ = wr.buffers(n).reward_launches(wr, weights)
        fwd(*inputs, frame.to(torch.int32), out_terms, reward)
    return reward, out_terms if terms else None


class _Reward(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, wr: WarpTrackingReward, weights: tuple, frame: torch.Tensor, *inputs: torch.Tensor
                ) -> torch.Tensor:
        reward, terms = _reward(wr, weights, frame, inputs, True)
        ctx.wr, ctx.weights = wr, weights
        ctx.save_for_backward(frame, terms, *inputs)
        return reward

    @staticmethod
    @once_differentiable  # the adjoint launch is not itself differentiable: a double backward raises
    def backward(ctx: Any, g_reward: torch.Tensor):  # type: ignore[override]
        frame, terms, *inputs = ctx.saved_tensors
        wr: WarpTrackingReward = ctx.wr
        n = frame.shape[0]
        with wr.lock:
            buf = wr.buffers(n)
            _, bwd = buf.reward_launches(wr, ctx.weights)
            for name, x in zip(_IN, inputs, strict=True):
                head(buf.t[name], n).copy_(x)
            head(buf.t_frame, n).copy_(frame)
            head(buf.t_terms, n).copy_(terms)
            head(buf.t_g_reward, n).copy_(g_reward)
            bwd()
            grads = [head(buf.gt[k], n).clone() if need else None
                     for k, need in zip(_IN, ctx.needs_input_grad[3:], strict=True)]
        return None, None, None, *grads


class WarpTrackingReward(BucketPool):
    """The default :class:`~bcg.envs.rewards.TrackingReward` against a clip's reference table, in Warp launches.

    Args:
        ref: the reference :class:`Features` at every frame of the clip (F rows, float32).
    """

    def __init__(self, ref: Features, nu: int):
        if set(_W) != {f.name for f in dataclasses.fields(TrackingReward)}:  # a new field would be ignored here
            raise RuntimeError("WarpTrackingReward does not know every TrackingReward field")
        self.wp_device = wp.get_device("cpu")
        self.nj, self.nk, self.nb, self.nu = (int(ref.joint_pos.shape[1]), int(ref.key_pos_w.shape[1]),
                                              int(ref.body_pos_w.shape[1]), int(nu))
        r = _Ref()
        r.joint_pos, r.joint_vel = cpu_array(ref.joint_pos, wp.float32), cpu_array(ref.joint_vel, wp.float32)
        r.key_pos, r.body_pos = cpu_array(ref.key_pos_w, wp.vec3), cpu_array(ref.body_pos_w, wp.vec3)
        r.root_pos, r.root_rot = cpu_array(ref.root_pos_w, wp.vec3), cpu_array(ref.root_rot_w, wp.mat33)
        r.lin_vel, r.ang_vel = cpu_array(ref.root_lin_vel_w, wp.vec3), cpu_array(ref.root_ang_vel_b, wp.vec3)
        self.ref = r
        super().__init__()

    def make_buffers(self, rows: int) -> _Buffers:
        return _Buffers(self, rows)

    @staticmethod
    def accepts(reward_fn: Any, sim: Features, ctx: StepContext) -> bool:
        """Whether ``reward_fn`` is the plain :class:`TrackingReward` (not a subclass) and the features and actions
        are float32 CPU tensors (at least one row)."""
        xs = (*sim, ctx.actions, ctx.prev_actions)
        return (type(reward_fn) is TrackingReward and all(x.dtype == torch.float32 and x.device.type == "cpu"
                                                          for x in xs) and sim.body_rot_w.shape[0] > 0)

    def __call__(self, reward_fn: TrackingReward, sim: Features, frame: torch.Tensor, ctx: StepContext
                 ) -> torch.Tensor:
        """Reward [N] of ``sim`` against the reference at frames ``frame`` [N] (clamped to the clip)."""
        weights = tuple(float(getattr(reward_fn, k)) for k in _W)
        inputs = (sim.joint_pos, sim.joint_vel, sim.key_pos_w, sim.root_pos_w, sim.root_rot_w, sim.root_lin_vel_w,
                  sim.root_ang_vel_b, ctx.actions, ctx.prev_actions)
        if torch.is_grad_enabled() and any(x.requires_grad for x in inputs):
            return _Reward.apply(self, weights, frame, *inputs)
        return _reward(self, weights, frame, tuple(x.detach() for x in inputs), False)[0]  # the launch alone

    def metrics(self, sim: Features, frame: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(largest key-point distance [N], mean body-origin distance [N]) [m] to the reference at ``frame`` [N]
        (clamped), without gradient."""
        n = frame.shape[0]
        out = sim.key_pos_w.new_empty(n, 2)
        with self.lock:
            self.buffers(n).metrics(sim.key_pos_w.detach(), sim.body_pos_w.detach(), frame.to(torch.int32), out)
        return out[:, 0], out[:, 1]
