"""The documentation: config docstrings document every field (TRL's idiom); the site builds with
`mkdocs build --strict` (warnings are errors: broken links, docstrings that do not match signatures), and the built
pages open in a real headless browser (Chromium): the index and the API reference render their content, the API
reference has a parameter row for every config field, and every internal link and anchor on them resolves."""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest
from conftest import missing_extra
from trl import GRPOConfig

from trl_mintrl import MInTRLConfig, SORTConfig

REPO = Path(__file__).resolve().parent.parent
CONFIGS = [MInTRLConfig, SORTConfig]

# The quick start installs `.[test]`: the docs toolchain (`.[docs]`) and Chromium (Debian's `chromium`) are extra;
# the tests that need them are marked `docs` (conftest.missing_extra: skipped without them, failed in CI's extras step).
MKDOCS = shutil.which("mkdocs", path=str(Path(sys.executable).parent))
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def own_fields(config: type) -> set[str]:
    """Fields a config adds to GRPOConfig (not the inherited ones it only gives new defaults)."""
    inherited = {f.name for f in dataclasses.fields(GRPOConfig)}
    return {f.name for f in dataclasses.fields(config)} - inherited


def documented_parameters(config: type) -> list[str]:
    """Names of the entries of the docstring's `Parameters:` section, in TRL's idiom: `    name (`type`, ...):`."""
    doc = inspect.getdoc(config)
    assert "\nParameters:\n" in doc, f"{config.__name__} has no Parameters: section"
    section = doc.split("\nParameters:\n", 1)[1]
    section = re.split(r"\n(?=\S)", section, maxsplit=1)[0]  # up to the next unindented line
    return re.findall(r"^    (\w+) \(`", section, flags=re.M)


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.__name__)
def test_config_docstring_documents_every_field_once(config):
    documented = documented_parameters(config)
    duplicates = {name for name in documented if documented.count(name) > 1}
    assert not duplicates, f"{config.__name__}: documented twice: {sorted(duplicates)}"
    missing = own_fields(config) - set(documented)
    assert not missing, f"{config.__name__}: fields missing from the docstring's Parameters: {sorted(missing)}"
    all_fields = {f.name for f in dataclasses.fields(config)}
    stale = set(documented) - all_fields
    assert not stale, f"{config.__name__}: Parameters entries that are not fields: {sorted(stale)}"
    # inherited fields the config gives new defaults are named in the docstring too (entry or text)
    redefaulted = set(config.__annotations__) - own_fields(config)
    unnamed = {n for n in redefaulted if n not in documented and f"`{n}" not in inspect.getdoc(config)}
    assert not unnamed, f"{config.__name__}: new defaults of {sorted(unnamed)} are not mentioned in its docstring"


@pytest.mark.parametrize(
    "page", ["README.md", *sorted(p.relative_to(REPO).as_posix() for p in (REPO / "docs").glob("*.md"))]
)
def test_python_snippets_compile(page):
    """Every ```python block of the README and the docs pages is valid Python (copy-pasted snippets must parse)."""
    blocks = re.findall(r"^```python\n(.*?)^```", (REPO / page).read_text(), flags=re.M | re.S)
    for i, block in enumerate(blocks):
        compile(block, f"{page}, python block {i + 1}", "exec")


def test_readme_links_point_at_files_in_the_repository():
    """The README's relative links (docs pages, plots) name files that exist: it is read on GitHub, not built."""
    prose = re.sub(r"^```.*?^```|`[^`\n]*`", "", (REPO / "README.md").read_text(), flags=re.M | re.S)  # no code
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", prose)
    relative = [t for t in targets if not urlparse(t).scheme]
    missing = [t for t in relative if not (REPO / t).exists()]
    assert not missing, f"README.md links to missing files: {missing}"


class _Links(HTMLParser):
    def __init__(self):
        super().__init__()
        self.hrefs, self.ids = [], set()

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if attrs.get("id"):
            self.ids.add(attrs["id"])
        if tag == "a" and attrs.get("href"):
            self.hrefs.append(attrs["href"])


def _parse(html: str) -> _Links:
    links = _Links()
    links.feed(html)
    return links


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    if MKDOCS is None:
        missing_extra('mkdocs is not installed: pip install -e ".[docs]"')
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    result = subprocess.run(
        [MKDOCS, "build", "--strict", "--site-dir", str(out)], cwd=REPO, env=env, capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    return out


def _browser_dom(page: Path) -> str:
    """The page as Chromium renders it (after its scripts ran), as HTML."""
    if CHROMIUM is None:
        missing_extra("Chromium is not installed: apt-get install chromium")
    result = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom", page.as_uri()],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0 and "<body" in result.stdout, result.stderr[-2000:]
    return result.stdout


def _resolves(page: Path, page_ids: set[str], href: str) -> bool:
    """An internal link resolves: its file exists in the built site and so does the element its #anchor names."""
    parsed = urlparse(href)
    target = (page.parent / unquote(parsed.path)).resolve() if parsed.path else page
    if target.is_dir():
        target = target / "index.html"
    if not target.is_file():
        return False
    return not parsed.fragment or parsed.fragment in (page_ids if target == page else _parse(target.read_text()).ids)


@pytest.mark.slow
@pytest.mark.docs
@pytest.mark.parametrize(
    "page, must_show",
    [
        ("index.html", ["trl-mintrl", "MInTRLTrainer", "SORTTrainer"]),
        ("api/index.html", ["MInTRLConfig", "num_control_generations", "SORTConfig", "repair_batch_size",
                            "advantage_regression_loss", "FunctionJudge", "pass_at_k"]),
    ],
)  # fmt: skip
def test_pages_render_in_a_browser_with_working_internal_links(site, page, must_show):
    path = site / page
    dom = _browser_dom(path)
    text = re.sub(r"<[^>]+>", " ", dom)
    for phrase in must_show:
        assert phrase in text, f"{page} does not show {phrase!r}"
    links = _parse(dom)
    internal = [h for h in links.hrefs if not urlparse(h).scheme and not h.startswith(("mailto:", "javascript:"))]
    assert internal, "no internal links found"
    broken = [href for href in internal if not _resolves(path, links.ids, href)]
    assert not broken, f"{page}: broken internal links {broken}"


@pytest.mark.slow
@pytest.mark.docs
def test_api_reference_has_a_parameter_row_for_every_config_field(site):
    """The docstrings reach the rendered reference as parameter tables (the signature alone would list the names)."""
    dom = _browser_dom(site / "api" / "index.html")
    for config in CONFIGS:
        heading = f'id="{config.__module__}.{config.__name__}"'
        assert heading in dom, f"API reference has no section for {config.__name__}"
        section = dom.split(heading, 1)[1].split('class="doc doc-object doc-class"', 1)[0]  # up to the next class
        rows = set(re.findall(r'<tr class="doc-section-item">\s*<td>\s*<code>(\w+)</code>', section))
        missing = own_fields(config) - rows
        assert not missing, f"API reference: no parameter row for {config.__name__} fields {sorted(missing)}"


def test_readme_says_what_the_python_quick_start_needs_on_cpu(tmp_path):
    """The fields the README tells CPU users to add make a config construct here; without them, on a machine with
    no GPU, TRL's bf16 default stops it (the error the README quotes)."""
    import torch

    readme = " ".join((REPO / "README.md").read_text().split())
    added = re.search(r"On a machine without a GPU, add `([^`]+)` to either config", readme).group(1)
    fields = eval(f"dict({added})")  # noqa: S307 - the README's own text
    assert fields == {"use_cpu": True, "bf16": False}
    group = {MInTRLConfig: dict(num_control_generations=4, num_intervened_generations=4), SORTConfig: {}}
    for config in CONFIGS:
        args = config(str(tmp_path), num_generations=8, **group[config], **fields)
        assert args.device.type == "cpu" and not args.bf16
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="Your setup doesn't support bf16/gpu"):
            SORTConfig(str(tmp_path), num_generations=8)
        assert "Your setup doesn't support bf16/gpu" in readme


README_MAX_LINES = 250  # the front page: install, quick starts, a short Results section; the tables are in the docs


def test_readme_is_at_most_250_lines():
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines (at most {README_MAX_LINES})"


def _summary_blocks() -> dict[str, tuple[str, str, object, str]]:
    """Every script-written block of docs/benchmarks.md: name -> (start marker, end marker, the script's block
    function, the committed JSON it reads)."""
    from benchmarks.lib.readme import markers
    from benchmarks.studies import beyond, cost, cost_async, learned_judge, learning, learning_tools, references

    tools = cost.COST_FILES["tools-in-band"]
    return {
        "learning": (learning.README_START, learning.README_END, learning.readme_block, "learning.json"),
        "cost": (cost.README_START, cost.README_END, cost.readme_block, "cost.json"),
        "cost-rollout": (cost.ROLLOUT_START, cost.ROLLOUT_END, cost.rollout_readme_block, "cost_rollout.json"),
        "cost-async": (cost_async.README_START, cost_async.README_END, cost_async.readme_block, "cost_async.json"),
        "beyond": (beyond.README_START, beyond.README_END, beyond.readme_block, "beyond.json"),
        "learned-judge": (
            learned_judge.README_START, learned_judge.README_END, learned_judge.readme_block, "learned_judge.json"
        ),
        "references": (references.README_START, references.README_END, references.readme_block, "references.json"),
        "learning-tools": (
            learning_tools.README_START, learning_tools.README_END, learning_tools.readme_block, "learning_tools.json"
        ),
        "cost-tools": (
            *markers("-m benchmarks.studies.cost --tools in-band", f"{tools}-results"), cost.readme_block, f"{tools}.json"
        ),
    }  # fmt: skip


SUMMARY_BLOCKS = ["learning", "cost", "cost-rollout", "cost-async", "beyond", "learned-judge", "references",
                  "learning-tools", "cost-tools"]  # fmt: skip


@pytest.mark.parametrize("name", SUMMARY_BLOCKS)
def test_summary_block_lives_in_docs_benchmarks_and_is_what_its_script_writes(name):
    """The scripts' `--replot JSON --readme docs/benchmarks.md` rewrite their block there (the README holds none):
    each block's markers are in docs/benchmarks.md once, and the text between them is what the script writes from
    the committed JSON (the marker line says so)."""
    start, end, block, json_name = _summary_blocks()[name]
    assert "--readme docs/benchmarks.md`" in start
    page = (REPO / "docs" / "benchmarks.md").read_text()
    assert page.count(start) == 1 and page.count(end) == 1, f"docs/benchmarks.md: markers of {name}"
    assert start not in (REPO / "README.md").read_text()
    written = page.split(start, 1)[1].split(end, 1)[0]
    saved = json.loads((REPO / "benchmarks" / "results" / json_name).read_text())
    assert written == f"\n{block(saved)}\n", f"docs/benchmarks.md's {name} block is not what its script writes"


def test_readme_holds_no_script_written_block_and_its_results_come_from_the_docs_blocks():
    """The README's Results section is short and quotes only intervals that a script writes into docs/benchmarks.md
    (its summary blocks, or the results files that page includes), so the numbers follow the committed JSON."""
    readme = (REPO / "README.md").read_text()
    assert not re.search(r"<!-- [\w-]+:start", readme), "README.md holds a script-written block"
    results = readme.split("\n## Results\n", 1)[1].split("\n## ", 1)[0]
    assert results.startswith("\n### A real pretrained chat model: SmolLM2-135M-Instruct")  # the real model leads
    page = (REPO / "docs" / "benchmarks.md").read_text()
    sources = [b.split(":end -->", 1)[0] for b in re.split(r"<!-- [\w-]+:start", page)[1:]]
    included = re.findall(r'^--8<-- "(benchmarks/results/[\w.]+\.md)', page, flags=re.M)
    sources += [(REPO / path).read_text() for path in included]
    quoted = re.findall(r"[+-]?\d+\.\d+ \[[+-]?\d+\.\d+, [+-]?\d+\.\d+\]", results)
    assert len(quoted) >= 10, quoted
    unsourced = [q for q in quoted if not any(q in s for s in sources)]
    assert not unsourced, f"README's Results quote intervals no script-written table holds: {unsourced}"


def test_readme_real_model_numbers_are_the_committed_measurements():
    """The real-model paragraph quotes the calibration and the self-judge check as their scripts wrote them."""
    readme = (REPO / "README.md").read_text()
    real = readme.split("\n### A real pretrained chat model", 1)[1].split("\n### ", 1)[0]
    calibration = (REPO / "benchmarks" / "results" / "real_calibration.md").read_text()
    judge_check = (REPO / "benchmarks" / "results" / "real_judge_check.md").read_text()
    assert "| 1 | 16 x 8 | 0.8 / 6.2 |" in calibration and "0.8% of one-step problems (pass@8 6.2%)" in real
    assert "| 2 | 16 x 8 | 0.0 / 0.0 |" in calibration and "| 3 | 16 x 8 | 0.0 / 0.0 |" in calibration
    assert "| self-judge reviews that failed (unusable answers, counted as KEEP) | 89 of 89 |" in judge_check
    assert "all 89 of its reviews were unusable (87 cut at 256 tokens" in real
    assert "87 were cut off at the review budget" in judge_check
    # the results table: the paired rows of learning_real.md (pass@1, pass@8) and the real model's vLLM step cost
    learning = (REPO / "benchmarks" / "results" / "learning_real.md").read_text()
    for regime, pair, quoted in [
        ("in-band", "mintrl-const − grpo", "MInTRL (rule judge) − GRPO"),
        ("in-band", "sft-grpo − grpo", "SFT on the references then GRPO − GRPO"),
        ("in-band", "mintrl-const − sft-grpo", "MInTRL − SFT then GRPO"),
        ("in-band", "sort − grpo", "SORT − GRPO"),
        ("in-band", "grpo-2x − grpo", "GRPO with 2x rollouts − GRPO"),
        ("reachable", "mintrl-const − grpo", "where sampling reaches the answer (one-step problems): MInTRL − GRPO"),
    ]:  # fmt: skip
        [row] = [line for line in learning.splitlines() if line.startswith(f"| {regime} | {pair} |")]
        pass1, pass8 = row.split(" | ")[2:4]
        [line] = [line for line in real.splitlines() if line.startswith(f"| {quoted} |")]
        assert pass1 in line and pass8 in line, (pair, pass1, pass8, line)
    # the headline pairs on fresh seeds (`--fresh`), as learning_real_fresh.md writes them
    fresh = (REPO / "benchmarks" / "results" / "learning_real_fresh.md").read_text()
    sentence = " ".join(real.split("On fresh seed", 1)[1].split("([details]", 1)[0].split())
    for pair, quoted in [
        ("mintrl-const − grpo", "MInTRL − GRPO"),
        ("mintrl-const − sft-grpo", "MInTRL − SFT then GRPO"),
    ]:
        [row] = [line for line in fresh.splitlines() if line.startswith(f"| in-band | {pair} |")]
        pass1, pass8 = row.split(" | ")[2:4]
        assert f"{quoted} {pass1} / {pass8}" in sentence, (pair, pass1, pass8, sentence)
    for name, quoted in [("cost_real_vllm.md", "1.00 [0.93, 1.06]"), ("cost_real.md", "1.24 [1.13, 1.35]")]:
        cost = (REPO / "benchmarks" / "results" / name).read_text()
        row = next(line for line in cost.splitlines() if line.startswith("| mintrl_interventions | "))  # time table
        assert row.split(" | ")[3] == quoted and quoted in real, (name, row)  # the CPU-time ratio column


def test_the_docs_front_page_quotes_the_readmes_demo_numbers():
    """docs/index.md says what the README says of the two demos: the same seeds and the same paired intervals."""
    readme = (REPO / "README.md").read_text()
    index = " ".join((REPO / "docs" / "index.md").read_text().split())
    claims = re.findall(r"Over (\d+) seeds, (SORT|MInTRL) - GRPO is pass@1 ([+-][\d.]+ \[[+-][\d.]+, [+-][\d.]+\])",
                        " ".join(readme.split()))  # fmt: skip
    assert {method for _, method, _ in claims} == {"SORT", "MInTRL"}
    for seeds, method, interval in claims:
        assert f"over {seeds} seeds, {method} - GRPO is pass@1 {interval}" in index, (method, seeds, interval)


def test_the_layout_table_names_every_module_of_the_package():
    """docs/development.md's layout table: every module of trl_mintrl/ by its file name, so a newcomer finds it."""
    text = (REPO / "docs" / "development.md").read_text()
    table = text[text.index("| room |") : text.index("Outside the package")]
    unnamed = [
        str(path.relative_to(REPO / "trl_mintrl"))
        for path in sorted((REPO / "trl_mintrl").rglob("*.py"))
        if path.name != "__init__.py"
        and f"`{path.name}`" not in table
        and f"`{path.relative_to(REPO / 'trl_mintrl')}`" not in table
    ]
    assert not unnamed, f"modules the layout table does not name: {unnamed}"
