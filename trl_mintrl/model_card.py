"""Model cards that name the method, the base model, the recipe and the paper, in the output folder and in every
checkpoint.

TRL's `create_model_card` writes `README.md` to `output_dir` only (never into `checkpoint-N/`), names the base model
only when it is a Hub id, and knows nothing of recipes. Every trl-mintrl trainer (`trainer_base.TrainerExtras`) keeps
TRL's card (and so its metadata, tags and citations), adds a "Training recipe" section (`add_recipe_section`) and
copies the card into each checkpoint (`copy_card`).
"""

from __future__ import annotations

import os
import shutil

from ._version import __version__

CARD = "README.md"
_SECTION_BEFORE = "### Framework versions"


def add_recipe_section(path: str, base_model: str, output_dir: str, hub_model_id: str | None, section: str) -> None:
    """Rewrite TRL's card at `path`: the base model named even when it is a local folder, the quick-start snippet
    loading the saved folder when nothing goes to the Hub, and `section` before its framework versions."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    # TRL leaves the base model out of the card when it is a local folder; its template then links to "None"
    text = text.replace("[None](https://huggingface.co/None)", f"`{base_model}` (a local model)")
    if hub_model_id is None:  # the quick-start snippet then loads the saved folder
        text = text.replace('model="None"', f'model="{output_dir}"')
    head, marker, tail = text.partition(_SECTION_BEFORE)
    text = f"{head}{section}\n{marker}{tail}" if marker else f"{text}\n{section}"
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def recipe_section(method: str, paper: dict, base_model: str, recipe: dict | None) -> str:
    """Markdown naming the method, its paper, the base model and how the run was launched (`recipe`: {"path": ...,
    "command": ...}, as `trl-mintrl train` sets it)."""
    title = paper.get("title")
    lines = [
        "### Training recipe",
        "",
        f"- Method: **{method}**" + (f" ({title})" if title else ""),
        f"- Base model: `{base_model}`",
        f"- Library: trl-mintrl {__version__}",
    ]
    if recipe is not None:
        if recipe.get("path"):
            lines.append(f"- Recipe: `{recipe['path']}`")
        lines += ["", "```bash", recipe["command"], "```"]
    return "\n".join(lines) + "\n"


def copy_card(output_dir: str, checkpoint_folder: str) -> None:
    """The card TRL wrote to `output_dir`, copied into a checkpoint folder (when both exist)."""
    source = os.path.join(output_dir, CARD)
    if os.path.isfile(source) and os.path.isdir(checkpoint_folder):
        shutil.copyfile(source, os.path.join(checkpoint_folder, CARD))
