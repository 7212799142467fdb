"""The tool task's learning benchmark (`benchmarks/studies/learning_tools.py`) end to end in its smallest mode, its SFT arm,
its demo (`examples/mintrl_tools_toy.py`) and the tool-calling cost measurement (`benchmarks/studies/cost.py --tools`)."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SMOKE_LABELS = ("grpo", "mintrl-const", "sft-grpo", "sort")


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """`benchmarks/studies/learning_tools.py --smoke` run as a user would: its folder."""
    out = tmp_path_factory.mktemp("learning_tools")
    command = [
        sys.executable,
        "-m",
        "benchmarks.studies.learning_tools",
        "--smoke",
        "--workers",
        "0",
        "--out",
        str(out),
    ]
    subprocess.run(command, cwd=ROOT, check=True, capture_output=True, timeout=600)
    return out


def test_smoke_mode_trains_every_arm_with_the_tool_loop(smoke):
    results = json.loads((smoke / "learning_tools.json").read_text())
    assert results["provenance"]["command"].startswith("python -m benchmarks.studies.learning_tools --smoke")
    assert {(r["label"], r["seed"]) for r in results["runs"]} == {(label, s) for label in SMOKE_LABELS for s in (0, 1)}
    for run in results["runs"]:
        assert run["steps"] == 1 and len(run["logs"]) == 1
        assert {"pass@1", "pass@8", "read_all"} <= set(run["final"]) and set(run["curve"]) == {"0", "1"}
        assert "tools/call_frequency" in run["logs"][0]  # TRL's tool loop ran in every arm
    mintrl = [r for r in results["runs"] if r["label"] == "mintrl-const"]
    assert all(r["logs"][0]["mintrl/intervention_rate"] > 0 and r["logs"][0]["mintrl/judge_token_frac"] > 0
               for r in mintrl)  # fmt: skip
    sft = [r for r in results["runs"] if r["label"] == "sft-grpo"]
    assert all(r["sft_end"]["steps"] == 1 for r in sft)  # 2 prompts, batches of 8: one SFT step, then GRPO
    sort = [r for r in results["runs"] if r["label"] == "sort"]
    assert all("sort/all_wrong_frac" in r["logs"][0] for r in sort)
    assert (smoke / "learning_tools.png").stat().st_size > 0


def test_the_report_and_the_readme_block_follow_the_json(smoke, tmp_path):
    from benchmarks.studies.learning_tools import README_END, README_START

    results = json.loads((smoke / "learning_tools.json").read_text())
    for run in results["runs"]:  # MInTRL +50 points on seed 0, +30 on seed 1; every other arm 0
        bump = {("mintrl-const", 0): 0.5, ("mintrl-const", 1): 0.3}.get((run["label"], run["seed"]), 0.0)
        run["final"]["pass@1"] = bump
    (tmp_path / "learning_tools.json").write_text(json.dumps(results))
    readme = tmp_path / "README.md"
    readme.write_text(f"# title\n{README_START}\nold\n{README_END}\nafter\n")
    command = [sys.executable, "-m", "benchmarks.studies.learning_tools", "--replot", str(tmp_path / "learning_tools.json"),
               "--readme", str(readme)]  # fmt: skip
    subprocess.run(command, cwd=ROOT, check=True, capture_output=True, timeout=300)
    table = (tmp_path / "learning_tools.md").read_text()
    row = next(line for line in table.splitlines() if line.startswith("| in-band | mintrl-const | 2 |"))
    cells = [c.strip() for c in row.split("|")]
    assert cells[4] == "40.0 ± 14.1" and cells[7] == "+40.0 [-87.1, +167.1]"  # mean ± std; paired, t(1) = 12.706
    assert "| in-band | mintrl-const - sft-grpo | +40.0 [-87.1, +167.1] |" in table
    text = readme.read_text()
    assert "old" not in text and text.endswith(f"{README_END}\nafter\n")
    assert "mintrl-const − GRPO +40.0 [-87.1, +167.1] pass@1" in text


def test_sft_on_transcripts_learns_the_calls_and_not_the_tool_results():
    """One SFT step on reference transcripts moves the calls' and the computation's NLL down, and the tool results'
    tokens carry no loss (the labels `sft_example` gives them are -100)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from benchmarks.tasks.toy.tool_chat import sft_example
    from benchmarks.tasks.toy.tool_run import sft_on_transcripts
    from benchmarks.tasks.toy.tool_task import make_tool_problems
    from benchmarks.tasks.toy.warm_start import pad_batch
    from benchmarks.tasks.toy.warm_start_tools_build import WARM_START_TOOLS_DIR

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(WARM_START_TOOLS_DIR)
    model = AutoModelForCausalLM.from_pretrained(WARM_START_TOOLS_DIR)
    problems = make_tool_problems(8, seed=5, regime="in-band")
    batch = pad_batch(tokenizer, [sft_example(tokenizer, p, True, random.Random(0)) for p in problems])
    with torch.no_grad():
        before = model(**batch).loss.item()
    assert sft_on_transcripts(model, tokenizer, problems, batch_size=8, learning_rate=3e-4, seed=0) == 1
    with torch.no_grad():
        after = model(**batch).loss.item()
    assert after < before
    ids, labels = sft_example(tokenizer, problems[0], True, random.Random(0))
    text_of_masked = tokenizer.decode([i for i, lab in zip(ids, labels, strict=True) if lab == -100])
    assert "<|im_start|>tool" in text_of_masked and problems[0].question in text_of_masked


def test_the_demo_trains_the_benchmarks_job_and_ends_with_the_committed_line(capsys):
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        import mintrl_tools_toy
    finally:
        sys.path.remove(str(ROOT / "examples"))
    from benchmarks.studies.learning_tools import MODES, plan_jobs

    args = mintrl_tools_toy.parse_args(["--steps", "1", "--prompts-per-step", "2", "--eval-problems", "2"])
    job = mintrl_tools_toy.demo_job("mintrl-const", args)
    full = next(j for j in plan_jobs(MODES["full"]) if j["name"] == "tools-in-band-mintrl-const-s0")
    assert {k: v for k, v in job.items() if k not in ("steps", "prompts_per_step", "final_prompts", "curve_prompts",
            "eval_every")} == {k: v for k, v in full.items() if k not in ("steps", "prompts_per_step",
            "final_prompts", "curve_prompts", "eval_every")}  # fmt: skip
    mintrl_tools_toy.main(["--steps", "1", "--prompts-per-step", "2", "--eval-problems", "2", "--no-grpo"])
    out = capsys.readouterr().out
    assert "after MInTRL" in out and "MInTRL's judge wrote" in out
    assert "benchmarks/results/learning_tools" in out  # the committed line (or that there is none yet)


def test_tool_calling_cost_variants_sample_trls_rollouts_after_the_phase():
    """`cost.py --tools`: MInTRL after its intervention phase samples exactly the rollouts of TRL's tool-calling
    GRPOTrainer (same prompts, seed, tools and tokens), so their ratio is MInTRL's own overhead; with interventions the
    judge writes tokens and the rollouts differ."""
    from functools import partial

    from benchmarks.lib.step_cost import measure_time
    from benchmarks.studies.cost import build

    steps = measure_time(["grpo", "mintrl_after_phase", "mintrl_interventions"], 1, 1,
                         partial(build, tools="in-band"))["steps"]  # fmt: skip
    [grpo], [after], [interventions] = steps["grpo"], steps["mintrl_after_phase"], steps["mintrl_interventions"]
    assert after["rollout_digest"] == grpo["rollout_digest"] and after["generated_tokens"] == grpo["generated_tokens"]
    assert after["judge_tokens"] == 0 < interventions["judge_tokens"]
    assert interventions["rollout_digest"] != grpo["rollout_digest"]
