"""SORT with TRL's `tools=` and `environment_factory=`: the GRPO part is TRL's tool loop exactly as in `GRPOTrainer`,
and the repair learns reference conversations (assistant turns learnt, tool results not) after the prompt the
policy saw, tool schemas and environment observation included.

The tiny model cannot call tools, so a scripted policy replaces TRL's `_generate_single_turn` (the one call that
samples tokens): TRL's own tool loop, parsing, masks, rewards and loss run on what it writes. The chat template is a
small Qwen3-style one (`<tool_call>` JSON, results in a user turn); TRL 1.16 knows templates by their exact text
(`add_response_schema`), so it parses this one with its Qwen3 `response_template`, set on the tokenizer here.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import re

import pytest
import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM
from trl import GRPOConfig, GRPOTrainer
from trl.chat_template_utils import qwen3_template

from tests.conftest import cpu_run_args
from trl_mintrl.input_checks import InputError, check_train_dataset
from trl_mintrl.losses import REPAIR_WEIGHTINGS, RepairWeighting, sort_repair_terms
from trl_mintrl.sort import FunctionPlanner, SORTConfig, SORTTrainer
from trl_mintrl.sort.buffer import RepairItem

TOOL_TEMPLATE = (
    "{% if tools %}{{ '<|im_start|>system\\n<tools>' }}{% for tool in tools %}{{ '\\n' + (tool | tojson) }}{% endfor %}"
    "{{ '\\n</tools><|im_end|>\\n' }}{% endif %}"
    "{% for message in messages %}"
    "{% if message.role == 'assistant' %}{{ '<|im_start|>assistant\\n' + (message.content or '') }}"
    "{% for call in message.tool_calls or [] %}"
    '{{ \'<tool_call>\\n{"name": "\' + call.function.name + \'", "arguments": \' + (call.function.arguments | tojson)'
    " + '}\\n</tool_call>' }}{% endfor %}{{ '<|im_end|>\\n' }}"
    "{% elif message.role == 'tool' %}"
    "{% if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{ '<|im_start|>user' }}{% endif %}"
    "{{ '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}"
    "{% if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{ '<|im_end|>\\n' }}{% endif %}"
    "{% else %}{{ '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

REGISTERS = {"a": 3, "b": 6}


def get(name: str) -> str:
    """Read a register.

    Args:
        name: the register's name
    """
    return str(REGISTERS[name]) if name in REGISTERS else "unknown register"


class RegisterEnv:
    """Registers only its `get` tool reveals; `reset` says which one the task is about; the reward is whether the
    rollout read it."""

    def reset(self, register: str, **row) -> str:
        self.register, self.read = register, False
        return f" (register {register} is hidden)"

    def get(self, name: str) -> str:
        """Read a register.

        Args:
            name: the register's name
        """
        self.read = self.read or name == self.register
        return get(name)

    def get_reward(self) -> float:
        return float(self.read)


def call_text(name: str) -> str:
    return f'<tool_call>\n{{"name": "get", "arguments": {{"name": "{name}"}}}}\n</tool_call>'


def scripted_turn(text: str, row: int) -> str:
    """The policy's next turn after `text` (prompt and completion so far): rows of even index look the register up
    once and answer it; odd rows want three look-ups (so `max_tool_calling_iterations=2` cuts them) and answer it.
    Every answer to a "(hard)" question is wrong: those groups are all-wrong."""
    register = re.search(r"register (\w+)\?", text).group(1)
    results = re.findall(r"<tool_response>\n(.*?)\n</tool_response>", text)
    if not results:
        return f"Try {row % 2}.{call_text(register)}<|im_end|>"
    if "Try 1." in text and len(results) < 3:
        return f"{call_text(register)}<|im_end|>"
    return f"Answer: {0 if '(hard)' in text else results[-1]}<|im_end|>"


def script_the_policy(trainer) -> None:
    """Replace the trainer's sampling (TRL's `_generate_single_turn`) with `scripted_turn`."""
    tokenizer = trainer.processing_class

    def generate(prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        texts = tokenizer.batch_decode(prompt_ids)
        turns = [scripted_turn(text, row) for row, text in enumerate(texts)]
        return [tokenizer(turn, add_special_tokens=False)["input_ids"] for turn in turns], None

    trainer._generate_single_turn = generate


def answer_reward(completions, register, **kwargs) -> list[float]:
    return [float(c[-1]["content"] == f"Answer: {REGISTERS[r]}") for c, r in zip(completions, register, strict=True)]


def reference_conversation(register: str) -> list[dict]:
    value = str(REGISTERS[register])
    return [
        {"role": "assistant", "content": "Try 0.", "tool_calls": [
            {"type": "function", "function": {"name": "get", "arguments": json.dumps({"name": register})}}]},
        {"role": "tool", "name": "get", "content": value},
        {"role": "assistant", "content": f"Answer: {value}"},
    ]  # fmt: skip


def register_rows(reference=reference_conversation) -> Dataset:
    return Dataset.from_list(
        [
            {"prompt": [{"role": "user", "content": f"What is in register {r}?{' (hard)' if r == 'b' else ''}"}],
             "register": r, "solution": reference(r)}
            for r in REGISTERS
        ]
    )  # fmt: skip


@pytest.fixture
def tool_tokenizer(tiny_tokenizer):
    tokenizer = copy.deepcopy(tiny_tokenizer)
    tokenizer.chat_template = TOOL_TEMPLATE
    tokenizer.response_template = qwen3_template  # TRL's parser of Qwen3's `<tool_call>` JSON
    return tokenizer


def sort_args(tmp_path, **overrides) -> SORTConfig:
    fields = cpu_run_args(tmp_path / "out", per_device_train_batch_size=8, max_steps=1, max_completion_length=512)
    return SORTConfig(**fields | {"correctness_reward_funcs": ["answer_reward"], "repair_batch_size": 1} | overrides)


def same_grpo_args(args: SORTConfig) -> GRPOConfig:
    """A GRPOConfig with every GRPO field as `args` has it (those GRPOConfig derives, derived again)."""
    derived = {"generation_batch_size", "steps_per_generation"}
    fields = [f.name for f in dataclasses.fields(GRPOConfig) if f.init and f.name not in derived]
    return GRPOConfig(**{name: getattr(args, name) for name in fields})


def build(trainer_class, args, model_path, tokenizer, dataset, **kwargs):
    model = AutoModelForCausalLM.from_pretrained(model_path)
    trainer = trainer_class(model, [answer_reward], args, dataset, processing_class=copy.deepcopy(tokenizer), **kwargs)
    script_the_policy(trainer)
    batches = []
    generate_and_score = trainer._generate_and_score_completions
    trainer._generate_and_score_completions = lambda inputs: batches.append(generate_and_score(inputs)) or batches[-1]
    return trainer, batches


def assert_same_rollouts(grpo_batches, sort_batches) -> None:
    assert len(grpo_batches) == len(sort_batches) > 0
    for grpo, sort in zip(grpo_batches, sort_batches, strict=True):
        for key in ("prompt_ids", "completion_ids", "tool_mask", "advantages"):
            assert torch.equal(grpo[key], sort[key]), key


def test_sort_with_tools_trains_as_grpo_and_defers_all_wrong_groups(tiny_model_path, tool_tokenizer, tmp_path):
    """Same tools, iteration limit and scripted policy: SORT's rollouts and advantages are GRPOTrainer's to the bit and
    its step to float rounding (no repair is due), tool results are masked, the limit binds, and the all-wrong prompt
    is in the buffer."""
    args = sort_args(tmp_path, max_tool_calling_iterations=2, repair_batch_size=8)
    dataset = register_rows()
    sort, sort_batches = build(SORTTrainer, args, tiny_model_path, tool_tokenizer, dataset, tools=[get])
    grpo, grpo_batches = build(
        GRPOTrainer, same_grpo_args(args), tiny_model_path, tool_tokenizer, dataset, tools=[get]
    )
    sort.train()
    grpo.train()

    assert_same_rollouts(grpo_batches, sort_batches)
    before = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    for name, param in grpo.model.named_parameters():  # two GRPOTrainers' steps differ by ~6e-6 here too
        torch.testing.assert_close(sort.model.get_parameter(name), param, atol=2e-5, rtol=0, msg=name)
    assert max((p - before.get_parameter(n)).abs().max() for n, p in grpo.model.named_parameters()) > 1e-4
    batch = sort_batches[0]
    texts = sort.processing_class.batch_decode(batch["completion_ids"] * batch["completion_mask"])
    results = [text.count("<tool_response>") for text in texts]
    assert sorted(set(results)) == [1, 2]  # odd rows cut after two executed calls by max_tool_calling_iterations=2
    for row, text in enumerate(texts):  # every result token, and only those, is masked out
        result_tokens = sort.processing_class(re.findall(r"<tool_response>\n\d\n</tool_response>", text)[0],
                                              add_special_tokens=False)["input_ids"]  # fmt: skip
        assert (batch["tool_mask"][row] == 0).sum() >= results[row] * len(result_tokens)
    assert 0 < (batch["tool_mask"] * batch["completion_mask"]).sum() < batch["completion_mask"].sum()
    assert [item.prompt[0]["content"] for item in sort.repair.buffer.items] == ["What is in register b? (hard)"]


def test_sort_with_an_environment_repairs_after_the_prompt_the_policy_saw(
    tiny_model_path, tool_tokenizer, tmp_path, monkeypatch
):
    """`environment_factory`: the rollouts (observation, tool calls, results, `get_reward`) are GRPOTrainer's, the
    all-wrong prompt is repaired, and its base and teacher passes start from exactly the tokens the policy's prompt
    had, tool schemas and `reset` observation included."""
    args = sort_args(tmp_path)
    dataset = register_rows()
    planner = FunctionPlanner(lambda question, reference: "read the register")
    sort, sort_batches = build(SORTTrainer, args, tiny_model_path, tool_tokenizer, dataset,
                               environment_factory=RegisterEnv, planner=planner)  # fmt: skip
    grpo, grpo_batches = build(GRPOTrainer, same_grpo_args(args), tiny_model_path, tool_tokenizer, dataset,
                               environment_factory=RegisterEnv)  # fmt: skip
    scored = []  # (prompt ids, reference ids) of each repair forward: teacher pass first, then base
    reference_logps = sort.repair._reference_logps
    monkeypatch.setattr(sort.repair, "_reference_logps",
                        lambda model, prompts, refs: scored.append((prompts, refs)) or reference_logps(model, prompts, refs))  # fmt: skip
    sort.train()
    grpo.train()

    assert_same_rollouts(grpo_batches, sort_batches)
    env_rewards = [h["rewards/RegisterEnv/mean"] for h in sort.state.log_history if "rewards/RegisterEnv/mean" in h]
    assert env_rewards == [1.0]
    assert sort.repair.buffer.counters["repairs"] == 1
    batch = sort_batches[0]
    hard = next(row for row in range(len(batch["prompt_ids"])) if batch["advantages"][row] == 0 and
                "(hard)" in sort.processing_class.decode(batch["prompt_ids"][row]))  # fmt: skip
    seen = batch["prompt_ids"][hard][batch["prompt_mask"][hard].bool()].tolist()
    assert "register b is hidden" in sort.processing_class.decode(seen)
    (teacher, _), (base, _) = scored
    assert base == [seen]
    assert '"name": "get"' in sort.processing_class.decode(teacher[0])  # the teacher's prompt shows the tools too


def test_conversation_reference_weights_are_zero_exactly_on_tool_results(
    tiny_model_path, tool_tokenizer, tmp_path, monkeypatch
):
    """A conversation reference is laid out as TRL lays out a rollout; hand-computed: its assistant turns' tokens are
    learnt, and the tokens of the tool result (and the template's around it) get weight 0."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    trainer = SORTTrainer(model, [answer_reward], sort_args(tmp_path), register_rows(), processing_class=tool_tokenizer,
                          tools=[get], planner=FunctionPlanner(lambda q, r: "read a"))  # fmt: skip
    tokenize = lambda text: tool_tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    first_turn = tokenize(f"Try 0.{call_text('a')}<|im_end|>")
    tool_result = tokenize(
        "\n<|im_start|>user\n<tool_response>\n3\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    answer = tokenize("Answer: 3<|im_end|>")
    reference = trainer.repair.renderer.reference(reference_conversation("a"))
    assert reference.ids == first_turn + tool_result + answer
    learned = [1] * len(first_turn) + [0] * len(tool_result) + [1] * len(answer)
    assert reference.learned == learned

    seen = []
    spy = RepairWeighting(lambda *a: seen.append((a[2], terms := sort_repair_terms(*a))) or terms, uses_plan=True)
    monkeypatch.setitem(REPAIR_WEIGHTINGS, "salience", spy)
    prompt = trainer.train_dataset[0]["prompt"]
    trainer.repair._repair_loss(trainer.model, [RepairItem(prompt, reference_conversation("a"))])
    (mask, terms), = seen  # fmt: skip
    assert mask[0].tolist() == learned
    weights = (terms.weights * mask)[0]
    assert (weights[torch.tensor(learned) == 0] == 0).all() and (weights[torch.tensor(learned) == 1] > 0).all()


def test_string_references_learn_every_token(tiny_model_path, tool_tokenizer, tmp_path):
    """A string reference with tools is learnt whole, with its EOS, as without them."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    dataset = register_rows(reference=lambda r: f"Answer: {REGISTERS[r]}")
    trainer = SORTTrainer(model, [answer_reward], sort_args(tmp_path), dataset, processing_class=tool_tokenizer,
                          tools=[get])  # fmt: skip
    reference = trainer.repair.renderer.reference("Answer: 3")
    assert reference.learned is None and reference.learned_tokens == len(reference.ids)
    assert reference.ids == [
        *tool_tokenizer("Answer: 3", add_special_tokens=False)["input_ids"],
        tool_tokenizer.eos_token_id,
    ]


def bad(messages_change):
    conversation = reference_conversation("a")
    messages_change(conversation)
    return conversation


class ColumnsOf(list):
    """Rows read by column, as a `Dataset` is, without Arrow's one type per column (an image result needs a list
    where other rows' contents are strings)."""

    column_names = ("prompt", "solution")

    def __getitem__(self, column):
        return [row[column] for row in self]


BAD_CONVERSATIONS = {
    "user message": (lambda c: c.insert(0, {"role": "user", "content": "hi"}), "'user'.*put system and user"),
    "orphan tool result": (lambda c: c.insert(0, {"role": "tool", "name": "get", "content": "3"}), "no tool call"),
    "ends on a result": (lambda c: c.pop(), "end with the final assistant answer"),
    "missing result": (lambda c: c.pop(1), r"\['get'\] before it have no result"),
    "image result": (
        lambda c: c[1].update(content=[{"type": "image", "image": None}]),
        "images in tool results cannot be learnt",
    ),
    "wrong result name": (lambda c: c[1].update(name="put"), "call to 'get' but is named 'put'"),
    "bad call": (lambda c: c[0].update(tool_calls=[{"function": {"name": "get"}}]), "each must be"),
}


@pytest.mark.parametrize("case", sorted(BAD_CONVERSATIONS))
def test_bad_reference_conversations_are_refused_naming_the_column(case):
    change, reason = BAD_CONVERSATIONS[case]
    dataset = ColumnsOf([{"prompt": [{"role": "user", "content": "q"}], "solution": bad(change)}])
    with pytest.raises(InputError, match=rf"(?s)Column 'solution' \(reference_column\).*row 0.*{reason}"):
        check_train_dataset(dataset, reference_column="solution", reference_conversations=True)


def test_reference_conversations_are_refused_where_references_are_read_as_text():
    with pytest.raises(InputError, match="holds conversations in row 0.*only SORTTrainer"):
        check_train_dataset(register_rows().select([0]), reference_column="solution")


@pytest.mark.parametrize(
    ("arguments", "tools", "reason"),
    [
        ({"name": "a"}, [], r"calls 'get', which is not among the tools its prompt shows \(\[\]\)"),
        ({"name": "a", "index": None}, [get], r"argument\(s\) \['index'\].*JSON string"),
    ],
)
def test_calls_the_prompt_does_not_show_are_refused_before_training(
    tiny_model_path, tool_tokenizer, tmp_path, arguments, tools, reason
):
    conversation = reference_conversation("a")
    conversation[0]["tool_calls"][0]["function"]["arguments"] = json.dumps(arguments)
    dataset = Dataset.from_list(
        [{"prompt": [{"role": "user", "content": "q"}], "register": "a", "solution": conversation}]
    )
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    with pytest.raises(InputError, match=rf"Column 'solution' \(reference_column\).*row 0.*{reason}"):
        SORTTrainer(model, [answer_reward], sort_args(tmp_path), dataset, processing_class=tool_tokenizer, tools=tools)
