#!/usr/bin/env bash
# On a machine with an NVIDIA GPU: 2 MInTRL and 2 SORT steps on the tiny model with vLLM colocate in bf16, then a
# short table (step times, tokens/s, prefix-cache hit rate, chunked rollout vs plain generation).
# Installs what is missing: from the wheels in ./wheels (git-ignored; for machines without a package index) when
# that folder holds any, else from the package index. Extra arguments go to scripts/gpu_smoke.py (--steps, --batch).
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
command -v nvidia-smi >/dev/null && nvidia-smi -L || { echo "gpu_smoke: no NVIDIA GPU here (nvidia-smi)"; exit 1; }

missing=$("$python" -c 'import importlib.util as u; print(" ".join(n for n in ("vllm", "trl", "datasets", "math_verify", "trl_mintrl") if u.find_spec(n) is None))')
if [ -n "$missing" ]; then
  echo "gpu_smoke: installing what is missing: $missing"
  if compgen -G "wheels/*.whl" >/dev/null; then
    "$python" -m pip install -q --no-index --find-links wheels -e ".[vllm]"
  else
    "$python" -m pip install -q -e ".[vllm]"
  fi
fi
"$python" -c "import vllm" || { echo "gpu_smoke: vLLM does not import; see the README section "vLLM" (GPU install)"; exit 1; }
PYTHONUNBUFFERED=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-4} "$python" scripts/gpu_smoke.py "$@"
