#!/usr/bin/env bash
# Stage 14 (decoding) on the GPU machine, in one call of at most ten minutes: build the
# stage's targets, run its tests (the CPU ones, the kernels on CPU threads, the GPU ones),
# compute-sanitizer on the small GPU tests and on one call of every step, the CLI check of
# every step, and the benchmark sweep of issue 33 into one CSV (with PyTorch's SDPA backends on
# the same shapes, where torch imports).
#
#   bash scripts/gpu/stage14.sh [--part 1|2|3] [OUT]      OUT (default $OUT, else ./gpu_out) receives:
#     build.log, tests.log, sanitizer.log, check.log, bench.log
#     stage14_bench.csv   device,commit,date,step,dtype,batch,heads,kv_heads,head_dim,q_len,cache,
#                         block_size,splits,ms,kv_gbs,copy_gbs,pct_of_copy   (one row per step and shape)
#     stage14_sdpa.csv    the same shapes through F.scaled_dot_product_attention, per backend
#     summary.txt         one line per part: PASS / FAIL / SKIPPED
#   --part: 1 build, tests, CLI check (~3 min); 2 compute-sanitizer (~3 min); 3 the sweep
#   (~5 min). Without it, all three (about ten minutes: where one call is limited to ten
#   minutes, run the parts one by one; each part builds what is missing, so 2 and 3 reuse 1's
#   build on the same machine).
#   env: FA14_SANITIZE=0 skips compute-sanitizer, FA14_BENCH=0 the sweep, FA14_SDPA=0 the SDPA
#        side; FA14_QUICK=1 sweeps batch 1 and 8 at caches 1k and 32k only; FA14_JOBS build
#        jobs (default 16).
set -uo pipefail
cd "$(dirname "$0")/../.."
PART=all
if [[ ${1:-} == --part ]]; then PART=$2; shift 2; fi
OUT=${1:-${OUT:-./gpu_out}}
mkdir -p "$OUT"
source scripts/gpu/env.sh  # the CUDA tools on PATH; gpu_configure
BUILD=build-gpu
SUMMARY="$OUT/summary.txt"
[[ $PART == all || $PART == 1 ]] && : >"$SUMMARY"
run_part() { [[ $PART == all || $PART == "$1" ]]; }
note() { echo "$1" | tee -a "$SUMMARY"; }

DEVICE=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | tr ',' ' ')
COMMIT=${FA_COMMIT:-$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)}
DATE=$(date -u +%FT%T+00:00)
note "device: ${DEVICE:-unknown}; commit $COMMIT; $DATE"

# --- build: only stage 14's targets (Release, sm_90)
gpu_configure . $BUILD -DFA_BUILD_TORCH=OFF >"$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; note "build: FAIL (configure)"; exit 1; }
if ! cmake --build $BUILD -j "${FA14_JOBS:-16}" --target stage14 test_stage14_cpu test_stage14_emu test_stage14_gpu >>"$OUT/build.log" 2>&1; then
  grep -E "error" -A3 "$OUT/build.log" | head -60
  note "build: FAIL"
  exit 1
fi
note "build: PASS"
S=$BUILD/stages/14_decode/stage14
T=$BUILD/tests

# --- tests
if run_part 1; then
{
  echo "== test_stage14_cpu"; timeout 120 $T/test_stage14_cpu; echo "rc=$?"
  echo "== test_stage14_emu"; timeout 120 $T/test_stage14_emu; echo "rc=$?"
  echo "== test_stage14_gpu"; timeout 300 $T/test_stage14_gpu; echo "rc=$?"
} >"$OUT/tests.log" 2>&1
for t in cpu emu gpu; do
  rc=$(awk -v t="== test_stage14_$t" '$0==t{f=1;next} f&&/^rc=/{sub("rc=","");print;exit}' "$OUT/tests.log")
  [[ $rc == 0 ]] && note "test_stage14_$t: PASS" || note "test_stage14_$t: FAIL (rc=$rc; see tests.log)"
done

# --- every step through the program, checked, on a few shapes (contiguous: 14a–14e; paged: 14d, 14e);
# the append is checked where every length counts the new tokens (a length 0 cannot)
{
  for args in "--lens 1000,1,0,4097 --q-len 1" "--lens 300,77 --q-len 4 --heads 32 --kv-heads 4 --append" \
              "--lens 513,16 --q-len 16 --heads 8 --kv-heads 8 --head-dim 64 --dtype f16 --append"; do
    for step in 14a 14b 14c 14d 14e; do
      echo "== $step $args"
      timeout 60 $S --step $step $args 2>&1 | grep -E "launch|PASS|FAIL|rror|^14_decode"
    done
  done
  for block in 16 64 256; do
    for step in 14d 14e; do
      echo "== $step paged $block"
      timeout 60 $S --step $step --block-size $block --lens 5000,17,1,300 --q-len 1 --append 2>&1 | grep -E "launch|PASS|FAIL|rror|^14_decode"
      timeout 60 $S --step $step --block-size $block --lens 5000,17,0,300 --q-len 4 2>&1 | grep -E "launch|PASS|FAIL|rror|^14_decode"
    done
  done
} >"$OUT/check.log" 2>&1
if grep -q -E "FAIL|rror|^14_decode" "$OUT/check.log"; then note "cli check: FAIL (see check.log)"; else note "cli check: PASS ($(grep -c "result PASS" "$OUT/check.log") runs)"; fi
fi  # part 1

# --- compute-sanitizer: memcheck over the small GPU tests; racecheck, synccheck, initcheck on
# one call of every step (a split one, a paged one, the append)
if ! run_part 2; then
  :
elif [[ ${FA14_SANITIZE:-1} == 1 ]] && command -v compute-sanitizer >/dev/null; then
  {
    echo "== memcheck test_stage14_gpu (FA_TEST_SMALL=1)"
    FA_TEST_SMALL=1 timeout 240 compute-sanitizer --tool memcheck --error-exitcode 9 $T/test_stage14_gpu 2>&1 | tail -15
    echo "rc=${PIPESTATUS[0]}"
    for tool in racecheck synccheck initcheck; do
      for step in 14a 14b 14c 14d 14e; do
        echo "== $tool $step"
        timeout 60 compute-sanitizer --tool $tool --error-exitcode 9 $S --step $step --lens 100,37 --heads 8 \
          --kv-heads 2 --q-len 4 --splits 3 --append 2>&1 | grep -E "ERROR SUMMARY|PASS|FAIL|rror" | head -5
        echo "rc=${PIPESTATUS[0]}"
      done
      for step in 14d 14e; do
        echo "== $tool $step paged"
        timeout 60 compute-sanitizer --tool $tool --error-exitcode 9 $S --step $step --block-size 16 --lens 100,37 \
          --heads 8 --kv-heads 2 --q-len 4 --splits 3 --append 2>&1 | grep -E "ERROR SUMMARY|PASS|FAIL|rror" | head -5
        echo "rc=${PIPESTATUS[0]}"
      done
    done
  } >"$OUT/sanitizer.log" 2>&1
  bad=$(grep -c -E "^rc=[^0]" "$OUT/sanitizer.log")
  [[ $bad == 0 ]] && note "compute-sanitizer: PASS" || note "compute-sanitizer: FAIL ($bad runs; see sanitizer.log)"
else
  note "compute-sanitizer: SKIPPED"
fi

# --- the benchmark sweep of issue 33: bf16, d = 128, 32 query heads over 8 KV heads
if run_part 3 && [[ ${FA14_BENCH:-1} == 1 ]]; then
  CSV="$OUT/stage14_bench.csv"
  echo "device,commit,date,step,dtype,batch,heads,kv_heads,head_dim,q_len,cache,block_size,splits,ms,kv_gbs,copy_gbs,pct_of_copy" >"$CSV"
  ROWS=$(mktemp)
  # The full grid times the last two steps (14a–14c take minutes at batch 64 and 128k keys);
  # the quick one every step, to show what each buys.
  batches="1 8 64" caches="1024 8192 32768 131072" steps="14d 14e"
  [[ ${FA14_QUICK:-0} == 1 ]] && batches="1 8" caches="1024 32768" steps="14a 14b 14c 14d 14e"
  {
    for b in $batches; do
      for n in $caches; do
        for q in 1 4; do
          for step in $steps; do
            echo "== $step batch=$b cache=$n q_len=$q contiguous"
            timeout 60 $S --step $step --batch $b --cache $n --q-len $q --no-check --bench --repeat 10 --csv "$ROWS" 2>&1 \
              | grep -E "launch|time|bandwidth|rror"
          done
          for block in 16 256; do
            echo "== 14e batch=$b cache=$n q_len=$q paged $block"
            timeout 60 $S --step 14e --batch $b --cache $n --q-len $q --block-size $block --no-check --bench --repeat 10 \
              --csv "$ROWS" 2>&1 | grep -E "launch|time|bandwidth|rror"
          done
        done
      done
    done
  } >"$OUT/bench.log" 2>&1
  awk -v d="$DEVICE" -v c="$COMMIT" -v t="$DATE" '{print d "," c "," t "," $0}' "$ROWS" >>"$CSV"
  rm -f "$ROWS"
  note "bench: $(($(wc -l <"$CSV") - 1)) rows in stage14_bench.csv"
  if [[ ${FA14_SDPA:-1} == 1 ]] && python3 -c "import torch" 2>/dev/null; then
    timeout 300 python3 scripts/bench/bench_decode_sdpa.py --out "$OUT/stage14_sdpa.csv" --batches $batches --caches $caches \
      --commit "$COMMIT" --date "$DATE" \
      >>"$OUT/bench.log" 2>&1 && note "sdpa: $(($(wc -l <"$OUT/stage14_sdpa.csv") - 1)) rows in stage14_sdpa.csv" \
      || note "sdpa: FAIL (see bench.log)"
  else
    note "sdpa: SKIPPED"
  fi
fi
cat "$SUMMARY"
