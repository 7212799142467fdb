"""A toy task that needs a tool: arithmetic over registers whose values only `get(name)` reveals.

DESIGN NOTE (the next session writes its hypotheses from this; numbers: benchmarks/results/tools_calibration.md)

Task. `Compute 4+a-b+2 =`: a chain of 2-4 additions and subtractions (running values in 0..19, the base toy's
arithmetic) in which 1-2 operands are registers. Their values (0-9) are drawn per problem and live only in the
environment (`RegisterEnv`, one per rollout, `reset(**row)` from the dataset row); its one public method, the tool
`get(name)`, returns `a=7`. The right transcript reads every register, then computes:

    turn 1   [get name=a][get name=b]<|im_end|>                          (policy: the calls)
    tool     <|im_start|>tool\\na=7<|im_end|> <|im_start|>tool\\nb=3<|im_end|> <|im_start|>assistant\\n
    turn 2   4+7=11\\n\\n11-3=8\\n\\n8+2=10\\n\\nAnswer: 10<|im_end|>

Reward (`tool_reward`, also `solved`): 1 when the last assistant turn's `Answer:` is right AND every register of
the problem was read through the tool (the environment records reads), else 0: a guessed value that happens to
give the right answer (about 1 in 10-20) earns nothing. The decisive step is the call: once it has the values the
warm start's arithmetic is right in ~59% of rollouts ("solved given read" in the calibration), the ceiling the
arithmetic leaves.

Tool-call format. `[get name=a]`: 12 characters, one token each in the char tokenizer, brackets that arithmetic never
uses. Qwen3's `<tool_call>\\n{"name": "get", "arguments": {"name": "a"}}\\n</tool_call>` would be ~60 char tokens
per call; LFM2.5's Python-style calls are compact but TRL only recognises a template by its exact chat-template
text, and those templates' own special tokens are not in the char vocabulary. TRL 1.16 does not need a known
template: `GRPOTrainer.__init__` skips `add_response_schema` when the tokenizer already has a `response_template`,
and `trl.chat_template_utils.parse_response` (what TRL's `_tool_call_loop` and MInTRL's rollout parse every turn
with) hands it to transformers' response parser (>= 5.13; here 5.25). So the tool tokenizer (`tool_chat.tool_tokenizer`)
has its own chat template (`TOOL_CHAT_TEMPLATE`: the tiny model's `<|im_start|>role\\n...<|im_end|>` turns, an assistant
turn's `tool_calls` rendered as `[name key=value]`, tool results as `tool` turns, the tool schemas not rendered:
the prompt is the question alone) and `TOOL_RESPONSE_TEMPLATE`, an xml-inline tool-call field `[name k=v ...]`. The
template passes TRL's `supports_tool_calling` and `is_chat_template_prefix_preserving` checks, and both are saved
with the tokenizer (`response_template` round-trips through `save_pretrained`).

Warm start (`benchmarks/tasks/toy/warm_start_tools/`, 3.1 MB; `python -m benchmarks.tasks.toy.warm_start_tools_build`, 800
steps, 548 s wall / 271 s CPU on one thread of a loaded machine): the committed arithmetic warm start trained
further on register problems of both regimes, which differ only in the question's verb (design "d3-verb-rate",
`DESIGNS`): `Evaluate ...` problems are read with the tool in 30% of the warm-start transcripts, `Compute ...`
problems (the base toy's verb) in 0.3%; every other transcript guesses a value for each register and computes with it
(the habit of a model that answers without looking). The registers are the same lowercase letters in both, so the
call is written with the same tokens in both regimes and only the decision to call is rare. One warm start, two
regimes:
- "in-band" (`Compute`): the warm start rarely calls the tool by itself, so pass@k with the tool loop on is low;
  the rule judge's correction is the call, `[get name=a]`, in the format the warm start writes for `Evaluate`
  problems: unlikely here, not impossible (its NLL under the warm start is `correction_nats`; ~7 of its ~10 nats
  are the first token, `[`, the decision to call; most of the rest is which register to read first).
- "reachable" (`Evaluate`): the control, where the warm start already calls the tool (pass@k well above 0) and GRPO
  has signal.

Rule judge (`tool_judge`, a `FunctionJudge` reading `conversation`): while a register of the problem has not been
read (no `x=v` tool result in the conversation so far), the current turn must be calls to unread registers, each
once; the first step with anything else (a guessed computation, a call to an unknown or already-read register, a
malformed call) is flagged, and the correction is the next missing call, `[get name=x]`, in the policy's own format
(the policy then continues: another call or the end of its turn, when the calls run). Once everything was read it
keeps every turn (calls-only judge); `check_steps=True` also checks the arithmetic with the read values (the base
toy's rule judge), which would confound "the decisive step is a tool call" and is off by default.

Preconditions (MInTRL's, as in the in-band regime of `benchmarks/studies/learning.py`), measured by
`python -m benchmarks.studies.tool_calibration` (96 held-out problems x 64 rollouts at temperature 1, tool loop on:
MInTRL's own rollout, `InterventionRollout`, with `LocalToolEnvironment`: TRL's parser and TRL's tool-result
tokens; corrections from 8 intervened rollouts per problem, chunks of 16 tokens, 6 reviews). Targets: in-band
pass@8 <= 1%, pass@64 <= 5%, correction NLL ~7 nats (not beyond ~11); reachable pass@8 well above 0.
- d1-case (registers' case tells the regimes apart, lowercase read in 0.2%; missed): in-band pass@1/8/64 0/0/0%
  but corrections 19.88 +- 8.60 nats (n=1122; `[` only 5.82): the warm start had never written a lowercase name
  inside a call (the name ~5-7 nats, then `]` ~10-12): a foreign notation, not a rare decision.
- d2-verb (the verb tells them apart, in-band rate 0.1%): in-band pass@1/8/64 0.02/0.13/1.04%, corrections
  10.75 +- 3.46 nats (n=925; `[` 7.96); reachable pass@1/8/64 5.9/27.4/54.2%. In band, at its far edge.
- d3-verb-rate (committed; in-band rate 0.3%): in-band pass@1/8/64 0/0/0% (3 of 6144 rollouts read every register,
  none solved), corrections 10.01 +- 3.72 nats (n=886; `[` 7.09); intervened rollouts reward 45%; reachable
  pass@1/8/64 6.2/28.3/57.3%, its corrections 3.27 +- 2.44 nats. Both preconditions hold, the correction nearer the far edge (~10) than the in-band
  regime's ~7: the next session may want a d4 (longer build, so the register order is learned) if MInTRL's gain
  is small. Judge tokens are ~33% of the written tokens of intervened rollouts (a 12-token call in a ~33-token
  answer), far above the paper's 2-4%: the toy's answers are short, and H4 below watches it.

Proposed arms for the next session (5 seeds each, same budgets as the in-band benchmark; held-out pass@1 and
pass@8 with the tool loop on at evaluation, paired 95% intervals), on both regimes:
1. GRPO (TRL's `GRPOTrainer`, `environment_factory=RegisterEnv`, `reward_funcs=tool_reward`), 8 rollouts/prompt;
2. GRPO at equal rollouts (as many rollouts per step as MInTRL's controls + intervened, or matched total tokens);
3. MInTRL-const (4 control + 4 intervened, the toy's const anchor, `tool_judge()`, chunk 16, max_reviews 6,
   corrections up to 16 tokens, interventions for the first 40% of steps: `training.rl_fields`' MInTRL settings);
4. SFT on the reference transcripts (`reference_messages`: the calls, the results, the computation) then GRPO;
5. SORT with reference conversations (`reference_messages` as the reference column; tool-result tokens weight 0).
Hypotheses to write before the runs: H1 (in-band) MInTRL-const beats GRPO and GRPO at equal rollouts on pass@1 and
pass@8, because GRPO's groups are all-wrong on almost every prompt (pass@8 <= 1%) while one correction per
rollout makes a rewarded trajectory (45% of intervened rollouts at the warm start) within the policy's training
support; H2 (reachable) MInTRL is no better than GRPO (within the interval): GRPO already has signal; H3 SFT on
references reaches the call habit fastest (it is shown the calls) and SORT lies between SFT and GRPO; H4 MInTRL's judge-token share starts high (~33%:
one 12-token call per intervened rollout) and falls as the policy calls by itself, and the judge tokens' NLL falls
during the phase (if it does not, the ~10-nat correction is not being absorbed: try d4).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from .task import Problem, final_answer, make_problem

TOOL_NAME = "get"
MIN_OPS, MAX_OPS = 2, 4
MIN_REGISTERS, MAX_REGISTERS = 1, 2
REGIMES = ("in-band", "reachable")
TOOL_FIELDS = dict(max_completion_length=128, max_tool_calling_iterations=3)  # a rollout's limits (the calibration's)


@dataclass(frozen=True)
class Design:
    """How the warm start's habit differs between the two regimes: each regime's register alphabet and question verb,
    and the share of its warm-start transcripts that read the registers with the tool (`call_rates`)."""

    description: str
    alphabets: dict
    verbs: dict
    call_rates: dict
    build_steps: int


DESIGNS = {
    # design 1: the regimes differ by the registers' case. Missed: the in-band correction was ~20 nats, because
    # the warm start had never written a lowercase name inside a call (`a` after `[get name=` ~5-7 nats, then `]`
    # ~10-12 nats): a foreign notation, not a rare decision
    "d1-case": Design(
        "registers lowercase (in-band, read in 0.2% of warm-start transcripts) or UPPERCASE (reachable, 30%); "
        "questions `Compute ...`; 500 build steps",
        alphabets={"in-band": "abcdefgh", "reachable": "ABCDEFGH"},
        verbs={"in-band": "Compute", "reachable": "Compute"},
        call_rates={"in-band": 0.002, "reachable": 0.3},
        build_steps=500,
    ),
    # design 2: one register alphabet, so the call is written with the same tokens in both regimes; the regimes
    # differ by the question's verb, and only the decision to call is rare in the in-band regime
    "d2-verb": Design(
        "registers lowercase in both regimes; questions `Compute ...` (in-band, read in 0.1% of warm-start "
        "transcripts) or `Evaluate ...` (reachable, 30%); 800 build steps",
        alphabets={"in-band": "abcdefgh", "reachable": "abcdefgh"},
        verbs={"in-band": "Compute", "reachable": "Evaluate"},
        call_rates={"in-band": 0.001, "reachable": 0.3},
        build_steps=800,
    ),
    # design 3: design 2 with the in-band call rate tripled, to bring the correction nearer ~7 nats
    "d3-verb-rate": Design(
        "design 2 with `Compute` problems read in 0.3% of warm-start transcripts (reachable `Evaluate`: 30%); 800 "
        "build steps",
        alphabets={"in-band": "abcdefgh", "reachable": "abcdefgh"},
        verbs={"in-band": "Compute", "reachable": "Evaluate"},
        call_rates={"in-band": 0.003, "reachable": 0.3},
        build_steps=800,
    ),
}
DESIGN = "d3-verb-rate"  # the committed warm start's design

_QUESTION = re.compile(r"(?:Compute|Evaluate)\s+([0-9A-Za-z]+(?:\s*[-+]\s*[0-9A-Za-z]+)+)\s*=")
_TERM = re.compile(r"([-+]?)\s*([0-9]+|[A-Za-z])")


def call_text(register: str) -> str:
    """A call of the tool in the policy's format."""
    return f"[{TOOL_NAME} name={register}]"


@dataclass(frozen=True)
class ToolProblem:
    """`terms[0] ops[0] terms[1] ...`, each term a digit string or a register name; `values` the registers'."""

    terms: tuple[str, ...]
    ops: tuple[str, ...]
    values: tuple[tuple[str, int], ...]
    verb: str = "Compute"

    @property
    def question(self) -> str:
        return self.verb + " " + self.terms[0] + "".join(op + t for op, t in zip(self.ops, self.terms[1:])) + " ="

    @property
    def registers(self) -> list[str]:
        """The registers in order of appearance."""
        return [t for t in self.terms if t.isalpha()]

    def numeric(self, values: dict[str, int] | None = None) -> Problem:
        """The base toy problem with the registers' `values` (default: the true ones) substituted."""
        values = dict(self.values) if values is None else values
        numbers = [values[t] if t.isalpha() else int(t) for t in self.terms]
        return Problem(numbers[0], tuple(zip(self.ops, numbers[1:])))

    @property
    def answer(self) -> int:
        return self.numeric().answer

    @property
    def calls(self) -> str:
        """The right first turn: every register read, in order."""
        return "".join(call_text(r) for r in self.registers)

    @property
    def solution(self) -> str:
        """The right last turn (after the results): the computation with the read values."""
        return self.numeric().solution

    def reference_messages(self) -> list[dict]:
        """The reference transcript (SFT's and SORT's reference conversation): the calls, the results, the
        computation."""
        calls = [
            {"type": "function", "function": {"name": TOOL_NAME, "arguments": {"name": r}}} for r in self.registers
        ]
        values = dict(self.values)
        return [
            {"role": "assistant", "content": "", "tool_calls": calls},
            *({"role": "tool", "name": TOOL_NAME, "content": f"{r}={values[r]}"} for r in self.registers),
            {"role": "assistant", "content": self.solution},
        ]

    def row(self) -> dict:
        return {
            "prompt": [{"role": "user", "content": self.question}],
            "answer": self.answer,
            "registers": "".join(self.registers),
            "values": [dict(self.values)[r] for r in self.registers],
            "solution": self.solution,
            "num_ops": len(self.ops),
        }


def make_tool_problem(
    rng: random.Random, num_ops: int, num_registers: int, alphabet: str, verb: str = "Compute"
) -> ToolProblem:
    """A base toy problem of `num_ops` operations (running values in 0..19) with `num_registers` distinct operands
    (values 0-9) replaced by distinct register names from `alphabet`."""
    base = make_problem(rng, num_ops)
    numbers = [base.first, *(b for _, b in base.ops)]
    terms = [str(n) for n in numbers]
    positions = sorted(rng.sample(range(len(numbers)), num_registers))
    names = rng.sample(alphabet, num_registers)
    for position, name in zip(positions, names, strict=True):
        terms[position] = name
    values = tuple((name, numbers[p]) for p, name in zip(positions, names, strict=True))
    return ToolProblem(tuple(terms), tuple(op for op, _ in base.ops), values, verb)


def draw_tool_problem(rng: random.Random, regime: str, design: str = DESIGN) -> ToolProblem:
    """One problem of `regime` under `design`: 2-4 operations, 1-2 registers."""
    d = DESIGNS[design]
    num_ops, num_registers = rng.randint(MIN_OPS, MAX_OPS), rng.randint(MIN_REGISTERS, MAX_REGISTERS)
    return make_tool_problem(rng, num_ops, num_registers, d.alphabets[regime], d.verbs[regime])


def make_tool_problems(n: int, seed: int, regime: str = "in-band", design: str = DESIGN) -> list[ToolProblem]:
    """`n` problems of `regime` (its alphabet and verb under `design`); deterministic."""
    if regime not in REGIMES:
        raise ValueError(f"unknown regime {regime!r}; expected one of {REGIMES}")
    rng = random.Random(seed)
    return [draw_tool_problem(rng, regime, design) for _ in range(n)]


def make_tool_dataset(n: int, seed: int, regime: str = "in-band", design: str = DESIGN):
    from datasets import Dataset

    return Dataset.from_list([p.row() for p in make_tool_problems(n, seed, regime, design)])


def parse_tool_question(question: str) -> ToolProblem:
    """The problem's shape from its question (register values unknown: 0)."""
    match = _QUESTION.search(question)
    if match is None:
        raise ValueError(f"not a toy register question: {question!r}")
    found = _TERM.findall(match.group(1))
    terms = tuple(t for _, t in found)
    verb = question[match.start() : match.start(1)].split()[0]
    return ToolProblem(terms, tuple(op for op, _ in found[1:]), tuple((t, 0) for t in terms if t.isalpha()), verb)


class RegisterEnv:
    """One rollout's registers (TRL's `environment_factory`): `get` is the only tool; reads are recorded."""

    def __init__(self):
        self.values: dict[str, int] = {}
        self.reads: list[str] = []

    def reset(self, registers: str = "", values=(), **row) -> None:
        self.values = dict(zip(registers, values, strict=True))
        self.reads = []

    def get(self, name: str) -> str:
        """Read a register.

        Args:
            name: The register's name.
        """
        if name not in self.values:
            raise ValueError(f"no register {name!r}")
        self.reads.append(name)
        return f"{name}={self.values[name]}"


def last_answer(messages) -> int | None:
    """The `Answer:` of the last assistant turn with text (plain text: its first `Answer:`)."""
    if isinstance(messages, str):
        return final_answer(messages)
    texts = [m.get("content") or "" for m in messages if m.get("role") == "assistant"]
    texts = [t for t in texts if t.strip()]
    return final_answer(texts[-1]) if texts else None


def solved(answer: int, registers: str, completion, reads) -> bool:
    """The task's success: the last turn's answer is right and every register was read with the tool."""
    return last_answer(completion) == int(answer) and set(registers) <= set(reads)


def tool_reward(completions, answer, registers, environments=None, **kwargs) -> list[float]:
    """1.0 when `solved` (the right answer and every register read through `get`), else 0.0: a guess earns nothing."""
    if environments is None:
        raise ValueError("tool_reward needs the rollouts' environments (train with environment_factory=RegisterEnv)")
    return [
        float(solved(a, r, c, env.reads))
        for c, a, r, env in zip(completions, answer, registers, environments, strict=True)
    ]
