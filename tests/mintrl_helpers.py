"""MInTRL test helpers shared by the main suite and the real-vLLM suite: a reward whose control baseline is known,
a scripted judge, small configs, and a trainer that records each generation batch."""

from __future__ import annotations

from trl_mintrl import MInTRLConfig, MInTRLTrainer, cpu_training_fields
from trl_mintrl.judges import FunctionJudge

CORRECTION = "7+7=14\n\n"


def role_reward(completions, mintrl_intervened, completion_ids, **kwargs):
    """Intervened rollouts score 1; controls score by length, so the control baseline varies but is known."""
    return [1.0 if inter else (len(ids) % 4) / 4 for inter, ids in zip(mintrl_intervened, completion_ids)]


def revise_first_step_judge(calls: dict | None = None) -> FunctionJudge:
    """Revises the first chunk of every intervened rollout (step 0) with CORRECTION, keeps the rest; counts calls."""
    calls = {"review": 0, "correct": 0} if calls is None else calls

    def review(question, prefix, steps, reference):
        calls["review"] += 1
        return 0 if not prefix else None

    def correct(question, prefix, reference):
        calls["correct"] += 1
        return CORRECTION

    return FunctionJudge(review, correct)


def mintrl_fields(cpu_args: dict, **overrides) -> dict:
    """2 control + 2 intervened rollouts per prompt, small chunks, interventions on for the whole run."""
    args = {k: v for k, v in cpu_args.items() if k != "num_generations"}
    args.update(
        num_control_generations=2,
        num_intervened_generations=2,
        chunk_size=6,
        max_reviews=2,
        max_correction_tokens=8,
        max_completion_length=24,
        intervention_steps=100,
    )
    args.update(overrides)
    return args


def mintrl_args(cpu_args: dict, **overrides) -> MInTRLConfig:
    return MInTRLConfig(**mintrl_fields(cpu_args, **overrides))


# eight one-step prompts, the multi-process scripts' data
ONE_STEP_ROWS = [
    {"prompt": [{"role": "user", "content": f"Compute {a}+1 ="}], "solution": f"{a + 1}"} for a in range(8)
]


def multi_process_args(out_dir: str, **overrides) -> MInTRLConfig:
    """The multi-process scripts' CPU run: per-device batch 2, groups of 2 control + 2 intervened rollouts of 12
    tokens (so a group spans two processes), chunks of 4, 2 steps."""
    args = dict(output_dir=out_dir, **cpu_training_fields(),
                num_control_generations=2, num_intervened_generations=2, per_device_train_batch_size=2,
                max_completion_length=12, chunk_size=4, max_reviews=2, max_correction_tokens=4, max_steps=2,
                logging_steps=1, save_strategy="no", learning_rate=1e-3, disable_tqdm=True)  # fmt: skip
    args.update(overrides)
    return MInTRLConfig(**args)


def scripted_trainer(model, args: MInTRLConfig, train_dataset, trainer_class=None) -> MInTRLTrainer:
    """A trainer (`RecordingTrainer` unless given) with the scripted reward and judge of these tests."""
    return (trainer_class or RecordingTrainer)(
        model=model,
        reward_funcs=role_reward,
        args=args,
        train_dataset=train_dataset,
        judge=revise_first_step_judge(),
    )


class RecordingTrainer(MInTRLTrainer):
    """Keeps each generation batch's output and rewards for the assertions."""

    def _score_batch(self, output, batch):
        super()._score_batch(output, batch)
        self.records = getattr(self, "records", [])
        self.records.append({**output, "rewards": batch.rewards(self.reward_weights).clone()})
