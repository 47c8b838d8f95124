#!/usr/bin/env bash
# The README's "test" command: set up (if needed), build, and run the tests with CTest (GPU
# tests are skipped without a GPU; the docs and the notebooks run as tests too).
#
#   scripts/test.sh [ctest arguments]            everything, in build/
#   scripts/test.sh --quick [ctest arguments]    CPU only, in build-quick/: the harness and the
#                                                stages' own tests (no CUDA, docs, notebooks,
#                                                tour or C ABI); builds only what they need and
#                                                prints the build's output only if it fails
#   scripts/test.sh [--quick] --stage NN [...]   one stage: rebuild everything of stage NN
#                                                (target stageNN_all) and run its tests only
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
quick=0
stage=""
args=()
while (($#)); do
  case "$1" in
    --quick) quick=1 ;;
    --stage) stage="$(printf '%02d' "$((10#${2:?--stage needs a stage number}))")"; shift ;;
    *) args+=("$1") ;;
  esac
  shift
done

select=()
if ((quick == 0)); then
  build="$root/build"
  "$root/scripts/setup/setup.sh" --tests "$build"  # what the tests run (not bench06 and the like)
else
  build="$root/build-quick"
  "$root/scripts/setup/setup.sh" --quick "$build"
fi
if [ -n "$stage" ] || ((quick == 1)); then
  if [ -n "$stage" ]; then
    targets=("stage${stage}_all")
    # stageNN, and the stage's other programs: stage06_forward, stage12_cpu, stage14_gpu, …
    select=(-R "^stage${stage}(_[a-z_]+)?\$")
  else
    # The harness and every CPU stage's test programs.
    targets=(test_harness $(ninja -C "$build" -t targets all | sed -n 's/^\(stage[0-9][0-9]_all\): .*/\1/p'))
    select=(-R '^(harness|stage[0-9][0-9](_forward|_cpu)?)$')
  fi
  start=$(date +%s)
  echo "test: building ${targets[*]} in $build"
  if ! cmake --build "$build" -j "$(nproc)" --target "${targets[@]}" >"$build/build.log" 2>&1; then
    grep -E "error|Error" -A3 "$build/build.log" | head -n 60
    echo "test: the build failed (full log: $build/build.log)"
    exit 1
  fi
  echo "test: built in $(( $(date +%s) - start )) s"
fi
cd "$build"
ctest --output-on-failure -j "$(nproc)" "${select[@]}" "${args[@]}"
