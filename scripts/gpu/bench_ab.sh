#!/usr/bin/env bash
# Two versions of the GPU stages timed side by side on one machine: did a change move them?
#
#   git archive <before-commit> | (mkdir -p .base && tar -x -C .base)   # on the build machine
#   scripts/gpu/bench_ab.sh .base OUT                                     # on the GPU machine
#
# Builds libfa_c.so from the tree in BASE (the "before") and from this tree (the "after"),
# then runs this tree's scripts/bench/bench_gpu.py on each, alternating before/after in rounds while
# the time budget lasts, so both see the same GPU, clocks and PyTorch. The same script times
# both, so a difference is the stages', not the harness's. Then scripts/results/compare_bench.py
# compares each stage's ratio to its baseline (FlashAttention-2 for 08/09) point by point,
# round by round, and finally `bench_gpu.py --steps` times the steps of 08 and 09.
#
# env: FA_AB_BUDGET_S (default 540), FA_AB_ARGS (bench arguments, default --stages 07,08,09),
#      FA_AB_STEPS=0 skips the steps run, FA_BASE_COMMIT (recorded in the before rows).
# Writes at most 8 files to OUT: before_N.csv/after_N.csv of the first two rounds, steps.csv,
# compare.txt, bench.log (everything printed), build.log.
set -uo pipefail
cd "$(dirname "$0")/../.."
BASE=${1:?usage: scripts/gpu/bench_ab.sh BASE_TREE OUT}
OUT=${2:-${OUT:-./gpu_out}}
mkdir -p "$OUT"
BASE=$(cd "$BASE" && pwd)
start=$SECONDS
budget=${FA_AB_BUDGET_S:-540}
source scripts/gpu/env.sh  # the CUDA tools on PATH; gpu_configure
after_commit=${FA_COMMIT:-$(cat .git_head 2>/dev/null || echo unknown)}
before_commit=${FA_BASE_COMMIT:-before}
log=$OUT/bench.log

build() {  # build(tree): libfa_c.so in tree/build-gpu
  local tree=$1
  gpu_configure "$tree" "$tree/build-gpu" >>"$OUT/build.log" 2>&1 &&
  cmake --build "$tree/build-gpu" -j "$(nproc)" --target fa_c >>"$OUT/build.log" 2>&1
}
for tree in "$BASE" "$PWD"; do
  if ! build "$tree"; then
    echo "build failed in $tree"; grep -E "error" -A3 "$OUT/build.log" | head -40; exit 1
  fi
done
echo "built both libraries in $((SECONDS - start)) s" | tee -a "$log"

bench() {  # bench(tree, commit, csv, seconds)
  FA_COMMIT=$2 timeout -k 10 "$4" python3 scripts/bench/bench_gpu.py --lib "$1/build-gpu/stages/libfa_c.so" \
    --commit "$2" --out "$3" ${FA_AB_ARGS:---stages 07,08,09} >>"$log" 2>&1
  echo "bench $2 -> $(basename "$3"): rc $? after $((SECONDS - start)) s" | tee -a "$log"
}
steps_cost=$(( ${FA_AB_STEPS:-1} == 1 ? 100 : 0 ))
round=0 last=0
while :; do
  left=$((budget - (SECONDS - start) - steps_cost))
  (( round > 0 && left < last + 20 )) && break
  (( left < 60 )) && break
  round=$((round + 1)); t0=$SECONDS
  keep=$OUT; (( round > 2 )) && keep=$(mktemp -d)  # only two rounds' CSVs come back
  if (( round % 2 == 1 )); then order=(before after); else order=(after before); fi
  for which in "${order[@]}"; do
    if [[ $which == before ]]; then bench "$BASE" "$before_commit" "$keep/before_$round.csv" $((left / 2))
    else bench "$PWD" "$after_commit" "$keep/after_$round.csv" $((left / 2)); fi
  done
  last=$((SECONDS - t0))
  { echo "== round $round (order: ${order[*]})"
    python3 scripts/results/compare_bench.py "$keep/before_$round.csv" "$keep/after_$round.csv" | tail -6
  } | tee -a "$OUT/compare.txt"
done
{ echo "== round 1, every point"
  python3 scripts/results/compare_bench.py "$OUT/before_1.csv" "$OUT/after_1.csv"
} >>"$OUT/compare.txt"
if [[ ${FA_AB_STEPS:-1} == 1 ]]; then
  left=$((budget - (SECONDS - start)))
  (( left > 40 )) && FA_COMMIT=$after_commit timeout -k 10 "$left" python3 scripts/bench/bench_gpu.py \
    --lib build-gpu/stages/libfa_c.so --commit "$after_commit" --out "$OUT/steps.csv" --steps >>"$log" 2>&1
  echo "steps: rc $? after $((SECONDS - start)) s" | tee -a "$log"
fi
sed -n '/==== bench_gpu summary ====/,$p' "$log" | tail -60
echo "total $((SECONDS - start)) s"
