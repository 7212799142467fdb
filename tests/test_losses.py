import math

import pytest
import torch

from trl_mintrl.losses import (
    advantage_regression_loss,
    control_baseline_advantages,
    mintrl_anchors,
    sort_repair_terms,
)


def test_advantage_regression_loss_hand_computed():
    logps = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, -0.5, -0.5]])
    anchors = torch.tensor([[-1.5, -2.0, 9.0], [-0.2, -0.2, -0.2]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    adv = torch.tensor([0.5, -1.0])
    beta = 0.1
    # row 0: beta*((-1+1.5)+(-2+2)) - 0.5 = 0.05 - 0.5 = -0.45 ; row 1: beta*(3*-0.3) + 1 = 0.91
    expected = ((-0.45) ** 2 + 0.91**2) / 2
    loss, residuals = advantage_regression_loss(logps, anchors, mask, adv, beta)
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    assert residuals.tolist() == pytest.approx([-0.45, 0.91], rel=1e-6)


def test_advantage_regression_gradient_float64():
    torch.manual_seed(0)
    logps = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    anchors = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    mask = (torch.rand(3, 5) > 0.3).double()
    adv = torch.randn(3, dtype=torch.float64)

    def f(x):
        return advantage_regression_loss(x, anchors, mask, adv, 0.7)[0]

    assert torch.autograd.gradcheck(f, (logps,))
    f(logps).backward()
    # analytic: dL/dlogp_bt = 2/B * residual_b * beta * mask_bt; anchors are detached
    residual = 0.7 * ((logps - anchors) * mask).sum(-1) - adv
    assert torch.allclose(logps.grad, (2 / 3 * residual * 0.7).unsqueeze(1).detach() * mask)
    assert anchors.grad is None


def test_anchor_variants_differ_only_on_judge_tokens():
    logps = torch.tensor([[-1.0, -3.0, -2.0]])
    old = logps.clone().requires_grad_(True)
    judge = torch.tensor([[False, True, True]])
    kappa = -0.2
    proxy = mintrl_anchors(old, judge, "proxy", kappa)
    const = mintrl_anchors(old, judge, "const", kappa)
    assert torch.equal(proxy, old.detach()) and not proxy.requires_grad and not const.requires_grad
    # kappa on judge tokens only, log pi_old on policy tokens
    assert const.tolist()[0] == pytest.approx([-1.0, kappa, kappa])
    adv, mask = torch.tensor([1.0]), torch.ones(1, 3)
    # proxy anchor: residual is exactly -A at the sampling policy
    assert advantage_regression_loss(logps, proxy, mask, adv, 1e-3)[0].item() == pytest.approx(1.0)
    # const anchor: judge tokens contribute beta * (logp - kappa) = 1e-3 * (-2.8 - 1.8)
    expected = (1e-3 * (-2.8 - 1.8) - 1.0) ** 2
    assert advantage_regression_loss(logps, const, mask, adv, 1e-3)[0].item() == pytest.approx(expected)
    with pytest.raises(ValueError, match="anchor='bogus'"):
        mintrl_anchors(old, judge, "bogus", kappa)


def test_control_baseline_advantages_with_unscorable_rewards():
    nan = math.nan
    rewards = torch.tensor(
        [
            [1.0, nan, 0.5, 0.0],  # one control unscorable: baseline is the other control (1.0)
            [0.2, 0.4, nan, 1.0],  # an intervened rollout unscorable: its advantage is 0
            [nan, nan, 1.0, 0.0],  # no scorable control: no baseline, no signal for the whole group
            [0.0, 0.5, 1.0, 0.0],  # all scorable: baseline 0.25
        ]
    ).view(-1)
    is_control = (torch.arange(16) % 4) < 2
    advantages = control_baseline_advantages(rewards, is_control, 4).view(4, 4)
    expected = torch.tensor(
        [[0.0, 0.0, -0.5, -1.0], [-0.1, 0.1, 0.0, 0.7], [0.0, 0.0, 0.0, 0.0], [-0.25, 0.25, 0.75, -0.25]]
    )
    torch.testing.assert_close(advantages, expected)
    assert not torch.isnan(advantages).any()
    # without interventions every rollout is a control: the baseline is the mean of the scorable ones
    all_controls = control_baseline_advantages(torch.tensor([1.0, nan, 0.0, 0.5]), torch.ones(4, dtype=bool), 4)
    torch.testing.assert_close(all_controls, torch.tensor([0.5, 0.0, -0.5, 0.0]))


def test_sort_repair_loss_hand_computed_and_gradient_path():
    base = torch.log(torch.tensor([[0.5, 0.25], [0.8, 0.1]])).requires_grad_(True)
    plan = torch.log(torch.tensor([[0.5, 1.0], [0.2, 0.9]])).requires_grad_(True)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    w = torch.sqrt(torch.tensor([[0.25, 0.25], [0.16, 0.09]]))  # sqrt(p_base * p_plan)
    expected = -(w * base.detach() * mask).sum() / 3
    loss = sort_repair_terms(base, plan, mask, 0.5).loss
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)
    terms = sort_repair_terms(base, plan, mask, 0.5)  # what the trainer logs comes from the same computation
    torch.testing.assert_close(terms.weights, w)
    torch.testing.assert_close(terms.salience, (plan - base).detach())
    assert not terms.weights.requires_grad and not terms.salience.requires_grad
    loss.backward()
    assert plan.grad is None or torch.all(plan.grad == 0)
    assert torch.allclose(base.grad, -(w * mask) / 3)


@pytest.mark.parametrize("beta,which", [(0.0, "base"), (1.0, "plan")])
def test_sort_repair_beta_limits(beta, which):
    base = torch.log(torch.tensor([[0.5, 0.25, 0.9]]))
    plan = torch.log(torch.tensor([[0.1, 0.7, 0.3]]))
    mask = torch.ones(1, 3)
    w = (base if which == "base" else plan).exp()
    expected = -(w * base).sum() / 3
    assert sort_repair_terms(base, plan, mask, beta).loss.item() == pytest.approx(expected.item(), rel=1e-6)
