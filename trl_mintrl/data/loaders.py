"""Loaders that turn the papers' training sets and the standard benchmarks into the columns our trainers and
rewards read:

- `prompt`: chat messages (`[{"role": "user", "content": ...}]`) built from a configurable template;
- math: `solution` (what `math_reward` checks against: a worked solution ending in `\\boxed{answer}`, or just
  `\\boxed{answer}`) and `answer` (the bare gold answer);
- code: `tests` (a JSON string `code_reward` reads) and `solution` (a reference program, "" if none).

Every loader has the same signature, `loader(path_or_name=None, split=None, prompt_template=None, limit=None,
**load_kwargs)`:
- `path_or_name=None` loads the dataset from the Hugging Face Hub under its usual name (`loader.hub`);
- a Hub name loads that dataset (a mirror or a filtered copy with the same columns);
- a local file (.json/.jsonl/.parquet/.csv) or folder is loaded with `datasets` and converted the same way. The
  package ships a few-row fixture per loader in the original schema: `fixture_path(name)`.
`split` defaults to the Hub dataset's usual split, and to "train" (datasets' name for unsplit data) for local
files. `limit` keeps the first rows. `load_kwargs` go to `datasets.load_dataset` (e.g. `name=` for a config).
"""

from __future__ import annotations

import base64
import io
import json
import os
import pickle
import re
import zlib
from dataclasses import dataclass
from pathlib import Path

from ..text import fill_template, last_boxed

MATH_TEMPLATE = "{question}\n\nPlease reason step by step, and put your final answer within \\boxed{}."
CODE_TEMPLATE = "{question}\n\nWrite your solution in Python and put the complete program in one ```python code block."
FIXTURES = Path(__file__).parent / "fixtures"

_LOCAL_FORMATS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv"}
_QUESTION_COLUMNS = ("problem", "question")
_ANSWER_COLUMNS = ("answer", "final_answer")
_DEF = re.compile(r"^\s*def\s+([A-Za-z_]\w*)\s*\(", re.MULTILINE)


@dataclass(frozen=True)
class Source:
    """Where a dataset lives on the Hub: repository, usual split, and configs (several are concatenated)."""

    hub: str
    split: str
    configs: tuple[str | None, ...] = (None,)
    data_files: str | None = None


def _features(*text_columns: str):
    """Output schema, given explicitly: `map` would otherwise keep an input column's type for an output column of
    the same name (an integer `answer` column would turn "27" back into 27)."""
    from datasets import Features, List, Value

    message = {"role": Value("string"), "content": Value("string")}
    return Features({"prompt": List(message), **{name: Value("string") for name in text_columns}})


def fixture_path(name: str) -> Path:
    """The shipped few-row fixture of loader `name` (original schema), for tests and offline demos."""
    path = FIXTURES / f"{name}.jsonl"
    if not path.exists():
        raise ValueError(
            f"no fixture for {name!r}; fixtures exist for: {sorted(p.stem for p in FIXTURES.glob('*.jsonl'))}"
        )
    return path


def load_raw(source: Source, path_or_name: str | None, split: str | None, **load_kwargs):
    """The dataset as stored: from a local file/folder, or from the Hub (default repository when None)."""
    import datasets

    if path_or_name is not None and os.path.exists(path_or_name):
        if os.path.isdir(path_or_name):
            return datasets.load_dataset(path_or_name, split=split or "train", **load_kwargs)
        fmt = _LOCAL_FORMATS.get(Path(path_or_name).suffix)
        if fmt is None:
            raise ValueError(f"unsupported file type {path_or_name!r}: use one of {sorted(_LOCAL_FORMATS)}")
        return datasets.load_dataset(fmt, data_files=str(path_or_name), split=split or "train", **load_kwargs)
    hub = path_or_name or source.hub
    configs = (load_kwargs.pop("name"),) if "name" in load_kwargs else source.configs
    if source.data_files and hub == source.hub:
        load_kwargs.setdefault("data_files", source.data_files)
    parts = [datasets.load_dataset(hub, config, split=split or source.split, **load_kwargs) for config in configs]
    return parts[0] if len(parts) == 1 else datasets.concatenate_datasets(parts)


def chat_prompt(template: str, question: str) -> list[dict]:
    """The user message: the template's `{question}` filled (see `trl_mintrl.text`; `\\boxed{}` stays as it is)."""
    return [{"role": "user", "content": fill_template(template, {"question": question.strip()})}]


def pick_column(columns, candidates: tuple[str, ...], dataset: str, role: str) -> str:
    """The first candidate column present, or a clear error naming what was expected and what is there."""
    for name in candidates:
        if name in columns:
            return name
    raise ValueError(f"{dataset}: no {role} column (expected one of {list(candidates)}); columns: {sorted(columns)}")


def require_columns(raw, names: tuple[str, ...], dataset: str) -> list[str]:
    """The dataset's columns, after checking that each of `names` is one (`pick_column`'s error otherwise)."""
    columns = raw.column_names
    for needed in names:
        pick_column(columns, (needed,), dataset, needed)
    return columns


# ---------------------------------------------------------------------------------------------------------------
# Math


def answer_text(value) -> str:
    """A gold answer as text: 27.0 -> "27", ["1", "2"] -> "1, 2", "$x$" -> "x"."""
    if isinstance(value, list):
        return ", ".join(answer_text(v) for v in value)
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    text = str(value).strip()
    if len(text) > 1 and text.startswith("$") and text.endswith("$"):
        text = text.strip("$").strip()
    return text


def math_solution(worked: str | None, answer: str) -> str:
    """What `math_reward` checks against: the worked solution when there is one, ending in `\\boxed{answer}` (added
    if its last box holds something else), else the boxed answer alone."""
    if not worked:
        return f"\\boxed{{{answer}}}"
    if last_boxed(worked) == answer:
        return worked
    return f"{worked.rstrip()}\n\nThe final answer is $\\boxed{{{answer}}}$."


def convert_math(raw, template: str, dataset: str):
    columns = raw.column_names
    question = pick_column(columns, _QUESTION_COLUMNS, dataset, "question")
    answer = pick_column(columns, _ANSWER_COLUMNS, dataset, "answer")
    worked = "solution" if "solution" in columns else None

    def convert(row):
        gold = answer_text(row[answer])
        text = row[worked] if worked else None
        text = "\n\n".join(text) if isinstance(text, list) else text  # OlympiadBench: a list of solutions
        return {"prompt": chat_prompt(template, row[question]), "solution": math_solution(text, gold), "answer": gold}

    raw = raw.filter(lambda row: answer_text(row[answer]) != "")  # a row without a gold answer cannot be scored
    return raw.map(convert, remove_columns=columns, features=_features("solution", "answer"))


# ---------------------------------------------------------------------------------------------------------------
# Code


def code_question(problem: str, starter_code: str | None, fn_name: str | None) -> str:
    """The problem plus how the answer is run: starter code to complete, a function to define, or stdin/stdout."""
    if starter_code and starter_code.strip():
        return f"{problem.strip()}\n\nUse this starter code:\n```python\n{starter_code.rstrip()}\n```"
    if fn_name:
        return f"{problem.strip()}\n\nDefine a function `{fn_name}`; the tests call it and check what it returns."
    return f"{problem.strip()}\n\nRead the input from standard input and write the answer to standard output."


def with_fn_name(tests: list[dict], fn_name: str | None) -> list[dict]:
    """Function-call cases that do not name their function get the row's function name."""
    functional = ("functional", "function_call")
    return [
        {**case, "fn_name": fn_name} if (case.get("testtype") or case.get("type")) in functional else case
        for case in tests
    ]


def row_fn_name(tests, metadata, starter_code) -> str | None:
    """The function the tests call: from the tests, the row's metadata (`func_name`), or the starter code."""
    if isinstance(tests, dict) and tests.get("fn_name"):
        return tests["fn_name"]
    if isinstance(tests, list):
        for case in tests:
            name = case.get("fn_name") or (case.get("metadata") or {}).get("func_name")
            if name:
                return name
    meta = json.loads(metadata) if isinstance(metadata, str) and metadata.strip() else (metadata or {})
    if isinstance(meta, dict) and meta.get("func_name"):
        return meta["func_name"]
    match = _DEF.search(starter_code or "")
    return match.group(1) if match else None


def convert_deepcoder(raw, template: str, dataset: str):
    columns = require_columns(raw, ("problem", "tests"), dataset)

    def convert(row):
        tests = json.loads(row["tests"]) if isinstance(row["tests"], str) else row["tests"]
        starter = row.get("starter_code") or ""
        fn_name = row_fn_name(tests, row.get("metadata"), starter)
        if isinstance(tests, list):
            tests = with_fn_name(tests, fn_name)
        solutions = row.get("solutions") or []
        return {
            "prompt": chat_prompt(template, code_question(row["problem"], starter, fn_name)),
            "tests": json.dumps(tests),
            "solution": solutions[0] if solutions else "",
        }

    return raw.map(convert, remove_columns=columns, features=_features("tests", "solution"))


class _StringsOnly(pickle.Unpickler):
    """LiveCodeBench pickles a plain string; refuse anything that would construct objects."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}: LiveCodeBench tests are plain strings")


def lcb_private_tests(encoded: str) -> list[dict]:
    """LiveCodeBench's private tests: JSON, or base64(zlib(pickle(JSON string))) in `code_generation_lite`."""
    if not encoded:
        return []
    try:
        return json.loads(encoded)
    except json.JSONDecodeError:
        text = _StringsOnly(io.BytesIO(zlib.decompress(base64.b64decode(encoded)))).load()
        return json.loads(text)


def convert_livecodebench(raw, template: str, dataset: str):
    columns = require_columns(raw, ("question_content", "public_test_cases"), dataset)

    def convert(row):
        tests = json.loads(row["public_test_cases"]) + lcb_private_tests(row.get("private_test_cases") or "")
        starter = row.get("starter_code") or ""
        fn_name = row_fn_name(tests, row.get("metadata"), starter)
        return {
            "prompt": chat_prompt(template, code_question(row["question_content"], starter, fn_name)),
            "tests": json.dumps(with_fn_name(tests, fn_name)),
            "solution": "",
        }

    return raw.map(convert, remove_columns=columns, features=_features("tests", "solution"))


def convert_humanevalplus(raw, template: str, dataset: str):
    columns = require_columns(raw, ("prompt", "test", "entry_point"), dataset)

    def convert(row):
        test = row["test"]
        if not re.search(r"^check\(", test, re.MULTILINE):
            test = f"{test.rstrip()}\n\ncheck({row['entry_point']})\n"
        question = f"Complete the following Python function.\n\n```python\n{row['prompt'].rstrip()}\n```"
        return {
            "prompt": chat_prompt(template, question),
            "tests": json.dumps({"script": test}),
            "solution": row["prompt"] + (row.get("canonical_solution") or ""),
        }

    return raw.map(convert, remove_columns=columns, features=_features("tests", "solution"))


def convert_mbppplus(raw, template: str, dataset: str):
    columns = require_columns(raw, ("prompt", "test", "test_list"), dataset)

    def convert(row):
        imports = "\n".join(row.get("test_imports") or [])
        example = row["test_list"][0] if row["test_list"] else ""
        question = f"{row['prompt'].strip()}\n\nYour code should pass this test:\n```python\n{example}\n```"
        return {
            "prompt": chat_prompt(template, question),
            "tests": json.dumps({"script": f"{imports}\n{row['test']}"}),
            "solution": row.get("code") or "",
        }

    return raw.map(convert, remove_columns=columns, features=_features("tests", "solution"))
