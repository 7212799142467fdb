"""CPU recipes through `accelerate launch ... -m trl_mintrl.cli train`: one process, two processes (DDP over gloo)
and DeepSpeed ZeRO-2, each with the repository's accelerate configs, as users launch them."""

import json
import os
import sys
from pathlib import Path

import pytest
from conftest import free_port, requires_deepspeed, run_process_group

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow


def launch(accelerate_config: str, method: str, model: str, out: Path, *flags: str) -> str:
    """Run a CPU recipe for 2 steps (checkpoint at step 2) under `accelerate launch`; returns its output."""
    command = [
        sys.executable, "-m", "accelerate.commands.launch",
        "--config_file", f"recipes/accelerate/{accelerate_config}.yaml", "--main_process_port", str(free_port()),
        "-m", "trl_mintrl.cli", "train", method, "--config", f"recipes/cpu/{method}.yaml",
        "--model_name_or_path", model, "--output_dir", str(out), "--max_steps", "2", "--save_steps", "2", *flags,
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    result = run_process_group(command, cwd=REPO, env=env, timeout=900)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    return output


def logged(out: Path, key: str) -> list[float]:
    history = json.loads((out / "checkpoint-2" / "trainer_state.json").read_text())["log_history"]
    return [entry[key] for entry in history if key in entry and "train_runtime" not in entry]


def assert_saved_with_cards(out: Path, method_name: str, recipe: str) -> None:
    for folder in (out, out / "checkpoint-2"):
        card = (folder / "README.md").read_text()
        assert f"Method: **{method_name}**" in card and f"Recipe: `recipes/cpu/{recipe}.yaml`" in card, folder
        assert (folder / "model.safetensors").is_file()


@pytest.fixture(scope="module")
def one_process_mintrl(tiny_model_path, tmp_path_factory):
    out = tmp_path_factory.mktemp("launch") / "mintrl-1proc"
    return out, launch("cpu", "mintrl", tiny_model_path, out)


def test_one_process(one_process_mintrl):
    out, output = one_process_mintrl
    assert "(trained on 1 process)" in output
    assert_saved_with_cards(out, "MInTRL", "mintrl")
    assert (out / "checkpoint-2" / "mintrl_state.json").is_file()
    # the rule judge's corrections make intervened rollouts score where the random policy's controls cannot
    control, intervened = logged(out, "mintrl/reward_control"), logged(out, "mintrl/reward_intervened")
    assert len(control) == 2 and all(i > c for i, c in zip(intervened, control))
    assert all(loss > 0 for loss in logged(out, "loss"))


def test_two_processes_gloo(tiny_model_path, tmp_path):
    out = tmp_path / "sort-2proc"
    output = launch("cpu_ddp2", "sort", tiny_model_path, out)
    assert "(trained on 2 processes)" in output
    assert_saved_with_cards(out, "SORT", "sort")
    # per step: 2 processes x 16 rollouts / 4 generations = 8 prompts, all wrong -> buffered and repaired
    assert logged(out, "sort/repairs")[-1] >= 2
    assert (out / "checkpoint-2" / "sort_buffer.json").is_file()


@requires_deepspeed
def test_deepspeed_zero2_matches_the_plain_run(one_process_mintrl, tiny_model_path, tmp_path):
    out = tmp_path / "mintrl-zero2"
    output = launch("cpu_zero2", "mintrl", tiny_model_path, out)
    assert "(trained on 1 process)" in output
    assert (out / "checkpoint-2" / "global_step2").is_dir()  # DeepSpeed's own checkpoint layout: the engine ran
    assert_saved_with_cards(out, "MInTRL", "mintrl")
    plain_out, _ = one_process_mintrl
    # same seed, same data, same update: ZeRO-2 (fp32, one process) trains exactly as the plain run
    assert logged(out, "loss") == pytest.approx(logged(plain_out, "loss"), rel=1e-4)
    assert logged(out, "grad_norm") == pytest.approx(logged(plain_out, "grad_norm"), rel=1e-3)
