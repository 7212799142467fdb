"""Checkpoints that survive a kill: which folder a resume picks, and real CPU runs SIGKILLed and resumed.

The slow tests run `trl-mintrl train` (tests/kill_point_train.py) with a checkpoint every step, SIGKILL it during
generation, during the backward pass, while the weights are written and while TRL's trainer_state.json is written,
re-run the same command with `--resume_from_checkpoint true` after each kill, and compare the end of that chain with
an uninterrupted run: same weights, same extra state (MInTRL's schedule and judge state, SORT's buffer), bit for bit.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
from pathlib import Path

import pytest
from conftest import run_process_group
from safetensors.torch import load_file, save_file

from trl_mintrl.cli.train import main
from trl_mintrl.resume import checkpoint_problem, last_complete_checkpoint, resolve_resume_from_checkpoint

ROOT = Path(__file__).resolve().parents[1]


# ----- which checkpoint is complete (no training) -----


def fake_checkpoint(folder: Path, step: int, extra: str | None = "extra.json") -> Path:
    """A checkpoint folder with the files a resume reads: weights, TRL's trainer state, an extra state file."""
    import torch

    folder.mkdir(parents=True)
    save_file({"w": torch.arange(64, dtype=torch.float32)}, str(folder / "model.safetensors"))
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    if extra:
        (folder / extra).write_text("{}")
    return folder


def cut(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


@pytest.mark.parametrize(
    "damage, problem",
    [
        (lambda f: (f / "trainer_state.json").unlink(), "trainer_state.json is missing"),
        (lambda f: cut(f / "trainer_state.json"), "trainer_state.json is not valid JSON"),
        (
            lambda f: (f / "trainer_state.json").write_text('{"global_step": 2}'),
            "trainer_state.json is for step 2, not 3",
        ),
        (lambda f: cut(f / "model.safetensors"), "model.safetensors is truncated"),
        (lambda f: (f / "model.safetensors").unlink(), "it holds no model weights"),
        (lambda f: (f / "extra.json").unlink(), "extra.json is missing"),
        (lambda f: cut(f / "extra.json"), "extra.json is not valid JSON"),
    ],
)
def test_a_checkpoint_cut_short_is_skipped_with_a_warning(tmp_path, caplog, damage, problem):
    fake_checkpoint(tmp_path / "checkpoint-2", 2)
    newest = fake_checkpoint(tmp_path / "checkpoint-3", 3)
    assert checkpoint_problem(str(newest), ["extra.json"]) is None
    damage(newest)
    assert problem in checkpoint_problem(str(newest), ["extra.json"])
    with caplog.at_level(logging.WARNING, logger="trl_mintrl.resume"):
        assert last_complete_checkpoint(str(tmp_path), ["extra.json"]) == str(tmp_path / "checkpoint-2")
    assert f"Skipping {newest}: incomplete ({problem}" in caplog.text


def test_checkpoints_are_ordered_by_number_not_name(tmp_path):
    for step in (9, 10, 2):
        fake_checkpoint(tmp_path / f"checkpoint-{step}", step)
    (tmp_path / "checkpoint-11").write_text("a file, not a folder")
    assert last_complete_checkpoint(str(tmp_path), ["extra.json"]) == str(tmp_path / "checkpoint-10")


def test_resolve_true_false_and_folders(tmp_path):
    assert resolve_resume_from_checkpoint(None, str(tmp_path)) is None
    assert resolve_resume_from_checkpoint("false", str(tmp_path)) is None
    with pytest.raises(ValueError, match="resume_from_checkpoint=true: no complete checkpoint-N folder"):
        resolve_resume_from_checkpoint("true", str(tmp_path))
    good = fake_checkpoint(tmp_path / "checkpoint-1", 1)
    bad = fake_checkpoint(tmp_path / "checkpoint-2", 2, extra=None)
    assert resolve_resume_from_checkpoint("True", str(tmp_path), ["extra.json"]) == str(good)
    assert resolve_resume_from_checkpoint(True, str(tmp_path), ["extra.json"]) == str(good)
    assert resolve_resume_from_checkpoint(str(good), "elsewhere", ["extra.json"]) == str(good)
    with pytest.raises(ValueError, match="checkpoint-2' is incomplete: extra.json is missing"):
        resolve_resume_from_checkpoint(str(bad), str(tmp_path), ["extra.json"])
    with pytest.raises(ValueError, match="no such folder"):
        resolve_resume_from_checkpoint(str(tmp_path / "checkpoint-7"), str(tmp_path))


def test_a_run_is_finished_at_max_steps_or_else_after_its_last_epoch(tmp_path):
    from trl_mintrl.resume import finished_run

    folder = fake_checkpoint(tmp_path / "checkpoint-8", 8)
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": 8, "epoch": 2.0}))
    assert "Nothing to resume" in finished_run(str(folder), max_steps=8, num_train_epochs=3)  # max_steps wins
    assert finished_run(str(folder), max_steps=9, num_train_epochs=1) is None
    assert "(num_train_epochs=2)" in finished_run(str(folder), max_steps=-1, num_train_epochs=2)
    assert finished_run(str(folder), max_steps=-1, num_train_epochs=3) is None


def test_trainer_train_true_skips_a_checkpoint_cut_short(tiny_model_path, cpu_args, toy_dataset, caplog):
    from conftest import digit_count_reward

    from trl_mintrl.sort import SORTConfig, SORTTrainer

    def trainer(max_steps: int) -> SORTTrainer:
        args = SORTConfig(**{**cpu_args, "save_strategy": "steps", "save_steps": 1, "max_steps": max_steps})
        return SORTTrainer(tiny_model_path, digit_count_reward, args, train_dataset=toy_dataset)

    trainer(2).train()
    out = Path(cpu_args["output_dir"])
    cut(out / "checkpoint-2" / "trainer_state.json")  # killed while TRL wrote its last file
    resumed = trainer(3)
    with caplog.at_level(logging.WARNING, logger="trl_mintrl.resume"):
        resumed.train(resume_from_checkpoint=True)  # transformers alone would pick checkpoint-2 and fail
    assert f"Skipping {out / 'checkpoint-2'}: incomplete (trainer_state.json is not valid JSON" in caplog.text
    assert resumed.state.global_step == 3
    assert [h["step"] for h in resumed.state.log_history if "loss" in h] == [1, 2, 3]  # 1 from checkpoint-1


@pytest.fixture
def transformers_warnings(caplog):
    """caplog, also receiving transformers' own log records (its library logger does not propagate)."""
    trainer_logger = logging.getLogger("transformers.trainer")
    trainer_logger.addHandler(caplog.handler)
    try:
        yield caplog
    finally:
        trainer_logger.removeHandler(caplog.handler)


def test_a_finished_run_resumes_to_nothing_and_keeps_its_checkpoint(
    tiny_model_path, cpu_args, toy_dataset, transformers_warnings
):
    from conftest import digit_count_reward

    from trl_mintrl.sort import SORTConfig, SORTTrainer

    def trainer() -> SORTTrainer:
        args = SORTConfig(**{**cpu_args, "save_strategy": "steps", "save_steps": 1, "save_total_limit": 1})
        return SORTTrainer(tiny_model_path, digit_count_reward, args, train_dataset=toy_dataset)

    trainer().train()
    out = Path(cpu_args["output_dir"])
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-2"]
    resumed = trainer()
    with transformers_warnings.at_level(logging.WARNING):
        result = resumed.train(resume_from_checkpoint=True)  # transformers alone: trains step 3, deletes checkpoint-2
    assert f"Nothing to resume: {out / 'checkpoint-2'} is at step 2 (epoch" in transformers_warnings.text
    assert "no step is trained and no checkpoint is removed" in transformers_warnings.text
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-2"]
    assert result.global_step == resumed.state.global_step == 2
    assert [h["step"] for h in resumed.state.log_history if "loss" in h] == [1, 2]
    saved = load_file(out / "checkpoint-2" / "model.safetensors")
    weights = resumed.model.state_dict()
    assert all(weights[name].equal(tensor) for name, tensor in saved.items())  # the finished run's weights
    model = resumed.model
    assert model.lm_head.weight is model.get_input_embeddings().weight  # the tied output layer came along
    assert saved["model.embed_tokens.weight"].equal(model.lm_head.weight)
    assert "missing keys" not in transformers_warnings.text  # lm_head.weight: filled through the tie


def test_only_tied_keys_are_dropped_from_the_missing_keys_warning(
    tiny_model_path, cpu_args, toy_dataset, transformers_warnings
):
    from conftest import digit_count_reward
    from torch.nn.modules.module import _IncompatibleKeys

    from trl_mintrl.sort import SORTConfig, SORTTrainer

    trainer = SORTTrainer(tiny_model_path, digit_count_reward, SORTConfig(**cpu_args), train_dataset=toy_dataset)
    with transformers_warnings.at_level(logging.WARNING):
        trainer._issue_warnings_after_load(_IncompatibleKeys(["lm_head.weight"], []))
        assert "missing keys" not in transformers_warnings.text
        trainer._issue_warnings_after_load(_IncompatibleKeys(["lm_head.weight", "model.norm.weight"], []))
    assert "missing keys in the checkpoint model loaded: ['model.norm.weight']" in transformers_warnings.text


def test_the_documented_upstream_reproduction_still_reproduces(tmp_path, monkeypatch, capsys):
    """docs/training.md's plain-transformers script (no TRL): a finished run resumed trains step 5 and rotates out
    checkpoint-4. When this fails, transformers fixed it: update the known-issues section."""
    import re

    page = (ROOT / "docs" / "training.md").read_text().split("## Known issues (upstream)")[1]
    script = re.search(r"^```python\n(.*?)^```", page, flags=re.M | re.S).group(1)
    monkeypatch.chdir(tmp_path)
    exec(compile(script, "docs/training.md known issue", "exec"), {})
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("['")]  # not the logs
    assert printed == ["['checkpoint-4']", "['checkpoint-5'] 5"]


# ----- real runs killed with SIGKILL and resumed -----

STEPS = 5
# where each run of the chain dies (POINT:STEP, see tests/kill_point_train.py); the last run finishes
KILLS = ["generate:2", "backward:3", "save_weights:4", "save_state:5"]
METHODS = {
    # intervention_stop_gap far below any gap: the adaptive schedule's moving average is tracked (extra state) but
    # never stops the interventions
    "mintrl": ("mintrl_state.json", ["--intervention_stop_gap", "-10"]),
    "sort": ("sort_buffer.json", []),
}


def train_args(method: str, model: str, output_dir: Path) -> list[str]:
    return [method, "--config", f"recipes/cpu/{method}.yaml", "--model_name_or_path", model, "--output_dir",
            str(output_dir), "--max_steps", str(STEPS), "--save_steps", "1", "--save_total_limit", "100",
            *METHODS[method][1]]  # fmt: skip


@pytest.fixture(scope="module", params=list(METHODS))
def chain(request, tiny_model_path, tmp_path_factory):
    """Run METHOD killed at each of KILLS in turn, each time re-running the same command with
    `--resume_from_checkpoint true`; then an uninterrupted run. Returns (method, killed dir, straight dir, runs)."""
    method = request.param
    root = tmp_path_factory.mktemp(f"kill-{method}")
    killed, straight = root / "killed", root / "straight"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    runs = []
    for i, kill in enumerate([*KILLS, "none:0"]):
        resume = ["--resume_from_checkpoint", "true"] if i else []
        before = sorted(p.name for p in killed.glob("checkpoint-*"))
        proc = run_process_group(
            [sys.executable, str(ROOT / "tests" / "kill_point_train.py"), *train_args(method, tiny_model_path, killed),
             *resume],
            cwd=ROOT, env={**env, "KILL_AT": kill}, timeout=600,
        )  # fmt: skip
        after = sorted(p.name for p in killed.glob("checkpoint-*"))
        runs.append({"kill": kill, "returncode": proc.returncode, "log": proc.stdout + proc.stderr, "before": before,
                     "after": after})  # fmt: skip
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        main(train_args(method, tiny_model_path, straight))
    finally:
        os.chdir(cwd)
    return method, killed, straight, runs


@pytest.mark.slow
def test_each_kill_resumes_from_the_last_complete_checkpoint(chain):
    method, killed, _, runs = chain
    for run, kill in zip(runs, KILLS, strict=False):
        point, step = kill.split(":")
        step = int(step)
        assert run["returncode"] == -signal.SIGKILL, (kill, run["log"][-3000:])
        if point in ("generate", "backward"):  # died mid-step: the previous step's checkpoint is the last one
            assert run["after"][-1] == f"checkpoint-{step - 1}", (kill, run["after"])
        else:  # died while writing checkpoint-STEP: the folder exists, cut short
            assert run["after"][-1] == f"checkpoint-{step}", (kill, run["after"])
    for previous, run in zip(runs, runs[1:], strict=False):
        point, step = previous["kill"].split(":")
        last_complete = f"checkpoint-{int(step) - 1}"
        assert f"resuming from {killed / last_complete}\n" in run["log"], (previous["kill"], run["log"][-3000:])
        skipped = f"Skipping {killed / f'checkpoint-{step}'}: incomplete"
        assert (skipped in run["log"]) == point.startswith("save"), (previous["kill"], run["log"][-3000:])
    assert "incomplete (trainer_state.json is missing)" in runs[3]["log"]  # weights cut short: TRL never got further
    assert "incomplete (trainer_state.json is not valid JSON" in runs[4]["log"]
    assert runs[-1]["returncode"] == 0, runs[-1]["log"][-3000:]
    state = json.loads((killed / f"checkpoint-{STEPS}" / "trainer_state.json").read_text())
    assert state["global_step"] == STEPS
    assert [h["step"] for h in state["log_history"] if "loss" in h] == list(range(1, STEPS + 1))


@pytest.mark.slow
def test_killed_and_resumed_run_ends_as_the_uninterrupted_one(chain):
    method, killed, straight, _ = chain
    a, b = load_file(killed / "model.safetensors"), load_file(straight / "model.safetensors")
    assert a.keys() == b.keys()
    differences = {name: (a[name] - b[name]).abs().max().item() for name in a if not a[name].equal(b[name])}
    assert not differences, differences  # bit-exact
    start = load_file(killed / "checkpoint-1" / "model.safetensors")
    assert any(not a[name].equal(start[name]) for name in a)  # it trained after the first checkpoint
    state_file = METHODS[method][0]
    extra = json.loads((killed / f"checkpoint-{STEPS}" / state_file).read_text())
    assert extra == json.loads((straight / f"checkpoint-{STEPS}" / state_file).read_text())
    if method == "mintrl":
        assert extra["reward_gap_ema"] is not None and extra["interventions_stopped_at"] is None
    else:
        assert extra["counters"]["repairs"] >= 1
