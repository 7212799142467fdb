"""`trl-mintrl train ... --accelerate_config NAME|PATH --num_processes N`: launcher flags split off, config names
resolved from any folder (ours, then TRL's), and a real 2-process launch."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from trl_mintrl.cli.launch import resolve_accelerate_config, split_launch_args

REPO = Path(__file__).resolve().parent.parent


def test_launcher_flags_are_split_off_in_both_spellings():
    launch, rest = split_launch_args(
        ["mintrl", "--config", "r.yaml", "--accelerate_config", "zero2", "--num_processes=4", "--max_steps", "3"]
    )
    assert launch == ["--accelerate_config", "zero2", "--num_processes", "4"]
    assert rest == ["mintrl", "--config", "r.yaml", "--max_steps", "3"]
    assert split_launch_args(["grpo", "--config", "r.yaml"]) == ([], ["grpo", "--config", "r.yaml"])
    with pytest.raises(SystemExit, match="--num_processes needs a value"):
        split_launch_args(["grpo", "--num_processes", "--config", "r.yaml"])


def test_config_names_resolve_from_any_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ours = resolve_accelerate_config("cpu_ddp2")
    assert ours.parent.name == "accelerate_configs" and ours.parent.parent.name == "trl_mintrl"
    assert ours.read_text() == (REPO / "recipes" / "accelerate" / "cpu_ddp2.yaml").read_text()
    assert resolve_accelerate_config("zero1").parent.parent.name == "trl"  # TRL's own, not shipped by us
    mine = tmp_path / "mine.yaml"
    mine.write_text("num_processes: 1\n")
    assert resolve_accelerate_config(str(mine)) == mine
    with pytest.raises(SystemExit, match=r"'zero9' is neither a file nor a shipped config \(.*cpu_ddp2.*zero3"):
        resolve_accelerate_config("zero9")


@pytest.mark.slow
def test_train_launches_two_processes_by_config_name(tiny_model_path, tmp_path):
    out = tmp_path / "grpo-2proc"
    command = [
        sys.executable, "-m", "trl_mintrl.cli", "train", "grpo", "--config", "recipes/cpu/grpo.yaml",
        "--accelerate_config", "cpu_ddp2", "--main_process_port", "0",
        "--model_name_or_path", tiny_model_path, "--output_dir", str(out), "--max_steps", "1", "--save_steps", "1",
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    assert "(trained on 2 processes)" in output
    assert (out / "checkpoint-1" / "model.safetensors").is_file()
