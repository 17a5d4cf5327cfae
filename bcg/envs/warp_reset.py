"""The autoreset of the vector env without randomisation, in one Warp launch on the CPU.

With random actions at N = 64, two or three episodes end on most steps. Resetting them in torch operations (a
counter-based draw of the start frames, a gather from the per-frame reset table for every field, an out-of-place
scatter per state field, the new episodes' first observations scattered into the step's observation) is about 25
operations, 0.4-0.5 ms per step on this machine, most of it per-operation overhead. Without domain randomisation a
new episode is a function of its row's key and index alone: its start frame is a counter-based draw, and its state
and first observation are rows of the reset table. Here torch copies each field once (a memcpy) and one launch
rewrites the rows that start over, in those copies (:class:`bcg.sim.replay.TensorLaunch`: no pooled arrays, no
copies in or out). The launch does not copy the other rows: Warp's CPU code copies an array element by element, at
about 3 ns per float here, ten times slower than torch's memcpy.

The draws are the same integer arithmetic as the torch path (:meth:`bcg.envs.resets.EpisodeStarts.frames` and
:meth:`bcg.envs.draws.CounterDraws.next_keys`), so the results are the same bits
(``tests/test_env_warp_features.py``).
"""

from __future__ import annotations

import threading

import torch
import warp as wp

from bcg.envs.state import EnvState
from bcg.envs.warp_hash import _mix

__all__ = ["WarpTableReset"]

wp.set_module_options({"enable_backward": False})


@wp.kernel
def _table_reset(
    done: wp.array(dtype=wp.bool),  # [N] rows that start a new episode
    key: wp.array(dtype=wp.int64),  # [N] rng_key: the state's on entry, the next state's on return
    frame: wp.array(dtype=wp.int64),  # [N] (this and every array below: rewritten in the rows ``done`` only)
    steps: wp.array(dtype=wp.int64),
    q: wp.array2d(dtype=wp.float32),  # [N, nq]
    qd: wp.array2d(dtype=wp.float32),  # [N, nv]
    prev: wp.array2d(dtype=wp.float32),  # [N, nu]
    delayed: wp.array2d(dtype=wp.float32),
    offset: wp.array2d(dtype=wp.float32),
    latency: wp.array(dtype=wp.bool),
    countdown: wp.array(dtype=wp.int64),
    push: wp.array2d(dtype=wp.float32),  # [N, 6]
    obs: wp.array2d(dtype=wp.float32),  # [N, D] the step's observation
    t_q: wp.array2d(dtype=wp.float32),  # [F, nq] reset table
    t_qd: wp.array2d(dtype=wp.float32),  # [F, nv]
    t_prev: wp.array2d(dtype=wp.float32),  # [F, nu] the action that holds each frame's pose
    t_obs: wp.array2d(dtype=wp.float32),  # [F, D] first observation
    key_add: wp.int64,  # CounterDraws.next_keys' constant
    stream: wp.uint32,  # the start frames' stream of hash_uniform
    num_frames: wp.int64,
):
    i = wp.tid()
    if not done[i]:
        return
    # CounterDraws.next_keys: _hash32(key + add) & 0x7FFFFFFF (the uint32 cast keeps the low 32 bits, as the
    # torch mask does)
    k = wp.int64(_mix(wp.uint32(key[i] + key_add)) & wp.uint32(0x7FFFFFFF))
    # EpisodeStarts.frames: hash_uniform(key, row, 1, stream)'s 24 bits times (F - 1), shifted down: exact integers
    a = _mix(wp.uint32(k) * wp.uint32(0x9E37) + stream)
    b = _mix(a ^ wp.uint32(i))
    bits = wp.int64(_mix(b) >> wp.uint32(8))
    f = (bits * (num_frames - wp.int64(1))) >> wp.int64(24)
    key[i] = k
    frame[i] = f
    steps[i] = wp.int64(0)
    for j in range(q.shape[1]):
        q[i, j] = t_q[f, j]
    for j in range(qd.shape[1]):
        qd[i, j] = t_qd[f, j]
    for j in range(prev.shape[1]):
        prev[i, j] = t_prev[f, j]
        delayed[i, j] = t_prev[f, j]
        offset[i, j] = 0.0
    latency[i] = False
    countdown[i] = wp.int64(-1)
    for j in range(6):
        push[i, j] = 0.0
    for j in range(obs.shape[1]):
        obs[i, j] = t_obs[f, j]


_ARGS = ("done", "key", "frame", "steps", "q", "qd", "prev", "delayed", "offset", "latency", "countdown", "push",
         "obs")


class WarpTableReset:
    """``(state, done [N] bool, obs [N, D]) -> (next state, obs)``: rows ``done`` start new episodes from the reset
    table, as :meth:`bcg.envs.resets.EpisodeStarts.reset_rows` does without randomisation, in one launch; the other
    rows are copied. Every output is a fresh tensor (states are never modified in place).

    Args:
        table: ``(q [F, nq], qd [F, nv], prev [F, nu], obs [F, D])``, the reset state, held action and first
            observation at every frame (float32 CPU, kept alive here: the launches point into them).
        key_add: the constant of ``CounterDraws.next_keys``; stream: the stream of the start-frame draw.
    """

    def __init__(self, table: tuple[torch.Tensor, ...], key_add: int, stream: int):
        self.table = tuple(t.detach().to(torch.float32).contiguous() for t in table)
        self.key_add, self.stream = int(key_add), int(stream) & 0xFFFF
        self._launches: dict[int, object] = {}
        self.lock = threading.Lock()

    @staticmethod
    def accepts(s: EnvState, obs: torch.Tensor) -> bool:
        """Whether this path can reset ``s`` (float32 CPU state without per-environment physics)."""
        return (s.physics is None and s.q.device.type == "cpu" and s.q.dtype == torch.float32
                and obs.dtype == torch.float32 and obs.device.type == "cpu")

    def _launch(self, n: int) -> object:
        from bcg.sim import TensorLaunch

        run = self._launches.get(n)
        if run is None:
            t_q, t_qd, t_prev, t_obs = (wp.from_torch(t) for t in self.table)
            nq, nv, nu, d = t_q.shape[1], t_qd.shape[1], t_prev.shape[1], t_obs.shape[1]
            dev = "cpu"

            def arr(shape: tuple, dtype: object) -> wp.array:
                return wp.zeros(shape, dtype=dtype, device=dev)

            layout = {"done": ((n,), wp.bool), "key": ((n,), wp.int64), "frame": ((n,), wp.int64),
                      "steps": ((n,), wp.int64), "q": ((n, nq), wp.float32), "qd": ((n, nv), wp.float32),
                      "prev": ((n, nu), wp.float32), "delayed": ((n, nu), wp.float32),
                      "offset": ((n, nu), wp.float32), "latency": ((n,), wp.bool), "countdown": ((n,), wp.int64),
                      "push": ((n, 6), wp.float32), "obs": ((n, d), wp.float32)}
            bound = [arr(*layout[name]) for name in _ARGS]
            cmd = wp.launch(_table_reset, dim=n,
                            inputs=[*bound, t_q, t_qd, t_prev, t_obs, wp.int64(self.key_add), wp.uint32(self.stream),
                                    wp.int64(t_q.shape[0])], device=dev, record_cmd=True)
            run = self._launches[n] = (TensorLaunch(cmd, list(zip(_ARGS, bound, strict=True))), bound)
        return run[0]

    def __call__(self, s: EnvState, done: torch.Tensor, obs: torch.Tensor) -> tuple[EnvState, torch.Tensor]:
        if not self.accepts(s, obs):
            raise ValueError("WarpTableReset expects a float32 CPU state without per-environment physics")
        # torch copies every field (one memcpy each, where the launch would copy element by element), then the
        # launch rewrites the rows that start over
        outs = tuple(x.detach().clone() for x in (s.rng_key, s.frame, s.episode_steps, s.q, s.qd, s.prev_actions,
                                                   s.delayed_actions, s.joint_offset, s.latency, s.push_countdown,
                                                   s.push_vel, obs))
        with self.lock:
            self._launch(done.shape[0])(done, *outs)
        key, frame, steps, q, qd, prev, delayed, offset, latency, countdown, push, obs_out = outs
        nxt = EnvState(q=q, qd=qd, frame=frame, episode_steps=steps, prev_actions=prev, delayed_actions=delayed,
                       joint_offset=offset, latency=latency, push_countdown=countdown, push_vel=push, rng_key=key,
                       env_id=s.env_id, physics=None, memory=s.memory)
        return nxt.clear_memory(done), obs_out
