#!/usr/bin/env bash
# The kill rate of the CPU mutation set: every mutation check CTest knows (tests/CMakeLists.txt,
# fa_add_mutant and fa_add_mutant_of: a one-line bug planted in a copy of a stage's or the
# harness's source) is built and run. A mutant is killed when the test case it must fail fails
# with the expected message; its CTest check then passes.
#
#   tests/mutation/kill_rate.sh [BUILD_DIR]     (default: build-quick, configured CPU-only if new)
#
# Prints one line per check and "killed K of N mutation checks (P%)"; exits 1 unless all are killed.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build-quick}
if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFA_ENABLE_CUDA=OFF -DFA_BUILD_DOCS=OFF >/dev/null
fi
cmake --build "$build" -j "${JOBS:-2}" >/dev/null
cd "$build"
log=$(ctest -R '^mutation_' -j "${JOBS:-2}" 2>&1 || true)
killed=$(grep -c 'Test *#[0-9]*: mutation_[^ ]* \.*  *Passed' <<<"$log" || true)
total=$(grep -c 'Test *#[0-9]*: mutation_' <<<"$log" || true)
grep -o 'mutation_[^ ]* \.*  *[*A-Za-z]*[A-Za-z]' <<<"$log" | sed -E 's/ \.+ +/ /; s/Passed$/killed/; s/\*+Failed$/SURVIVED/' | sort
if [ "$total" -eq 0 ]; then
  echo "no mutation checks found in $build" >&2
  exit 1
fi
echo "killed $killed of $total mutation checks ($((100 * killed / total))%)"
[ "$killed" -eq "$total" ]
