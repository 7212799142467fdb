#!/usr/bin/env bash
# On a machine with NVIDIA GPUs: 2 MInTRL and 2 SORT steps on the tiny model with vLLM colocate in bf16, then a
# short table (step times, tokens/s, prefix-cache hit rate, chunked rollout vs plain generation), then the rollout
# benchmark (benchmarks/studies/cost.py --rollout: barrier vs continuous schedule, x plain generation). With 2+ GPUs also
# colocate with tensor parallelism 2, and server mode (`trl vllm-serve` on GPU 1, TRL's NCCL weight sync; the same
# chunked rollout through the server and colocate, round by round).
# Installs what is missing: from the wheels in ./wheels (git-ignored; for machines without a package index) when
# that folder holds any, else from the package index. Extra arguments go to scripts/gpu_smoke.py (--steps, --batch).
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
command -v nvidia-smi >/dev/null && nvidia-smi -L || { echo "gpu_smoke: no NVIDIA GPU here (nvidia-smi)"; exit 1; }

missing=$("$python" -c 'import importlib.util as u; print(" ".join(n for n in ("vllm", "trl", "datasets", "math_verify", "openai", "trl_mintrl") if u.find_spec(n) is None))')
if [ -n "$missing" ]; then
  echo "gpu_smoke: installing what is missing: $missing"
  if compgen -G "wheels/*.whl" >/dev/null; then
    "$python" -m pip install -q --no-index --find-links wheels -e ".[vllm,openai]"
  else
    "$python" -m pip install -q -e ".[vllm,openai]"
  fi
fi
"$python" -c "import vllm" || { echo "gpu_smoke: vLLM does not import; see the README section "vLLM" (GPU install)"; exit 1; }
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}
gpus=$(nvidia-smi -L | wc -l)
work=$(mktemp -d)
model="$work/tiny"
"$python" -c "import sys; from trl_mintrl.tiny import build_tiny_model; build_tiny_model(sys.argv[1])" "$model"

# 1. colocate, TP 1, on GPU 0
CUDA_VISIBLE_DEVICES=0 "$python" scripts/gpu_smoke.py --model "$model" "$@"
# 1b. one MInTRL rollout, lock-step rounds vs continuous batching (admitting a full engine in arrival order, by
#     priority, and by priority with speculative chunks), each against plain generation of its tokens, with the rule
#     judge (instant, and delayed per call) and the endpoint judge behind a local server answering after a tenth of a
#     full-length generation; every row per engine step, then the engine saturated (max_num_seqs a quarter, then a
#     sixteenth of the rows)
CUDA_VISIBLE_DEVICES=0 "$python" benchmarks/studies/cost.py --rollout --rounds 3 --out "$work/rollout"

if [ "$gpus" -lt 2 ]; then
  echo "gpu_smoke: server mode and TP 2 need 2 GPUs (NCCL weight sync cannot share one GPU); $gpus here"
  exit 0
fi
# 2. colocate with tensor parallelism 2: two processes, one TP group over GPUs 0-1
CUDA_VISIBLE_DEVICES=0,1 "$python" -m accelerate.commands.launch --num_processes 2 --mixed_precision bf16 \
  scripts/gpu_smoke.py --model "$model" --tp 2 "$@"

# 3. server mode: TRL's server of the tiny model on GPU 1, training on GPU 0 (weights synced over NCCL each step);
#    the same chunked rollout through the server and colocate, round by round
port=${GPU_SMOKE_PORT:-8017}
CUDA_VISIBLE_DEVICES=1 "$python" -m trl.cli.main vllm-serve --model "$model" --port "$port" --host 127.0.0.1 \
  --gpu_memory_utilization 0.3 --enable_prefix_caching true > "$work/server.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT
for _ in $(seq 1 120); do
  curl -sf "http://127.0.0.1:$port/health" >/dev/null && break
  kill -0 $server 2>/dev/null || { echo "gpu_smoke: the vLLM server exited:"; tail -40 "$work/server.log"; exit 1; }
  sleep 2
done
CUDA_VISIBLE_DEVICES=0 "$python" scripts/gpu_smoke.py --model "$model" --server-url "http://127.0.0.1:$port" "$@"
