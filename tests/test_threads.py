"""The thread rule of the dense updates (critic fit, PPO's update) and OpenMP's waiting policy."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from bcg.agents.threads import MIN_PARALLEL_WORK, dense_update_threads, torch_threads


def test_dense_update_threads_use_every_core_only_for_large_minibatches_and_spinning_waits() -> None:
    assert dense_update_threads(64, 3 * 128, cores=2, spinning=True) == 1     # cpu-small's 64-row minibatches
    assert dense_update_threads(512, 3 * 256, cores=2, spinning=True) == 2    # the paper's 512-row minibatches
    assert dense_update_threads(MIN_PARALLEL_WORK, 1, cores=16, spinning=True) == 16
    assert dense_update_threads(MIN_PARALLEL_WORK - 1, 1, cores=16, spinning=True) == 1
    assert dense_update_threads(10**6, 10**6, cores=1, spinning=True) == 1
    assert dense_update_threads(512, 3 * 256, cores=2, spinning=False) == 1   # passive waits: one thread pays more


def test_the_spinning_default_follows_the_openmp_wait_policy(monkeypatch) -> None:
    monkeypatch.setenv("OMP_WAIT_POLICY", "active")
    assert dense_update_threads(512, 3 * 256, cores=2) == 2
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    assert dense_update_threads(512, 3 * 256, cores=2) == 1
    monkeypatch.delenv("OMP_WAIT_POLICY")
    assert dense_update_threads(512, 3 * 256, cores=2) == 1


def test_torch_threads_restores_the_previous_number_also_after_an_error() -> None:
    before = torch.get_num_threads()
    other = 2 if before != 2 else 1
    with torch_threads(other):
        assert torch.get_num_threads() == other
    assert torch.get_num_threads() == before
    with pytest.raises(RuntimeError), torch_threads(other):
        raise RuntimeError("inside")
    assert torch.get_num_threads() == before
    with torch_threads(None):
        assert torch.get_num_threads() == before


@pytest.mark.parametrize("preset,expect", [(None, "PASSIVE True"), ("ACTIVE", "ACTIVE False")])
def test_importing_bcg_makes_openmp_wait_passively_unless_the_user_chose(preset, expect) -> None:
    env = dict(os.environ)
    env.pop("OMP_WAIT_POLICY", None)
    if preset is not None:
        env["OMP_WAIT_POLICY"] = preset
    code = ("import os, bcg; from bcg._openmp import prefer_passive_openmp_wait as p; "
            "print(os.environ['OMP_WAIT_POLICY'], p())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    assert out.stdout.strip() == expect


def test_after_torch_is_loaded_the_policy_is_left_alone() -> None:
    env = dict(os.environ)
    env.pop("OMP_WAIT_POLICY", None)
    code = ("import os, torch, bcg; from bcg._openmp import prefer_passive_openmp_wait as p; "
            "print(os.environ.get('OMP_WAIT_POLICY'), p())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    assert out.stdout.strip() == "None False"
