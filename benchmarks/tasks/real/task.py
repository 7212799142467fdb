"""Generated GSM8K-style word problems for SmolLM2-135M-Instruct, with reference solutions written its way.

A problem is a chain of `num_steps` computations on one running quantity (a person's stickers, a shop's stock,
savings, a bill), one computation per sentence of the question, all with integer results:

    Jack has 28 stickers. He gives 12 stickers to his sister. He finds 5 more stickers.
    How many stickers does Jack have now?

Its reference solution is written the way the model writes (measured on its own samples: one step per line, each step a
sentence carrying its computation, GSM8K's `#### N` at the end):

    Jack has 28 - 12 = 16 stickers left.
    Jack has 16 + 5 = 21 stickers.
    #### 21

Every operand is written in the question as digits (no "twice", "a dozen"), so a judge can tell the numbers the
question gives from the ones a solution makes up. Themes (`themes`): `people` (objects a person has), `shop` (a
shop's stock), `savings` (a person's dollars) and `shopping` (a bill in dollars). Operations: `+`, `-`, `*` (operand
2-5), `/` (operand 2-6, exact); every running value stays in 2..`MAX_VALUE`. A division that changes what is counted
(dollars per person, items per shelf) is only drawn as the last step, and the question then asks for it.

A second family, `chain` (`make_chain_problem`), is built for MInTRL's own regime, a short correction inside a long
rollout the policy writes: long chains of easy steps (`+` or `-` of one digit, values kept in 10..`MAX_VALUE`) with
one decisive step of another operation (`*` by 2-4, never the first step), so that a model warmed up on the easy
steps (`chain-easy`, the decisive step in few chains or none) gets most of a solution right but rarely the decisive
step, and a judge's correction of that one step is a small part of the rollout.

Splits (`make_splits`, `make_datasets`): `heldout` (the training difficulties), `heldout_longer` (more steps than
training saw), `train`; drawn in that order from their own seeded streams, each skipping every problem an earlier
split holds (a problem is its chain of computations, whatever the names and objects: `Problem.key`), so the held-out
sets do not depend on the training set's size. `chat`: handwritten non-math conversations (`CHAT`) for measuring how
much of the chat model a method keeps (its NLL on the answers).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from .themes import JOBS, RELATIVES, THEMES, THINGS

MAX_VALUE = 200
INSTRUCTION = (
    'Solve it step by step. Write one step per line, and end with the final answer on its own line as "#### <answer>".'
)
CALIBRATION_SEED = 4500  # calibration draws its own problems: fresh draws from the training distribution
OPS = ("+", "-", "*", "/")
# `make_problem`'s family; `make_chain_problem`'s with and without its decisive step
FAMILIES = ("mixed", "chain", "chain-easy")
EASY_OPS = ("+", "-")
CHAIN_LOW = 10  # a chain's running value never goes below it
CHAIN_START_HIGH = 60  # a chain starts at 20..this
DECISIVE_OP = "*"


@dataclass(frozen=True)
class Problem:
    """One word problem. `computations`: its steps as `(a, op, b, c)` with `c = a op b`; `steps`: the reference's
    sentences, one per computation; `question`: the problem text (without the instruction)."""

    theme: str
    question: str
    steps: tuple[str, ...]
    computations: tuple[tuple[int, str, int, int], ...]

    @property
    def answer(self) -> int:
        return self.computations[-1][3]

    @property
    def num_steps(self) -> int:
        return len(self.computations)

    @property
    def key(self) -> tuple:
        """What makes two problems the same: the chain of computations (names, objects and wording aside)."""
        return self.computations

    @property
    def solution(self) -> str:
        """The reference solution: one step per line, then `#### answer`."""
        return "\n".join(self.steps) + f"\n#### {self.answer}"

    @property
    def prompt(self) -> list[dict]:
        return [{"role": "user", "content": f"{self.question}\n\n{INSTRUCTION}"}]

    def row(self) -> dict:
        """A dataset row: `prompt` (conversation), `solution` (the reference, read by the math reward through its
        final answer, and by SORT and the judges as the reference), `answer`, `num_steps`, `theme`."""
        return {
            "prompt": self.prompt,
            "solution": self.solution,
            "answer": self.answer,
            "num_steps": self.num_steps,
            "theme": self.theme,
        }


def apply(a: int, op: str, b: int) -> int:
    return {"+": a + b, "-": a - b, "*": a * b, "/": a // b}[op]


def _operand(rng: random.Random, a: int, op: str) -> int | None:
    """An operand for `a op b` that keeps the result an integer in 2..MAX_VALUE, or None when there is none."""
    if op == "+":
        high = min(40, MAX_VALUE - a)
        return rng.randint(2, high) if high >= 2 else None
    if op == "-":
        high = min(40, a - 2)
        return rng.randint(2, high) if high >= 2 else None
    if op == "*":
        high = min(5, MAX_VALUE // a)
        return rng.randint(2, high) if high >= 2 else None
    divisors = [b for b in range(2, 7) if a % b == 0 and a // b >= 2]
    return rng.choice(divisors) if divisors else None


def make_problem(rng: random.Random, num_steps: int) -> Problem:
    """A random problem with `num_steps` computations (see the module's docstring)."""
    if num_steps < 1:
        raise ValueError(f"num_steps must be >= 1, got {num_steps}")
    theme = rng.choice(THEMES)
    slots = theme.slots(rng)
    sentences, steps, computations = [], [], []
    question = theme.question
    if rng.random() < 0.3:  # the first computation is a product given by the first sentence
        a, b = rng.randint(2, 9), rng.randint(3, 12)
        asked, written = theme.start_mul
        computations.append((a, "*", b, a * b))
        sentences.append(asked.format(a=a, b=b, **slots))
        steps.append(written.format(a=a, b=b, c=a * b, **slots))
        value = a * b
    else:
        value = rng.randint(8, 60)
        sentences.append(theme.start.format(v=value, **slots))
    while len(computations) < num_steps:
        last = len(computations) == num_steps - 1
        choices = [op for op in OPS if last or op not in theme.last_only]
        op = rng.choice(choices)
        b = _operand(rng, value, op)
        if b is None:
            continue
        asked, written = theme.ops[op]
        c = apply(value, op, b)
        computations.append((value, op, b, c))
        # the things, relatives and jobs of each sentence drawn anew: "spends 9 dollars on a kite. He pays 5 dollars
        # for a hat", not the same kite twice
        fresh = {"thing": rng.choice(THINGS), "rel": rng.choice(RELATIVES), "job": rng.choice(JOBS)}
        sentences.append(rng.choice(asked).format(b=b, **{**slots, **fresh}))
        steps.append(written.format(a=value, b=b, c=c, **slots))
        if last and op in theme.last_only:
            question = theme.last_only[op]
        value = c
    sentences.append(question.format(**slots))
    return Problem(theme.name, " ".join(sentences), tuple(steps), tuple(computations))


def make_chain_problem(
    rng: random.Random, num_steps: int, decisive: bool = True, start_high: int = CHAIN_START_HIGH
) -> Problem:
    """A `chain` problem (module docstring): `num_steps` steps of `EASY_OPS` with operands 2-9 on a value starting at
    20..`start_high` and kept in `CHAIN_LOW`..`MAX_VALUE` (before the decisive step, at most half of it: a decisive
    chain starts at most there); with `decisive`, the
    step at a random position after the first is `DECISIVE_OP` by 2-4 instead. The question's and the solution's
    sentences are the themes' own."""
    if num_steps < 2:
        raise ValueError(f"a chain needs num_steps >= 2 (the decisive step is never the first), got {num_steps}")
    theme = rng.choice(THEMES)
    slots = theme.slots(rng)
    value = rng.randint(20, min(start_high, MAX_VALUE // 2) if decisive else start_high)
    sentences, steps, computations = [theme.start.format(v=value, **slots)], [], []
    at = rng.randint(1, num_steps - 1) if decisive else None
    while len(computations) < num_steps:
        if len(computations) == at:
            op, high = DECISIVE_OP, min(4, MAX_VALUE // value)
        else:
            op = rng.choice(EASY_OPS)
            # before the decisive step the value stays at most half the maximum, so that it can always double
            top = MAX_VALUE // 2 if at is not None and len(computations) < at else MAX_VALUE
            high = min(9, top - value) if op == "+" else min(9, value - CHAIN_LOW)
            if high < 2:  # no operand keeps the value in range this way: draw the operation again
                continue
        b = rng.randint(2, high)
        c = apply(value, op, b)
        asked, written = theme.ops[op]
        fresh = {"thing": rng.choice(THINGS), "rel": rng.choice(RELATIVES), "job": rng.choice(JOBS)}
        sentences.append(rng.choice(asked).format(b=b, **{**slots, **fresh}))
        steps.append(written.format(a=value, b=b, c=c, **slots))
        computations.append((value, op, b, c))
        value = c
    sentences.append(theme.question.format(**slots))
    return Problem(theme.name, " ".join(sentences), tuple(steps), tuple(computations))


def make_problems(
    n: int,
    steps: int | tuple[int, ...],
    seed: int | str,
    exclude: set | None = None,
    family: str = "mixed",
    start_high: int = CHAIN_START_HIGH,
    decisive_share: float | None = None,
) -> list[Problem]:
    """`n` distinct problems (by `Problem.key`) of `family` (`FAMILIES`), their `num_steps` cycling through `steps`;
    deterministic in `seed`, `steps`, `family` and the chain options. Problems whose key is in `exclude` are skipped
    (and not returned). Chains start at 20..`start_high`; `decisive_share` (chain families): each chain has its
    decisive step with this probability, instead of all (`chain`) or none (`chain-easy`)."""
    steps = (steps,) if isinstance(steps, int) else tuple(steps)
    if family not in FAMILIES:
        raise ValueError(f"family must be one of {FAMILIES}, got {family!r}")
    # the mixed family's stream is named as before families existed: its problems stay the same
    rng = random.Random(f"real-task/{seed}/{steps}" if family == "mixed" else f"real-task/{family}/{seed}/{steps}")
    seen = set(exclude or ())
    out: list[Problem] = []
    tries = 0
    while len(out) < n:
        tries += 1
        if tries > 100 * n + 1000:
            raise RuntimeError(f"could not draw {n} distinct problems with steps {steps}: the space is too small")
        num_steps = steps[len(out) % len(steps)]
        if family == "mixed":
            problem = make_problem(rng, num_steps)
        else:
            decisive = family == "chain" if decisive_share is None else rng.random() < decisive_share
            problem = make_chain_problem(rng, num_steps, decisive=decisive, start_high=start_high)
        if problem.key not in seen:
            seen.add(problem.key)
            out.append(problem)
    return out


SPLIT_ORDER = ("heldout", "heldout_longer", "train")


def make_splits(
    train_steps: tuple[int, ...] = (1, 2),
    longer_steps: tuple[int, ...] = (3,),
    n_train: int = 1000,
    n_heldout: int = 200,
    n_longer: int = 200,
    seed: int = 0,
    family: str = "mixed",
) -> dict[str, list[Problem]]:
    """`heldout` (at `train_steps`), `heldout_longer` (at `longer_steps`) and `train` (at `train_steps`), drawn in
    that order, each from its own stream, none sharing a problem (`Problem.key`) with another; of `family`."""
    if min(longer_steps) <= max(train_steps):
        raise ValueError(f"longer_steps {longer_steps} must all exceed train_steps {train_steps}")
    plan = {
        "heldout": (n_heldout, train_steps),
        "heldout_longer": (n_longer, longer_steps),
        "train": (n_train, train_steps),
    }
    splits, used = {}, set()
    for name in SPLIT_ORDER:
        n, steps = plan[name]
        splits[name] = make_problems(n, steps, seed=f"{seed}/{name}", exclude=used, family=family)
        used |= {p.key for p in splits[name]}
    return splits


def calibration_problems(num_steps: int, n: int, seed: int = CALIBRATION_SEED, family: str = "mixed") -> list[Problem]:
    """Problems for calibrating a difficulty before any method runs: fresh draws from the training distribution
    (their own stream; not a split, so they may coincide with a split's problem)."""
    return make_problems(n, num_steps, seed=f"calibration/{seed}", family=family)


def make_datasets(**kwargs) -> dict:
    """`datasets.Dataset`s: the splits of `make_splits(**kwargs)` (columns of `Problem.row`) and `chat`
    (`chat_dataset`)."""
    from datasets import Dataset

    out = {name: Dataset.from_list([p.row() for p in problems]) for name, problems in make_splits(**kwargs).items()}
    out["chat"] = chat_dataset()
    return out


def chat_dataset():
    """The non-math conversations as a prompt-completion `datasets.Dataset` (`prompt`: the user turn, `completion`:
    the assistant's answer, both conversations)."""
    from datasets import Dataset

    return Dataset.from_list(
        [
            {"prompt": [{"role": "user", "content": q}], "completion": [{"role": "assistant", "content": a}]}
            for q, a in CHAT
        ]
    )


# Handwritten general chat prompts with good answers: what a method keeps of the chat model is measured as the NLL of
# these answers under the trained model (none is arithmetic).
CHAT = (
    (
        "What is the capital of France?",
        "The capital of France is Paris. It is also the country's largest city and is known for landmarks such as "
        "the Eiffel Tower and the Louvre museum.",
    ),
    (
        "Give me three tips for sleeping better.",
        "Here are three tips for better sleep:\n1. Go to bed and wake up at the same time every day.\n2. Keep your "
        "bedroom dark, quiet and cool.\n3. Avoid screens and caffeine in the hour before bed.",
    ),
    (
        "Write a short poem about autumn.",
        "Golden leaves drift slowly down,\npainting paths in red and brown.\nThe air is crisp, the days grow short,"
        "\nand geese fly south in long cohorts.",
    ),
    (
        "How do I boil an egg?",
        "Place the egg in a pot and cover it with cold water. Bring the water to a boil, then lower the heat and "
        "let it simmer for about nine minutes for a hard-boiled egg. Cool the egg in cold water before peeling it.",
    ),
    (
        "How do you say 'good morning' in Spanish?",
        "In Spanish, 'good morning' is 'buenos días'.",
    ),
    (
        "What is photosynthesis?",
        "Photosynthesis is the process plants use to turn light into food. Using energy from sunlight, they combine "
        "water and carbon dioxide to make sugar, and they release oxygen as a by-product.",
    ),
    (
        "Can you suggest a name for a small coffee shop?",
        'Sure! Here are a few ideas: "The Daily Grind", "Bean There", "Corner Cup" or "Morning Ritual". '
        "Pick one that matches the feel of your shop.",
    ),
    (
        "Why is the sky blue?",
        "The sky looks blue because air molecules scatter sunlight, and they scatter short blue wavelengths much "
        "more than long red ones. This scattered blue light reaches our eyes from every direction of the sky.",
    ),
    (
        "Write a polite email asking my manager for a day off next Friday.",
        "Subject: Day off request for next Friday\n\nHi Sarah,\n\nI would like to ask for a day off next Friday. "
        "I will make sure my tasks are finished or covered before then.\n\nPlease let me know if that works.\n\n"
        "Thank you,\nAlex",
    ),
    (
        "What are the benefits of drinking water?",
        "Drinking enough water keeps your body working well. It helps control your temperature, supports "
        "digestion, keeps your skin healthy and helps you stay focused and energetic.",
    ),
    (
        "Who wrote 'Romeo and Juliet'?",
        "'Romeo and Juliet' was written by William Shakespeare. It is a tragedy about two young lovers from feuding "
        "families in Verona.",
    ),
    (
        "Give me a simple recipe for a salad.",
        "Try a simple green salad: wash and tear some lettuce, add sliced cucumber and tomatoes, and toss everything "
        "with olive oil, lemon juice, salt and pepper.",
    ),
    (
        "What is the difference between weather and climate?",
        "Weather is what the air is like at a given time and place, such as rain today. Climate is the usual "
        "pattern of weather in a region over many years.",
    ),
    (
        "How can I be more productive when working from home?",
        "Set up a dedicated workspace, keep regular working hours and plan your day with a short to-do list. Take "
        "short breaks, and turn off notifications you do not need while you focus.",
    ),
    (
        "Tell me a fun fact about octopuses.",
        "Octopuses have three hearts and blue blood. Two hearts pump blood to the gills, and the third pumps it to "
        "the rest of the body.",
    ),
    (
        "What should I pack for a weekend camping trip?",
        "Pack a tent, a sleeping bag and a sleeping pad, warm layers and a rain jacket, a flashlight, water, easy "
        "meals, a first aid kit and sunscreen.",
    ),
    (
        "Explain what a computer virus is.",
        "A computer virus is a harmful program that copies itself into other files or programs. It can spread "
        "between computers and may damage data, slow the system down or steal information.",
    ),
    (
        "Summarize the story of Cinderella in two sentences.",
        "Cinderella, mistreated by her stepmother and stepsisters, goes to the royal ball with help from her fairy "
        "godmother and wins the prince's heart. She flees at midnight, leaving a glass slipper behind, and the "
        "prince finds her by searching for the girl whose foot it fits.",
    ),
    (
        "What is a good way to start learning to play the guitar?",
        "Start by learning how to hold the guitar and tune it, then practice a few basic chords such as G, C and D. "
        "Play for a short time every day and learn simple songs that use those chords.",
    ),
    (
        "Is it better to study in the morning or at night?",
        "It depends on the person. Some people focus best in the morning when they are rested, while others work "
        "better at night. Try both and keep the time when you remember the most.",
    ),
)
