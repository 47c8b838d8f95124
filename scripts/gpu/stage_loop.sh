#!/usr/bin/env bash
# One Hopper stage's short loop on the GPU machine, stage 10 or 11: build the stage program,
# check every step on a few shapes through the CLI, run the stage's test program at small
# sizes (FA_TEST_SMALL=1), and time the steps. For iterating on one kernel;
# scripts/gpu/check.sh is the full check.
#
#   scripts/gpu/stage_loop.sh 10|11 [OUT]      OUT: the argument, else $OUT, else ./gpu_out
#
# What differs between the two stages is the table below and how each is timed. env:
#   stage 10  FA10_TESTS=1 also runs test_stage10 (default: not), FA10_BENCH=0 skips the
#             timings; FA10_CHECK_STEPS, FA10_STEPS, FA10_DIMS and FA10_NS narrow the check and
#             the timings (the stage program's own --bench: step × d × mask × N)
#   stage 11  FA11_TESTS=0 skips the tests, FA11_BENCH=0 the timings: the backward (forward by
#             stage 10, backward by the step) against SDPA's flash and cuDNN backends through
#             scripts/bench/bench_gpu.py, with FA11_BENCH_ARGS (default --quick)
set -uo pipefail
cd "$(dirname "$0")/../.."
STAGE=${1:?usage: scripts/gpu/stage_loop.sh 10|11 [OUT]}
OUT=${2:-${OUT:-./gpu_out}}
BUILD=build-gpu

# The shapes of the check: tails, seq_q ≠ seq_k, GQA, batch and heads > 1, both masks.
shapes=("--head-dim 64 --seq-q 300 --seq-k 513 --heads 4 --kv-heads 2 --causal"
        "--head-dim 128 --seq-q 257 --seq-k 1000"
        "--head-dim 128 --seq-q 1025 --seq-k 1025 --causal")
case $STAGE in
  # the program, the pass, the lines kept per check, the modes checked; tests and timings
  10) program=stages/10_hopper_fwd/stage10 pass="" lines=4
      modes=(); for step in ${FA10_CHECK_STEPS:-10a 10b 10c 10d 10e 10f}; do modes+=("--step $step"); done
      tests=${FA10_TESTS:-0} bench=${FA10_BENCH:-1} bench_targets=()
      shapes+=("--head-dim 256 --seq-q 190 --seq-k 190 --causal --batch 2") ;;  # d = 256: stage 10 only
  11) program=stages/11_hopper_bwd/stage11 pass=--backward lines=8
      modes=("--step 11a" "--step 11b" "--step 11c" "--step 11d" "--deterministic")
      tests=${FA11_TESTS:-1} bench=${FA11_BENCH:-1} bench_targets=(fa_c) ;;
  *) echo "stage_loop.sh: the stage is 10 or 11 (got '$STAGE')" >&2; exit 2 ;;
esac
shapes+=("--head-dim 64 --seq-q 1000 --seq-k 777 --causal --batch 2 --heads 3")

bench_10() {  # every step × d × mask × N at batch·N = 16384, heads·d = 2048, by the CLI
  for step in ${FA10_STEPS:-10a 10b 10c 10d 10e 10f}; do
    for d in ${FA10_DIMS:-64 128 256}; do
      for causal in "" "--causal"; do
        for n in ${FA10_NS:-4096}; do
          h=$((2048 / d)) b=$((16384 / n))
          echo "== bench $step d=$d N=$n $causal"
          timeout 60 $BUILD/$program --step $step --dtype bf16 --head-dim $d --heads $h --batch $b --seq-q $n \
            --seq-k $n $causal --bench --repeat 20 2>&1 | grep -E "TFLOP|PASS|FAIL|rror" | head -4
        done
      done
    done
  done 2>&1 | tee "$OUT/bench.log"
}
bench_11() {  # the steps' backward beside SDPA's backends, in one process
  FA_COMMIT=${FA_COMMIT:-$(cat .git_head 2>/dev/null || echo unknown)} timeout 400 python3 scripts/bench/bench_gpu.py \
    --lib $BUILD/stages/libfa_c.so --stages 11 --hopper ${FA11_BENCH_ARGS:---quick} --out "$OUT/bench11.csv" \
    2>&1 | tail -60 | tee "$OUT/bench.log"
}

mkdir -p "$OUT"
source scripts/gpu/env.sh  # the CUDA tools on PATH; gpu_configure
gpu_configure . $BUILD >"$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
targets=("stage$STAGE")
[[ $tests == 1 ]] && targets+=("test_stage$STAGE")
[[ $bench == 1 ]] && targets+=(${bench_targets[@]+"${bench_targets[@]}"})
cmake --build $BUILD -j "$(nproc)" --target "${targets[@]}" >>"$OUT/build.log" 2>&1 ||
  { grep -E "error" -A3 "$OUT/build.log" | head -60; exit 1; }
for mode in "${modes[@]}"; do
  for args in "${shapes[@]}"; do
    echo "== $mode $args"
    timeout 60 $BUILD/$program $mode $pass --dtype bf16 $args 2>&1 | grep -E "PASS|FAIL|error|rror|max abs|worst" | head -$lines
  done
done 2>&1 | tee "$OUT/check.log"
if [[ $tests == 1 ]]; then
  FA_TEST_SMALL=1 timeout 300 $BUILD/tests/test_stage$STAGE 2>&1 | tail -40 | tee "$OUT/test.log"
fi
if [[ $bench == 1 ]]; then
  bench_$STAGE
fi
