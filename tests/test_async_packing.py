"""MInTRL's regression on TRL's packed async batches: the packed loss equals the padded one, and the judge-token mask
reaches every loss term through TRL's real dataset, planners, trie packing and collator."""

import queue
from collections import defaultdict

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader
from trl.experimental.async_grpo.async_grpo_trainer import (
    FixedCountBatcher,
    RolloutQueueDataset,
    TokenBudgetBatcher,
)
from trl.experimental.async_grpo.async_rollout_worker import RolloutSample
from trl.experimental.async_grpo.packing import TreeRow

from trl_mintrl.losses import advantage_regression_loss, mintrl_anchors, packed_advantage_regression_loss
from trl_mintrl.mintrl.async_ import MInTRLRolloutCollator, SampleMetrics

NUM_PROCESSES = 2
TOKEN_BUDGET = 16
VOCAB = 27

# (group_id, prompt, completion, judge flags on the completion, completion offsets left untrained). Group 0: uid 0's
# judge token 5 is uid 1's policy token 5, one trie node predicts both; uid 2 forks at the prompt's last token.
# Group 1: uid 5 trains no token (no loss term, not a sequence of the regression).
SPECS = [
    (0, [1, 2, 3, 4], [5, 6, 7, 8], [1, 0, 0, 1], ()),
    (0, [1, 2, 3, 4], [5, 6, 9], [0, 0, 1], ()),
    (0, [1, 2, 3, 4], [10, 11, 12], [0, 0, 0], (1,)),
    (1, [1, 2, 20, 21], [22, 23], [0, 1], ()),
    (1, [1, 2, 20, 21], [22, 24, 25], [1, 0, 0], ()),
    (1, [1, 2, 20, 21], [26], [0], (0,)),
]
ADVANTAGES = [0.5, -0.25, 0.75, -1.0, 1.25, 0.0]
STALE_UID = 0  # written by the weights before the last sync: model_version 0 while the trainer is at 1
# the step's rollouts in the regression, as the worker counts them: these 5 in the micro-batch and 3 in another
STEP_REGRESSION_ROWS = 8


def make_samples(old_log_probs):
    """RolloutSamples of SPECS; `old_log_probs(uid, input_ids, judge_mask)` gives the behaviour log-probs."""
    samples = []
    for uid, (group_id, prompt, completion, judge, untrained) in enumerate(SPECS):
        input_ids = np.array(prompt + completion)
        completion_mask = np.array([0] * len(prompt) + [int(k not in untrained) for k in range(len(completion))])
        judge_mask = np.array([0] * len(prompt) + judge)
        samples.append(
            RolloutSample(
                prompt=[],
                completion=[],
                input_ids=input_ids,
                completion_mask=completion_mask,
                old_log_probs=old_log_probs(uid, input_ids, judge_mask).astype(np.float32),
                advantage=ADVANTAGES[uid],
                model_version=0 if uid == STALE_UID else 1,
                group_id=group_id,
                metrics=SampleMetrics(
                    {"reward": float(uid)},
                    extras={
                        "judge_mask": judge_mask,
                        "model_version": 0 if uid == STALE_UID else 1,
                        "is_control": False,
                        "step_regression_rows": STEP_REGRESSION_ROWS,
                    },
                ),
            )
        )
    return samples


def _queue_ran_dry(stale_after_s):
    raise AssertionError("the planner asked for more samples than the test queued")


def collate_through_trl(samples, planner):
    """The trainer's path: TRL's RolloutQueueDataset (trainer at model_version 1, max_staleness 1) -> planner ->
    DataLoader(batch_size=1) -> MInTRLRolloutCollator, for NUM_PROCESSES ranks. Returns (batch, collator)."""
    rollout_queue = queue.Queue()
    for sample in samples:
        rollout_queue.put(sample)
    metrics = defaultdict(list)
    dataset = RolloutQueueDataset(
        rollout_queue, lambda: 1, _queue_ran_dry, 1.0, metrics, max_staleness=1, poll_interval_s=0.05
    )
    if planner == "fixed":
        dataset = FixedCountBatcher(dataset, NUM_PROCESSES, len(samples))
    else:  # a sample of unshared tokens that fits in no row closes the micro-batch
        closer = make_samples(lambda uid, ids, judge: np.zeros(len(ids)))[0]
        closer.input_ids, closer.group_id = np.arange(100, 100 + TOKEN_BUDGET), 2
        rollout_queue.put(closer)
        dataset = TokenBudgetBatcher(dataset, NUM_PROCESSES, TOKEN_BUDGET, metrics)
    collator = MInTRLRolloutCollator(pad_token_id=0, num_processes=NUM_PROCESSES, metrics=metrics)
    batch = next(iter(DataLoader(dataset, batch_size=1, collate_fn=collator, num_workers=0)))
    return batch, collator


def uid_coded_log_probs(uid, input_ids, judge_mask):
    """Behaviour log-probs that name their token: -(100 * uid + position), exact in float32."""
    return -(100.0 * uid + np.arange(len(input_ids)))


@pytest.mark.parametrize("planner", ["fixed", "token_budget"])
def test_judge_mask_reaches_every_loss_term(planner):
    samples = make_samples(uid_coded_log_probs)
    batch, collator = collate_through_trl(samples, planner)

    assert batch["judge_mask"].shape == batch["old_log_probs"].shape
    assert batch["step_regression_rows"].tolist() == [float(STEP_REGRESSION_ROWS)] * NUM_PROCESSES
    assert len(collator.metrics["reward"]) == 1  # TRL still averages the float keys of SampleMetrics

    terms, shared_position_flags = [], defaultdict(set)
    for rank in range(NUM_PROCESSES):
        real = batch["token_index"][rank] >= 0
        assert batch["judge_mask"][rank, ~real].eq(0).all()
        for position, code, flag in zip(
            batch["token_index"][rank, real].tolist(),
            batch["old_log_probs"][rank, real].tolist(),
            batch["judge_mask"][rank, real].tolist(),
            strict=True,
        ):
            uid, p = divmod(int(-code), 100)
            assert flag == samples[uid].metrics.extras["judge_mask"][p], (rank, uid, p)
            terms.append((uid, p))
            shared_position_flags[(rank, position)].add(flag)

    trained = [(uid, p) for uid, s in enumerate(samples) for p in np.flatnonzero(s.completion_mask)]
    assert sorted(terms) == sorted(trained)
    # one forwarded position predicts token 5 for uid 0 (judge) and uid 1 (policy): two terms, two flags
    assert {0.0, 1.0} in shared_position_flags.values()
    assert batch["attention_mask"].sum() < sum(len(s.input_ids) for s in samples)  # the trie shared prefixes


def test_packed_regression_hand_computed():
    # sequences 0 and 2 of a row (sequence 1 trains no token); the middle term is a judge token anchored at kappa,
    # the first an older policy's log-prob (stale anchor)
    logps = torch.tensor([-1.0, -2.0, -0.5], dtype=torch.float64, requires_grad=True)
    anchors = torch.tensor([-1.5, -0.2, -0.25], dtype=torch.float64, requires_grad=True)
    segment_id = torch.tensor([0, 0, 2])
    advantages = torch.tensor([0.5, 0.5, -1.0], dtype=torch.float64)
    loss, residuals = packed_advantage_regression_loss(logps, anchors, segment_id, advantages, beta=0.1)
    # r_0 = 0.1 * ((-1 + 1.5) + (-2 + 0.2)) - 0.5 = -0.63 ; r_2 = 0.1 * (-0.5 + 0.25) + 1 = 0.975
    assert residuals.tolist() == pytest.approx([-0.63, 0.975], abs=1e-12)
    assert loss.item() == pytest.approx((0.63**2 + 0.975**2) / 2, abs=1e-12)
    loss.backward()
    # dL/dlogp_t = 2 * beta * r_y / 2 sequences; no gradient into the anchors
    assert logps.grad.tolist() == pytest.approx([-0.063, -0.063, 0.0975], abs=1e-12)
    assert anchors.grad is None


def test_packed_regression_equals_padded_regression():
    """The whole path in float64: a context-free 'model' theta[depth, previous token, token] gives every trie node
    one log-prob, so packed and padded layouts score the same tokens; fresh samples are anchored at the current
    log-probs, the stale one at older weights', judge tokens (old log-prob 0, as the worker writes) at kappa."""
    beta, kappa = 0.3, -0.2
    generator = torch.Generator().manual_seed(0)
    theta = (torch.randn(8, VOCAB, VOCAB, generator=generator, dtype=torch.float64) - 2.0).requires_grad_()
    theta_old = theta.detach() + 0.5 * torch.randn(theta.shape, generator=generator, dtype=torch.float64)

    def current(input_ids):
        ids = torch.as_tensor(input_ids)
        return theta[torch.arange(len(ids) - 1), ids[:-1], ids[1:]]

    def behaviour(uid, input_ids, judge_mask):
        ids = torch.as_tensor(input_ids)
        table = theta_old if uid == STALE_UID else theta.detach()
        logps = torch.cat([torch.zeros(1, dtype=torch.float64), table[torch.arange(len(ids) - 1), ids[:-1], ids[1:]]])
        return np.where(judge_mask == 1, 0.0, logps.numpy())

    samples = make_samples(behaviour)
    batch, _ = collate_through_trl(samples, "fixed")

    loss, residuals = 0.0, []
    for rank in range(NUM_PROCESSES):  # what each rank computes; DDP then averages the ranks' gradients
        real = batch["token_index"][rank] >= 0
        token_index = batch["token_index"][rank, real]
        per_token_logps = theta[
            batch["position_ids"][rank, token_index],
            batch["input_ids"][rank, token_index],
            batch["shift_labels"][rank, token_index],
        ]
        anchors = mintrl_anchors(
            batch["old_log_probs"][rank, real].double(), batch["judge_mask"][rank, real], "const", kappa
        )
        rank_loss, rank_residuals = packed_advantage_regression_loss(
            per_token_logps,
            anchors,
            batch["segment_id"][rank, real],
            batch["advantages"][rank, real].double(),
            beta,
            num_sequences=batch["step_regression_rows"][rank].double() / NUM_PROCESSES,
        )
        loss = loss + rank_loss / NUM_PROCESSES
        residuals.append(rank_residuals)

    in_regression = [s for s in samples if s.completion_mask.any()]
    width = max(len(s.input_ids) for s in in_regression) - 1

    def padded(values):
        return torch.stack([torch.nn.functional.pad(torch.as_tensor(v), (0, width - len(v))) for v in values])

    padded_logps = padded([current(s.input_ids) for s in in_regression])
    padded_anchors = mintrl_anchors(
        padded([s.old_log_probs[1:].astype(np.float64) for s in in_regression]),
        padded([s.metrics.extras["judge_mask"][1:] for s in in_regression]),
        "const",
        kappa,
    )
    expected_loss, expected_residuals = advantage_regression_loss(
        padded_logps,
        padded_anchors,
        padded([s.completion_mask[1:] for s in in_regression]),
        torch.tensor([s.advantage for s in in_regression], dtype=torch.float32).double(),
        beta,
        num_rows=STEP_REGRESSION_ROWS,  # this micro-batch's share of the step's mean
    )

    torch.testing.assert_close(loss, expected_loss, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(torch.cat(residuals).sort().values, expected_residuals.sort().values)
    (grad,) = torch.autograd.grad(loss, theta)
    (expected_grad,) = torch.autograd.grad(expected_loss, theta)
    torch.testing.assert_close(grad, expected_grad, rtol=1e-12, atol=1e-12)
    assert grad.abs().sum() > 0


class _TermsReversed(TreeRow):
    """TreeRow with its loss terms in reverse order: a stand-in for a TRL release that lays them out differently."""

    def pack(self):
        packed = super().pack()
        for key in ("token_index", "old_log_probs", "advantages", "segment_id"):
            packed[key] = packed[key].flip(0)
        return packed


class _TermsReversedWithinSamples(TreeRow):
    """TreeRow with each sample's terms reversed, samples in order: segment ids still match, targets do not."""

    def pack(self):
        packed = super().pack()
        reversed_order = torch.arange(len(packed["segment_id"])).flip(0)
        order = reversed_order[torch.sort(packed["segment_id"][reversed_order], stable=True).indices]
        for key in ("token_index", "old_log_probs", "advantages", "segment_id"):
            packed[key] = packed[key][order]
        return packed


def _rows(row_class, samples):
    """One row per group, holding what RolloutQueueDataset yields for each sample."""
    rows = [row_class() for _ in range(NUM_PROCESSES)]
    for sample in samples:
        queued = {
            "input_ids": sample.input_ids,
            "completion_mask": sample.completion_mask,
            "old_log_probs": sample.old_log_probs,
            "advantage": sample.advantage,
            "group_id": sample.group_id,
            "metrics": sample.metrics,
        }
        rows[sample.group_id].add(queued)
    return rows


@pytest.mark.parametrize("row_class", [_TermsReversed, _TermsReversedWithinSamples])
def test_misordered_terms_raise(row_class):
    samples = make_samples(uid_coded_log_probs)
    collator = MInTRLRolloutCollator(pad_token_id=0, num_processes=NUM_PROCESSES)
    collator([_rows(TreeRow, samples)])  # TRL's own order passes
    with pytest.raises(RuntimeError, match="judge-token mask would be misaligned"):
        collator([_rows(row_class, samples)])


def test_plain_metrics_dict_is_refused():
    samples = make_samples(uid_coded_log_probs)
    samples[0].metrics = {"reward": 0.0}
    collator = MInTRLRolloutCollator(pad_token_id=0, num_processes=NUM_PROCESSES)
    with pytest.raises(TypeError, match="SampleMetrics"):
        collator([_rows(TreeRow, samples)])
