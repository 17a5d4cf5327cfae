"""Forward kinematics and key points of the simulated state in one Warp launch, with a hand-written adjoint.

The environments evaluate the features of the simulated state every step. In torch
(:class:`bcg.motion.KinematicsFn`) that is one batched product per tree level, about 80 small operations of a few
microseconds each at N = 64, and as many again in the backward pass. Here one CPU launch (one thread per row) walks
the tree and writes every body's rotation and position and the key points; the backward is a second launch that
walks the tree in reverse. Both are plain kernels: Warp's own autodiff is not used (a tree walk that reads what it
has just written is the pattern of the pitfalls in the simulator notes), so the adjoint is the explicit chain rule
below, checked against finite differences and against torch autograd of the torch path in
``tests/test_env_warp_features.py``.

Same formulas as :class:`bcg.motion.KinematicsFn` (Rodrigues' formula for the hinges, the normalised root
quaternion): values agree with the torch path to float32 rounding (the products sum in another order), not bit for
bit. Only float32 tensors on the CPU take this path; :class:`WarpFeatureFn` hands anything else to the torch one.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import torch
import warp as wp
from torch.autograd.function import once_differentiable

from bcg.motion.features import FeatureFn, Features
from bcg.sim import SimModel

__all__ = ["BucketPool", "WarpFeatureFn", "WarpKinematics", "bucket", "cpu_array", "head", "struct_of"]

# the kernels' adjoints are written by hand below: Warp's generated ones would only cost compile time
wp.set_module_options({"enable_backward": False})
wp.config.log_level = max(wp.config.log_level, wp.LOG_WARNING)  # no init banner, no line per module load


def bucket(n: int) -> int:
    """Rows of the pooled arrays that serve a batch of ``n`` rows: the next power of two, so a process that sees
    many batch sizes (autoresets of K rows) keeps O(log N) array sets of at most 2 N rows, not one per size."""
    return 1 << max(0, n - 1).bit_length()


class BucketPool:
    """Base of a Warp path: one set of arrays and packed launches per ``bucket(n)`` rows (made on first use by
    ``make_buffers``), and the lock that serialises their use."""

    def __init__(self) -> None:
        self._pool: dict[int, Any] = {}
        self.lock = threading.Lock()

    def make_buffers(self, rows: int) -> Any:
        """A new set of arrays and launches for ``rows`` rows."""
        raise NotImplementedError

    def buffers(self, n: int) -> Any:
        """The arrays and packed launches that serve ``n`` rows (``bucket(n)`` rows; made on first use)."""
        m = bucket(n)
        buf = self._pool.get(m)
        if buf is None:
            buf = self._pool[m] = self.make_buffers(m)
        return buf


def cpu_array(x: torch.Tensor, dtype: Any) -> wp.array:
    """A CPU Warp array of ``dtype`` (``wp.float32``, ``wp.vec3``, ``wp.mat33``, ...): a float32 copy of ``x``."""
    return wp.array(x.detach().to("cpu", torch.float32).contiguous().numpy(), dtype=dtype, device="cpu")


def struct_of(cls: type, arrays: dict[str, wp.array]) -> Any:
    """An instance of the Warp struct ``cls`` whose fields are ``arrays`` (by name)."""
    out = cls()
    for name, a in arrays.items():
        setattr(out, name, a)
    return out


def head(t: torch.Tensor, n: int) -> torch.Tensor:
    """The first ``n`` rows of a pooled array's torch view (the view itself when it has ``n`` rows: no slice op)."""
    return t if t.shape[0] == n else t[:n]


@wp.struct
class _Kin:
    """The tree's constants for the kinematics launches (nb bodies, nk key points)."""

    parent: wp.array(dtype=wp.int32)  # [nb]
    B: wp.array(dtype=wp.mat33)  # [nb] fixed rotation of each body in its parent
    BK: wp.array(dtype=wp.mat33)  # [nb] B K (K: cross-product matrix of the hinge axis)
    BK2: wp.array(dtype=wp.mat33)  # [nb] B K K
    offset: wp.array(dtype=wp.vec3)  # [nb] body origin in its parent [m]
    key_body: wp.array(dtype=wp.int32)  # [nk]
    key_offset: wp.array(dtype=wp.vec3)  # [nk] key point in its body's frame [m]


@wp.func
def _fk_row(
    q: wp.array2d(dtype=wp.float32),  # [N, 7 + nb - 1] qpos
    i: int,  # the row
    c: _Kin,
    nb: int,
    nk: int,
    rot: wp.array2d(dtype=wp.mat33),  # [N, nb] out
    pos: wp.array2d(dtype=wp.vec3),  # [N, nb] out
    key: wp.array2d(dtype=wp.vec3),  # [N, nk] out
):
    """Row ``i`` of the forward kinematics (also called by the fused step outputs, bcg.envs.warp_step)."""
    qw, qx, qy, qz = q[i, 3], q[i, 4], q[i, 5], q[i, 6]
    inv = 1.0 / wp.sqrt(qw * qw + qx * qx + qy * qy + qz * qz)
    w, x, y, z = qw * inv, qx * inv, qy * inv, qz * inv
    rot[i, 0] = wp.mat33(
        1.0 - 2.0 * (y * y + z * z), 2.0 * (x * y - w * z), 2.0 * (x * z + w * y),
        2.0 * (x * y + w * z), 1.0 - 2.0 * (x * x + z * z), 2.0 * (y * z - w * x),
        2.0 * (x * z - w * y), 2.0 * (y * z + w * x), 1.0 - 2.0 * (x * x + y * y))
    pos[i, 0] = wp.vec3(q[i, 0], q[i, 1], q[i, 2])
    for b in range(1, nb):  # parents come before their children
        a = q[i, 6 + b]
        Rj = c.B[b] + wp.sin(a) * c.BK[b] + (1.0 - wp.cos(a)) * c.BK2[b]
        p = c.parent[b]
        Rp = rot[i, p]
        rot[i, b] = Rp @ Rj
        pos[i, b] = pos[i, p] + Rp @ c.offset[b]
    for k in range(nk):
        kb = c.key_body[k]
        key[i, k] = pos[i, kb] + rot[i, kb] @ c.key_offset[k]


@wp.kernel
def _fk_forward(q: wp.array2d(dtype=wp.float32), c: _Kin, nb: int, nk: int, rot: wp.array2d(dtype=wp.mat33),
                pos: wp.array2d(dtype=wp.vec3), key: wp.array2d(dtype=wp.vec3)):
    _fk_row(q, wp.tid(), c, nb, nk, rot, pos, key)


@wp.kernel
def _fk_adjoint(
    q: wp.array2d(dtype=wp.float32),  # [N, nq] the forward's input
    rot: wp.array2d(dtype=wp.mat33),  # [N, nb] the forward's rotations
    kc: _Kin,
    nb: int,
    nk: int,
    g_rot: wp.array2d(dtype=wp.mat33),  # [N, nb] dL/drot
    g_pos: wp.array2d(dtype=wp.vec3),  # [N, nb] dL/dpos
    g_key: wp.array2d(dtype=wp.vec3),  # [N, nk] dL/dkey
    a_rot: wp.array2d(dtype=wp.mat33),  # [N, nb] scratch: total adjoint of each rotation
    a_pos: wp.array2d(dtype=wp.vec3),  # [N, nb] scratch: total adjoint of each position
    g_q: wp.array2d(dtype=wp.float32),  # [N, nq] out: dL/dq
):
    i = wp.tid()
    for b in range(nb):
        a_rot[i, b] = g_rot[i, b]
        a_pos[i, b] = g_pos[i, b]
    for k in range(nk):  # key = pos[kb] + rot[kb] off
        kb = kc.key_body[k]
        gk = g_key[i, k]
        a_pos[i, kb] = a_pos[i, kb] + gk
        a_rot[i, kb] = a_rot[i, kb] + wp.outer(gk, kc.key_offset[k])
    for j in range(nb - 1):  # children before parents: a body's adjoint is complete when it is reached
        b = nb - 1 - j
        p = kc.parent[b]
        a = q[i, 6 + b]
        s, c = wp.sin(a), wp.cos(a)
        Rj = kc.B[b] + s * kc.BK[b] + (1.0 - c) * kc.BK2[b]
        dRj = c * kc.BK[b] + s * kc.BK2[b]  # dRj / da
        Rp = rot[i, p]
        gR = a_rot[i, b]
        gp = a_pos[i, b]
        # rot[b] = Rp Rj, pos[b] = pos[p] + Rp offset[b]
        a_rot[i, p] = a_rot[i, p] + gR @ wp.transpose(Rj) + wp.outer(gp, kc.offset[b])
        a_pos[i, p] = a_pos[i, p] + gp
        gRj = wp.transpose(Rp) @ gR
        g_q[i, 6 + b] = wp.ddot(gRj, dRj)
    gp0 = a_pos[i, 0]
    g_q[i, 0] = gp0[0]
    g_q[i, 1] = gp0[1]
    g_q[i, 2] = gp0[2]
    # root rotation of the normalised quaternion u = q / |q|
    G = a_rot[i, 0]
    qw, qx, qy, qz = q[i, 3], q[i, 4], q[i, 5], q[i, 6]
    n = wp.sqrt(qw * qw + qx * qx + qy * qy + qz * qz)
    w, x, y, z = qw / n, qx / n, qy / n, qz / n
    gw = 2.0 * (-G[0, 1] * z + G[0, 2] * y + G[1, 0] * z - G[1, 2] * x - G[2, 0] * y + G[2, 1] * x)
    gx = (2.0 * (G[0, 1] * y + G[0, 2] * z + G[1, 0] * y - G[1, 2] * w + G[2, 0] * z + G[2, 1] * w)
          - 4.0 * x * (G[1, 1] + G[2, 2]))
    gy = (2.0 * (G[0, 1] * x + G[0, 2] * w + G[1, 0] * x + G[1, 2] * z - G[2, 0] * w + G[2, 1] * z)
          - 4.0 * y * (G[0, 0] + G[2, 2]))
    gz = (2.0 * (-G[0, 1] * w + G[0, 2] * x + G[1, 0] * w + G[1, 2] * y + G[2, 0] * x + G[2, 1] * y)
          - 4.0 * z * (G[0, 0] + G[1, 1]))
    d = w * gw + x * gx + y * gy + z * gz  # d(q / |q|)/dq = (I - u u^T) / |q|
    g_q[i, 3] = (gw - w * d) / n
    g_q[i, 4] = (gx - x * d) / n
    g_q[i, 5] = (gy - y * d) / n
    g_q[i, 6] = (gz - z * d) / n


class _Buffers:
    """Warp arrays of one batch size, their torch views, and both launches packed once (``bcg.sim.replay``)."""

    def __init__(self, kin: WarpKinematics, n: int):
        from bcg.sim import TensorLaunch, prepack

        dev, nb, nk, nq = kin.wp_device, kin.nb, kin.nk, kin.nq
        self.q = wp.zeros((n, nq), dtype=wp.float32, device=dev)
        self.rot = wp.zeros((n, nb), dtype=wp.mat33, device=dev)
        self.pos = wp.zeros((n, nb), dtype=wp.vec3, device=dev)
        self.key = wp.zeros((n, nk), dtype=wp.vec3, device=dev)
        self.g_rot = wp.zeros((n, nb), dtype=wp.mat33, device=dev)
        self.g_pos = wp.zeros((n, nb), dtype=wp.vec3, device=dev)
        self.g_key = wp.zeros((n, nk), dtype=wp.vec3, device=dev)
        self.a_rot = wp.zeros((n, nb), dtype=wp.mat33, device=dev)
        self.a_pos = wp.zeros((n, nb), dtype=wp.vec3, device=dev)
        self.g_q = wp.zeros((n, nq), dtype=wp.float32, device=dev)
        # torch views of the same memory: copies in and out are single torch operations
        self.t = {name: wp.to_torch(getattr(self, name)) for name in
                  ("q", "rot", "pos", "key", "g_rot", "g_pos", "g_key", "g_q")}
        c = kin.consts
        fwd = wp.launch(_fk_forward, dim=n, inputs=[self.q, c, nb, nk], outputs=[self.rot, self.pos, self.key],
                        device=dev, record_cmd=True)
        # the forward reads and writes the caller's tensors (no copies in or out)
        self.forward = TensorLaunch(fwd, [("q", self.q), ("rot", self.rot), ("pos", self.pos), ("key", self.key)],
                                    rows=True)
        bwd = wp.launch(_fk_adjoint, dim=n, inputs=[self.q, self.rot, c, nb, nk, self.g_rot, self.g_pos,
                                                    self.g_key, self.a_rot, self.a_pos], outputs=[self.g_q],
                        device=dev, record_cmd=True)
        self.backward = prepack(bwd)


def _fk(kin: WarpKinematics, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The forward launch on ``q`` [n, nq]: fresh (rot, pos, key) tensors."""
    n = q.shape[0]
    rot, pos, key = q.new_empty(n, kin.nb, 3, 3), q.new_empty(n, kin.nb, 3), q.new_empty(n, kin.nk, 3)
    with kin.lock:
        kin.buffers(n).forward(q, rot, pos, key)
    return rot, pos, key


class _FK(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, kin: WarpKinematics) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        rot, pos, key = _fk(kin, q)
        ctx.kin = kin
        ctx.save_for_backward(q, rot)
        return rot, pos, key

    @staticmethod
    @once_differentiable  # the adjoint launch is not itself differentiable: a double backward raises
    def backward(ctx: Any, g_rot: torch.Tensor, g_pos: torch.Tensor, g_key: torch.Tensor):  # type: ignore[override]
        q, rot = ctx.saved_tensors
        kin: WarpKinematics = ctx.kin
        n = q.shape[0]
        with kin.lock:
            buf = kin.buffers(n)
            for name, x in (("q", q), ("rot", rot), ("g_rot", g_rot), ("g_pos", g_pos), ("g_key", g_key)):
                head(buf.t[name], n).copy_(x)
            buf.backward()  # rows from n on hold another batch's values: computed, never read
            g_q = head(buf.t["g_q"], n).clone()
        return g_q, None


class WarpKinematics(BucketPool):
    """``q [N, nq] -> (rot [N, nb, 3, 3], pos [N, nb, 3], key points [N, nk, 3])`` in one CPU launch (float32),
    differentiable in ``q`` through torch autograd (the adjoint is one more launch).

    Args:
        model: the :class:`bcg.sim.SimModel` (tree, hinge axes, body offsets).
        key_body: [nk] long, the body of each key point; key_offset: [nk, 3], its offset in that body's frame [m].
    """

    def __init__(self, model: SimModel, key_body: torch.Tensor, key_offset: torch.Tensor):
        from bcg.motion.rotations import quat_to_matrix_wxyz

        self.wp_device = wp.get_device("cpu")
        self.nb, self.nk, self.nq = int(model.nb), int(key_body.numel()), int(model.nq)
        if self.nq != 7 + self.nb - 1:
            raise ValueError(f"WarpKinematics needs a floating root and one hinge per body (nq = 6 + nb), got "
                             f"nq = {self.nq}, nb = {self.nb}")
        parent = np.asarray(model.body_parent, dtype=np.int64)
        if np.any(parent[1:] >= np.arange(1, self.nb)):
            raise ValueError("WarpKinematics needs every body's parent to come before it (model.body_parent)")
        # the same constants as bcg.motion.KinematicsFn, built in float32 by the same torch operations
        axis = torch.as_tensor(model.body_axis, dtype=torch.float32)
        K = torch.zeros(self.nb, 3, 3)
        K[:, 0, 1], K[:, 0, 2], K[:, 1, 0] = -axis[:, 2], axis[:, 1], axis[:, 2]
        K[:, 1, 2], K[:, 2, 0], K[:, 2, 1] = -axis[:, 0], -axis[:, 1], axis[:, 0]
        Bm = quat_to_matrix_wxyz(torch.as_tensor(model.body_quat_wxyz, dtype=torch.float32))
        dev = self.wp_device
        c = _Kin()
        c.parent = wp.array(parent.clip(min=0).astype(np.int32), dtype=wp.int32, device=dev)
        c.B, c.BK, c.BK2 = cpu_array(Bm, wp.mat33), cpu_array(Bm @ K, wp.mat33), cpu_array(Bm @ K @ K, wp.mat33)
        c.offset = cpu_array(torch.as_tensor(model.body_pos, dtype=torch.float32), wp.vec3)
        c.key_body = wp.array(key_body.cpu().numpy().astype(np.int32), dtype=wp.int32, device=dev)
        c.key_offset = cpu_array(key_offset, wp.vec3)
        self.consts = c  # the struct holds the arrays: they live as long as this object
        super().__init__()

    def make_buffers(self, rows: int) -> _Buffers:
        return _Buffers(self, rows)

    def __call__(self, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if q.dtype != torch.float32 or q.device.type != "cpu" or q.dim() != 2 or q.shape[1] != self.nq:
            raise ValueError(f"WarpKinematics expects float32 CPU q [N, {self.nq}], got {list(q.shape)} "
                             f"{q.dtype} on {q.device}")
        if torch.is_grad_enabled() and q.requires_grad:
            return _FK.apply(q, self)
        return _fk(self, q.detach())  # no graph to record: the launch alone


class WarpFeatureFn(FeatureFn):
    """:class:`bcg.motion.FeatureFn` whose kinematics and key points run in :class:`WarpKinematics` for float32 CPU
    states (same :class:`Features`, to float32 rounding); other dtypes and devices take the torch path."""

    def __init__(self, model: SimModel, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"):
        super().__init__(model, dtype, device)
        self.warp_kin = (WarpKinematics(model, self.keys.body, self.keys.offset)
                         if dtype == torch.float32 and self.device.type == "cpu" else None)
        self.enabled = True
        """False: every call takes the torch path (the reference the Warp path is tested against)."""

    def __call__(self, q: torch.Tensor, qd: torch.Tensor) -> Features:
        if (self.warp_kin is None or not self.enabled or q.dtype != torch.float32 or q.device.type != "cpu"
                or q.shape[0] == 0):
            return super().__call__(q, qd)
        rot, pos, key = self.warp_kin(q)
        return Features(root_pos_w=q[:, 0:3], root_rot_w=rot[:, 0], root_lin_vel_w=qd[:, 0:3],
                        root_ang_vel_b=qd[:, 3:6], joint_pos=q[:, 7:], joint_vel=qd[:, 6:], body_pos_w=pos,
                        body_rot_w=rot, key_pos_w=key)
