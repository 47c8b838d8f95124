#!/usr/bin/env bash
# Stage 13's Hopper backward before and after a change, side by side on one GPU: builds
# bench13_hopper from BASE (the "before" tree) and from this tree, runs both on the same
# cases in three rounds, each case before then after, and prints the median backward time
# (bwd_ms) of each. With TESTS=1 it also builds and runs this tree's test_stage13_gpu first.
#
#   git archive <before-commit> | (mkdir -p .base && tar -x -C .base)   # on the build machine
#   scripts/gpu/stage13_ab.sh .base OUT                                   # on the GPU machine
#
# env: CASES ("N window|N window|…", default the five of session 16's record), TESTS=1.
# Writes OUT/ab.txt (every run), OUT/build.log and with TESTS=1 OUT/test13.log.
set -uo pipefail
cd "$(dirname "$0")/../.."
BASE=${1:?usage: scripts/gpu/stage13_ab.sh BASE_TREE OUT}
OUT=${2:-${OUT:-./gpu_out}}
mkdir -p "$OUT"
source scripts/gpu/env.sh
start=$SECONDS
build() { gpu_configure "$1" "$1/build-ab" >/dev/null 2>&1 && cmake --build "$1/build-ab" -j8 --target bench13_hopper ${2:-} >>"$OUT/build.log" 2>&1; }
build "$BASE" & build . "${TESTS:+test_stage13_gpu}" & wait
echo "built in $((SECONDS - start)) s"
for tree in "$BASE" .; do
  [[ -x $tree/build-ab/stages/13_masks/bench13_hopper ]] || { grep -E "error" -A3 "$OUT/build.log" | head -30; exit 1; }
done
if [[ -n ${TESTS:-} ]]; then
  build-ab/tests/test_stage13_gpu >"$OUT/test13.log" 2>&1
  echo "test_stage13_gpu: rc $? ($(grep -E "assertions" "$OUT/test13.log" | tail -1))"
fi
IFS='|' read -ra cases <<<"${CASES:-4096 4096|16384 1024|16384 16384|4096 1024|16384 4096}"
for round in 1 2 3; do
  for c in "${cases[@]}"; do
    read -r n window <<<"$c"
    for tree in "$BASE" .; do
      r=$("$tree"/build-ab/stages/13_masks/bench13_hopper --seq "$n" --heads 16 --head-dim 128 --causal \
        --window-left "$window" --backward --repeats 7)
      echo "round=$round tree=$tree seq=$n window=$window $r"
    done
  done
done >"$OUT/ab.txt"
python3 - "$OUT/ab.txt" "$BASE" <<'PY'
import collections, statistics, sys
runs = collections.defaultdict(list)
for line in open(sys.argv[1]):
    f = dict(x.split("=", 1) for x in line.split() if "=" in x)
    runs[(int(f["seq"]), int(f["window"]), f["tree"])].append(float(f["bwd_ms"]))
print("    N  window  before ms  after ms  speed-up")
for n, w in sorted({(k[0], k[1]) for k in runs}):
    a, b = statistics.median(runs[(n, w, sys.argv[2])]), statistics.median(runs[(n, w, ".")])
    print(f"{n:5d} {w:7d}  {a:9.4f} {b:9.4f}  {a / b:7.3f}")
PY
echo "total $((SECONDS - start)) s"
