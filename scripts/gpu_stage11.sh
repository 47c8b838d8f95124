#!/usr/bin/env bash
# Stage 11's short loop on the GPU machine: build the stage program and its tests, check
# every step on a few shapes through the CLI (forward by stage 10, backward by the step),
# run test_stage11 (FA_TEST_SMALL=1), and time the backward against SDPA's flash and cuDNN
# backends. For iterating on one kernel; scripts/gpu_check.sh is the full check.
#
#   scripts/gpu_stage11.sh [OUT]   env: FA11_TESTS=0 skips the tests, FA11_BENCH=0 the timings,
#                                  FA11_BENCH_ARGS (default --quick) goes to bench_gpu.py
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-${OUT:-./gpu_out}}
mkdir -p "$OUT"
source scripts/gpu_env.sh  # the CUDA tools on PATH; gpu_configure
BUILD=build-gpu
gpu_configure . $BUILD >"$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
targets=(stage11)
[[ ${FA11_TESTS:-1} == 1 ]] && targets+=(test_stage11)
[[ ${FA11_BENCH:-1} == 1 ]] && targets+=(fa_c)
cmake --build $BUILD -j "$(nproc)" --target "${targets[@]}" >>"$OUT/build.log" 2>&1 ||
  { grep -E "error" -A3 "$OUT/build.log" | head -60; exit 1; }
S=$BUILD/stages/11_hopper_bwd/stage11
{
modes=("--step 11a" "--step 11b" "--step 11c" "--step 11d" "--deterministic")
for mode in "${modes[@]}"; do
  for args in "--head-dim 64 --seq-q 300 --seq-k 513 --heads 4 --kv-heads 2 --causal" \
              "--head-dim 128 --seq-q 257 --seq-k 1000" \
              "--head-dim 128 --seq-q 1025 --seq-k 1025 --causal" \
              "--head-dim 64 --seq-q 1000 --seq-k 777 --causal --batch 2 --heads 3"; do
    echo "== $mode $args"
    timeout 60 $S $mode --backward --dtype bf16 $args 2>&1 | grep -E "PASS|FAIL|error|rror|max abs|worst" | head -8
  done
done
} 2>&1 | tee "$OUT/check.log"
if [[ ${FA11_TESTS:-1} == 1 ]]; then
  FA_TEST_SMALL=1 timeout 300 $BUILD/tests/test_stage11 2>&1 | tail -40 | tee "$OUT/test.log"
fi
if [[ ${FA11_BENCH:-1} == 1 ]]; then
  FA_COMMIT=${FA_COMMIT:-$(cat .git_head 2>/dev/null || echo unknown)} timeout 400 python3 scripts/bench_gpu.py \
    --lib $BUILD/stages/libfa_c.so --stages 11 --hopper ${FA11_BENCH_ARGS:---quick} --out "$OUT/bench11.csv" \
    2>&1 | tail -60 | tee "$OUT/bench.log"
fi
