#!/usr/bin/env bash
# The GPU machine's one command: configure (Release, sm_90), build, run every test (CPU and
# GPU), run compute-sanitizer (memcheck, racecheck, initcheck) over the GPU test programs at
# small sizes, then the side-by-side benchmark. Logs and the CSV go to OUT; a summary table
# is printed last.
#
#   scripts/gpu/check.sh [--part N] [OUT]   OUT: the argument, else $OUT, else ./gpu_out
#   scripts/gpu/check.sh --join OUT1 OUT2 …   one summary of the parts' summary.txt
#
# The whole check does not fit one device call of ten minutes, so it runs in four parts, one
# call each (each builds: about 60–100 s on 16 cores from nothing, 3–20 s after another part
# on the same machine). Times on one H100, each part with the default budget, from
# docs/results/h100_gpu_check_2026-11-27_session17.txt (build time first, then the rest):
#   --part 1   build, every test (ctest), the SASS check, the benchmark sweep   76 + 195 s
#   --part 2   compute-sanitizer over the programs of stages 07, 08, 09 and
#              test_gpu_bad_input                                           3 + 206 s
#   --part 3   compute-sanitizer over the programs of stages 10, 11 and 13 (Hopper)
#                                                                          66 + 106 s
#   --part 4   compute-sanitizer over stage 12's ring on one GPU (test_stage12_gpu),
#              an initcheck case run again after a failed first attempt   3 + 258 s
#              (session 16 on an H200: three cases failed a first attempt under initcheck, 99 + 269 s)
# Stage 12's ring has a part of its own since stage 10's sixth step (10f): together with 10
# and 11, its racecheck and initcheck jobs ran out of their time (224 s).
# No --part runs everything in one go (within FA_BUDGET_S: on one H100 the sanitizers then
# run out of time).
# On a machine with several GPUs, scripts/gpu/stage12_scaling.sh adds what one GPU cannot
# show: stage 12's ring over NCCL, fa_attention.distributed under NCCL (torchrun), and the
# scaling sweep.
#
# Needs the header-only dependencies in .deps/usr (scripts/setup/vendor_deps.sh makes it; the
# GPU machine has no network). Environment:
#   FA_COMMIT          commit named in the CSV rows (default: git rev-parse, else "unknown")
#   FA_BUDGET_S        seconds for the whole script (default 510: it must end within 9 minutes)
#   FA_BENCH_ARGS      extra arguments for scripts/bench/bench_gpu.py (e.g. "--quick --stages 07")
#   FA_SKIP_CTEST=1, FA_SKIP_SANITIZER=1, FA_SKIP_BENCH=1   leave a step out
#   FA_SANITIZE        space-separated test programs to sanitize (default: every GPU test program)
#   FA_SANITIZER_JOBS  sanitizer jobs at once (default: one per CPU core, at most 16 per GPU; 1 runs
#                      them one after another, e.g. to tell a failure under load from one alone)
# OUT holds at most 8 files (what the device tool brings back): build.log, ctest.log,
# ctest_junit.xml, sanitizer.log, bench.log, bench_gpu.csv, summary.txt. The CSV is meant to
# be committed as docs/results/h200_bench_gpu.csv (device, commit and date are in each row).
# Exit code: 0 when the build, every test, every sanitizer run and the benchmark checks pass.
set -euo pipefail
# --join: the parts' summaries one after another, and one verdict over all of them.
if [[ ${1:-} == --join ]]; then
  shift
  bad=0
  for dir in "$@"; do
    if [[ ! -f $dir/summary.txt ]]; then echo "gpu_check --join: $dir/summary.txt is missing" >&2; exit 2; fi
    cat "$dir/summary.txt"
    echo
    # A step's result (third column) or a sanitizer row's verdict that is not ok/skipped.
    if grep -Eq "FAILED|TIMED OUT|NOT RUN|ERRORS" "$dir/summary.txt"; then bad=1; fi
  done
  if ((bad)); then echo "==== joined: FAILED (a part above says where)"; else echo "==== joined: every part passed"; fi
  exit "$bad"
fi

cd "$(dirname "$0")/../.."
ROOT=$PWD

PART=all
if [[ ${1:-} == --part ]]; then
  PART=${2:-}
  shift 2 || true
  case $PART in
    1) FA_SKIP_SANITIZER=1 ;;
    2) FA_SKIP_CTEST=1 FA_SKIP_BENCH=1 FA_SKIP_SASS=1
       FA_SANITIZE="test_stage07 test_stage08 test_stage09 test_gpu_bad_input" ;;
    3) FA_SKIP_CTEST=1 FA_SKIP_BENCH=1 FA_SKIP_SASS=1 FA_SANITIZE="test_stage10 test_stage11 test_stage13_gpu" ;;
    4) FA_SKIP_CTEST=1 FA_SKIP_BENCH=1 FA_SKIP_SASS=1 FA_SANITIZE="test_stage12_gpu" SANITIZER_SHARE=85 ;;
    *) echo "gpu_check: --part takes 1, 2, 3 or 4 (got '$PART')" >&2; exit 2 ;;
  esac
fi
OUT=${1:-${OUT:-./gpu_out}}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
BUDGET=${FA_BUDGET_S:-510}
BUILD=$ROOT/build-gpu
JOBS=$(nproc 2>/dev/null || echo 16)
COMMIT=${FA_COMMIT:-$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)}
export FA_COMMIT=$COMMIT
source scripts/gpu/env.sh  # the CUDA tools on PATH; gpu_configure
SECONDS=0
status=()   # one "step|result|seconds" line per step
failed=0

note() { printf '\n=== [%3ds] %s\n' "$SECONDS" "$*"; }
record() { status+=("$1|$2|$3"); if [[ $2 != ok* && $2 != skipped* ]]; then failed=1; fi; }
# Seconds left for a step: a share of what remains, at least `min`.
share() { local left=$((BUDGET - SECONDS)); local s=$((left * $1 / 100)); ((s < $2)) && s=$2; echo "$s"; }

# ---- 1. configure and build ------------------------------------------------------------
note "configure + build (Release, sm_90) in $BUILD"
t0=$SECONDS
{
  echo "commit: $COMMIT   date: $(date -u +%FT%TZ)   host: $(hostname)"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1 || true
  nvcc --version 2>&1 | tail -2 || true
  cmake --version | head -1
} >"$OUT/build.log"
keep_going=(-- -k)
((${#FA_GENERATOR[@]})) && keep_going=(-- -k 0)  # Ninja's way of keeping going
if [[ ! -d .deps/usr ]]; then
  echo ".deps/usr is missing: run scripts/setup/vendor_deps.sh on a machine with the Debian packages" |
    tee -a "$OUT/build.log"
fi
if gpu_configure . "$BUILD" >>"$OUT/build.log" 2>&1 &&
   cmake --build "$BUILD" -j "$JOBS" "${keep_going[@]}" >>"$OUT/build.log" 2>&1; then
  record build ok $((SECONDS - t0))
else
  # Keep going: whatever did build (other stages, their tests) is still worth running.
  record build "FAILED (what built is tested below; see build.log)" $((SECONDS - t0))
  grep -E "error|FAILED" "$OUT/build.log" | head -20 || true
fi
echo "build: $((SECONDS - t0)) s (log: $OUT/build.log)"
if [[ ! -f $BUILD/CTestTestfile.cmake ]]; then
  printf '%s\n' "configure failed; nothing else can run (see build.log)" | tee "$OUT/summary.txt"
  tail -30 "$OUT/build.log"
  exit 1
fi

# ---- 2. every test, CPU and GPU --------------------------------------------------------
note "ctest (all tests; FA_TEST_LARGE=1 adds the > 2^31-element case)"
t0=$SECONDS
cap=$(share 40 120)
set +e
if [[ ${FA_SKIP_CTEST:-0} == 1 ]]; then
  echo "ctest skipped (FA_SKIP_CTEST=1)" >"$OUT/ctest.log"; rc=0
else
  FA_TEST_LARGE=1 timeout -k 10 "$cap" ctest --test-dir "$BUILD" --output-on-failure \
    -j "$JOBS" --timeout "$cap" --output-junit "$OUT/ctest_junit.xml" >"$OUT/ctest.log" 2>&1
  rc=$?
fi
set -e
ctest_line=$(grep -E "tests passed|tests failed" "$OUT/ctest.log" | tail -1 || true)
if [[ ${FA_SKIP_CTEST:-0} == 1 ]]; then record ctest "skipped (FA_SKIP_CTEST=1)" 0
elif ((rc == 0)); then record ctest "ok: $ctest_line" $((SECONDS - t0))
elif ((rc == 124 || rc == 137)); then record ctest "TIMED OUT after ${cap}s" $((SECONDS - t0))
else record ctest "FAILED: ${ctest_line:-rc $rc}" $((SECONDS - t0)); fi
grep -E "^\s*[0-9]+/[0-9]+ Test|tests passed|Total Test time" "$OUT/ctest.log" | tail -60 || true

# ---- 3. compute-sanitizer over the GPU test programs, small sizes ----------------------
gpu_tests=()
for n in 07 08 09 10 11; do
  [[ -x $BUILD/tests/test_stage$n ]] && gpu_tests+=("$BUILD/tests/test_stage$n")
done
# Bad input through the C ABI's device entry points, every GPU stage (a doctest program too).
[[ -x $BUILD/tests/test_gpu_bad_input ]] && gpu_tests+=("$BUILD/tests/test_gpu_bad_input")

# ---- stage 12 (ring attention) ---------------------------------------------------------
# The ring of virtual ranks on one GPU (test_stage12_gpu) under the same tools as the stages
# above. Its NCCL test (test_stage12_nccl) needs two or more GPUs: it runs in the ctest step
# and reports itself skipped on one GPU.
[[ -x $BUILD/tests/test_stage12_gpu ]] && gpu_tests+=("$BUILD/tests/test_stage12_gpu")
# ---- end of stage 12 -------------------------------------------------------------------
# Stage 13's Hopper forward and backward under the document mask and score modifiers.
[[ -x $BUILD/tests/test_stage13_gpu ]] && gpu_tests+=("$BUILD/tests/test_stage13_gpu")
# FA_SANITIZE="test_stage11 test_stage12_gpu": only these programs (a re-check after a change).
if [[ -n ${FA_SANITIZE:-} ]]; then
  chosen=()
  for prog in "${gpu_tests[@]}"; do [[ " $FA_SANITIZE " == *" $(basename "$prog") "* ]] && chosen+=("$prog"); done
  gpu_tests=(${chosen[@]+"${chosen[@]}"})
fi
: >"$OUT/sanitizer.log"
sanitizer_rows=()
if [[ ${FA_SKIP_SANITIZER:-0} == 1 ]]; then
  record sanitizer "skipped (FA_SKIP_SANITIZER=1)" 0
elif ! command -v compute-sanitizer >/dev/null; then
  record sanitizer "NOT RUN: compute-sanitizer not found" 0
elif ((${#gpu_tests[@]} == 0)); then
  record sanitizer "NOT RUN: no GPU test programs in $BUILD/tests" 0
else
  note "compute-sanitizer memcheck, racecheck, initcheck (FA_TEST_SMALL=1), in parallel"
  t0=$SECONDS
  # A job's time limit: half of what is left (part 4, stage 12 alone, gives a job 85%: its
  # racecheck of every ring size took 254 s and more on an H200).
  cap=$(share "${SANITIZER_SHARE:-50}" 90)
  tmp=$(mktemp -d)
  # One job: a program (or one of its test cases, by doctest's 1-based --first/--last index)
  # under one tool; log and exit code land in $tmp/<job name>.{log,rc}.
  # With several GPUs the jobs take them in turn (CUDA_VISIBLE_DEVICES), one GPU each.
  gpu_count=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
  ((gpu_count >= 1)) || gpu_count=1
  launched=0
  sanitize() {  # prog tool job-name [test-case index]
    local extra=() device=$((launched % gpu_count))
    [[ -n ${4:-} ]] && extra=(--first="$4" --last="$4")
    (set +e
     [[ $gpu_count -gt 1 ]] && export CUDA_VISIBLE_DEVICES=$device
     FA_TEST_SMALL=1 timeout -k 10 "$cap" compute-sanitizer --tool "$2" \
       --error-exitcode 86 --print-limit 20 "$1" ${extra[@]+"${extra[@]}"} >"$tmp/$3.log" 2>&1
     echo $? >"$tmp/$3.rc")
  }
  # memcheck and initcheck run each program whole. racecheck is several times slower (stage
  # 09's tests take minutes under it), so it runs one process per test case; all jobs share
  # a pool of one per CPU core, the long whole-program jobs started first.
  slots=$JOBS
  ((slots > 16 * gpu_count)) && slots=$((16 * gpu_count))
  [[ ${FA_SANITIZER_JOBS:-} =~ ^[1-9][0-9]*$ ]] && slots=$FA_SANITIZER_JOBS
  # The tools a program runs one test case per process; the others of memcheck and initcheck
  # run it whole. Stages 10 and 11 run every tool per case (their matrices cover several
  # kernels in two dtypes), synccheck too: the Hopper kernels' named barriers and warp roles.
  # Stage 12's ring runs one test case per process under every tool, to keep each job short.
  per_case_tools() {
    case $1 in
      test_stage10|test_stage11|test_stage13_gpu) echo memcheck racecheck initcheck synccheck ;;
      test_stage12_gpu) echo memcheck racecheck initcheck ;;
      *) echo racecheck ;;
    esac
  }
  # The tools a program runs with the GPU to itself, after the parallel jobs, one job at a time.
  # With other processes on the GPU, initcheck reports uninitialized reads in stage 12's ring
  # that are not there, and stops test cases with an illegal address; memcheck under the same
  # load is clean, and scripts/dev/repro/initcheck_threads.cu (several host threads and streams,
  # none of the project's code) shows both symptoms too (docs/results/
  # h200_gpu_check_2026-11-25_session8.txt). Alone, the same runs are clean.
  # test_gpu_bad_input calls every GPU stage, stage 12's ring among them, so the same holds for it.
  alone_tools() {
    case $1 in
      test_stage12_gpu|test_gpu_bad_input) echo initcheck ;;
    esac
  }
  declare -A pieces=() per_case=()
  jobs_list=()
  alone_list=()
  for prog in "${gpu_tests[@]}"; do
    base=$(basename "$prog")
    count=$(FA_TEST_SMALL=1 "$prog" --count 2>/dev/null | grep -Eo "filters: [0-9]+" | grep -Eo "[0-9]+" || true)
    pieces[$base]=${count:-0}
    per_case[$base]=" $(per_case_tools "$base") "
    for tool in memcheck initcheck; do
      [[ ${per_case[$base]} == *" $tool "* ]] && continue
      job="$prog|$tool|${base}_$tool|"
      if [[ " $(alone_tools "$base") " == *" $tool "* ]]; then alone_list+=("$job"); else jobs_list+=("$job"); fi
    done
  done
  for prog in "${gpu_tests[@]}"; do
    base=$(basename "$prog")
    for tool in ${per_case[$base]}; do
      for ((i = 1; i <= ${pieces[$base]}; ++i)); do
        job="$prog|$tool|${base}_${tool}_$i|$i"
        if [[ " $(alone_tools "$base") " == *" $tool "* ]]; then alone_list+=("$job"); else jobs_list+=("$job"); fi
      done
    done
  done
  for job in "${jobs_list[@]}"; do
    IFS='|' read -r prog tool name index <<<"$job"
    while (($(jobs -rp | wc -l) >= slots)); do wait -n || true; done
    sanitize "$prog" "$tool" "$name" "$index" &
    launched=$((launched + 1))
  done
  wait || true
  # The GPU to themselves, one after another, each capped by its share of the time left but
  # given at least a minute while one is left (most take seconds; a job with no time left is
  # recorded as timed out, with a log that says so).
  # Even alone, initcheck on a program whose ranks are host threads reports errors now and then
  # that the next run of the same case does not (session 15, H200: stage 12's shape matrix 32
  # errors in one run of three, its d = 256 case an illegal address in one of three; the repro
  # above, with none of the project's code, shows the same kind of report). A job that fails
  # runs again, up to three attempts in all: a read of memory nothing wrote is reported on every
  # attempt and still fails the check, while the tool's thread noise does not. Every attempt's
  # log goes to sanitizer.log, and the row names the retried cases.
  for ((k = 0; k < ${#alone_list[@]}; ++k)); do
    IFS='|' read -r prog tool name index <<<"${alone_list[k]}"
    left=$((BUDGET - 30 - SECONDS))
    job_cap=$((left / (${#alone_list[@]} - k)))
    ((job_cap < 60)) && job_cap=$((left < 60 ? left : 60))
    ((job_cap > cap)) && job_cap=$cap
    if ((job_cap < 10)); then
      echo "not run: no time left in the budget" >"$tmp/$name.log"
      echo 124 >"$tmp/$name.rc"
      continue
    fi
    for attempt in 1 2 3; do
      cap=$job_cap sanitize "$prog" "$tool" "$name" "$index"
      launched=$((launched + 1))
      rc=$(cat "$tmp/$name.rc")
      [[ $rc == 0 || $rc == 77 || $rc == 124 || $rc == 137 || $attempt == 3 ]] && break
      { echo "---- attempt $attempt: rc $rc (run again)"; cat "$tmp/$name.log"; } >>"$tmp/$name.retried"
    done
  done
  sane=1
  # (a log cut short by a timeout has no summary line: grep finds nothing, the sum is 0 and
  # the verdict above already says TIMED OUT; under pipefail the empty grep must not end the
  # script)
  # (compute-sanitizer adds a second summary line, "N errors were not printed", past
  # --print-limit: it is not counted again)
  sum_of() {
    local pattern=$1; shift
    { grep -Eh "$pattern [0-9]+" "$@" 2>/dev/null || true; } | { grep -v "not printed" || true; } |
      { grep -Eo "$pattern [0-9]+" || true; } | { grep -Eo "[0-9]+$" || true; } | awk '{s += $1} END {print s + 0}'
  }
  for prog in "${gpu_tests[@]}"; do
    base=$(basename "$prog")
    tools=(memcheck racecheck initcheck)
    [[ ${per_case[$base]} == *" synccheck "* ]] && tools+=(synccheck)
    for tool in "${tools[@]}"; do
      if [[ ${per_case[$base]} == *" $tool "* ]]; then
        logs=()
        for ((i = 1; i <= ${pieces[$base]}; ++i)); do logs+=("$tmp/${base}_${tool}_$i"); done
        tests="${pieces[$base]} test cases, one process each"
      else
        logs=("$tmp/${base}_$tool")
        tests=$(grep -E "test cases:" "${logs[0]}.log" | tail -1 | sed 's/\[doctest\] //; s/  */ /g' || true)
      fi
      verdict=ok
      retried=""
      ((${#logs[@]} == 0)) && verdict="NOT RUN (no test cases)" && sane=0
      for log in "${logs[@]}"; do
        rc=$(cat "$log.rc" 2>/dev/null || echo "?")
        case $rc in
          0) ;;
          77) [[ $verdict == ok ]] && verdict="skipped (no GPU)" ;;
          86) verdict="ERRORS"; sane=0 ;;
          124|137) [[ $verdict != ERRORS ]] && verdict="TIMED OUT (${cap}s)"; sane=0 ;;
          *) [[ $verdict == ok || $verdict == skipped* ]] && verdict="FAILED (rc $rc)"; sane=0 ;;
        esac
        {
          echo "################ $(basename "$log") ($tool): rc $rc"
          if [[ -f $log.retried ]]; then
            retried+=" ${log##*_}"
            echo "(the attempts before the last, not counted below)"
            head -c 100000 "$log.retried"
            echo "---- last attempt"
          fi
          head -c 300000 "$log.log" 2>/dev/null || echo "(no log)"
          echo
        } >>"$OUT/sanitizer.log"
      done
      [[ -n $retried ]] && tests+="; run again after a failed attempt:$retried"
      errors=-
      hazards=-
      if [[ $tool == racecheck ]]; then
        hazards=$(sum_of "RACECHECK SUMMARY:" "${logs[@]/%/.log}")
      else
        errors=$(sum_of "ERROR SUMMARY:" "${logs[@]/%/.log}")
      fi
      sanitizer_rows+=("$(printf '%-16s %-10s errors %-4s hazards %-4s %-18s %s' \
        "$base" "$tool" "$errors" "$hazards" "$verdict" "$tests")")
    done
  done
  rm -rf "$tmp"
  if ((sane)); then record sanitizer ok $((SECONDS - t0)); else record sanitizer "FAILED (see sanitizer.log)" $((SECONDS - t0)); fi
  printf '%s\n' "${sanitizer_rows[@]}"
fi

# ---- 3b. the Hopper kernels' machine code: wgmma (HGMMA) present, no local memory ------
sass_libs=()
for lib in $BUILD/stages/10_hopper_fwd/libfa_stage_10.a $BUILD/stages/11_hopper_bwd/libfa_stage_11.a; do
  [[ -f $lib ]] && sass_libs+=("$lib")
done
if [[ ${FA_SKIP_SASS:-0} == 1 ]]; then
  record sass "skipped (FA_SKIP_SASS=1)" 0
elif ((${#sass_libs[@]} > 0)) && command -v cuobjdump >/dev/null; then
  note "SASS of the Hopper stages' kernels (cuobjdump --dump-sass)"
  t0=$SECONDS
  sass_file=$(mktemp)
  for lib in "${sass_libs[@]}"; do cuobjdump --dump-sass "$lib" >>"$sass_file" 2>&1 || true; done
  sass_ok=1
  # Every kernel of the two libraries uses wgmma, except the small preprocess and convert
  # kernels of stage 11 (plain loads and stores): they are checked for local memory only.
  sass_rows=$(awk '
    /Function : / { if (name != "") print name, hgmma, local; name = $3; hgmma = 0; local = 0 }
    /HGMMA/ { hgmma++ }
    /[[:space:]](LDL|STL)(\.|[[:space:]])/ { local++ }
    END { if (name != "") print name, hgmma, local }' "$sass_file")
  kernels=0
  while read -r name hgmma local; do
    [[ -z $name ]] && continue
    kernels=$((kernels + 1))
    needs_hgmma=1
    [[ $name == *preprocess_kernel* || $name == *convert_dq_kernel* ]] && needs_hgmma=0
    if (( (needs_hgmma && hgmma == 0) || local > 0 )); then
      sass_ok=0
      echo "SASS: $name has $hgmma HGMMA and $local local-memory instructions"
    fi
  done <<<"$sass_rows"
  echo "SASS: $kernels kernels of stages 10 and 11 checked"
  if ((kernels > 0 && sass_ok)); then record sass "ok: $kernels kernels, HGMMA in each wgmma kernel, no LDL/STL" $((SECONDS - t0))
  else record sass "FAILED (the kernels are named above)" $((SECONDS - t0)); fi
  rm -f "$sass_file"
else
  record sass "NOT RUN: no Hopper stage library or no cuobjdump" 0
fi

# ---- 4. benchmark sweep ------------------------------------------------------------------
if [[ ${FA_SKIP_BENCH:-0} == 1 ]]; then
  record bench "skipped (FA_SKIP_BENCH=1)" 0
else
  t0=$SECONDS
  cap=$((BUDGET - SECONDS - 15))
  ((cap < 60)) && cap=60
  # The full sweep takes a few minutes; with less time left, the quick one (stage 07 is
  # measured in full either way).
  if [[ -z ${FA_BENCH_ARGS+set} ]] && ((cap < 240)); then FA_BENCH_ARGS=--quick; fi
  note "benchmark: scripts/bench/bench_gpu.py ${FA_BENCH_ARGS:-} (at most ${cap}s)"
  set +e
  # shellcheck disable=SC2086
  PYTHONUNBUFFERED=1 timeout -k 10 "$cap" python3 scripts/bench/bench_gpu.py \
    --lib "$BUILD/stages/libfa_c.so" --out "$OUT/bench_gpu.csv" --commit "$COMMIT" \
    ${FA_BENCH_ARGS:-} >"$OUT/bench.log" 2>&1
  rc=$?
  set -e
  if ((rc == 0)); then record bench ok $((SECONDS - t0))
  elif ((rc == 124 || rc == 137)); then record bench "TIMED OUT after ${cap}s (partial log; try FA_BENCH_ARGS=--quick)" $((SECONDS - t0))
  else record bench "FAILED (rc $rc, see bench.log)" $((SECONDS - t0)); fi
fi

# ---- 5. summary --------------------------------------------------------------------------
{
  echo "==== gpu_check summary (part $PART): commit $COMMIT, $(date -u +%FT%TZ), $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)"
  printf '%-10s %6s  %s\n' step seconds result
  for s in "${status[@]}"; do
    IFS='|' read -r step result secs <<<"$s"
    printf '%-10s %6s  %s\n' "$step" "$secs" "$result"
  done
  if ((${#sanitizer_rows[@]})); then
    echo "-- compute-sanitizer (FA_TEST_SMALL=1)"
    printf '%s\n' "${sanitizer_rows[@]}"
  fi
  if [[ -f $OUT/ctest.log ]] && grep -q "The following tests FAILED" "$OUT/ctest.log"; then
    echo "-- failed tests"
    sed -n '/The following tests FAILED/,$p' "$OUT/ctest.log" | head -20
  fi
  if [[ -f $OUT/bench.log ]]; then
    echo "-- benchmark (bench.log, bench_gpu.csv)"
    if grep -q "==== bench_gpu summary ====" "$OUT/bench.log"; then
      sed -n '/==== bench_gpu summary ====/,$p' "$OUT/bench.log" | tail -n +2 | head -80
    else
      tail -15 "$OUT/bench.log"
    fi
  fi
  echo "total: ${SECONDS}s of a ${BUDGET}s budget; files in $OUT: $(cd "$OUT" && echo *)"
} | tee "$OUT/summary.txt"
exit "$failed"
