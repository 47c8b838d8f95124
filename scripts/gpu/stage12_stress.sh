#!/usr/bin/env bash
# Stage 12's GPU ring under load, with and without compute-sanitizer's initcheck: does a test
# case of test_stage12_gpu ever fail, or initcheck report an uninitialized read, and does it
# depend on the tool or on other processes sharing the GPU? (Issue #20's open question.)
#
#   scripts/gpu/stage12_stress.sh OUT [phases]     phases: any of  alone load serial loaded repro
#                                                  (default: all but repro)
#
#   alone   each test case once, no tool, one process at a time (the baseline)
#   load    LOAD copies of the whole program at once, no tool, ROUNDS rounds: failures without any tool
#   serial  initcheck, one test case per process, one process at a time (FA_TEST_SMALL=1)
#   loaded  initcheck of CASES, one process per case, while LOAD no-tool copies of the program run
#   repro   TOOL on scripts/dev/repro/initcheck_threads.cu (the ring's pattern without the project's
#           code), REPRO_RUNS times alone, then REPRO_RUNS times beside the load
#
# Env: TOOL (initcheck; the sanitizer tool of loaded and repro, "none" for repro without one),
# LOAD (default 12), ROUNDS (2), CASES ("1 3 6 8"), REPRO_ARGS ("8 20": threads, rounds),
# REPRO_RUNS (3), FA_BUDGET_S (550).
# Every process's full output lands in OUT/stage12_stress.log, the verdicts in OUT/stage12_stress.txt.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:?usage: scripts/gpu/stage12_stress.sh OUT [phases]}
shift
PHASES=${*:-alone load serial loaded}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
source scripts/gpu/env.sh  # the CUDA tools on PATH; gpu_configure
BUDGET=${FA_BUDGET_S:-550}
LOAD=${LOAD:-12}
ROUNDS=${ROUNDS:-2}
CASES=${CASES:-1 3 6 8}
REPRO_ARGS=${REPRO_ARGS:-8 20}
REPRO_RUNS=${REPRO_RUNS:-3}
TOOL=${TOOL:-initcheck}
BUILD=$PWD/build-gpu
LOG=$OUT/stage12_stress.log
SUM=$OUT/stage12_stress.txt
SECONDS=0
: >"$LOG"
{
  echo "commit: $(cat .git_head 2>/dev/null || git rev-parse --short=12 HEAD 2>/dev/null)  date: $(date -u +%FT%TZ)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  compute-sanitizer --version 2>/dev/null | tail -1
} >"$SUM"

t0=$SECONDS
gpu_configure . "$BUILD" >>"$LOG" 2>&1 &&
  cmake --build "$BUILD" -j "$(nproc)" --target test_stage12_gpu >>"$LOG" 2>&1 || {
  echo "build FAILED" | tee -a "$SUM"
  tail -40 "$LOG"
  exit 1
}
PROG=$BUILD/tests/test_stage12_gpu
echo "build: $((SECONDS - t0)) s" | tee -a "$SUM"
COUNT=$("$PROG" --count 2>/dev/null | grep -Eo "filters: [0-9]+" | grep -Eo "[0-9]+$")
[[ $COUNT =~ ^[1-9][0-9]*$ ]] || { echo "$PROG --count gave no test cases" | tee -a "$SUM"; exit 1; }
echo "test cases: $COUNT" | tee -a "$SUM"
# Interrupted: stop the load (its loops look for the stop file).
trap '[[ -n ${LOAD_DIR:-} && -d $LOAD_DIR ]] && touch "$LOAD_DIR/stop"' EXIT

# run NAME CAP CMD...: one process; its output into the log under a header; prints "rc seconds".
run() {
  local name=$1 cap=$2 t=$SECONDS out
  shift 2
  out=$(mktemp)
  timeout -k 5 "$cap" "$@" >"$out" 2>&1
  local rc=$?
  {
    echo "################ $name: rc $rc, $((SECONDS - t)) s"
    # doctest's failures and the tool's summary; the full text of a failing run
    if ((rc == 0)); then grep -E "ERROR SUMMARY|test cases:|wrong values" "$out"; else head -c 60000 "$out"; fi
  } >"$out.block"
  cat "$out.block" >>"$LOG"  # one append per run: runs at once do not interleave their blocks
  rm -f "$out.block"
  local errors
  # (the summary's first line; a second one counts the errors past --print-limit)
  errors=$(grep -Eo "ERROR SUMMARY: [0-9]+ errors?$" "$out" | grep -Eo "[0-9]+" | tail -1)
  rm -f "$out"
  echo "$rc $((SECONDS - t)) ${errors:--}"
}
left() { echo $((BUDGET - SECONDS)); }
# The load: LOAD copies of the whole program (no tool), each over and over until stop_load;
# stop_load waits for the runs in flight and prints how many ran and failed.
start_load() {
  LOAD_DIR=$(mktemp -d)
  for ((j = 1; j <= LOAD; ++j)); do  # (each run capped by the time left, so stop_load ends in time)
    (n=0; while [[ ! -e $LOAD_DIR/stop ]] && (($(left) > 10)); do
       n=$((n + 1)); run "load copy $j run $n" $(($(left) < 240 ? $(left) : 240)) "$PROG" >>"$LOAD_DIR/load_$j"
     done) &
  done
}
stop_load() {
  touch "$LOAD_DIR/stop"
  wait
  cat "$LOAD_DIR"/load_* | awk -v c=$LOAD '{n++; if ($1 != 0) f++} END {printf "load: %d copies, %d runs, %d failed\n", c, n, f + 0}' |
    tee -a "$SUM"
  rm -rf "$LOAD_DIR"
}

for phase in $PHASES; do
  case $phase in
  alone)
    echo "-- alone: each case, no tool, one at a time" | tee -a "$SUM"
    for ((i = 1; i <= COUNT; ++i)); do
      (($(left) < 30)) && { echo "case $i: no time left" | tee -a "$SUM"; break; }
      read -r rc s _ < <(run "alone case $i" 120 "$PROG" --first=$i --last=$i)
      echo "case $i: rc $rc, $s s" | tee -a "$SUM"
    done
    ;;
  load)
    echo "-- load: $LOAD copies of the whole program at once, no tool, $ROUNDS rounds" | tee -a "$SUM"
    for ((round = 1; round <= ROUNDS; ++round)); do
      (($(left) < 60)) && { echo "round $round: no time left" | tee -a "$SUM"; break; }
      tmp=$(mktemp -d)
      for ((j = 1; j <= LOAD; ++j)); do
        (run "load round $round copy $j" $(($(left) < 240 ? $(left) : 240)) "$PROG" >"$tmp/$j") &
      done
      wait
      fails=0
      for ((j = 1; j <= LOAD; ++j)); do
        read -r rc s _ <"$tmp/$j"
        ((rc != 0)) && fails=$((fails + 1)) && echo "round $round copy $j: rc $rc, $s s" | tee -a "$SUM"
      done
      echo "round $round: $fails of $LOAD copies failed" | tee -a "$SUM"
      rm -rf "$tmp"
    done
    ;;
  serial)
    echo "-- serial: initcheck, one case per process, one at a time (FA_TEST_SMALL=1)" | tee -a "$SUM"
    for ((i = 1; i <= COUNT; ++i)); do
      (($(left) < 30)) && { echo "case $i: no time left" | tee -a "$SUM"; break; }
      read -r rc s e < <(FA_TEST_SMALL=1 run "initcheck case $i" 200 compute-sanitizer --tool initcheck \
        --error-exitcode 86 --print-limit 10 "$PROG" --first=$i --last=$i)
      echo "case $i: rc $rc, $s s, errors $e" | tee -a "$SUM"
    done
    ;;
  loaded)
    echo "-- loaded: $TOOL of cases $CASES (FA_TEST_SMALL=1), beside $LOAD no-tool copies" | tee -a "$SUM"
    (($(left) < 90)) && { echo "no time left" | tee -a "$SUM"; continue; }
    start_load
    tmp=$(mktemp -d)
    pids=()
    for i in $CASES; do
      (FA_TEST_SMALL=1 run "loaded: $TOOL case $i" $(($(left) - 30)) compute-sanitizer --tool "$TOOL" \
        --error-exitcode 86 --print-limit 10 "$PROG" --first=$i --last=$i >"$tmp/case_$i") &
      pids+=($!)
    done
    wait "${pids[@]}"
    stop_load
    for i in $CASES; do
      read -r rc s e <"$tmp/case_$i"
      echo "case $i: rc $rc, $s s, errors $e" | tee -a "$SUM"
    done
    rm -rf "$tmp"
    ;;
  repro)
    # scripts/dev/repro/initcheck_threads.cu: the ring's pattern with none of the project's code.
    echo "-- repro: $TOOL on scripts/dev/repro/initcheck_threads.cu ($REPRO_ARGS), alone, then beside $LOAD no-tool copies" |
      tee -a "$SUM"
    nvcc -O2 -std=c++17 -arch=sm_90 scripts/dev/repro/initcheck_threads.cu -o "$BUILD/initcheck_threads" >>"$LOG" 2>&1 ||
      { echo "repro build FAILED" | tee -a "$SUM"; continue; }
    for mode in alone loaded; do
      [[ $mode == loaded ]] && start_load
      for ((k = 1; k <= REPRO_RUNS; ++k)); do
        (($(left) < 40)) && break
        tool=(compute-sanitizer --tool "$TOOL" --error-exitcode 86 --print-limit 10)
        [[ $TOOL == none ]] && tool=()
        read -r rc s e < <(run "repro $TOOL $mode $k" $(($(left) - 30)) ${tool[@]+"${tool[@]}"} \
          "$BUILD/initcheck_threads" $REPRO_ARGS)
        echo "repro $mode run $k: rc $rc, $s s, errors $e" | tee -a "$SUM"
      done
      [[ $mode == loaded ]] && stop_load
    done
    ;;
  *) echo "unknown phase $phase" >&2; exit 2 ;;
  esac
done
echo "total: $SECONDS s" | tee -a "$SUM"
