"""The stacked critic ensemble against separate critic MLPs, and the reading of states written before the critics
were stacked."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from bcg.agents.networks import CriticEnsemble

DATA = Path(__file__).parent / "data"


@pytest.mark.parametrize("hidden,layer_norm,activation", [((256, 256), True, "elu"), ((16,), False, "tanh"),
                                                          ((), True, "elu"), ((32, 8, 16), True, "silu")])
def test_stacked_critics_equal_separate_critics_in_values_and_gradients(hidden, layer_norm, activation) -> None:
    torch.manual_seed(0)
    ens = CriticEnsemble(849, hidden, 3, activation, layer_norm)
    with torch.no_grad():  # non-trivial LayerNorm affines (they start at 1 and 0)
        for name, p in ens.named_parameters():
            if name.startswith("norm_"):
                p.add_(0.3 * torch.randn_like(p))
    obs = 3.0 * torch.randn(300, 849)
    targets = torch.randn(300)
    separate = [ens.critic_mlp(k) for k in range(3)]

    values = ens(obs)
    expect = torch.stack([m(obs)[:, 0] for m in separate])
    scale = float(expect.detach().abs().max())
    assert values.shape == (3, 300)
    assert float((values - expect).detach().abs().max()) <= 1e-6 * scale

    (ens(obs) - targets).square().mean(1).sum().backward()
    sum((m(obs)[:, 0] - targets).square().mean() for m in separate).backward()
    # each critic's whole gradient (all its parameters) to 1e-6 of its largest entry
    by_new = {n: p for n, p in ens.named_parameters()}
    got: list[list[torch.Tensor]] = [[] for _ in range(3)]
    ref: list[list[torch.Tensor]] = [[] for _ in range(3)]
    for old, (new, k) in ens.separate_names().items():
        _, ki, idx, kind = old.split(".")
        ref[k].append(getattr(separate[int(ki)][int(idx)], kind).grad.flatten())
        got[k].append(by_new[new].grad[k].flatten())
    for k in range(3):
        g, r = torch.cat(got[k]), torch.cat(ref[k])
        assert float((g - r).abs().max()) <= 1e-6 * float(r.abs().max()), k


def test_critic_mlp_rejects_an_index_out_of_range() -> None:
    with pytest.raises(IndexError, match="critic index 3 out of range for 3 critics"):
        CriticEnsemble(4, (8,), 3).critic_mlp(3)


def _v1_agent():
    from bcg.agents.shac import SHAC, SHACConfig
    from bcg.envs.config import EnvConfig

    cfg = SHACConfig(num_envs=2, horizon=3, actor_hidden=(8,), critic_hidden=(8, 8), num_critics=2,
                     critic_iterations=2, critic_minibatches=2, max_iterations=10, target_critic_alpha=0.5)
    return SHAC(cfg, EnvConfig(motion_file="jump"), seed=3)


def test_a_state_with_separate_critics_loads_with_the_same_values_and_adam_moments() -> None:
    """tests/data/shac_state_v1.pt was written by the agent with K separate critic modules (format bcg.shac/1) after
    one iteration, with the critics' values on fixed observations."""
    old = torch.load(DATA / "shac_state_v1.pt", weights_only=True)
    assert old["format"] == "bcg.shac/1"
    agent = _v1_agent()
    agent.load_state_dict(old)
    with torch.no_grad():  # float32 rounding of the batched products: to 1e-6 of the largest value (measured 5e-7)
        for net, expect in ((agent.critics, old["_test_values"]), (agent.target_critics, old["_test_target_values"])):
            assert float((net(old["_test_obs"]) - expect).abs().max()) <= 1e-6 * float(expect.abs().max())
    # Adam's moments: critic 1's first-layer weight moments sit at index 1 of the stacked first layer
    old_group = old["critic_opt"]["param_groups"][0]["params"]
    per_critic = len(old_group) // 2
    old_first_w_critic1 = old["critic_opt"]["state"][old_group[per_critic]]
    new_state = agent.critic_opt.state[agent.critics.weight_0]
    assert torch.equal(new_state["exp_avg"][1], old_first_w_critic1["exp_avg"])
    assert torch.equal(new_state["exp_avg_sq"][1], old_first_w_critic1["exp_avg_sq"])
    assert float(new_state["step"]) == float(old_first_w_critic1["step"]) == 4.0  # 2 passes x 2 minibatches
    assert agent.critic_opt.param_groups[0]["fused"] is True
    m = agent.train_iteration()  # and training continues from it
    assert agent.iteration == 2 and torch.isfinite(torch.tensor(m["critic_loss"]))
    assert agent.state_dict()["format"] == "bcg.shac/2"


def test_a_state_of_another_format_is_refused_with_the_formats_expected() -> None:
    agent = _v1_agent()
    state = dict(agent.state_dict(), format="bcg.shac/0")
    with pytest.raises(ValueError, match=r"format 'bcg.shac/0', expected 'bcg.shac/2' or 'bcg.shac/1'"):
        agent.load_state_dict(state)
