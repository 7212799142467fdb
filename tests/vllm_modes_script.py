"""Run by tests/test_vllm_modes.py under `torchrun --nproc_per_node=2`: 2 MInTRL steps on a synchronized engine.

`tp`: our real `VLLMEngine` with a 2-rank tensor-parallel group (gloo); `server`: our real `VLLMServerEngine`, with
a client on rank 0 only. In both, only the backend call (`LLM.generate`, `VLLMClient.generate`) is replaced by
`transformers` generation. Each engine call first checks that both ranks are in the same call (number, kind), so a
rank that skips a round or a judge call fails the run instead of passing. Rank 0 holds the controls (one round),
rank 1 the intervened rollouts (chunks, reviews, corrections): rank 0 must keep joining rank 1's rounds.
"""

import json
import os
import sys
import threading
from datetime import timedelta

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from datasets import Dataset  # noqa: E402
from mintrl_helpers import ONE_STEP_ROWS, multi_process_args  # noqa: E402

from trl_mintrl import MInTRLTrainer  # noqa: E402
from trl_mintrl.cpu import exit_launched_process  # noqa: E402
from trl_mintrl.engines.vllm import VLLMEngine, VLLMServerEngine, _all_gather  # noqa: E402
from trl_mintrl.judges import GeneratingJudge  # noqa: E402
from trl_mintrl.judges.base import Correction, Verdict  # noqa: E402

CORRECTION = "1+1=2\n\n"


class CallContract:
    """Both ranks must be in the same engine call: same number, same kind (policy: temperature None; judge: 0)."""

    def __init__(self, group=None):
        self.group = group
        self.log: list[tuple[str, int]] = []  # (kind, this rank's number of prompts)

    def check(self, temperature, n_prompts: int) -> None:
        kind = "policy" if temperature is None else "judge"
        label = (len(self.log), kind)
        labels = _all_gather(label, self.group)
        if len(set(labels)) != 1:
            raise RuntimeError(f"ranks are in different engine calls: {labels}")
        self.log.append((kind, n_prompts))


class ContractTPEngine(VLLMEngine):
    """`VLLMEngine` (gather within the TP group, slice, `any_rank`) with `transformers` in place of `LLM.generate`."""

    def __init__(self, inner, group):
        super().__init__(None, eos_token_ids=inner.eos_token_ids, return_logprobs=False, tp_group=group)
        self.inner, self.contract = inner, CallContract(group)

    def _generate(self, prompt_ids, max_new_tokens, temperature):
        self.contract.check(temperature, len(prompt_ids))
        return super()._generate(prompt_ids, max_new_tokens, temperature)

    def _generate_all(self, prompt_ids, max_new_tokens, temperature):
        return self.inner.generate(prompt_ids, max_new_tokens, temperature)


class TransformersClient:
    """Rank 0's stand-in for TRL's `VLLMClient.generate`: same arguments and reply layout."""

    def __init__(self, inner):
        self.inner, self.requests, self.lock = inner, [], threading.Lock()

    def generate(self, prompts, max_tokens, logprobs, generation_kwargs, temperature, **sampling):
        with self.lock:  # the engine sends concurrent requests; the transformers engine is not thread-safe
            self.requests.append((len(prompts), max_tokens, sorted(generation_kwargs["stop_token_ids"])))
            out = self.inner.generate(prompts, max_tokens, None if temperature == 1.0 else temperature)
        return {"completion_ids": [g.token_ids for g in out], "logprobs": [[[0.0]] * g.num_tokens for g in out]}


class ContractServerEngine(VLLMServerEngine):
    def __init__(self, inner, client):
        super().__init__(client, eos_token_ids=inner.eos_token_ids, sampling_defaults={"temperature": 1.0})
        self.contract = CallContract()

    def _generate(self, prompt_ids, max_new_tokens, temperature):
        self.contract.check(temperature, len(prompt_ids))
        return super()._generate(prompt_ids, max_new_tokens, temperature)


class FirstChunkJudge(GeneratingJudge):
    """A self-judge whose engine calls are real (so they take part in the collectives) but whose verdicts are
    scripted: the first chunk of each intervened rollout is wrong at step 0 and replaced by CORRECTION."""

    def review(self, requests):
        super().review(requests)
        return [Verdict(wrong_step=0 if not r.prefix else None) for r in requests]

    def correct(self, requests):
        super().correct(requests)
        return [Correction(CORRECTION) for _ in requests]


class RecordingTrainer(MInTRLTrainer):
    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        self.records = getattr(self, "records", [])
        self.records.append({"judge_rows": (output["tool_mask"] == 0).any(dim=1).tolist()})
        return output

    def _intervention_rollout(self, prompts, trainer):
        calls_before = len(self.policy_engine.contract.log)
        out = super()._intervention_rollout(prompts, trainer)
        self.rollout_calls = getattr(self, "rollout_calls", [])
        self.rollout_calls.append(self.policy_engine.contract.log[calls_before:])
        return out


def main(mode: str, model_path: str, out_dir: str):
    # a short timeout turns a missed collective into an error instead of a 30-minute hang
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    torch.manual_seed(0)
    args = multi_process_args(out_dir)
    trainer = RecordingTrainer(
        model_path,
        reward_funcs=lambda completions, **kw: [0.0] * len(completions),
        args=args,
        train_dataset=Dataset.from_list(ONE_STEP_ROWS),
    )  # engine, judge replaced below
    inner = trainer.policy_engine
    rank = dist.get_rank()
    if mode == "tp":
        engine = ContractTPEngine(inner, dist.new_group([0, 1], timeout=timedelta(seconds=60)))
        client = None
    else:
        client = TransformersClient(inner) if rank == 0 else None
        engine = ContractServerEngine(inner, client)
    trainer._policy_engine = engine
    trainer.judge = FirstChunkJudge(engine, trainer.processing_class, max_review_tokens=6, max_correction_tokens=4)
    trainer.train()
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(
            {
                "steps": trainer.state.global_step,
                "calls": engine.contract.log,
                "rollout_calls": trainer.rollout_calls,
                "records": trainer.records,
                "requests": client.requests if client else None,
            },
            f,
        )
    exit_launched_process(trainer)  # the script's last step: no gloo teardown (trl_mintrl.cpu)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3])
