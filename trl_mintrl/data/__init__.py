"""Paper training sets and standard benchmarks as `prompt` + `solution` (math) or `prompt` + `tests` (code).

`LOADERS[name](path_or_name=None, split=None, prompt_template=None, limit=None, **load_kwargs)` returns a
`datasets.Dataset`; `path_or_name=None` means the Hub dataset named in `LOADERS[name].source.hub`, a local path
is loaded and converted the same way (`fixture_path(name)` is a shipped few-row sample). See `loaders.py`.
`load_dataset_by_name("aime24")`, `("aime24=/data/aime.jsonl")` or `("/data/ready.jsonl")` pick the loader.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from ..text import check_template
from .loaders import (
    CODE_TEMPLATE,
    MATH_TEMPLATE,
    Source,
    convert_deepcoder,
    convert_humanevalplus,
    convert_livecodebench,
    convert_math,
    convert_mbppplus,
    fixture_path,
    load_raw,
)

__all__ = [
    "CODE_TEMPLATE",
    "LOADERS",
    "MATH_TEMPLATE",
    "PROMPT_TEMPLATE_FIELDS",
    "dataset_task",
    "fixture_path",
    "load_dataset_by_name",
    "load_prepared",
    "resolve_dataset",
]

PROMPT_TEMPLATE_FIELDS = {"question"}
"""The placeholder of a loader's `prompt_template` (see `trl_mintrl.text` for the convention)."""

# name -> (where it lives, converter, task, what it is)
_CATALOGUE = {
    "mintrl_math": (
        Source("nvidia/AceReason-Math", "train"),
        convert_math,
        "math",
        "MInTRL math training set (AceReason-Nemotron style: problem, answer)",
    ),
    "mintrl_code": (
        Source("agentica-org/DeepCoder-Preview-Dataset", "train", ("primeintellect", "taco", "lcbv5")),
        convert_deepcoder,
        "code",
        "MInTRL code training set (DeepCoder-Preview: problem, tests, solutions, starter_code, metadata)",
    ),
    "sort_math": (
        Source("open-r1/OpenR1-Math-220k", "train", ("default",)),
        convert_math,
        "math",
        "SORT training set (OpenR1-Math-220k: problem, worked solution, answer); `solution` is the reference",
    ),
    "aime24": (Source("HuggingFaceH4/aime_2024", "train"), convert_math, "math", "AIME 2024 (30 problems)"),
    "aime25": (Source("math-ai/aime25", "test"), convert_math, "math", "AIME 2025 (30 problems)"),
    "aime26": (Source("MathArena/aime_2026", "train"), convert_math, "math", "AIME 2026 (MathArena schema)"),
    "hmmt25": (Source("MathArena/hmmt_feb_2025", "train"), convert_math, "math", "HMMT February 2025 (MathArena)"),
    "math500": (Source("HuggingFaceH4/MATH-500", "test"), convert_math, "math", "MATH-500"),
    "amc23": (Source("math-ai/amc23", "test"), convert_math, "math", "AMC 2023 (40 problems)"),
    "olympiadbench": (Source("math-ai/olympiadbench", "test"), convert_math, "math", "OlympiadBench (math, English)"),
    "minerva": (Source("math-ai/minervamath", "test"), convert_math, "math", "Minerva Math (272 problems)"),
    "livecodebench": (
        Source("livecodebench/code_generation_lite", "train", data_files="test*.jsonl"),
        convert_livecodebench,
        "code",
        "LiveCodeBench code generation (all releases; pick files with data_files=)",
    ),
    "humanevalplus": (Source("evalplus/humanevalplus", "test"), convert_humanevalplus, "code", "HumanEval+"),
    "mbppplus": (Source("evalplus/mbppplus", "test"), convert_mbppplus, "code", "MBPP+"),
}


def _make_loader(name: str, source: Source, convert: Callable, task: str, description: str) -> Callable:
    def loader(
        path_or_name: str | None = None,
        split: str | None = None,
        prompt_template: str | None = None,
        limit: int | None = None,
        **load_kwargs,
    ):
        template = prompt_template or (MATH_TEMPLATE if task == "math" else CODE_TEMPLATE)
        check_template("prompt_template", template, PROMPT_TEMPLATE_FIELDS)
        _check_limit(limit)
        raw = load_raw(source, path_or_name, split, **load_kwargs)
        if limit is not None:
            raw = raw.select(range(min(limit, len(raw))))
        return convert(raw, template, name)

    loader.__name__ = loader.__qualname__ = f"load_{name}"
    loader.__doc__ = f"{description}. Default: Hub dataset {source.hub!r}, split {source.split!r}."
    loader.task, loader.source = task, source
    return loader


def _check_limit(limit) -> None:
    if limit is not None and (not isinstance(limit, int) or limit < 1):
        raise ValueError(f"limit must be a positive integer or None, got {limit!r}")


def load_prepared(
    path_or_name: str | None = None,
    split: str | None = None,
    prompt_template: str | None = None,
    limit: int | None = None,
    **load_kwargs,
):
    """A dataset already in our columns (`prompt` plus `solution` or `tests`), loaded as is."""
    if path_or_name is None:
        raise ValueError("the 'prepared' loader needs a path or Hub name of a dataset with our columns")
    if prompt_template is not None:
        raise ValueError("prompt_template does not apply to a prepared dataset: its prompts are already written")
    _check_limit(limit)
    dataset = load_raw(Source(path_or_name, "train"), path_or_name, split, **load_kwargs)
    dataset_task(dataset)
    return dataset.select(range(min(limit, len(dataset)))) if limit is not None else dataset


load_prepared.task = None

LOADERS: dict[str, Callable] = {name: _make_loader(name, *entry) for name, entry in _CATALOGUE.items()}
LOADERS["prepared"] = load_prepared


def dataset_task(dataset) -> str:
    """ "code" for a dataset with `tests`, "math" for one with `solution`: which reward scores it."""
    columns = set(dataset.column_names)
    if "prompt" in columns and "tests" in columns:
        return "code"
    if "prompt" in columns and "solution" in columns:
        return "math"
    raise ValueError(
        f"dataset has columns {sorted(columns)}: expected `prompt` plus `solution` (math) or `tests` (code); "
        f"convert it with one of the loaders ({', '.join(n for n in LOADERS if n != 'prepared')}): "
        "`--dataset_loader NAME` (recipe key `dataset_loader`) for `trl-mintrl train`, `--dataset NAME=PATH` for "
        "`trl-mintrl eval`"
    )


def resolve_dataset(spec: str) -> tuple[str, Callable, str | None]:
    """`"NAME"` (Hub default), `"NAME=PATH_OR_HUB_NAME"` or `"PATH"` (already in our columns) -> (benchmark name,
    loader, path). Checks names and paths without loading anything."""
    name, sep, path = spec.partition("=")
    if sep:
        if name not in LOADERS:
            raise ValueError(f"unknown dataset loader {name!r} in {spec!r}; known: {', '.join(LOADERS)}")
        return name, LOADERS[name], path
    if spec in LOADERS and spec != "prepared":
        return spec, LOADERS[spec], None
    if os.path.exists(spec):
        return Path(spec).stem, load_prepared, spec
    raise ValueError(
        f"unknown dataset {spec!r}: use a loader name ({', '.join(n for n in LOADERS if n != 'prepared')}), "
        "NAME=PATH to convert a local copy, or the path of a file already in our columns"
    )


def load_dataset_by_name(
    name_or_path: str,
    split: str | None = None,
    prompt_template: str | None = None,
    limit: int | None = None,
    **load_kwargs,
):
    """Load by spec (see `resolve_dataset`): `"aime24"`, `"aime24=/data/aime24.jsonl"`, `"/data/ready.jsonl"`."""
    _, loader, path = resolve_dataset(name_or_path)
    return loader(path, split=split, prompt_template=prompt_template, limit=limit, **load_kwargs)
