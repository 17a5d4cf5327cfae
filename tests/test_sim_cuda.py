"""CUDA: the same control step as on the CPU (where a GPU is present), and the kernels' CUDA build (anywhere)."""

from __future__ import annotations

import pytest
import torch

from bcg.robots import g1


def _cuda_available() -> bool:
    if not torch.cuda.is_available():
        return False
    import warp as wp

    wp.init()
    return wp.is_cuda_available()


@pytest.mark.cuda
@pytest.mark.skipif(not _cuda_available(), reason="needs a CUDA GPU visible to torch and Warp")
def test_cuda_step_matches_cpu_and_backpropagates():
    from bcg.sim import load_model, step

    cpu, gpu = load_model(device="cpu"), load_model(device="cuda")
    gen = torch.Generator().manual_seed(0)
    n = 8
    q = torch.tensor(g1.default_qpos(), dtype=torch.float32)[None].repeat(n, 1)
    qd = 0.1 * torch.randn(n, cpu.nv, generator=gen)
    tg = torch.tensor(g1.DEFAULT_JOINT_POS, dtype=torch.float32)[None] + 0.1 * torch.randn(n, 29, generator=gen)
    outs = {}
    for name, model, dev in (("cpu", cpu, "cpu"), ("cuda", gpu, "cuda:0")):
        t = tg.to(dev).requires_grad_(True)
        q1, qd1, rep = q.to(dev), qd.to(dev), None
        for _ in range(5):
            q1, qd1, rep = step(model, q1, qd1, t)
        q1[:, 2].sum().backward()
        outs[name] = (q1.detach().cpu(), rep.impulse.detach().cpu(), t.grad.cpu())
    for a, b in zip(outs["cpu"], outs["cuda"]):
        assert torch.allclose(a, b, rtol=1e-3, atol=1e-4)


def test_kernels_compile_for_hopper(tmp_path):
    """Even without a GPU, Warp's NVRTC compiles the CUDA version of every kernel (sm_90, PTX): this catches
    CUDA-only code-generation errors on machines that cannot run the CUDA step test above."""
    import warp as wp

    from bcg.sim import kernels

    try:
        paths = wp.compile_aot_module(kernels, arch=90, module_dir=str(tmp_path), use_ptx=True)
    except RuntimeError as err:  # a Warp build without NVRTC
        if "NVRTC" in str(err) or "CUDA" in str(err):
            pytest.skip(f"Warp cannot compile CUDA code here: {err}")
        raise
    assert paths and all(p.stat().st_size > 0 for p in paths)
