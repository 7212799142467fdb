"""`TransformersEngine` keeps each row's KV cache across the calls of a session: a continuation
prefills only its new tokens and gives what a fresh, uncached engine gives."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import AutoModelForCausalLM, GenerationConfig

from trl_mintrl.engines import TransformersEngine
from trl_mintrl.judges import FunctionJudge, GeneratingJudge
from trl_mintrl.mintrl.rollout import InterventionRollout, RolloutSettings, Trajectory


class RecordingEngine(TransformersEngine):
    """Records every backend call's requests and (truncated) outputs."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls: list[tuple[list[list[int]], list[list[int]]]] = []
        self.reads: list[tuple[float | None, int]] = []  # per call: its temperature, the tokens it prefilled

    def _generate(self, prompt_ids, max_new_tokens, temperature):
        before = self.prefill_tokens
        outputs = super()._generate(prompt_ids, max_new_tokens, temperature)
        self.calls.append((prompt_ids, [o.token_ids for o in outputs]))
        self.reads.append((temperature, self.prefill_tokens - before))
        return outputs


@pytest.fixture(scope="module")
def model(tiny_model_path):
    return AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32).eval()


def make_engine(model, tok, kv_cache=True, **kwargs):
    return RecordingEngine(
        model, pad_token_id=tok.pad_token_id, eos_token_ids=[tok.eos_token_id], kv_cache=kv_cache, **kwargs
    )


def cutting_judge():
    """Revises every other chunk at its first step; the correction repeats the first half of the wrong step's text
    and adds its own, so the continuation shares tokens with the cut chunk: the cut lands inside the cached row."""
    last_step: dict[str, str] = {}
    reviews: dict[str, int] = {}

    def review(question, prefix, steps, reference):
        reviews[question] = reviews.get(question, 0) + 1
        last_step[question] = steps[0]
        return 0 if reviews[question] % 2 == 1 else None

    def correct(question, prefix, reference):
        step = last_step[question]
        return step[: len(step) // 2] + " fix 1+1=2."

    return FunctionJudge(review, correct)


def rollout(engine, tok, n_rows=6, chunk=8, length=40, reviews=4, judge=None):
    trajectories = []
    for i in range(n_rows):
        ids = tok.apply_chat_template(
            [{"role": "user", "content": f"Problem {i}: what is {i} + {2 * i + 1}?" + " Think." * (i % 3)}],
            add_generation_prompt=True,
            tokenize=True,
        )
        ids = ids if isinstance(ids, list) else ids["input_ids"]
        budget = reviews if i % 3 else 0  # every third row a control rollout
        trajectories.append(Trajectory(prompt_ids=list(ids), question=f"q{i}", reference="r", review_budget=budget))
    settings = RolloutSettings(
        chunk_size=chunk, max_reviews=reviews, max_correction_tokens=16, max_completion_length=length
    )
    InterventionRollout(engine, judge or cutting_judge(), tok, settings).run(trajectories)
    return trajectories


def common_prefix(a, b):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_greedy_rollout_with_the_cache_gives_the_uncached_tokens_and_reads_only_new_tokens(model, tiny_tokenizer):
    tok = tiny_tokenizer
    config = GenerationConfig(do_sample=False)
    plain, cached = (make_engine(model, tok, flag, generation_config=config) for flag in (False, True))
    expected, got = rollout(plain, tok), rollout(cached, tok)
    assert [t.completion_ids for t in got] == [t.completion_ids for t in expected]
    assert [t.env_mask for t in got] == [t.env_mask for t in expected]
    assert sum(t.revisions for t in got) >= 4 and len(cached.calls) >= 4
    # the cuts land inside cached rows: a revised row's next request shares part of the chunk it replaces
    inside = 0
    for (requests, outputs), (next_requests, _) in zip(cached.calls, cached.calls[1:], strict=False):
        for request, output in zip(requests, outputs, strict=True):
            for following in next_requests:
                shared = common_prefix(request + output, following)
                inside += len(request) < shared < len(request) + len(output) - 1
    assert inside >= 1
    # the uncached engine reads every request in full; the cached one each prompt once, then only what follows the
    # cached prefix: the last sampled token of each chunk (no forward pass saw it) and the judge's tokens
    assert plain.prefill_tokens == sum(len(r) for requests, _ in plain.calls for r in requests)
    assert plain.reused_tokens == 0 and plain.prefix_cache_hit_rate() is None
    prompts = sum(len(t.prompt_ids) for t in got)
    bound = prompts + sum(t.judge_tokens for t in got) + sum(len(requests) for requests, _ in cached.calls)
    assert cached.prefill_tokens <= bound
    assert cached.prefill_tokens + cached.reused_tokens == plain.prefill_tokens
    assert cached.generated_tokens == plain.generated_tokens
    assert cached.prefill_tokens < plain.prefill_tokens / 2
    assert cached.prefix_cache_hit_rate() > 0.5


def test_sampled_logprobs_equal_a_fresh_forward_pass(model, tiny_tokenizer):
    tok = tiny_tokenizer
    temperature = 0.7
    config = GenerationConfig(do_sample=True, temperature=temperature, top_k=0, top_p=1.0)
    engine = make_engine(model, tok, generation_config=config, return_logprobs=True)
    torch.manual_seed(0)
    trajectories = rollout(engine, tok)
    assert engine.reused_tokens > 0 and sum(t.revisions for t in trajectories) >= 2
    worst, checked = 0.0, 0
    for t in trajectories:
        ids = torch.tensor([t.prompt_ids + t.completion_ids])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, len(t.prompt_ids) - 1 : -1].float()
        fresh = torch.log_softmax(logits / temperature, dim=-1).gather(-1, ids[0, len(t.prompt_ids) :, None])[:, 0]
        assert len(t.logprobs) == len(t.completion_ids)
        for position, (policy, logprob) in enumerate(zip(t.env_mask, t.logprobs, strict=True)):
            assert (logprob is None) == (policy == 0)
            if policy:
                worst = max(worst, abs(logprob - fresh[position].item()))
                checked += 1
    assert checked > 100 and worst < 1e-5


@pytest.mark.parametrize(
    "device",
    ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU"))],
)
def test_rows_with_different_cached_lengths_share_a_batch(model, tiny_tokenizer, device):
    """One call continues a row in full, one cut inside its generated tokens, one cut inside its prompt, and reads a
    fresh prompt: each row's tokens are those of an uncached engine, and only the uncached tokens are read."""
    tok = tiny_tokenizer
    model = model if device == "cpu" else copy.deepcopy(model).to(device)
    prompts = [tok(text, add_special_tokens=False)["input_ids"] for text in ("a b c", "d e f g h i j k", "l m n o p")]
    judge = tok(" fix it", add_special_tokens=False)["input_ids"]
    fresh = tok("q r", add_special_tokens=False)["input_ids"]
    engine, plain = make_engine(model, tok), make_engine(model, tok, kv_cache=False)
    with engine.session():
        first = [g.token_ids for g in engine.generate(prompts, [12, 5, 9], temperature=0)]
        assert engine.reused_tokens == 0
        assert all(len(ids) >= 4 and tok.eos_token_id not in ids for ids in first)
        requests = [
            prompts[0] + first[0],  # accepted: every token but the last one generated is cached
            prompts[1] + first[1][:2] + judge,  # cut inside the generated tokens
            prompts[2][:3] + judge,  # cut inside the prompt
            fresh,
        ]
        got = engine.generate(requests, [7, 9, 4, 6], temperature=0)
    expected = plain.generate(requests, [7, 9, 4, 6], temperature=0)
    assert [g.token_ids for g in got] == [g.token_ids for g in expected]
    reused = [len(requests[0]) - 1, len(prompts[1]) + 2, 3]
    shared_with_fresh = max(common_prefix(fresh, ids) for ids in prompts)
    assert engine.reused_tokens == sum(reused) + shared_with_fresh
    assert engine.prefill_tokens == sum(map(len, prompts)) + sum(map(len, requests)) - engine.reused_tokens


def test_caches_live_one_session(model, tiny_tokenizer):
    tok = tiny_tokenizer
    prompt = tok("s t u v", add_special_tokens=False)["input_ids"]
    engine = make_engine(model, tok)
    for _ in range(2):
        with engine.session():
            before = engine.reused_tokens
            out = engine.generate([prompt], 6, temperature=0)[0].token_ids
            assert engine.reused_tokens == before  # nothing kept from the previous session
            engine.generate([prompt + out], 6, temperature=0)
            assert engine.reused_tokens == before + len(prompt) + len(out) - 1
    # outside a session each call is its own session
    out = engine.generate([prompt], 6, temperature=0)[0].token_ids
    before = engine.reused_tokens
    engine.generate([prompt + out], 6, temperature=0)
    assert engine.reused_tokens == before


def test_cache_scopes_do_not_share(model, tiny_tokenizer):
    """A view of the model with other weights (the policy with its adapter disabled) reads no cache of the policy."""
    tok = tiny_tokenizer
    prompt = tok("w x y z", add_special_tokens=False)["input_ids"]
    engine = make_engine(model, tok)
    with engine.session():
        engine.generate([prompt], 4, temperature=0)
        with engine.cache_scope("adapter-disabled"):
            engine.generate([prompt], 4, temperature=0)
            assert engine.reused_tokens == 0
            engine.generate([prompt], 4, temperature=0)
            assert engine.reused_tokens == len(prompt) - 1
        engine.generate([prompt], 4, temperature=0)
        assert engine.reused_tokens == 2 * (len(prompt) - 1)


def test_self_judge_calls_between_policy_calls_keep_the_policy_rows(model, tiny_tokenizer):
    """The self judge generates with the policy's engine between two policy calls: the policy's rows survive its
    review calls, so each policy call after the first reads one token a row (the tiny model's reviews never parse:
    every chunk is kept)."""
    tok = tiny_tokenizer
    config = GenerationConfig(do_sample=False)
    results = {}
    for flag in (False, True):
        engine = make_engine(model, tok, flag, generation_config=config)
        judge = GeneratingJudge(engine, tok, max_review_tokens=8, max_correction_tokens=8)
        results[flag] = engine, rollout(engine, tok, length=24, judge=judge)
    (plain, expected), (cached, got) = results[False], results[True]
    assert [t.completion_ids for t in got] == [t.completion_ids for t in expected]
    policy_reads = [read for temperature, read in cached.reads if temperature is None]
    policy_rows = [
        len(requests) for (requests, _), (temperature, _) in zip(cached.calls, cached.reads) if temperature is None
    ]
    assert len(policy_reads) == 3 and len(cached.reads) > len(policy_reads)
    assert policy_reads[1:] == policy_rows[1:]
    assert cached.prefill_tokens < plain.prefill_tokens


class CallingTools:
    """A `ToolEnvironment` whose every turn calls `count` (the tiny model writes no tool calls): the result, a few
    tokens that differ per call, is appended and the next turn continues the conversation."""

    max_model_len = 100_000

    def __init__(self, tok):
        self.tok, self.calls = tok, 0

    def parse_turn(self, turn_ids, context_ids):
        call = {"type": "function", "function": {"name": "count", "arguments": {}}}
        return {"role": "assistant", "content": self.tok.decode(turn_ids), "tool_calls": [call]}

    def run(self, tool_calls):
        self.calls += 1
        return [{"role": "tool", "name": "count", "content": f"call {self.calls} done"}], 0

    def result_ids(self, tool_messages):
        return self.tok("".join(f"\n<r>{m['content']}</r>\n" for m in tool_messages), add_special_tokens=False)[
            "input_ids"
        ]


def test_tool_turns_continue_from_the_cache(model, tiny_tokenizer):
    """After a tool result the next turn continues the row's cache and reads only the result's
    tokens (and the turn's last token); the greedy conversation is the uncached engine's, judge cuts included."""
    tok = tiny_tokenizer
    config = GenerationConfig(do_sample=False)
    # the tiny model's greedy text repeats a few tokens forever: two of them end a turn here, so turns end and call
    turn_ends = [tok.eos_token_id, 241, 967]
    runs = {}
    for flag in (False, True):
        engine = RecordingEngine(
            model, pad_token_id=tok.pad_token_id, eos_token_ids=turn_ends, kv_cache=flag, generation_config=config
        )
        trajectories = []
        for i in range(6):
            ids = tok.apply_chat_template([{"role": "user", "content": f"Problem {i}: what is {i} + {2 * i + 1}?"}],
                                          add_generation_prompt=True, tokenize=True)  # fmt: skip
            ids = ids if isinstance(ids, list) else ids["input_ids"]
            trajectories.append(Trajectory(prompt_ids=list(ids), question=f"q{i}", reference="r",
                                           review_budget=2 if i % 2 else 0, environment=CallingTools(tok)))  # fmt: skip
        settings = RolloutSettings(chunk_size=8, max_reviews=2, max_correction_tokens=16, max_completion_length=64,
                                   max_tool_calling_iterations=3)  # fmt: skip
        InterventionRollout(engine, cutting_judge(), tok, settings).run(trajectories)
        runs[flag] = engine, trajectories
    (plain, expected), (cached, got) = runs[False], runs[True]
    for a, b in zip(expected, got, strict=True):
        assert (a.completion_ids, a.env_mask, a.judge_mask, a.messages) == (b.completion_ids, b.env_mask, b.judge_mask, b.messages)  # fmt: skip
    tool_tokens = sum(len(t.completion_ids) - t.written_tokens for t in got)
    assert sum(t.tool_calls for t in got) >= 6 and tool_tokens > 0 and sum(t.revisions for t in got) >= 1
    assert cached.prefill_tokens + cached.reused_tokens == plain.prefill_tokens
    prompts = sum(len(t.prompt_ids) for t in got)
    bound = (
        prompts + tool_tokens + sum(t.judge_tokens for t in got) + sum(len(requests) for requests, _ in cached.calls)
    )
    assert cached.prefill_tokens <= bound < plain.prefill_tokens / 2
