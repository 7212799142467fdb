"""The tool toy task (benchmarks/tasks/toy/tool_task.py): environment and reward, the rule judge and its corrections as
TRL parses them, the rollout with the tool loop, and one MInTRLTrainer step with the environment on its warm start."""

from __future__ import annotations

import math

import pytest
from mintrl_helpers import mintrl_args
from trl.chat_template_utils import is_chat_template_prefix_preserving, parse_response, supports_tool_calling

from benchmarks.tasks.toy.tool_chat import tool_suffix_ids, tool_tokenizer
from benchmarks.tasks.toy.tool_judge import correct_calls, review_calls, tool_judge
from benchmarks.tasks.toy.tool_task import (
    RegisterEnv,
    ToolProblem,
    call_text,
    make_tool_dataset,
    make_tool_problems,
    tool_reward,
)
from benchmarks.tasks.toy.warm_start_tools_build import WARM_START_TOOLS_DIR

PROBLEM = ToolProblem(("4", "a", "b", "2"), ("+", "-", "+"), (("a", 7), ("b", 3)))  # 4+7-3+2 = 10


def env_for(problem: ToolProblem) -> RegisterEnv:
    env = RegisterEnv()
    env.reset(**problem.row())
    return env


def ids(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


def test_problem_and_reference():
    assert PROBLEM.question == "Compute 4+a-b+2 =" and PROBLEM.answer == 10 and PROBLEM.registers == ["a", "b"]
    assert PROBLEM.calls == "[get name=a][get name=b]"
    assert PROBLEM.solution == "4+7=11\n\n11-3=8\n\n8+2=10\n\nAnswer: 10"
    problems = make_tool_problems(50, seed=3, regime="reachable")
    assert problems == make_tool_problems(50, seed=3, regime="reachable")
    assert all(1 <= len(p.registers) <= 2 and p.question.startswith("Evaluate ") for p in problems)
    assert all(p.question.startswith("Compute ") for p in make_tool_problems(5, seed=3, regime="in-band"))


def test_a_guess_scores_zero_and_the_right_calls_score_one():
    guess = [{"role": "assistant", "content": PROBLEM.solution}]  # the right answer, no register read
    env = env_for(PROBLEM)
    row = PROBLEM.row()
    assert tool_reward([guess], [row["answer"]], [row["registers"]], environments=[env]) == [0.0]
    env = env_for(PROBLEM)
    assert env.get("a") == "a=7" and env.get("b") == "b=3"
    reads = [{"role": "assistant", "content": "", "tool_calls": []}, {"role": "tool", "name": "get", "content": "a=7"},
             {"role": "tool", "name": "get", "content": "b=3"}, {"role": "assistant", "content": PROBLEM.solution}]  # fmt: skip
    assert tool_reward([reads], [10], ["ab"], environments=[env]) == [1.0]
    half = env_for(PROBLEM)
    half.get("a")
    assert tool_reward([reads], [10], ["ab"], environments=[half]) == [0.0]  # b was never read
    assert tool_reward([[{"role": "assistant", "content": "Answer: 9"}]], [10], ["ab"], environments=[env]) == [0.0]
    with pytest.raises(ValueError, match="no register 'z'"):
        env.get("z")


def test_the_tool_tokenizer_passes_trls_checks_and_parses_calls():
    tok = tool_tokenizer()
    assert supports_tool_calling(tok) and is_chat_template_prefix_preserving(tok)
    context = tok.apply_chat_template(PROBLEM.row()["prompt"], add_generation_prompt=True, tokenize=True,
                                      return_dict=False)  # fmt: skip
    parsed = parse_response(tok, ids(tok, PROBLEM.calls) + [tok.eos_token_id], prefix=context)
    assert [c["function"] for c in parsed["tool_calls"]] == [{"name": "get", "arguments": {"name": "a"}},
                                                            {"name": "get", "arguments": {"name": "b"}}]  # fmt: skip
    plain = parse_response(tok, ids(tok, PROBLEM.solution) + [tok.eos_token_id], prefix=context)
    assert plain == {"role": "assistant", "content": PROBLEM.solution}
    suffix = tok.decode(tool_suffix_ids(tok, [{"role": "tool", "name": "get", "content": "a=7"}]))
    assert suffix == "\n<|im_start|>tool\na=7<|im_end|>\n<|im_start|>assistant\n"


def test_the_rule_judge_flags_a_missing_call_and_writes_it_in_the_policys_format():
    tok = tool_tokenizer()
    q = PROBLEM.question
    assert review_calls(q, "", ["4+5=9\n\n", "9-3=6"], None, []) == 0  # a guessed value: no register read
    correction = correct_calls(q, "", None, [])
    assert correction == call_text("a") == "[get name=a]"
    context = tok.apply_chat_template(PROBLEM.row()["prompt"], add_generation_prompt=True, tokenize=True,
                                      return_dict=False)  # fmt: skip
    parsed = parse_response(tok, ids(tok, correction) + [tok.eos_token_id], prefix=context)
    assert parsed["tool_calls"][0]["function"] == {"name": "get", "arguments": {"name": "a"}}
    # the right calls, and an unfinished right call at the chunk's end, are kept
    assert review_calls(q, "", [PROBLEM.calls], None, []) is None
    assert review_calls(q, "[get name=a]", ["[get na"], None, []) is None
    # a call to an unknown register, or a repeated one, is wrong; the correction is the next missing call
    assert review_calls(q, "", ["[get name=z]"], None, []) == 0
    assert review_calls(q, "[get name=a]", ["[get name=a]"], None, []) == 0
    assert correct_calls(q, "[get name=a]", None, []) == "[get name=b]"
    # a chunk cut inside a call: the correction finishes it instead of starting another
    assert review_calls(q, "[get name=a][get", [" name=z]"], None, []) == 0
    assert correct_calls(q, "[get name=a][get", None, []) == " name=b]"
    assert correct_calls(q, "[get name=", None, []) == "a]"
    # after a's result only b is missing; after both, every turn is kept (calls-only judge)
    read_a = [{"role": "tool", "name": "get", "content": "a=7"}]
    assert (
        review_calls(q, "", ["[get name=a]"], None, read_a) == 0
        and correct_calls(q, "", None, read_a) == "[get name=b]"
    )
    read_all = read_a + [{"role": "tool", "name": "get", "content": "b=3"}]
    assert review_calls(q, "", ["4+5=9\n\n"], None, read_all) is None and correct_calls(q, "", None, read_all) == ""
    assert review_calls(q, "", ["4+5=9\n\n"], None, read_all, check_steps=True) == 0
    assert correct_calls(q, "", None, read_all, check_steps=True) == "4+7=11\n\n"
    # through the FunctionJudge (it passes the conversation)
    from trl_mintrl.judges.base import CorrectionRequest, ReviewRequest

    judge = tool_judge()
    verdict = judge.review([ReviewRequest(q, "", ["4+5=9\n\n"], conversation=[])])[0]
    assert verdict.wrong_step == 0
    assert judge.correct([CorrectionRequest(q, "", conversation=[])])[0].text == "[get name=a]"


def test_rollouts_with_the_tool_loop_on_the_warm_start():
    """MInTRL's rollout with `LocalToolEnvironment` on the committed warm start: the judge's calls run, the reads
    are recorded, and an intervened rollout reads every register."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from benchmarks.tasks.toy.tool_calibration import correction_scores, pass_scores, tool_rollouts

    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(WARM_START_TOOLS_DIR)
    tok = AutoTokenizer.from_pretrained(WARM_START_TOOLS_DIR)
    assert tok.response_template is not None
    problems = make_tool_problems(4, seed=5, regime="in-band")
    intervened = tool_rollouts(model, tok, problems, 2, judge=tool_judge(), seed=0)
    for _, t, env in intervened:  # every intervened rollout was corrected with a call, and the call ran
        assert env.reads and any(m["role"] == "tool" for m in t.messages) and sum(t.judge_mask) > 0
    assert any(set(env.reads) == set(problems[i].registers) for i, _, env in intervened)
    scores = correction_scores(model, tok, problems, intervened)
    assert scores["corrections"] >= len(intervened) and math.isfinite(scores["correction_nats"])
    controls = pass_scores(problems, tool_rollouts(model, tok, problems, 2, seed=0), 2)
    assert 0.0 <= controls["pass@1"] <= 1.0


def test_one_mintrl_step_with_the_register_environment(cpu_args):
    from transformers import AutoTokenizer

    from trl_mintrl.mintrl import MInTRLTrainer

    tok = AutoTokenizer.from_pretrained(WARM_START_TOOLS_DIR)  # the tool chat template and response template
    args = mintrl_args(cpu_args, max_completion_length=96, chunk_size=16, max_reviews=4, max_correction_tokens=16,
                       max_tool_calling_iterations=3, max_steps=1, per_device_train_batch_size=8)  # fmt: skip
    trainer = MInTRLTrainer(model=str(WARM_START_TOOLS_DIR), reward_funcs=tool_reward, args=args, processing_class=tok,
                            train_dataset=make_tool_dataset(8, seed=0), judge=tool_judge(),
                            environment_factory=RegisterEnv)  # fmt: skip
    trainer.train()
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert len(logs) == 1 and math.isfinite(logs[0]["loss"])
    assert logs[0]["tools/call_frequency"] > 0 and logs[0]["mintrl/intervention_rate"] > 0
