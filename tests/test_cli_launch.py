"""`trl-mintrl train ... --accelerate_config NAME|PATH --num_processes N`: launcher flags split off, config names
resolved from any folder (ours, then TRL's), and a real 2-process launch."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import run_process_group

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


def _two_process_command(model: str, out: Path, *flags: str) -> list[str]:
    return [sys.executable, "-m", "trl_mintrl.cli", "train", "grpo", "--config", "recipes/cpu/grpo.yaml",
            "--accelerate_config", "cpu_ddp2", "--main_process_port", "0", "--model_name_or_path", model,
            "--output_dir", str(out), *flags]  # fmt: skip


NOISE = (
    "`gradient_checkpointing` is deprecated",  # transformers, for TRL's default when a recipe sets the old name
    "`is_gradient_checkpointing` is deprecated",  # transformers, called by TRL's generation
    "`--num_cpu_threads_per_process` was set",  # accelerate, when it picks the CPU threads itself
    "find_unused_parameters=True was specified",  # DDP, when no parameter is unused
)


@pytest.mark.slow
def test_train_launches_two_processes_by_config_name(tiny_model_path, tmp_path):
    out = tmp_path / "grpo-2proc"
    flags = ["--num_processes", "2", "--max_steps", "1", "--save_steps", "1"]
    command = _two_process_command(tiny_model_path, out, *flags)
    env = {key: value for key, value in os.environ.items() if key != "OMP_NUM_THREADS"}  # as a user's shell
    env.update(HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    result = run_process_group(command, cwd=REPO, env=env, timeout=900)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    assert "(trained on 2 processes)" in output
    assert (out / "checkpoint-1" / "model.safetensors").is_file()
    assert not [line for line in output.splitlines() if any(noise in line for noise in NOISE)]
    bars = [part for part in re.split(r"[\r\n]", result.stderr) if re.match(r"\s*100%\|.*\| 1/1 \[", part)]
    assert bars  # the CPU recipes keep the training progress bar (a bar with no title; the shard writer's has one)
    card_command = "--save_steps 1 --accelerate_config cpu_ddp2 --main_process_port 0 --num_processes 2\n```"
    for folder in (out, out / "checkpoint-1"):
        assert card_command in (folder / "README.md").read_text()  # the command as typed, launcher flags too


def test_a_launched_run_that_fails_ends_with_its_own_line_and_exit_code(tmp_path):
    """Training that fails in the launched process: the user sees that process's one-line error and its exit code,
    not the launcher's RuntimeError and CalledProcessError tracebacks after it."""
    command = [sys.executable, "-m", "trl_mintrl.cli", "train", "mintrl", "--config",
               str(REPO / "recipes" / "cpu" / "mintrl.yaml"), "--accelerate_config", "cpu", "--kappa", "5"]  # fmt: skip
    result = run_process_group(command, cwd=tmp_path, timeout=300)
    assert result.returncode == 1, result.stderr[-3000:]
    assert "trl-mintrl train: error: kappa=5.0: " in result.stderr
    assert "Traceback" not in result.stderr and "CalledProcessError" not in result.stderr, result.stderr[-3000:]


def test_cpu_launches_set_the_threads_accelerate_would_announce(monkeypatch):
    import psutil

    from trl_mintrl.cli.launch import accelerate_launch_args

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    threads = str(max(1, psutil.cpu_count(logical=False) // 2))
    ddp2 = accelerate_launch_args(["--accelerate_config", "cpu_ddp2"])
    assert ddp2[0] == "--config_file" and ddp2[2:] == ["--num_cpu_threads_per_process", threads]
    assert accelerate_launch_args(["--accelerate_config", "cpu", "--num_processes", "2"])[-1] == threads
    assert "--num_cpu_threads_per_process" not in accelerate_launch_args(["--accelerate_config", "multi_gpu"])
    given = ["--accelerate_config", "cpu", "--num_cpu_threads_per_process", "3"]
    assert accelerate_launch_args(given)[2:] == ["--num_cpu_threads_per_process", "3"]
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert "--num_cpu_threads_per_process" not in accelerate_launch_args(["--accelerate_config", "cpu_ddp2"])


@pytest.mark.slow
def test_two_process_runs_exit_every_time(tiny_model_path, tmp_path):
    """A 2-process CPU run used to hang at exit now and then (rank 1 in `ProcessGroupGloo`'s destructor, 2 of 8
    runs), or abort there (SIGABRT, once in CI), so each process skips the interpreter's native teardown: several
    runs in a row must all exit, each in seconds, and the Python-level exit work (atexit handlers, as a user's
    tracker registers) still runs on every rank."""
    site = tmp_path / "site"  # a user's atexit handler, registered in every process of the launch
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import atexit, os\n"
        "if 'RANK' in os.environ:\n"
        "    atexit.register(lambda: open(os.environ['EXIT_MARKS'] + os.environ['RANK'], 'w').close())\n"
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
    flags = ["--max_steps", "1", "--save_strategy", "no", "--per_device_train_batch_size", "4"]
    for run in range(4):
        env["EXIT_MARKS"] = str(tmp_path / f"exit{run}-rank")
        command = _two_process_command(tiny_model_path, tmp_path / f"run{run}", *flags)
        result = run_process_group(command, cwd=REPO, env=env, timeout=180)  # a hang: killed, TimeoutExpired
        assert result.returncode == 0 and "(trained on 2 processes)" in result.stdout, result.stderr[-3000:]
        assert sorted(path.name for path in tmp_path.glob(f"exit{run}-rank*")) == [
            f"exit{run}-rank0",
            f"exit{run}-rank1",
        ]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")  # a zombie has exited, only its parent has not reaped it


@pytest.mark.parametrize("session", ["group", "own session"])
@pytest.mark.parametrize("ends", ["timeout", "exit"])
def test_run_process_group_kills_every_process_it_started(tmp_path, ends, session):
    """What tests launch (torchrun, accelerate launch) leaves no process behind: the whole group is killed when the
    command times out, and after it exits with a child still running, a child in a session of its own included (as
    torchrun starts its ranks; one seen hung in gloo's teardown after its parent was killed)."""
    pid_file = tmp_path / "child.pid"
    wait = "wait" if ends == "timeout" else "true"
    setsid = "setsid " if session == "own session" else ""
    # the child lets go of the output pipes, so that its parent's exit ends the command
    command = ["bash", "-c", f"{setsid}sleep 300 >/dev/null 2>&1 & echo $! > {pid_file}; {wait}"]
    if ends == "timeout":
        with pytest.raises(subprocess.TimeoutExpired):
            run_process_group(command, timeout=2)
    else:
        assert run_process_group(command, timeout=30).returncode == 0
    pid, deadline = int(pid_file.read_text()), time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:  # SIGKILL is delivered asynchronously
        time.sleep(0.05)
    assert not _alive(pid)
