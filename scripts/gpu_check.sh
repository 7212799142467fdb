#!/usr/bin/env bash
# vLLM-free GPU check (scripts/gpu_check.py) on a random model of Qwen3-1.7B's shapes in bf16, in this order: SORT's
# plan writing timed with plan_batch_size=None (one generate call) against calls of micro-batch 4 on the same weights;
# MInTRL's chunked intervention rollout through the transformers engine with and without its kept KV caches (8 rows,
# 512-token chunks, 4,096-token completions, a scripted judge that cuts every other chunk of a row and inserts a fixed
# correction); then a MInTRL step and a SORT step at the papers' lengths (16k-token completions, repairs of 16
# references of 4k tokens) at micro-batch 4, with peak GPU memory per phase and tokens/s of the transformers engine.
# For a machine with torch and transformers but no TRL, no vLLM and no network (this project's lent H200: torch 2.11,
# transformers 5.17). scripts/gpu_smoke.sh stays the check for machines with vLLM.
#
# 1. Here (network, once per checkout): build the wheelhouse of what that machine lacks, into the git-ignored
#    .gpu_wheels/ (about 2.1 MB: trl, datasets, dill, multiprocess, math-verify, latex2sympy2_extended, antlr4; the
#    package itself is used from the checkout through PYTHONPATH, so it is always the working tree's code):
#        scripts/gpu_check.sh --build-wheels
# 2. On the device, one call of the `run` tool (about 7.5-8.5 minutes of command time estimated, plus the machine's
#    start; gpu_check.json/.md are rewritten after each plan setting, rollout setting and configuration, and every 30 s
#    during a rollout setting, so a run stopped at the limit still brings back what it finished; a run that uses the
#    whole limit leaves no time for a rerun in a 15-minute budget):
#        run(command="set -o pipefail; bash scripts/gpu_check.sh --out $OUT 2>&1 | tee $OUT/gpu_check.log",
#            carry=[".gpu_wheels"], timeout_s=540)
#    then give_back. Results come back as $OUT/gpu_check.{md,json,log}.
#    What the default leaves out (each its own run, same carry): plan_batch_size 1 (`--plan-batches none 4 1`, about
#    +2 minutes) and micro-batches 2 and 1 (`--configs mb4-r16 mb2-r16 mb1-r16`, about +2 minutes), both measured on
#    the H200 below; the rollout at the papers' 16k (see the estimate). `--plan-batches` or `--configs` with no value
#    skips that phase, `--rollout-lengths` with no value the rollout; a rollout alone:
#        bash scripts/gpu_check.sh --plan-batches --configs --rollout-lengths 4096 --out $OUT
# On a CPU (to prove the code paths, tiny shapes, about 35 s, the rollout phase about 7 s of it, with
# OMP_NUM_THREADS=1):  scripts/gpu_check.sh --cpu-dry-run
#
# Device-time estimate of the rollout phase (an estimate, not run: from the H200 run below and the schedule's counts,
# which the scripted judge and the suppressed EOS make independent of the model). Decoding on that H200 cost 23-33 ms
# a step (generation of 16 rows x 512 tokens, 11.9 and 16.1 s in the second and third configurations; plan writing,
# greedy, 1 to 4 rows at 4k-token references: 114 s / 4,096 steps, 34 s / 1,024) whatever the rows, and 81 ms in the
# first configuration's engine phase (the 198 tokens/s of 16 rows x 512 in 41 s; that configuration's generation
# phases all ran about 3x slower than the same phases later): count decode steps, not tokens. A 4,096-token rollout
# is 11 generate calls and 4,916 decode steps a setting, and without the cache re-reads 178k tokens: about 155 s with
# the cache and 160 s without (5-6 minutes the pair; 13 at 81 ms a step), so on this GPU the cache should save only
# a few percent at 4k: decoding, not re-reading, is the time. The papers' 16k is 39 calls and 19,362 decode steps a
# setting, with steps dearer as the cache grows (DynamicCache copies each layer's keys and values at every step:
# about 25 GB of memory traffic a step at 14k tokens of 8 rows), and 2.5M tokens re-read without the cache: about
# 11-12 minutes a setting, more than one command's 600 s, so a 16k pair does not fit a 15-minute session. Two ways
# to ask for it:
#   - its last quarter, in one run (about 7 minutes estimated: 11 calls, 4,916 steps at 12-16k tokens of context, 1.2M
#     tokens re-read without the cache), each row starting from 12,288 prepared tokens as if written and kept:
#        bash scripts/gpu_check.sh --plan-batches --configs --rollout-lengths 16384 --rollout-prefix 12288 --out $OUT
#   - the whole 16k, one setting a session (`--rollout-lengths 16384 --rollout-kv on`, then `off`, timeout_s=600):
#     expected to stop at the limit short of the end; each generate call's seconds and tokens come back (saved every
#     30 s), to be paired call by call across the two sessions' gpu_check.json.
# The whole default: imports and model about 20 s, plans about 45 s, rollout about 320 s, micro-batch 4 about
# 50-110 s (the first configuration of the H200 run took 130 s, 34 s of it plans now written in one call of ~10 s):
# about 7.5-8.5 minutes; at 81 ms a decode step the run would stop at 540 s inside the rollout's second setting
# (its calls so far compared with the first setting's), before the micro-batch 4 configuration.
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
# Not run there yet: the plan phase (added after that run; estimated 10 + 34 s for None and 4, while the
# configuration's plan phase drops to one call), the rollout phase (added after it too; checked in --cpu-dry-run
# only), and anything with vLLM (scripts/gpu_smoke.sh).
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
exec "$python" -m scripts.gpu_check "$@"
