# Sourced by the GPU machine's scripts (check.sh, stage_loop.sh, stage1*.sh, bench_ab.sh): the
# CUDA toolkit's tools on PATH, and the one configuration of the GPU build.
#
#   source scripts/gpu/env.sh               (the scripts cd to the repository root first)
#   gpu_configure SOURCE BUILD [cmake args…]   Release, sm_90, no docs; Ninja when there is one
#
# The header-only dependencies come from this checkout's .deps/usr (scripts/setup/vendor_deps.sh;
# the GPU machine has no network), also for another SOURCE tree (bench_ab.sh's base).
FA_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)

# nvcc and compute-sanitizer live in the CUDA toolkit's folders, which may not be on PATH.
for dir in /usr/local/cuda/bin /usr/local/cuda/compute-sanitizer; do
  [[ -d $dir && ":$PATH:" != *":$dir:"* ]] && PATH=$PATH:$dir
done
export PATH

FA_GENERATOR=()
command -v ninja >/dev/null && FA_GENERATOR=(-G Ninja)

gpu_configure() {
  local source=$1 build=$2
  shift 2
  cmake -S "$source" -B "$build" ${FA_GENERATOR[@]+"${FA_GENERATOR[@]}"} -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DFA_BUILD_DOCS=OFF -DCMAKE_PREFIX_PATH="$FA_ROOT/.deps/usr" \
    -DCMAKE_POLICY_VERSION_MINIMUM=3.5 "$@"
}
