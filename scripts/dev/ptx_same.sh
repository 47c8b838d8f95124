#!/usr/bin/env bash
# Checks that a change to the GPU stages' sources left their kernels as they were: compiles
# each stage's .cu file to PTX (compute_80 and compute_90, or compute_90a for the Hopper
# stages; no line info) from the working tree and from a git revision, and compares the two
# with source positions and the hashes of anonymous namespaces (which depend on the file's
# path) taken out. Needs nvcc, not a GPU, so
# a move of kernel code (into a header, a step file, common/) can be checked on the CPU
# machine; the same PTX gives the same SASS from the same ptxas.
#
#   scripts/dev/ptx_same.sh [revision]        (default: HEAD; exit 0 when every file is the same)
#
# A step file that starts from a copy of its neighbour's kernel can be compared the same way
# by hand: the PTX files stay in $FA_PTX_WORK (default /tmp/fa-ptx-same).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
rev="${1:-HEAD}"
work="${FA_PTX_WORK:-${TMPDIR:-/tmp}/fa-ptx-same}"
nvcc="$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)"
[ -x "$nvcc" ] || { echo "ptx_same: nvcc not found" >&2; exit 2; }

rm -rf "$work" && mkdir -p "$work/rev" "$work/old" "$work/new"
git -C "$root" archive "$rev" | tar -x -C "$work/rev"

# ptx <source root> <out dir>: every stage .cu file of that tree, for both architectures.
ptx() {
  local src=$1 out=$2 f
  for f in "$src"/stages/*/*.cu; do
    local dir name arch
    dir=$(dirname "$f")
    name=$(basename "$(dirname "$f")")_$(basename "$f" .cu)
    # Stages 10 and 11 and stage 13's Hopper kernels use wgmma and setmaxnreg, which only the
    # arch-specific target has (CMake builds them for sm_90a alone); compute_90 would stop at
    # the first wgmma.
    local archs="80 90"
    case "$name" in 10_* | 11_* | 13_masks_masked_hopper*) archs="80 90a" ;; esac
    for arch in $archs; do
      # The shared layers are under common/ (sm80/, hopper/); every stage folder is on the
      # path too, as in CMake, for the entry-point headers of other stages.
      "$nvcc" -DFA_HAVE_CUDA=1 -I"$dir" -I"$src/common" $(printf -- '-I%s ' "$src"/stages/*/) \
        -O3 -DNDEBUG -arch=compute_$arch --expt-relaxed-constexpr -std=c++17 -x cu -ptx "$f" \
        -o "$out/$name.$arch.ptx"
    done
  done
}
normalise() {
  grep -v '^\s*\.loc\|^\s*\.file\|^//' "$1" | sed -E 's/_GLOBAL__N__[0-9a-f]+_[0-9]+_[A-Za-z0-9_]+_cu_[0-9a-f]+/ANON/g'
}

ptx "$work/rev" "$work/old"
ptx "$root" "$work/new"
status=0
for f in "$work"/new/*.ptx; do
  n=$(basename "$f")
  if [ ! -f "$work/old/$n" ]; then
    echo "new    $n (no such file at $rev)"
  elif cmp -s <(normalise "$work/old/$n") <(normalise "$f"); then
    echo "same   $n"
  else
    echo "DIFF   $n: $(diff <(normalise "$work/old/$n") <(normalise "$f") | grep -c '^[<>]') lines differ"
    status=1
  fi
done
exit $status
