"""A full vLLM engine (`max_num_seqs` below the batch) under the continuous rollout: the stream holds the rest of
the requests back and admits them by priority, and the trajectories stay the lock-step ones. Its own module: two
in-process engines cannot live in one process at once, and `test_vllm_continuous.py` keeps one for its module."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from trl_mintrl.engines.vllm import VLLMEngine
from trl_mintrl.mintrl.continuous import ContinuousRollout
from trl_mintrl.mintrl.rollout import InterventionRollout, RolloutSettings

from .test_vllm_continuous import STATS, hashed_judge, trajectories


@pytest.fixture(scope="module")
def tokenizer(tiny_model_path):
    return AutoTokenizer.from_pretrained(tiny_model_path)


def test_a_full_engine_admits_by_priority_and_gives_the_lock_step_trajectories(tiny_model_path, llm_kwargs, tokenizer):
    engine = VLLMEngine.from_model_path(tiny_model_path, temperature=0.0, return_logprobs=True,
                                        gpu_memory_utilization=0.2, max_num_seqs=3, **llm_kwargs)  # fmt: skip
    try:
        settings = RolloutSettings(chunk_size=8, max_reviews=3, max_correction_tokens=6, max_completion_length=40)
        barrier, continuous = trajectories(tokenizer), trajectories(tokenizer)
        InterventionRollout(engine, hashed_judge(delay=0.005), tokenizer, settings).run(barrier)
        llm_engine, in_vllm = engine.llm.llm_engine, []
        step = llm_engine.step
        llm_engine.step = lambda: (in_vllm.append(llm_engine.get_num_unfinished_requests()), step())[1]
        try:
            ContinuousRollout(engine, hashed_judge(delay=0.005), tokenizer, settings).run(continuous)
        finally:
            del llm_engine.step
        for b, c in zip(barrier, continuous, strict=True):
            assert {k: getattr(c, k) for k in STATS} == {k: getattr(b, k) for k in STATS}
        assert max(in_vllm) == 3 and sum(t.revisions for t in barrier) >= 2  # full, never over, and judged
    finally:
        engine.close()
