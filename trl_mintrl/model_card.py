"""Model cards that name the method, the base model, the recipe and the paper, in the output folder and in every
checkpoint.

TRL's `create_model_card` writes `README.md` to `output_dir` only (never into `checkpoint-N/`), names the base model
only when it is a Hub id, and knows nothing of recipes. `ModelCardMixin` keeps TRL's card (and so its metadata,
tags and citations) and adds a "Training recipe" section; `_save_checkpoint` copies the card into the checkpoint.
"""

from __future__ import annotations

import os
import shutil

from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from trl.trainer.utils import get_config_model_id

from ._version import __version__

CARD = "README.md"
_SECTION_BEFORE = "### Framework versions"


class ModelCardMixin:
    """Mix in before a TRL trainer class. `recipe` ({"path": ..., "command": ...}) is set by `trl-mintrl train`."""

    recipe: dict | None = None

    def create_model_card(self, model_name=None, dataset_name=None, tags=None):
        if model_name is None:  # as TRL's `_save_checkpoint` names it
            model_name = (self.args.hub_model_id or self.args.output_dir).rstrip("/").split("/")[-1]
        super().create_model_card(model_name=model_name, dataset_name=dataset_name, tags=tags)
        if not self.is_world_process_zero():
            return
        path = os.path.join(self.args.output_dir, CARD)
        with open(path, encoding="utf-8") as f:
            text = f.read()
        base_model = get_config_model_id(self.model.config)
        # TRL leaves the base model out of the card when it is a local folder; its template then links to "None"
        text = text.replace("[None](https://huggingface.co/None)", f"`{base_model}` (a local model)")
        if self.args.hub_model_id is None:  # the quick-start snippet then loads the saved folder
            text = text.replace('model="None"', f'model="{self.args.output_dir}"')
        section = self.recipe_section(base_model)
        head, marker, tail = text.partition(_SECTION_BEFORE)
        text = f"{head}{section}\n{marker}{tail}" if marker else f"{text}\n{section}"
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)

    def recipe_section(self, base_model: str) -> str:
        """Markdown naming the method, its paper, the base model and how the run was launched."""
        paper = self._paper.get("title")
        lines = [
            "### Training recipe",
            "",
            f"- Method: **{self._name}**" + (f" ({paper})" if paper else ""),
            f"- Base model: `{base_model}`",
            f"- Library: trl-mintrl {__version__}",
        ]
        if self.recipe is not None:
            if self.recipe.get("path"):
                lines.append(f"- Recipe: `{self.recipe['path']}`")
            lines += ["", "```bash", self.recipe["command"], "```"]
        return "\n".join(lines) + "\n"

    def _save_checkpoint(self, model, trial):
        super()._save_checkpoint(model, trial)  # TRL's GRPOTrainer writes the card to output_dir first
        source = os.path.join(self.args.output_dir, CARD)
        folder = os.path.join(self._get_output_dir(trial=trial), f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")
        if self.is_world_process_zero() and os.path.isfile(source) and os.path.isdir(folder):
            shutil.copyfile(source, os.path.join(folder, CARD))


def with_model_card(trainer_cls: type) -> type:
    """`trainer_cls` itself when it already carries `ModelCardMixin`, else a subclass of the same name that does."""
    if issubclass(trainer_cls, ModelCardMixin):
        return trainer_cls
    return type(trainer_cls.__name__, (ModelCardMixin, trainer_cls), {"__module__": trainer_cls.__module__})
