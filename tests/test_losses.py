import pytest
import torch

from trl_mintrl.losses import advantage_regression_loss, regression_residuals, sort_repair_loss


def test_advantage_regression_loss_hand_computed():
    logps = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, -0.5, -0.5]])
    anchors = torch.tensor([[-1.5, -2.0, 9.0], [-0.2, -0.2, -0.2]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    adv = torch.tensor([0.5, -1.0])
    beta = 0.1
    # row 0: beta*((-1+1.5)+(-2+2)) - 0.5 = 0.05 - 0.5 = -0.45 ; row 1: beta*(3*-0.3) + 1 = 0.91
    expected = ((-0.45) ** 2 + 0.91**2) / 2
    assert advantage_regression_loss(logps, anchors, mask, adv, beta).item() == pytest.approx(expected, rel=1e-6)
    assert regression_residuals(logps, anchors, mask, adv, beta).tolist() == pytest.approx([-0.45, 0.91], rel=1e-6)


def test_advantage_regression_gradient_float64():
    torch.manual_seed(0)
    logps = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    anchors = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    mask = (torch.rand(3, 5) > 0.3).double()
    adv = torch.randn(3, dtype=torch.float64)

    def f(x):
        return advantage_regression_loss(x, anchors, mask, adv, 0.7)

    assert torch.autograd.gradcheck(f, (logps,))
    f(logps).backward()
    # analytic: dL/dlogp_bt = 2/B * residual_b * beta * mask_bt; anchors are detached
    residual = 0.7 * ((logps - anchors) * mask).sum(-1) - adv
    assert torch.allclose(logps.grad, (2 / 3 * residual * 0.7).unsqueeze(1).detach() * mask)
    assert anchors.grad is None


def test_anchor_variants_differ_only_on_judge_tokens():
    logps = torch.tensor([[-1.0, -3.0, -2.0]])
    old = logps.clone()
    judge = torch.tensor([[False, True, True]])
    kappa = -0.2
    proxy = old
    const = torch.where(judge, torch.full_like(old, kappa), old)
    adv, mask = torch.tensor([1.0]), torch.ones(1, 3)
    # proxy anchor: residual is exactly -A at the sampling policy
    assert advantage_regression_loss(logps, proxy, mask, adv, 1e-3).item() == pytest.approx(1.0)
    # const anchor: judge tokens contribute beta * (logp - kappa) = 1e-3 * (-2.8 - 1.8)
    expected = (1e-3 * (-2.8 - 1.8) - 1.0) ** 2
    assert advantage_regression_loss(logps, const, mask, adv, 1e-3).item() == pytest.approx(expected)


def test_sort_repair_loss_hand_computed_and_gradient_path():
    base = torch.log(torch.tensor([[0.5, 0.25], [0.8, 0.1]])).requires_grad_(True)
    plan = torch.log(torch.tensor([[0.5, 1.0], [0.2, 0.9]])).requires_grad_(True)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    w = torch.sqrt(torch.tensor([[0.25, 0.25], [0.16, 0.09]]))  # sqrt(p_base * p_plan)
    expected = -(w * base.detach() * mask).sum() / 3
    loss = sort_repair_loss(base, plan, mask, 0.5)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)
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
    assert sort_repair_loss(base, plan, mask, beta).item() == pytest.approx(expected.item(), rel=1e-6)
