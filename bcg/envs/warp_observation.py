"""The fused observation (:func:`bcg.envs.observations.observation`) in one Warp launch, with a hand-written adjoint.

At N = 64 the torch observation is about 25 operations (heading frame, five broadcast 3 x 3 products, three table
gathers, the concatenation), 0.6-0.9 ms per step, most of it per-operation overhead. Here one CPU launch (one
thread per row) writes the whole [N, D] observation; the backward is one more launch, the explicit chain rule
through the heading frame (Warp's autodiff is not used), checked against finite differences and torch autograd in
``tests/test_env_warp_features.py``.

Same formulas and layout as the torch function; the values agree to float32 rounding (the 3 x 3 products sum in
another order), not bit for bit. Only float32 CPU inputs take this path.
"""

from __future__ import annotations

from typing import Any

import torch
import warp as wp
from torch.autograd.function import once_differentiable

from bcg.envs.observations import ReferenceTable
from bcg.envs.warp_features import BucketPool, cpu_array, head, struct_of
from bcg.motion.features import Features

__all__ = ["WarpObservation"]

# the adjoint is written by hand below: Warp's generated one would only cost compile time
wp.set_module_options({"enable_backward": False})


@wp.func
def _get6(g: wp.array2d(dtype=wp.float32), i: int, o: int) -> wp.mat33:
    """The adjoint of _put6: a matrix with the six entries in its first and third columns."""
    return wp.mat33(g[i, o + 0], 0.0, g[i, o + 3],
                    g[i, o + 1], 0.0, g[i, o + 4],
                    g[i, o + 2], 0.0, g[i, o + 5])


@wp.func
def _get3(g: wp.array2d(dtype=wp.float32), i: int, o: int) -> wp.vec3:
    return wp.vec3(g[i, o + 0], g[i, o + 1], g[i, o + 2])


@wp.func
def _heading_inverse(R0: wp.mat33) -> wp.mat33:
    fx, fy = R0[0, 0], R0[1, 0]
    n = wp.sqrt(fx * fx + fy * fy + 1.0e-12)
    c, s = fx / n, fy / n
    return wp.mat33(c, s, 0.0, -s, c, 0.0, 0.0, 0.0, 1.0)


@wp.func
def _put6_h(obs: wp.array2d(dtype=wp.float32), i: int, o: int, c: float, s: float, M: wp.mat33):
    """_put6 of Hi M with Hi = [[c, s, 0], [-s, c, 0], [0, 0, 1]]: the two columns only, Hi's zeros skipped."""
    obs[i, o + 0] = c * M[0, 0] + s * M[1, 0]
    obs[i, o + 1] = c * M[1, 0] - s * M[0, 0]
    obs[i, o + 2] = M[2, 0]
    obs[i, o + 3] = c * M[0, 2] + s * M[1, 2]
    obs[i, o + 4] = c * M[1, 2] - s * M[0, 2]
    obs[i, o + 5] = M[2, 2]


@wp.func
def _put3_h(obs: wp.array2d(dtype=wp.float32), i: int, o: int, c: float, s: float, v: wp.vec3):
    """_put3 of Hi v."""
    obs[i, o + 0] = c * v[0] + s * v[1]
    obs[i, o + 1] = c * v[1] - s * v[0]
    obs[i, o + 2] = v[2]


@wp.struct
class _ObsTable:
    """The clip's reference table and the sizes of the observation launches."""

    points: wp.array2d(dtype=wp.vec3)  # [F, 1 + nk] reference root, then key points
    root_rot: wp.array(dtype=wp.mat33)  # [F]
    body_rot6: wp.array2d(dtype=wp.float32)  # [F, 6 nb]
    nb: int
    nj: int
    nk: int
    nref: int  # K, reference frames per observation


@wp.func
def _obs_row(
    root_pos: wp.array(dtype=wp.vec3),  # [N]
    root_rot: wp.array(dtype=wp.mat33),  # [N]
    lin_vel: wp.array(dtype=wp.vec3),  # [N] world frame
    ang_vel: wp.array(dtype=wp.vec3),  # [N] root frame
    joint_vel: wp.array2d(dtype=wp.float32),  # [N, nj]
    body_rot: wp.array2d(dtype=wp.mat33),  # [N, nb]
    key_pos: wp.array2d(dtype=wp.vec3),  # [N, nk]
    fut: wp.array2d(dtype=wp.int32),  # [N, K] reference frames
    i: int,  # the row
    tb: _ObsTable,
    obs: wp.array2d(dtype=wp.float32),  # [N, D] out
):
    """Row ``i`` of the observation (also called by the fused step outputs, bcg.envs.warp_step)."""
    R0 = root_rot[i]
    # the inverse heading [[c, s, 0], [-s, c, 0], [0, 0, 1]] (bcg.motion.rotations.heading_inverse)
    fx, fy = R0[0, 0], R0[1, 0]
    n = wp.sqrt(fx * fx + fy * fy + 1.0e-12)
    c, s = fx / n, fy / n
    rp = root_pos[i]
    obs[i, 0] = rp[2]
    _put6_h(obs, i, 1, c, s, R0)
    _put3_h(obs, i, 7, c, s, lin_vel[i])
    _put3_h(obs, i, 10, c, s, R0 @ ang_vel[i])
    o = 13
    for b in range(tb.nb):
        _put6_h(obs, i, o + 6 * b, c, s, body_rot[i, b])
    o = o + 6 * tb.nb
    for j in range(tb.nj):
        obs[i, o + j] = joint_vel[i, j]
    o = o + tb.nj
    for k in range(tb.nk):
        _put3_h(obs, i, o + 3 * k, c, s, key_pos[i, k] - rp)
    o = o + 3 * tb.nk
    for r in range(tb.nref):
        f = fut[i, r]
        _put3_h(obs, i, o, c, s, tb.points[f, 0] - rp)
        _put6_h(obs, i, o + 3, c, s, tb.root_rot[f])
        o = o + 9
        for m in range(6 * tb.nb):
            obs[i, o + m] = tb.body_rot6[f, m]
        o = o + 6 * tb.nb
        for k in range(tb.nk):
            _put3_h(obs, i, o + 3 * k, c, s, tb.points[f, 1 + k] - rp)
        o = o + 3 * tb.nk


@wp.struct
class _ObsRows:
    """The observation's per-row inputs (N rows), or their gradients."""

    root_pos: wp.array(dtype=wp.vec3)  # [N] world [m]
    root_rot: wp.array(dtype=wp.mat33)  # [N]
    lin_vel: wp.array(dtype=wp.vec3)  # [N] world [m/s]
    ang_vel: wp.array(dtype=wp.vec3)  # [N] body [rad/s]
    joint_vel: wp.array2d(dtype=wp.float32)  # [N, nj] [rad/s] (the adjoint does not read it: obs is linear in it)
    body_rot: wp.array2d(dtype=wp.mat33)  # [N, nb]
    key_pos: wp.array2d(dtype=wp.vec3)  # [N, nk] world [m]


@wp.kernel
def _obs_forward(
    rows: _ObsRows,
    fut: wp.array2d(dtype=wp.int32),
    tb: _ObsTable,
    obs: wp.array2d(dtype=wp.float32),  # [N, D] out
):
    _obs_row(rows.root_pos, rows.root_rot, rows.lin_vel, rows.ang_vel, rows.joint_vel, rows.body_rot, rows.key_pos,
             fut, wp.tid(), tb, obs)


@wp.kernel
def _obs_adjoint(
    rows: _ObsRows,
    fut: wp.array2d(dtype=wp.int32),
    tb: _ObsTable,
    g: wp.array2d(dtype=wp.float32),  # [N, D] dL/dobs
    g_rows: _ObsRows,  # out: the gradients of every input
):
    i = wp.tid()
    R0 = rows.root_rot[i]
    Hi = _heading_inverse(R0)
    HiT = wp.transpose(Hi)
    rp = rows.root_pos[i]
    gHi = wp.mat33(0.0)
    gR0 = wp.mat33(0.0)
    grp = wp.vec3(0.0, 0.0, g[i, 0])
    # root orientation: obs = tn(Hi R0)
    gM = _get6(g, i, 1)
    gHi = gHi + gM @ wp.transpose(R0)
    gR0 = gR0 + HiT @ gM
    # root velocities: Hi v and Hi (R0 w)
    gl = _get3(g, i, 7)
    v = rows.lin_vel[i]
    gHi = gHi + wp.outer(gl, v)
    g_rows.lin_vel[i] = HiT @ gl
    ga = _get3(g, i, 10)
    w = rows.ang_vel[i]
    gHi = gHi + wp.outer(ga, R0 @ w)
    gaw = HiT @ ga
    gR0 = gR0 + wp.outer(gaw, w)
    g_rows.ang_vel[i] = wp.transpose(R0) @ gaw
    o = 13
    for b in range(tb.nb):  # tn(Hi R_b)
        gMb = _get6(g, i, o + 6 * b)
        gHi = gHi + gMb @ wp.transpose(rows.body_rot[i, b])
        g_rows.body_rot[i, b] = HiT @ gMb
    o = o + 6 * tb.nb
    for j in range(tb.nj):
        g_rows.joint_vel[i, j] = g[i, o + j]
    o = o + tb.nj
    for k in range(tb.nk):  # Hi (p_k - rp)
        gy = _get3(g, i, o + 3 * k)
        gHi = gHi + wp.outer(gy, rows.key_pos[i, k] - rp)
        gx = HiT @ gy
        g_rows.key_pos[i, k] = gx
        grp = grp - gx
    o = o + 3 * tb.nk
    for r in range(tb.nref):
        f = fut[i, r]
        gy = _get3(g, i, o)
        gHi = gHi + wp.outer(gy, tb.points[f, 0] - rp)
        grp = grp - HiT @ gy
        gMr = _get6(g, i, o + 3)
        gHi = gHi + gMr @ wp.transpose(tb.root_rot[f])
        o = o + 9 + 6 * tb.nb  # the reference's own body orientations are constants
        for k in range(tb.nk):
            gy = _get3(g, i, o + 3 * k)
            gHi = gHi + wp.outer(gy, tb.points[f, 1 + k] - rp)
            grp = grp - HiT @ gy
        o = o + 3 * tb.nk
    # Hi = [[c, s, 0], [-s, c, 0], [0, 0, 1]] with (c, s) = (fx, fy) / sqrt(fx^2 + fy^2 + 1e-12)
    gc = gHi[0, 0] + gHi[1, 1]
    gs = gHi[0, 1] - gHi[1, 0]
    fx, fy = R0[0, 0], R0[1, 0]
    n = wp.sqrt(fx * fx + fy * fy + 1.0e-12)
    n3 = n * n * n
    gfx = gc * (1.0 / n - fx * fx / n3) - gs * (fx * fy / n3)
    gfy = gs * (1.0 / n - fy * fy / n3) - gc * (fx * fy / n3)
    gR0 = gR0 + wp.mat33(gfx, 0.0, 0.0, gfy, 0.0, 0.0, 0.0, 0.0, 0.0)
    g_rows.root_rot[i] = gR0
    g_rows.root_pos[i] = grp


_IN = ("root_pos", "root_rot", "lin_vel", "ang_vel", "joint_vel", "body_rot", "key_pos")


class _Buffers:
    """Warp arrays of one batch size, their torch views, and both launches packed once (``bcg.sim.replay``)."""

    def __init__(self, wo: WarpObservation, n: int):
        from bcg.sim import TensorLaunch, prepack

        dev, nb, nj, nk, k = wo.wp_device, wo.nb, wo.nj, wo.nk, wo.ref_steps
        shapes = {"root_pos": ((n,), wp.vec3), "root_rot": ((n,), wp.mat33), "lin_vel": ((n,), wp.vec3),
                  "ang_vel": ((n,), wp.vec3), "joint_vel": ((n, nj), wp.float32), "body_rot": ((n, nb), wp.mat33),
                  "key_pos": ((n, nk), wp.vec3)}
        self.w = {name: wp.zeros(s, dtype=d, device=dev) for name, (s, d) in shapes.items()}
        self.gw = {name: wp.zeros(s, dtype=d, device=dev) for name, (s, d) in shapes.items()}
        self.fut = wp.zeros((n, k), dtype=wp.int32, device=dev)
        self.obs = wp.zeros((n, wo.dim), dtype=wp.float32, device=dev)
        self.g_obs = wp.zeros((n, wo.dim), dtype=wp.float32, device=dev)
        self.t = {name: wp.to_torch(a) for name, a in self.w.items()}
        self.gt = {name: wp.to_torch(a) for name, a in self.gw.items()}
        self.t_fut, self.t_obs, self.t_g_obs = wp.to_torch(self.fut), wp.to_torch(self.obs), wp.to_torch(self.g_obs)
        w = self.w
        fwd = wp.launch(_obs_forward, dim=n, inputs=[struct_of(_ObsRows, w), self.fut, wo.table],
                        outputs=[self.obs], device=dev, record_cmd=True)
        bwd = wp.launch(_obs_adjoint, dim=n, inputs=[struct_of(_ObsRows, w), self.fut, wo.table, self.g_obs],
                        outputs=[struct_of(_ObsRows, self.gw)], device=dev, record_cmd=True)
        # the forward reads and writes the caller's tensors (no copies in or out)
        self.forward = TensorLaunch(fwd, [*(("rows." + x, w[x]) for x in _IN), ("fut", self.fut), ("obs", self.obs)],
                                    rows=True)
        self.backward = prepack(bwd)


def _load(buf: _Buffers, n: int, fut: torch.Tensor, inputs: tuple[torch.Tensor, ...]) -> None:
    """Copy a batch of ``n`` rows into the first rows of the pooled input arrays."""
    for name, x in zip(_IN, inputs, strict=True):
        head(buf.t[name], n).copy_(x)
    head(buf.t_fut, n).copy_(fut)


def _obs(wo: WarpObservation, fut: torch.Tensor, inputs: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """The forward launch: a fresh observation [n, D]."""
    n = fut.shape[0]
    obs = inputs[0].new_empty(n, wo.dim)
    with wo.lock:
        wo.buffers(n).forward(*inputs, fut.to(torch.int32), obs)
    return obs


class _Obs(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, wo: WarpObservation, fut: torch.Tensor, *inputs: torch.Tensor) -> torch.Tensor:
        obs = _obs(wo, fut, inputs)
        ctx.wo = wo
        ctx.save_for_backward(fut, *inputs)
        return obs

    @staticmethod
    @once_differentiable  # the adjoint launch is not itself differentiable: a double backward raises
    def backward(ctx: Any, g_obs: torch.Tensor):  # type: ignore[override]
        fut, *inputs = ctx.saved_tensors
        wo: WarpObservation = ctx.wo
        n = fut.shape[0]
        with wo.lock:
            buf = wo.buffers(n)
            _load(buf, n, fut, inputs)
            head(buf.t_g_obs, n).copy_(g_obs)
            buf.backward()
            grads = [head(buf.gt[name], n).clone() if need else None
                     for name, need in zip(_IN, ctx.needs_input_grad[2:], strict=True)]
        return None, None, *grads


class WarpObservation(BucketPool):
    """``(features, fut [N, K] long) -> obs [N, D]``, the values of :func:`bcg.envs.observations.observation` (to
    float32 rounding) in one CPU launch, differentiable in the features through torch autograd.

    Args:
        table: the :class:`~bcg.envs.observations.ReferenceTable` of the clip (float32, CPU).
        nb, nj, nk: bodies, hinges, key points; ref_steps: K, the reference frames per observation.
    """

    def __init__(self, table: ReferenceTable, nb: int, nj: int, nk: int, ref_steps: int):
        self.wp_device = wp.get_device("cpu")
        self.nb, self.nj, self.nk, self.ref_steps = int(nb), int(nj), int(nk), int(ref_steps)
        self.dim = 1 + 6 + 3 + 3 + 6 * nb + nj + 3 * nk + ref_steps * (3 + 6 + 6 * nb + 3 * nk)
        f = table.points_w.shape[0]
        if tuple(table.points_w.shape) != (f, 1 + nk, 3) or tuple(table.body_rot6.shape) != (f, 6 * nb):
            raise ValueError(f"the reference table does not match nb = {nb}, nk = {nk}: points "
                             f"{list(table.points_w.shape)}, body_rot6 {list(table.body_rot6.shape)}")
        tb = _ObsTable()
        tb.points, tb.root_rot = cpu_array(table.points_w, wp.vec3), cpu_array(table.root_rot_w, wp.mat33)
        tb.body_rot6 = cpu_array(table.body_rot6, wp.float32)
        tb.nb, tb.nj, tb.nk, tb.nref = self.nb, self.nj, self.nk, self.ref_steps
        self.table = tb  # the struct holds the arrays: they live as long as this object
        super().__init__()

    def make_buffers(self, rows: int) -> _Buffers:
        return _Buffers(self, rows)

    @staticmethod
    def accepts(f: Features) -> bool:
        """Whether ``f`` can take this path (every field a float32 CPU tensor, at least one row)."""
        return all(x.dtype == torch.float32 and x.device.type == "cpu" for x in f) and f.body_rot_w.shape[0] > 0

    def __call__(self, f: Features, fut: torch.Tensor) -> torch.Tensor:
        if not self.accepts(f):
            raise ValueError(f"WarpObservation expects float32 CPU features, got {f.body_rot_w.dtype} on "
                             f"{f.body_rot_w.device}")
        inputs = (f.root_pos_w, f.root_rot_w, f.root_lin_vel_w, f.root_ang_vel_b, f.joint_vel, f.body_rot_w,
                  f.key_pos_w)
        if torch.is_grad_enabled() and any(x.requires_grad for x in inputs):
            return _Obs.apply(self, fut, *inputs)
        return _obs(self, fut, tuple(x.detach() for x in inputs))  # no graph to record: the launch alone
