"""MInTRL and `mask_truncated_completions`: a masked row leaves the regression (weight 0, out of the mean over
rollouts, across micro-batches as TRL normalises its own loss); the loss forward runs in micro-batches; kappa > 0 is
refused."""

from __future__ import annotations

import pytest
import torch
from conftest import params_changed, snapshot
from mintrl_helpers import mintrl_args, revise_first_step_judge, role_reward, scripted_trainer
from transformers import AutoModelForCausalLM

from trl_mintrl import MInTRLTrainer
from trl_mintrl.losses import advantage_regression_loss

# ----- the pure function -----


def test_masked_rows_leave_the_regression_hand_computed():
    logps = torch.tensor([[-1.0, -2.0], [-0.5, -0.5], [-3.0, 0.0]], requires_grad=True)
    anchors = torch.tensor([[-1.5, -2.0], [-0.2, -0.2], [-1.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 1.0], [1.0, 0.0]])
    adv = torch.tensor([0.5, -1.0, 2.0])
    in_regression = torch.tensor([True, False, True])
    beta = 0.1
    # rows 0 and 2: residuals 0.1*0.5 - 0.5 = -0.45 and 0.1*(-2) - 2 = -2.2; row 1 (0.1*-0.6 + 1 = 0.94) is left out
    loss, residuals = advantage_regression_loss(logps, anchors, mask, adv, beta, in_regression)
    assert loss.item() == pytest.approx((0.45**2 + 2.2**2) / 2, rel=1e-6)  # the mean over the 2 rows left in
    assert residuals.tolist() == pytest.approx([-0.45, 0.94, -2.2], rel=1e-6)
    loss.backward()
    assert torch.all(logps.grad[1] == 0)  # weight 0
    assert logps.grad[0].tolist() == pytest.approx([2 / 2 * -0.45 * beta] * 2, rel=1e-6)

    nothing = torch.zeros(3, dtype=torch.bool)  # every row masked: loss 0, no gradient
    logps.grad = None
    loss, _ = advantage_regression_loss(logps, anchors, mask, adv, beta, nothing)
    loss.backward()
    assert loss.item() == 0.0 and torch.all(logps.grad == 0)


def test_micro_batches_add_up_to_the_mean_over_rows_left_in_float64():
    """Two micro-batches with 1 and 3 rows left in, each divided by its share of the whole batch's 4: their sum and
    its gradient are the float64 mean over those 4 rows, whatever the split (a per-micro-batch mean is not)."""
    torch.manual_seed(0)
    logps = torch.randn(6, 5, dtype=torch.float64, requires_grad=True)
    anchors = torch.randn(6, 5, dtype=torch.float64)
    mask = (torch.rand(6, 5) > 0.3).double()
    adv = torch.randn(6, dtype=torch.float64)
    in_regression = torch.tensor([True, False, False, True, True, True])
    total = sum(
        advantage_regression_loss(logps[rows], anchors[rows], mask[rows], adv[rows], 0.7, in_regression[rows], 4.0)[0]
        for rows in (slice(0, 3), slice(3, 6))
    )
    total.backward()
    kept = in_regression.nonzero().flatten().tolist()
    residual = 0.7 * ((logps - anchors) * mask).sum(-1) - adv
    expected = sum(residual[b] ** 2 for b in kept) / len(kept)
    assert total.item() == pytest.approx(expected.item(), rel=1e-12)
    expected_grad = (2 / len(kept) * residual * 0.7 * in_regression).unsqueeze(1).detach() * mask
    torch.testing.assert_close(logps.grad, expected_grad, rtol=1e-12, atol=1e-12)


# ----- through the trainer -----


def masked_batch(vocab_size: int) -> dict:
    """8 rollouts of 6 tokens; rows 1, 2 and 3 truncated and masked (completion_mask all 0, as TRL leaves them), so
    the first micro-batch of 4 keeps 1 row and the second keeps 4; rows 4 and 6 have judge tokens."""
    gen = torch.Generator().manual_seed(1)
    prompt_ids = torch.randint(3, vocab_size, (8, 4), generator=gen)
    completion_ids = torch.randint(3, vocab_size, (8, 6), generator=gen)
    lengths = torch.tensor([[6], [0], [0], [0], [4], [6], [3], [5]])
    completion_mask = (torch.arange(6) < lengths).long()
    tool_mask = torch.ones(8, 6, dtype=torch.long)
    tool_mask[4, :2] = 0
    tool_mask[6, :3] = 0
    return {
        "prompt_ids": prompt_ids,
        "prompt_mask": torch.ones_like(prompt_ids),
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
        "tool_mask": tool_mask,
        "advantages": torch.tensor([0.5, -0.25, 1.0, -1.0, 0.75, -0.5, 1.0, 0.25]),
        "num_regression_rows": torch.tensor(5),  # what `_score_batch` counts over the generation batch
    }


def float64_mean_over_rows_left_in(model_path: str, batch: dict, kappa: float, beta: float):
    """The paper's loss in float64 over the rows with completion tokens (judge tokens anchored at kappa, policy
    tokens at the detached log-prob), and its parameter gradients."""
    model64 = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float64)
    prompt_len = batch["prompt_ids"].size(1)
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    attention = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    logits = model64(input_ids=ids, attention_mask=attention).logits[:, prompt_len - 1 : -1]
    logps = torch.log_softmax(logits, dim=-1).gather(-1, batch["completion_ids"].unsqueeze(-1)).squeeze(-1)
    rows = [b for b in range(ids.size(0)) if batch["completion_mask"][b].any()]
    total = torch.zeros((), dtype=torch.float64)
    for b in rows:
        mask = batch["completion_mask"][b].bool()
        judge = mask & (batch["tool_mask"][b] == 0)
        anchors = torch.where(judge, torch.tensor(kappa, dtype=torch.float64), logps[b].detach())
        residual = beta * ((logps[b] - anchors) * mask).sum() - batch["advantages"][b].double()
        total = total + residual**2
    loss = total / len(rows)
    loss.backward()
    return loss.item(), {n: p.grad for n, p in model64.named_parameters() if p.grad is not None}


def test_compute_loss_over_micro_batches_is_the_mean_over_rows_left_in(tiny_model_path, cpu_args, toy_dataset):
    """The trainer's `_compute_loss` on the two micro-batches of one optimizer step (gradient accumulation 2), with
    masked rows spread unevenly: the summed losses and gradients are the float64 mean over the 5 rows left in."""
    kappa, beta = -0.7, 0.5
    args = mintrl_args(cpu_args, kappa=kappa, regression_beta=beta, gradient_accumulation_steps=2)
    trainer = MInTRLTrainer(
        model=tiny_model_path, reward_funcs=role_reward, args=args, train_dataset=toy_dataset,
        judge=revise_first_step_judge(),
    )  # fmt: skip
    batch = masked_batch(trainer.model.config.vocab_size)
    expected_loss, expected_grads = float64_mean_over_rows_left_in(tiny_model_path, batch, kappa, beta)

    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 2
    trainer.model.zero_grad()
    total = 0.0
    for rows in (slice(0, 4), slice(4, 8)):
        micro_batch = {k: v if v.dim() == 0 else v[rows] for k, v in batch.items()}
        loss = trainer._compute_loss(trainer.model, micro_batch)
        loss.backward()
        total += loss.item()
    assert total == pytest.approx(expected_loss, rel=1e-5)
    grads = {n: p.grad for n, p in trainer.model.named_parameters() if p.grad is not None}
    assert grads.keys() == expected_grads.keys()
    for name, grad in grads.items():
        error = (grad.double() - expected_grads[name]).norm() / expected_grads[name].norm()
        assert error < 1e-4, (name, error.item())
    residual = trainer._metrics["train"]["mintrl/regression_residual"]
    assert len(residual) == 2  # both micro-batches keep a row; the RMS is over the rows left in only


def test_all_truncated_batch_logs_loss_zero_and_changes_no_weight(tiny_model_path, cpu_args, toy_dataset):
    """TRL's own scenario (test_training_with_mask_truncated_completions_all_masked) with MInTRL: every completion
    is cut by max_completion_length (the untrained tiny model never writes EOS that soon), all are masked, the
    logged loss is 0 and no weight moves, even at a learning rate of 0.1."""
    args = mintrl_args(
        cpu_args, mask_truncated_completions=True, max_completion_length=8, max_steps=1, learning_rate=0.1
    )
    trainer = scripted_trainer(tiny_model_path, args, toy_dataset)
    before = snapshot(trainer.model)
    trainer.train()
    record = trainer.records[0]
    assert not record["completion_mask"].any()  # every rollout truncated and masked
    assert record["advantages"].abs().sum() > 0  # the rows had a regression target: only the mask keeps them out
    assert trainer.state.log_history[0]["loss"] == 0.0
    assert params_changed(before, trainer.model) == 0
    assert "mintrl/regression_residual" not in trainer.state.log_history[0]  # no row to measure


def test_loss_forward_with_gradients_runs_in_micro_batches(tiny_model_path, cpu_args, toy_dataset):
    """A generation batch of 8 rollouts with per_device_train_batch_size=2: every forward pass that builds a graph
    (the loss's) sees at most 2 rows; generation (no gradients) may see all 8."""
    args = mintrl_args(cpu_args, per_device_train_batch_size=2, gradient_accumulation_steps=4, max_steps=1)
    trainer = scripted_trainer(tiny_model_path, args, toy_dataset)
    rows_with_grad = []

    def record(module, forward_args, forward_kwargs):
        if torch.is_grad_enabled():
            input_ids = forward_kwargs.get("input_ids", forward_args[0] if forward_args else None)
            rows_with_grad.append(input_ids.size(0))

    handle = trainer.model.register_forward_pre_hook(record, with_kwargs=True)
    try:
        trainer.train()
    finally:
        handle.remove()
    assert sum(r["completion_ids"].size(0) for r in trainer.records) == 8
    assert rows_with_grad and max(rows_with_grad) <= 2, rows_with_grad
    assert sum(rows_with_grad) == 8  # each rollout's loss forward once


@pytest.mark.parametrize("kappa", [0.1, 2.0])
def test_kappa_above_zero_is_refused(cpu_args, kappa):
    with pytest.raises(ValueError, match=rf"kappa={kappa}: .*log-probability cannot be above 0.*<= 0"):
        mintrl_args(cpu_args, kappa=kappa)
    assert mintrl_args(cpu_args, kappa=0.0).kappa == 0.0  # probability 1: the boundary is allowed
