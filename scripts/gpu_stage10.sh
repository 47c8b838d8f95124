#!/usr/bin/env bash
# Stage 10's short loop on the GPU machine: build the stage program (and optionally its
# tests), check every step on a few shapes through the CLI, and time every step at a few
# points. For iterating on one kernel; scripts/gpu_check.sh is the full check.
#
#   scripts/gpu_stage10.sh [OUT]      env: FA10_TESTS=1 also builds and runs test_stage10
#                                     (FA_TEST_SMALL=1), FA10_BENCH=0 skips the timings
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-${OUT:-./gpu_out}}
mkdir -p "$OUT"
source scripts/gpu_env.sh  # the CUDA tools on PATH; gpu_configure
BUILD=build-gpu
gpu_configure . $BUILD >"$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
cmake --build $BUILD -j "$(nproc)" --target stage10 >>"$OUT/build.log" 2>&1 || { grep -E "error" -A3 "$OUT/build.log" | head -60; exit 1; }
S=$BUILD/stages/10_hopper_fwd/stage10
{
for step in ${FA10_CHECK_STEPS:-10a 10b 10c 10d 10e 10f}; do
  for args in "--head-dim 64 --seq-q 300 --seq-k 513 --heads 4 --kv-heads 2 --causal" \
              "--head-dim 128 --seq-q 257 --seq-k 1000" \
              "--head-dim 128 --seq-q 1025 --seq-k 1025 --causal" \
              "--head-dim 256 --seq-q 190 --seq-k 190 --causal --batch 2" \
              "--head-dim 64 --seq-q 1000 --seq-k 777 --causal --batch 2 --heads 3"; do
    echo "== $step $args"
    timeout 60 $S --step $step --dtype bf16 $args 2>&1 | grep -E "PASS|FAIL|error|rror|max abs|worst" | head -4
  done
done
} 2>&1 | tee "$OUT/check.log"
if [[ ${FA10_BENCH:-1} == 1 ]]; then
  for step in ${FA10_STEPS:-10a 10b 10c 10d 10e 10f}; do
    for d in ${FA10_DIMS:-64 128 256}; do
      for causal in "" "--causal"; do
        for n in ${FA10_NS:-4096}; do
          h=$((2048 / d)) b=$((16384 / n))
          echo "== bench $step d=$d N=$n $causal"
          timeout 60 $S --step $step --dtype bf16 --head-dim $d --heads $h --batch $b --seq-q $n --seq-k $n $causal \
            --bench --repeat 20 2>&1 | grep -E "TFLOP|PASS|FAIL|rror" | head -4
        done
      done
    done
  done 2>&1 | tee "$OUT/bench.log"
fi
if [[ ${FA10_TESTS:-0} == 1 ]]; then
  cmake --build $BUILD -j "$(nproc)" --target test_stage10 >>"$OUT/build.log" 2>&1 || { grep -E "error" -A3 "$OUT/build.log" | head -40; exit 1; }
  FA_TEST_SMALL=1 timeout 300 $BUILD/tests/test_stage10 2>&1 | tail -40 | tee "$OUT/test.log"
fi
