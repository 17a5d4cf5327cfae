"""Batch split across threads (bcg.sim.execution): the same bits as one thread, forward and gradients, with
per-environment physics, uneven blocks and block counts that do not divide N; and the options' validation.

Speed is not tested here (the 2-core ratio is a benchmark: ``bcg bench``, docs/performance.md)."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from bcg.robots import g1
from bcg.sim import default_physics, step
from bcg.sim.execution import ExecutionOptions, split_rows, thread_count
from bcg.sim.runtime import execution_options, execution_options_set, parallel, set_execution_options


def _start(model, n: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q = torch.tensor(g1.default_qpos(), dtype=torch.float32)[None].repeat(n, 1)
    q[:, 2] += 0.03 * torch.rand(n, generator=g) - 0.01  # some rows touch the floor, some do not
    qd = 0.2 * torch.randn(n, model.nv, generator=g)
    targets = (torch.tensor(g1.DEFAULT_JOINT_POS, dtype=torch.float32)[None, None]
               + 0.1 * torch.randn(n, 4, model.nu, generator=g))
    return q, qd, targets


def _rollout(model, n: int, grad: bool, physics=None, **options):
    """Final state, contact impulses and (with ``grad``) the gradients to the targets and the start state."""
    q, qd, targets = _start(model, n)
    q, qd, targets = (x.clone().requires_grad_(grad) for x in (q, qd, targets))
    with execution_options_set(**options), torch.set_grad_enabled(grad):
        x, v, imp = q, qd, []
        for t in range(targets.shape[1]):
            x, v, c = step(model, x, v, targets[:, t], physics)
            imp.append(c.impulse)
        out = [x.detach(), v.detach(), torch.stack(imp).detach()]
        if grad:
            (x[:, 2].sum() + x[:, 7:].sum() + 0.1 * v.sum() + torch.stack(imp).sum()).backward()
            out += [targets.grad, q.grad, qd.grad]
    return out


@pytest.mark.parametrize("grad", [False, True])
@pytest.mark.parametrize("n, threads", [(37, 2), (40, 3), (64, 2)])
def test_split_batch_is_bit_identical(g1_model, n: int, threads: int, grad: bool) -> None:
    one = _rollout(g1_model, n, grad, threads=1)
    many = _rollout(g1_model, n, grad, threads=threads, min_rows_per_thread=4)
    assert len(one) == len(many) == (6 if grad else 3)
    for a, b in zip(one, many, strict=True):
        assert torch.equal(a, b)
    assert float(one[2].abs().sum()) > 0  # contact is active: the split covers the contact path too


def test_split_batch_with_per_environment_physics(g1_model) -> None:
    n = 36
    phys = default_physics(g1_model, n, torch.device("cpu"))
    g = torch.Generator().manual_seed(3)
    phys = type(phys)(*(t * (1 + 0.1 * torch.rand(t.shape, generator=g)) for t in phys))  # every row different
    one = _rollout(g1_model, n, True, phys, threads=1)
    many = _rollout(g1_model, n, True, phys, threads=2, min_rows_per_thread=4)
    for a, b in zip(one, many, strict=True):
        assert torch.equal(a, b)


def test_thread_count_and_split_rows() -> None:
    opts = ExecutionOptions(threads=4, min_rows_per_thread=16)
    assert thread_count(opts, 64, "cpu") == 4
    assert thread_count(opts, 40, "cpu") == 2  # blocks of at least 16 rows
    assert thread_count(opts, 10, "cpu") == 1
    assert thread_count(opts, 64, "cuda:0") == 1  # one launch covers the batch on a GPU
    assert split_rows(10, 3) == [slice(0, 4), slice(4, 7), slice(7, 10)]
    with pytest.raises(ValueError, match="cannot split"):
        split_rows(2, 3)
    with pytest.raises(ValueError, match="threads must be"):
        ExecutionOptions(threads=0)


def test_options_are_restored_and_validated() -> None:
    before = execution_options()
    with execution_options_set(threads=3) as inside:
        assert inside.threads == 3 and execution_options().threads == 3
    assert execution_options() == before
    with pytest.raises(TypeError, match="ExecutionOptions"):
        set_execution_options("fast")  # type: ignore[arg-type]
    assert execution_options() == before


def test_parallel_runs_concurrently_and_reraises() -> None:
    """The blocks really overlap (two sleeps in about the time of one) and an error in any block surfaces."""
    t0 = time.perf_counter()
    names = parallel([lambda: (time.sleep(0.2), threading.current_thread().name)[1]] * 2)
    assert time.perf_counter() - t0 < 0.35  # 0.2 s measured; serial would take 0.4 s
    assert names[0] != names[1]

    def boom() -> None:
        raise KeyError("block 2")

    with pytest.raises(KeyError, match="block 2"):
        parallel([lambda: 1, boom])


_FRESH = """
import torch
from bcg.robots import g1
from bcg.sim import load_model, step
from bcg.sim.runtime import execution_options_set
model = load_model()
q = torch.tensor(g1.default_qpos(), dtype=torch.float32)[None].repeat(32, 1)
t = torch.tensor(g1.DEFAULT_JOINT_POS, dtype=torch.float32)[None].repeat(32, 1).requires_grad_(True)
with execution_options_set(threads=2, min_rows_per_thread=8, checkpoint=CKPT):
    q1, _, _ = step(model, q, torch.zeros(32, model.nv), t)  # the first launch of the process: module load
    q1[:, 2].sum().backward()
print("ok", bool(torch.isfinite(t.grad).all()))
"""


@pytest.mark.parametrize("checkpoint", [False, True])
def test_first_step_of_a_process_with_threads(checkpoint: bool) -> None:
    """The first step of a fresh process loads the Warp module; two block threads racing into that load
    segfaulted a PPO run, so everything that can load it runs in the calling thread."""
    import subprocess
    import sys

    code = _FRESH.replace("CKPT", str(checkpoint))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().endswith("ok True")
