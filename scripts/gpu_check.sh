#!/usr/bin/env bash
# vLLM-free GPU check (scripts/gpu_check.py): a MInTRL step and a SORT step at the papers' lengths (16k-token
# completions, repairs of 16 references of 4k tokens) on a random model of Qwen3-1.7B's shapes in bf16, peak GPU memory
# per phase, tokens/s of the transformers engine, and SORT's plan writing timed with plan_batch_size=None (one generate
# call) against calls of micro-batch 4 and 1 on the same weights. For a machine with torch and transformers but no
# TRL, no vLLM and no network (this project's lent H200: torch 2.11, transformers 5.17). scripts/gpu_smoke.sh stays the
# check for machines with vLLM.
#
# 1. Here (network, once per checkout): build the wheelhouse of what that machine lacks, into the git-ignored
#    .gpu_wheels/ (about 2.1 MB: trl, datasets, dill, multiprocess, math-verify, latex2sympy2_extended, antlr4; the
#    package itself is used from the checkout through PYTHONPATH, so it is always the working tree's code):
#        scripts/gpu_check.sh --build-wheels
# 2. On the device, one call of the `run` tool (3-7 minutes of command time estimated, plus the machine's start;
#    gpu_check.json/.md are rewritten after each configuration, so a run stopped at the limit still brings back the
#    configurations it finished; a run that uses the whole limit leaves no time for a rerun in a 15-minute budget):
#        run(command="set -o pipefail; bash scripts/gpu_check.sh --out $OUT 2>&1 | tee $OUT/gpu_check.log",
#            carry=[".gpu_wheels"], timeout_s=540)
#    then give_back. Results come back as $OUT/gpu_check.{md,json,log}.
# On a CPU (to prove the code paths, tiny shapes, ~1-2 minutes):  scripts/gpu_check.sh --cpu-dry-run
#
# Run so far (2026-12-04, on the lent H200; torch 2.11, transformers 5.17, python 3.12, the carried wheels installed
# and imported as listed): results in benchmarks/results/gpu_check_h200/ (what the run printed and wrote, as it came
# back). The first run (at a761adf) stopped with CUDA out of memory in the first GRPO loss (mb4: 4 x 16,384 tokens,
# 138 GiB allocated): the check never turned gradient checkpointing on, since `Trainer.train` does that and the phases
# run without it (benchmarks/memory.enable_checkpointing now does it as train() would). The second run (a761adf plus
# that fix) finished all three configurations in 446 s. Its "repair update" rows include the first allocation of the
# repair's own AdamW state (repair_optimizer_warmed: false; the warm-up looked for a seam since renamed, fixed after
# the run), which a rerun would leave out. In that run plans still followed the micro-batch: the configurations'
# "repair: plan" rows (16 plans of 256 tokens: 34 / 64 / 114 s at micro-batch 4 / 2 / 1) are what plan_batch_size
# (default None, one call) now avoids.
# Not run there yet: the plan phase (added after that run; estimated 10 + 34 + 114 s, while the configurations' plan
# phases drop to one call each, so the whole check should take about as long as before; `--plan-batches none 4` or
# `--configs mb4-r16` shortens it), and anything with vLLM (scripts/gpu_smoke.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
wheels=.gpu_wheels
# the versions the CPU dry run used (trl 1.16 is the package's pin; datasets 4.8.5 needs pyarrow >= 21 only)
packages=(trl==1.16.0 datasets==4.8.5 dill==0.4.1 multiprocess==0.70.19 math-verify==0.9.0
          latex2sympy2_extended==1.11.0 antlr4-python3-runtime==4.13.2)

if [ "${1:-}" = "--build-wheels" ]; then
  rm -rf "$wheels" && mkdir -p "$wheels"
  "$python" -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$wheels" "${packages[@]}"
  du -sh "$wheels"
  exit 0
fi

if compgen -G "$wheels/*.whl" >/dev/null; then
  site=${GPU_CHECK_SITE:-/tmp/gpu_check_site}
  "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" "$wheels"/*.whl
  export PYTHONPATH="$site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
else
  echo "gpu_check: no wheels in $wheels (build them with scripts/gpu_check.sh --build-wheels); using what is installed"
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}
command -v nvidia-smi >/dev/null && nvidia-smi -L || true
exec "$python" scripts/gpu_check.py "$@"
