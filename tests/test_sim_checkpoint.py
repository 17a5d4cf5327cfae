"""Checkpointed steps (bcg.sim.execution checkpoint=True): the forward recomputed inside the backward gives the
same outputs and the same gradients, bit for bit, as the stored forward, keeps only the step inputs, and still
refuses a second backward through the same step."""

from __future__ import annotations

import pytest
import torch

from bcg.robots import g1
from bcg.sim import ExecutionOptions, Runtime, step
from bcg.sim.runtime import execution_options_set


def _run(model, n: int, steps: int, **options):
    g = torch.Generator().manual_seed(1)
    q = torch.tensor(g1.default_qpos(), dtype=torch.float32)[None].repeat(n, 1).requires_grad_(True)
    qd = (0.1 * torch.randn(n, model.nv, generator=g)).requires_grad_(True)
    targets = (torch.tensor(g1.DEFAULT_JOINT_POS, dtype=torch.float32)[None, None]
               + 0.1 * torch.randn(n, steps, model.nu, generator=g)).requires_grad_(True)
    rt = Runtime(ExecutionOptions(**options))  # its own count: graphs other tests have not freed yet are not in it
    x, v, imp = q, qd, 0.0
    for t in range(steps):
        x, v, c = step(model, x, v, targets[:, t], runtime=rt)
        imp = imp + c.impulse.sum() + c.peak_force.sum() * 1e-3
    held = rt.kept_bytes()[0]
    (x[:, 0].sum() + x[:, 2].sum() + x[:, 7:].sum() + v.sum() + imp).backward()
    rt.close()
    return [x.detach(), v.detach(), targets.grad, q.grad, qd.grad], held, rt.kept_bytes()[0]


@pytest.mark.parametrize("threads", [1, 2])
def test_checkpoint_gradients_are_bit_identical(g1_model, threads: int) -> None:
    n, steps = 32, 6
    stored, held_stored, after_stored = _run(g1_model, n, steps, checkpoint=False, threads=threads,
                                            min_rows_per_thread=8)
    ckpt, held_ckpt, after_ckpt = _run(g1_model, n, steps, checkpoint=True, threads=threads, min_rows_per_thread=8)
    for a, b in zip(stored, ckpt, strict=True):
        assert torch.equal(a, b)
    # stored: every substep's scratch values (4.4 MiB per control step at N = 32, measured; the gradients come
    # from a shared pool and are not kept per step);
    # checkpointed: q, qd, targets of each step (32 x 100 float32 = 12.8 KB per step)
    assert held_stored > 6 * 3 * 2**20
    assert held_ckpt == steps * n * (36 + 35 + 29) * 4
    assert after_stored == after_ckpt == 0  # all given back once the backward has run


def test_checkpoint_second_backward_refused(g1_model) -> None:
    q = torch.tensor(g1.default_qpos(), dtype=torch.float32)[None]
    targets = torch.tensor(g1.DEFAULT_JOINT_POS, dtype=torch.float32)[None].requires_grad_(True)
    with execution_options_set(checkpoint=True):
        q1, _, _ = step(g1_model, q, torch.zeros(1, g1_model.nv), targets)
    q1[:, 2].sum().backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="backward called twice"):
        q1[:, 2].sum().backward()


def test_checkpoint_inputs_are_copies(g1_model) -> None:
    """Changing an input tensor in place after the step does not change the recomputed gradient."""
    q = torch.tensor(g1.default_qpos(), dtype=torch.float32)[None]
    base = torch.tensor(g1.DEFAULT_JOINT_POS, dtype=torch.float32)[None]

    def grad(mutate: bool) -> torch.Tensor:
        t = base.clone().requires_grad_(True)
        qd = torch.zeros(1, g1_model.nv)
        with execution_options_set(checkpoint=True):
            q1, _, _ = step(g1_model, q, qd, t)
        if mutate:
            qd += 5.0
        q1[:, 7:].sum().backward()
        return t.grad

    assert torch.equal(grad(False), grad(True))


def test_dropped_graph_gives_memory_back(g1_model) -> None:
    import gc

    rt = Runtime()  # its own count: graphs other tests left for the collector are not in it
    q = torch.tensor(g1.default_qpos(), dtype=torch.float32)[None].repeat(4, 1)
    t = torch.tensor(g1.DEFAULT_JOINT_POS, dtype=torch.float32)[None].repeat(4, 1).requires_grad_(True)
    out = step(g1_model, q, torch.zeros(4, g1_model.nv), t, runtime=rt)
    assert rt.kept_bytes()[0] > 0
    del out
    gc.collect()
    assert rt.kept_bytes()[0] == 0
