"""Judge prompts under a thinking chat template (Qwen3-like): the default `judge_chat_template_kwargs` gives working
reviews and corrections; `{}` reproduces the old failure (reviews spent inside <think>), counted and warned once."""

from __future__ import annotations

import copy
import logging

import pytest
from mintrl_helpers import mintrl_args, role_reward
from test_mintrl_rollout import ScriptedPolicy, make_trajectory

from trl_mintrl import MInTRLTrainer
from trl_mintrl.engines.base import Generation, GenerationEngine
from trl_mintrl.judges import Correction, CorrectionRequest, GeneratingJudge, ReviewRequest, Verdict
from trl_mintrl.judges.templates import STUDENT_NOTATION
from trl_mintrl.mintrl.rollout import InterventionRollout, RolloutSettings

# `thinking_tokenizer` (conftest) is Qwen3-like: the generation prompt opens a think block unless enable_thinking is
# false, in which case it writes an empty, closed one (Qwen3's hybrid template); Qwen3-*-Thinking templates always
# open it.
REVIEW = "Step 1 adds wrongly.\nVERDICT: REVISE 1"
CORRECTION = "2+3=5\n\n"


class ThinkingJudgeEngine(GenerationEngine):
    """A judge model that thinks whenever its prompt ends inside an open think block: it reasons until its token cap
    and never answers. Otherwise it answers at once: REVISE 1 to reviews, CORRECTION to correction requests."""

    def __init__(self, tokenizer):
        super().__init__([tokenizer.eos_token_id])
        self.tok = tokenizer
        self.prompts: list[str] = []

    def _generate(self, prompt_ids, max_new_tokens, temperature):
        outputs = []
        for ids, cap in zip(prompt_ids, max_new_tokens, strict=True):
            prompt = self.tok.decode(ids)
            self.prompts.append(prompt)
            if prompt.endswith("<think>\n"):
                thought = self.tok("Let me check each step carefully. " * cap, add_special_tokens=False)["input_ids"]
                outputs.append(Generation(thought[:cap]))
            else:
                answer = REVIEW if "## New steps to review" in prompt else CORRECTION
                outputs.append(Generation(self._ids(answer) + [self.tok.eos_token_id]))
        return outputs

    def _ids(self, text):
        return self.tok(text, add_special_tokens=False)["input_ids"]


# Llama 3's format (header tokens around the role, content trimmed, no system turn needed)
LLAMA3_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)
GENERATION_PROMPTS = {
    "chatml": "<|im_end|>\n<|im_start|>assistant\n",
    "qwen3-thinking": "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
    "llama3": "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
}


@pytest.mark.parametrize("chat", sorted(GENERATION_PROMPTS))
@pytest.mark.parametrize("preset", ["math", "code"])
def test_correction_prompt_asks_for_the_students_notation_in_every_chat_format(
    tiny_tokenizer, thinking_tokenizer, chat, preset
):
    """The path of judge='self', 'base' and 'model': the preset's instruction to keep the student's notation reaches
    the judge whole, the prompt ends in the format's generation prompt (thinking closed), and the answer is used."""
    tok = {"chatml": tiny_tokenizer, "qwen3-thinking": thinking_tokenizer}.get(chat)
    if tok is None:
        tok = copy.deepcopy(tiny_tokenizer)
        tok.chat_template = LLAMA3_TEMPLATE
    engine = ThinkingJudgeEngine(tok)
    judge = GeneratingJudge(engine, tok, preset, preset)
    assert judge.correct([CorrectionRequest("Compute 2+3.", "We add.\n\n", "2+3=5")]) == [Correction(CORRECTION)]
    (prompt,) = engine.prompts
    assert STUDENT_NOTATION in prompt and "2+3=5" in prompt
    assert prompt.endswith("your text is appended to the solution as is." + GENERATION_PROMPTS[chat])


def test_rendered_judge_prompt_closes_the_think_block_by_default(thinking_tokenizer):
    engine = ThinkingJudgeEngine(thinking_tokenizer)
    GeneratingJudge(engine, thinking_tokenizer).review([ReviewRequest("q", "", ["a"])])
    GeneratingJudge(engine, thinking_tokenizer, chat_template_kwargs={}).review([ReviewRequest("q", "", ["a"])])
    assert engine.prompts[0].endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert engine.prompts[1].endswith("<|im_start|>assistant\n<think>\n")


def test_default_kwargs_give_working_reviews_and_corrections(thinking_tokenizer):
    judge = GeneratingJudge(ThinkingJudgeEngine(thinking_tokenizer), thinking_tokenizer, max_review_tokens=32)
    assert judge.review([ReviewRequest("Compute 2+3.", "", ["2+3=6\n\n", "Answer: 6"])]) == [Verdict(0)]
    assert judge.correct([CorrectionRequest("Compute 2+3.", "")]) == [Correction(CORRECTION)]


def test_thinking_template_without_kwargs_fails_reviews_and_corrections(thinking_tokenizer):
    judge = GeneratingJudge(
        ThinkingJudgeEngine(thinking_tokenizer), thinking_tokenizer, max_review_tokens=32, chat_template_kwargs={}
    )
    assert judge.review([ReviewRequest("Compute 2+3.", "", ["2+3=6\n\n", "Answer: 6"])]) == [Verdict(failed=True)]
    assert judge.correct([CorrectionRequest("Compute 2+3.", "")]) == [Correction(failed=True)]


@pytest.mark.parametrize("kwargs", [None, {}])
def test_rollout_inserts_corrections_only_when_the_judge_can_answer(thinking_tokenizer, kwargs):
    tok = thinking_tokenizer
    judge = GeneratingJudge(ThinkingJudgeEngine(tok), tok, max_review_tokens=32, chat_template_kwargs=kwargs)
    policy = ScriptedPolicy(tok, {1: ["2+3=6\n\n", "Answer: 5" + tok.eos_token], 2: ["2+3=6\n\n" + tok.eos_token]})
    trajectories = [make_trajectory(1, intervened=True, budget=1), make_trajectory(2, intervened=False)]
    settings = RolloutSettings(chunk_size=8, max_reviews=1, max_correction_tokens=16, max_completion_length=64)
    InterventionRollout(policy, judge, tok, settings).run(trajectories)
    intervened, control = trajectories
    text = tok.decode(intervened.completion_ids, skip_special_tokens=True)
    if kwargs is None:  # the default: REVISE 1, the correction replaces the wrong step as judge tokens
        assert (intervened.revisions, intervened.judge_failures) == (1, 0)
        n = len(tok(CORRECTION, add_special_tokens=False)["input_ids"])
        assert text == CORRECTION + "Answer: 5"
        assert intervened.env_mask[:n] == [0] * n and set(intervened.env_mask[n:]) == {1}
    else:  # today's failure: the review is spent inside <think>, counted, and the chunk kept as if KEEP
        assert (intervened.revisions, intervened.judge_failures) == (0, 1)
        assert text == "2+3=6\n\nAnswer: 5" and set(intervened.env_mask) == {1}
    assert control.reviews == 0 and control.judge_failures == 0


def _self_judge_trainer(tiny_model_path, cpu_args, toy_dataset, tokenizer, **overrides):
    trainer = MInTRLTrainer(
        model=tiny_model_path,
        reward_funcs=role_reward,
        args=mintrl_args(cpu_args, judge="self", judge_max_review_tokens=64, **overrides),
        train_dataset=toy_dataset,
        processing_class=tokenizer,
    )
    return trainer


def test_self_judge_step_renders_judge_prompts_without_thinking(
    tiny_model_path, cpu_args, toy_dataset, thinking_tokenizer
):
    """A real MInTRLTrainer step (judge='self', the tiny model): policy prompts keep the template's thinking default
    (the trainer's own chat_template_kwargs), judge prompts turn it off."""
    trainer = _self_judge_trainer(tiny_model_path, cpu_args, toy_dataset, thinking_tokenizer, max_steps=1)
    assert trainer.judge.engine is trainer.policy_engine
    seen = []
    generate = trainer.policy_engine._generate

    def recording(prompt_ids, max_new_tokens, temperature):
        seen.extend(thinking_tokenizer.decode(p) for p in prompt_ids)
        return generate(prompt_ids, max_new_tokens, temperature)

    trainer.policy_engine._generate = recording
    trainer.train()
    judge_prompts = [p for p in seen if "## New steps to review" in p or "## Partial solution" in p]
    policy_prompts = [p for p in seen if p not in judge_prompts]
    assert judge_prompts and policy_prompts
    assert all(p.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n") for p in judge_prompts)
    assert all("<|im_start|>assistant\n<think>\n" in p and "</think>" not in p for p in policy_prompts)


@pytest.mark.parametrize("kwargs", [None, {}])
def test_trainer_counts_thinking_failures_and_warns_once(
    tiny_model_path, cpu_args, toy_dataset, thinking_tokenizer, caplog, kwargs
):
    """The trainer's judge (built from the config) answered by the thinking engine over two training steps: the
    default intervenes with no failure and no warning; {} fails every review, counts it and warns exactly once."""
    overrides = {} if kwargs is None else {"judge_chat_template_kwargs": kwargs}
    trainer = _self_judge_trainer(tiny_model_path, cpu_args, toy_dataset, thinking_tokenizer, **overrides)
    trainer.judge.engine = ThinkingJudgeEngine(thinking_tokenizer)
    with caplog.at_level(logging.WARNING, logger="trl_mintrl.mintrl.judge_watch"):
        trainer.train()
    steps = [e for e in trainer.state.log_history if "mintrl/judge_failures" in e]
    assert len(steps) == 2
    warnings = [r for r in caplog.records if "unusable answers" in r.getMessage()]
    if kwargs is None:
        assert all(e["mintrl/judge_failures"] == 0 and e["mintrl/intervention_rate"] > 0 for e in steps)
        assert warnings == []
    else:
        assert all(e["mintrl/judge_failures"] > 0 and e["mintrl/intervention_rate"] == 0 for e in steps)
        assert len(warnings) == 1
        message = warnings[0].getMessage()
        assert "judge_chat_template_kwargs={}" in message and "judge_max_review_tokens=64" in message


def test_judge_chat_template_kwargs_config_parsing(cpu_args):
    assert mintrl_args(cpu_args).judge_chat_template_kwargs == {"enable_thinking": False}
    parsed = mintrl_args(cpu_args, judge_chat_template_kwargs='{"enable_thinking": true}')
    assert parsed.judge_chat_template_kwargs == {"enable_thinking": True}
    assert mintrl_args(cpu_args, judge_chat_template_kwargs=None).judge_chat_template_kwargs == {}
    with pytest.raises(ValueError, match="judge_chat_template_kwargs"):
        mintrl_args(cpu_args, judge_chat_template_kwargs="{not json")
    with pytest.raises(ValueError, match="judge_chat_template_kwargs"):
        mintrl_args(cpu_args, judge_chat_template_kwargs=["enable_thinking"])


def test_endpoint_correction_cut_by_its_cap_or_still_thinking_fails(monkeypatch):
    """The endpoint renders its own template: a correction it cut (finish_reason "length") or that leaves <think>
    open is failed, never inserted; a closed reasoning block is stripped."""
    from openai_server import ScriptedServer

    from trl_mintrl.judges import EndpointJudge

    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    replies = {
        "cut": {"choices": [{"message": {"content": "So 2+3 is 5 and then"}, "finish_reason": "length"}]},
        "open": "<think>\nThe student added 2 and 3, which",
        "closed": "<think>\nfine\n</think>\n\n2+3=5\n",
    }
    server = ScriptedServer(lambda question, attempt, body: (200, replies[question], 0.0))
    try:
        judge = EndpointJudge(server.url, "judge-model", api_key_env=None, timeout_s=2.0, max_retries=0)
        corrections = judge.correct([CorrectionRequest(q, "x", None) for q in replies])
    finally:
        server.close()
    assert corrections == [Correction(failed=True), Correction(failed=True), Correction("2+3=5\n")]


def test_paper_recipes_turn_judge_thinking_off_explicitly():
    """The shipped recipes judge with Qwen3 models: each says so in the file, not only through the default."""
    import pathlib

    import yaml

    recipes = sorted((pathlib.Path(__file__).parent.parent / "recipes" / "mintrl").glob("*.yaml"))
    assert recipes
    for path in recipes:
        assert yaml.safe_load(path.read_text())["judge_chat_template_kwargs"] == {"enable_thinking": False}, path
