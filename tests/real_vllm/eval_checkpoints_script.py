"""`trl-mintrl eval --all_checkpoints --backend vllm` as a user runs it (vLLM's engine core in its own process, the
default), recording the vLLM engine-core processes alive each time a checkpoint's engine is built. Engines are fp32
and eager, as in the other tests (torch.compile warm-up costs 15-25 s per engine on 2 cores). vLLM is first imported
by the CLI, as in a user's run: the first engine's leak that `VLLMEngine.close` answers comes from that import.

Usage: python eval_checkpoints_script.py RUN_DIR OUTPUT_DIR DATASET_SPEC; prints one JSON line.
"""

import json
import sys

import psutil

from trl_mintrl.engines.vllm import VLLMEngine


def engine_core_processes() -> int:
    return sum("EngineCore" in child.name() for child in psutil.Process().children(recursive=True))


if __name__ == "__main__":  # the engine core is a spawned process that re-imports this file
    from trl_mintrl.cli import main

    assert "vllm" not in sys.modules, "the CLI must be the first to import vLLM"
    run_dir, output, dataset = sys.argv[1:4]
    alive_at_build = []
    build = VLLMEngine.from_model_path.__func__

    def recording_build(cls, *args, **kwargs):
        alive_at_build.append(engine_core_processes())
        return build(cls, *args, **{**kwargs, "dtype": "float32", "enforce_eager": True, "block_size": 32})

    VLLMEngine.from_model_path = classmethod(recording_build)
    main(["eval", "--model", run_dir, "--all_checkpoints", "--backend", "vllm", "--dataset", dataset,
          "--limit", "1", "--num_samples", "2", "--k", "1,2", "--temperature", "0", "--max_new_tokens", "8",
          "--output", output, "--vllm_gpu_memory_utilization", "0.2"])  # fmt: skip
    print(json.dumps({"alive_at_build": alive_at_build, "alive_at_end": engine_core_processes()}))
