"""The simulator's runtime (bcg.sim.Runtime): one object owns the options, pools, workspaces and counters, runtimes
do not see each other's state, a model's workspace goes with the model, and bcg.sim keeps no other mutable module
state."""

from __future__ import annotations

import ast
import gc
import weakref
from pathlib import Path

import pytest
import torch

import bcg.sim as sim
from bcg.robots import g1
from bcg.sim import ExecutionOptions, Runtime, default_runtime, step


def _inputs(model, n: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q = torch.tensor(g1.default_qpos(), dtype=torch.float32)[None].repeat(n, 1)
    q[:, 2] += 0.02 * torch.rand(n, generator=g) - 0.01
    qd = 0.1 * torch.randn(n, model.nv, generator=g)
    targets = q[:, 7:].clone() + 0.05 * torch.randn(n, model.nu, generator=g)
    return q, qd, targets


def _rollout(model, runtime, n: int = 32, steps: int = 3):
    q, qd, targets = _inputs(model, n)
    targets.requires_grad_(True)
    x, v = q, qd
    for _ in range(steps):
        x, v, rep = step(model, x, v, targets, runtime=runtime)
    (x.square().sum() + rep.impulse.sum()).backward()
    return x.detach(), v.detach(), targets.grad


def test_own_runtime_gives_the_bits_of_the_process_runtime(g1_model) -> None:
    own = Runtime(ExecutionOptions(threads=2))
    with sim.execution_options_set(threads=1):
        ref = _rollout(g1_model, None)
    got = _rollout(g1_model, own)
    for a, b in zip(ref, got, strict=True):
        assert torch.equal(a, b)
    own.close()


def test_runtimes_keep_their_own_pools_options_and_counters(g1_model) -> None:
    own = Runtime(ExecutionOptions(threads=1))
    sim.clear_pool(g1_model)
    before = default_runtime().kept_bytes()
    with sim.execution_options_set(threads=2):
        q, qd, targets = _inputs(g1_model, 8)
        targets.requires_grad_(True)
        x, _, _ = step(g1_model, q, qd, targets, runtime=own)
        assert own.kept_bytes()[0] > 0 and default_runtime().kept_bytes() == before
        assert own.options.threads == 1 and sim.execution_options().threads == 2
        x.sum().backward()
    assert own.kept_bytes()[0] == 0
    assert own.workspace(g1_model).grad_pool.get((8, False))  # the step's arrays went back to its runtime's pool
    assert not default_runtime().workspace(g1_model).grad_pool.get((8, False))
    with pytest.raises(TypeError, match="ExecutionOptions"):
        Runtime(options={"threads": 1})  # type: ignore[arg-type]


def test_a_models_workspace_goes_with_the_model() -> None:
    """The workspace (device arrays, pools, templates) is held by weak reference to its model: a model that goes out
    of scope frees them, where a cache on a global would keep every model ever stepped."""
    rt = Runtime(ExecutionOptions(threads=1))
    model = sim.load_model()
    _rollout(model, rt, n=4, steps=1)
    assert rt.workspace(model).arrays is not None and rt.workspace(model).grad_pool
    gone = weakref.ref(model)
    del model
    gc.collect()
    assert gone() is None
    assert len(rt._workspaces) == 0


def test_models_are_keyed_by_identity(g1_model) -> None:
    """A variant (other contact parameters) is another model with its own workspace, even where the fields agree."""
    twin = g1_model.with_params()
    assert twin is not g1_model and twin != g1_model
    assert default_runtime().workspace(twin) is not default_runtime().workspace(g1_model)


_SIM = Path(sim.__file__).parent
_ALLOWED = {
    ("runtime.py", "_PROCESS_RUNTIME"): "the process's runtime, the one holder of the functional API's state",
    ("engine.py", "_serial"): "a source of unique ids for gradient sets (nothing reads it back)",
}


def _module_state(path: Path, source: str) -> list[str]:
    """Module-level names of ``source`` that hold state: ``global`` statements, empty containers and container or
    counter constructor calls whatever the name, and any other non-constant value bound to a lower-case name."""
    tree = ast.parse(source)
    found = [f"{path.name}:{n.lineno} global" for n in ast.walk(tree) if isinstance(n, ast.Global)]
    for node in tree.body:
        if not isinstance(node, (ast.Assign, ast.AnnAssign)) or node.value is None:
            continue
        for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
            if not isinstance(t, ast.Name) or t.id.startswith("__") or (path.name, t.id) in _ALLOWED:
                continue
            v = node.value
            call = getattr(v.func, "id", getattr(v.func, "attr", "")) if isinstance(v, ast.Call) else ""
            empty = (isinstance(v, ast.Dict) and not v.keys) or (isinstance(v, (ast.List, ast.Set)) and not v.elts)
            if empty or call in ("dict", "list", "set", "defaultdict", "OrderedDict", "count", "Lock"):
                found.append(f"{path.name}:{node.lineno} {t.id}")
            elif not t.id.isupper() and not isinstance(v, (ast.Constant, ast.Tuple)) and call not in ("slice",
                                                                                                    "TypeVar"):
                found.append(f"{path.name}:{node.lineno} {t.id}")
    return found


def test_no_mutable_module_state_in_sim_outside_the_runtime() -> None:
    """No ``global`` statement in bcg.sim, no cache or counter at module level, and every lower-case module-level
    name a constant, except the two allowed."""
    found = [f for path in sorted(_SIM.glob("*.py")) for f in _module_state(path, path.read_text())]
    assert not found, f"mutable module state in bcg.sim (put it in bcg.sim.runtime.Runtime): {found}"


def test_the_state_rule_catches_what_it_forbids() -> None:
    src = "import itertools\n_BOUNDS: dict = {}\n_kept = {'bytes': 0}\n_pool = None\n_n = itertools.count()\n" \
          "def f():\n    global _pool\nNAMES = {'a': 1}\n_R = slice(0, 3)\n"
    got = _module_state(Path("x.py"), src)
    assert [g.split(" ")[1] for g in got] == ["global", "_BOUNDS", "_kept", "_n"]  # _pool: caught by its global
