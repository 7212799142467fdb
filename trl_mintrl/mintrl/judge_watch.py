"""The judge's watch during training: unusable answers and requests that got no answer are warned about apart
(`JudgeFailureWarning`), and a judge that stops answering altogether stops the run with a checkpoint or is warned
about again (`JudgeOutage`, `judge_outage_policy`)."""

from __future__ import annotations

import logging
import os

from transformers import TrainerCallback

from .config import MInTRLConfig
from .judge_factory import judge_correction_budget

logger = logging.getLogger(__name__)


class JudgeFailureWarning:
    """Warns when more than half of a step's reviews fail, since the judge then almost never intervenes, naming the
    cause it saw: requests that got no answer (a server down, a wrong URL, model name or key) or answers that came
    back unusable (a thinking chat template, too small a token budget). Once per run and cause."""

    def __init__(self, args: MInTRLConfig, enabled: bool = True):
        self.args = args
        self.enabled = enabled
        self.warned: set[str] = set()  # "unanswered", "unusable"

    def update(self, reviews: float, unusable: float, unanswered: float, last_error: str | None = None) -> None:
        """`reviews`: review requests made this step (all processes); `unusable`: reviews and corrections answered
        unusably; `unanswered`: requests that got no answer (`last_error`: why the latest did not)."""
        if not self.enabled or reviews <= 0 or unusable + unanswered <= reviews / 2:
            return
        cause = "unanswered" if unanswered >= unusable else "unusable"
        if cause in self.warned:
            return
        self.warned.add(cause)
        if cause == "unanswered":
            self._warn_unanswered(reviews, unanswered, last_error)
        else:
            self._warn_unusable(reviews, unusable)

    def _warn_unanswered(self, reviews: float, unanswered: float, last_error: str | None) -> None:
        args = self.args
        logger.warning(
            "MInTRL judge: %d judge requests got no answer this step (%d reviews asked); latest: %s. Failed reviews "
            "count as KEEP, so the judge does not intervene and the run trains as GRPO with a control baseline. "
            "Check that the judge server is up and that judge_base_url=%r, judge_model=%r and the key in $%s are "
            "right. Shown once per run; mintrl/judge_transport_failures counts them every step, and "
            "judge_outage_policy=%r acts after judge_outage_steps=%d steps in which every request fails.",
            int(unanswered),
            int(reviews),
            last_error or "see the judge's log lines",
            args.judge_base_url,
            args.judge_model,
            args.judge_api_key_env,
            args.judge_outage_policy,
            args.judge_outage_steps,
        )

    def _warn_unusable(self, reviews: float, failures: float) -> None:
        args = self.args
        if args.judge == "endpoint":
            fix = (
                "the endpoint renders its own chat template: turn thinking off on the server (vLLM/SGLang accept "
                "chat_template_kwargs per request) or raise judge_max_review_tokens / judge_max_correction_tokens"
            )
        else:
            fix = (
                f"judge_chat_template_kwargs={args.judge_chat_template_kwargs} (use {{'enable_thinking': False}} for "
                f"Qwen3-style templates), or raise judge_max_review_tokens={args.judge_max_review_tokens} / "
                f"judge_max_correction_tokens={judge_correction_budget(args)}"
            )
        logger.warning(
            "MInTRL judge: %d unusable answers in %d reviews this step (a failed review counts as KEEP, a failed "
            "correction keeps the chunk), so the judge rarely intervenes. Likely cause: the judge's answers are cut "
            "off by their token cap, e.g. a thinking chat template spending the budget inside <think>, or a review "
            "budget too small for the judge's explanation. Fix: %s. Shown once per run; mintrl/judge_parse_failures "
            "counts them every step.",
            int(failures),
            int(reviews),
            fix,
        )


class JudgeOutageError(RuntimeError):
    """Training stopped because the judge gave no answer for `judge_outage_steps` steps (`judge_outage_policy`)."""


def raise_if_judge_stopped(reason: str | None, checkpoint_folder: str) -> None:
    """After a MInTRL trainer's `train()`: raise `JudgeOutageError` when `judge_outage_policy="stop"` ended it
    (`reason`), naming the checkpoint the step it stopped at wrote, so that a script does not carry on as if training
    had finished."""
    if reason is not None:
        raise JudgeOutageError(f"{reason} Checkpoint: {os.path.abspath(checkpoint_folder)}")


class JudgeOutage(TrainerCallback):
    """Counts the consecutive training batches in which every judge request got no answer, and acts after
    `judge_outage_steps` of them: `"stop"` has the Trainer save a checkpoint and stop after the current optimizer
    step (the trainer then raises `JudgeOutageError`), `"continue"` warns again every `judge_outage_steps` batches.
    `update` is fed with counts summed over all processes, so every process takes the same decision (and saves the
    same checkpoint, a collective under DeepSpeed). Logs on the main process only."""

    def __init__(self, args: MInTRLConfig, main_process: bool = True):
        self.args = args
        self.main_process = main_process
        self.failed_steps = 0  # consecutive batches without an answered request (saved with checkpoints)
        self.stop_reason: str | None = None  # set when "stop" decides: training stops after this optimizer step

    def update(self, sent: float, unanswered: float, last_error: str | None) -> None:
        """One training batch's judge requests over all processes: `sent`, and `unanswered` of them (`last_error`:
        why the latest did not get an answer)."""
        if sent == 0:  # the judge was not called (e.g. every chunk ended at once): no news either way
            return
        if unanswered < sent:
            self.failed_steps = 0
            return
        self.failed_steps += 1
        args, steps = self.args, self.args.judge_outage_steps
        latest = last_error or "see the judge's log lines"
        if args.judge_outage_policy == "stop" and self.failed_steps >= steps:
            server = (  # a judge object passed to the trainer names no server in the config
                f"the judge server (judge_base_url={args.judge_base_url!r}, judge_model={args.judge_model!r})"
                if args.judge_base_url is not None
                else "the judge's server"
            )
            self.stop_reason = (
                f"MInTRL judge: no judge request was answered for {self.failed_steps} training steps in a row "
                f"(latest: {latest}), so training stopped with a checkpoint (judge_outage_policy='stop') rather than "
                f"go on as GRPO without the judge it was configured with. Fix {server}, then resume from the "
                "checkpoint (resume_from_checkpoint=True); to train on through an outage, set "
                "judge_outage_policy='continue'."
            )
            if self.main_process:
                logger.error("%s", self.stop_reason)
        elif args.judge_outage_policy == "continue" and self.failed_steps % steps == 0 and self.main_process:
            logger.warning(
                "MInTRL judge: no judge request was answered for %d training steps in a row (latest: %s). The run "
                "goes on as GRPO with a control baseline, without the judge it was configured with, because "
                "judge_outage_policy='continue'; repeated every %d such steps. Check the server at judge_base_url=%r.",
                self.failed_steps,
                latest,
                steps,
                args.judge_base_url,
            )

    def on_train_begin(self, args, state, control, **kwargs):
        self.stop_reason = None  # a new `train()` call (e.g. a resume after the judge came back) decides afresh

    def on_step_end(self, args, state, control, **kwargs):
        if self.stop_reason is not None:
            control.should_save = True
            control.should_training_stop = True
        return control
