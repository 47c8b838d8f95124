#!/usr/bin/env bash
# CI check of lab mode (scripts/lab/make_lab.py, scripts/lab/grade.py). It proves, on every run:
#   1. the generator's unit tests pass (tests/test_make_lab.py);
#   2. a marker that is opened and never closed makes the generator exit non-zero, naming
#      file:line;
#   3. the student tree with EVERY stage's regions stubbed builds (each stubbed stage's
#      library first, so that a region whose stub cannot compile is named), CPU only;
#   4. in it, exactly the stubbed stages fail with "not implemented" and everything else
#      passes (tests that run every stage, such as the tour, may fail only on those stubs);
#      the student's quick check (scripts/test.sh --quick) grades the stage tests alone;
#   5. with nvcc present, the stubbed GPU stages' sources compile (CUDA on, one arch);
#   6. pasting the solution regions back into that same tree makes every test pass.
#
#   scripts/lab/check_lab.sh            (from .ci/run: bash scripts/lab/check_lab.sh)
#
# Work folders are reused between runs (only what changed is rebuilt):
#   FA_LAB_WORK        default ${TMPDIR:-/tmp}/fa-lab-ci  (tree/, build/, build-cuda/)
#   FA_LAB_CUDA_ARCHS  architectures of the CUDA compile check, default 80 (the stubs do not
#                      depend on the architecture; the main build compiles sm_80 and sm_90)
#   FA_LAB_CUDA=0      skip step 5
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
work="${FA_LAB_WORK:-${TMPDIR:-/tmp}/fa-lab-ci}"
tree="$work/tree"
build="$work/build"
build_cuda="$work/build-cuda"
jobs="$(nproc)"
start=$(date +%s)
mkdir -p "$work"

step() { echo "check_lab: [$(($(date +%s) - start)) s] $*"; }
fail() {
  echo "check_lab: FAIL: $*" >&2
  exit 1
}
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi

# ---- 1. the generator's unit tests
step "unit tests of the generator"
log="$work/unit.log"
python3 "$root/tests/test_make_lab.py" >"$log" 2>&1 || { cat "$log"; fail "tests/test_make_lab.py failed"; }
tail -n 1 "$log"

# ---- 2. an unclosed marker is refused with file:line
step "an unclosed marker is refused"
scratch="$work/unclosed"
rm -rf "$scratch" "$scratch-out"
mkdir -p "$scratch/stages/05_x"
printf 'void forward() {\n  // LAB BEGIN: update — hint: h\n  int a = 0;\n  (void)a;\n}\n' >"$scratch/stages/05_x/x.cpp"
git -c init.defaultBranch=main init -q "$scratch"
if python3 "$root/scripts/lab/make_lab.py" --repo "$scratch" --out "$scratch-out" 2>"$work/unclosed.err"; then
  fail "make_lab.py accepted a LAB BEGIN without LAB END"
fi
grep -q "stages/05_x/x.cpp:2:.*never closed" "$work/unclosed.err" ||
  { cat "$work/unclosed.err"; fail "make_lab.py's error does not name stages/05_x/x.cpp:2"; }
sed 's/^/  /' "$work/unclosed.err"

# ---- 3. generate the student tree, every stage stubbed, and build it (CPU)
step "generating the student tree (all stages with regions stubbed) in $tree"
python3 "$root/scripts/lab/make_lab.py" --repo "$root" --out "$tree" --stages all --force
stubbed="$(python3 -c 'import json, sys; print(" ".join(json.load(open(sys.argv[1]))["stubbed_stages"]))' "$tree/.lab.json")"
[ -n "$stubbed" ] || fail "no stage has LAB regions"

if [ ! -f "$build/CMakeCache.txt" ]; then
  step "configuring $build (CPU only)"
  cmake -S "$tree" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFA_ENABLE_CUDA=OFF \
    -DFA_BUILD_DOCS=OFF -DFA_BUILD_TORCH=OFF >"$work/configure.log" 2>&1 || { cat "$work/configure.log"; fail "cmake configure of the student tree"; }
fi
for n in $stubbed; do
  [ "$((10#$n))" -lt 7 ] || continue
  step "building stage $n with its regions stubbed"
  cmake --build "$build" -j "$jobs" --target "fa_stage_$n" >"$work/build-$n.log" 2>&1 ||
    { grep -E "error|Error" -A3 "$work/build-$n.log" | head -n 60; fail "stage $n does not build with its regions stubbed (a region declares something the code after it uses? run scripts/lab/make_lab.py --check)"; }
done
step "building the student tree"
cmake --build "$build" -j "$jobs" >"$work/build.log" 2>&1 ||
  { grep -E "error|Error" -A3 "$work/build.log" | head -n 60; fail "the student tree does not build"; }

# ---- 4. exactly the stubbed stages are not implemented; everything else passes
step "grading the student tree (expected not implemented: $stubbed)"
python3 "$tree/scripts/lab/grade.py" --source-dir "$tree" --build-dir "$build" \
  --expect-not-implemented manifest -- -j "$jobs" ||
  fail "the stubbed tree did not fail exactly in the stubbed stages (see above)"

# ---- 4b. the student's quick check (scripts/test.sh --quick) on that build: it finds the
#          stages' targets, runs the stage tests and the harness only, and grades them
step "the quick check of the student tree (scripts/test.sh --quick, on the build above)"
ln -sfn "$build" "$tree/build-quick"
set +e
(cd "$tree" && scripts/test.sh --quick) >"$work/quick.log" 2>&1
quick_rc=$?
set -e
rm -f "$tree/build-quick"
for n in $stubbed; do
  [ "$((10#$n))" -lt 7 ] || continue
  grep -q "^stage ${n}_[a-z0-9_]*\(, [a-z ]*\)\?: not implemented" "$work/quick.log" ||
    { cat "$work/quick.log"; fail "scripts/test.sh --quick does not report stage $n as not implemented"; }
done
grep -q "^other tests: .* not selected" "$work/quick.log" && [ "$quick_rc" -ne 0 ] ||
  { cat "$work/quick.log"; fail "scripts/test.sh --quick ran more than the stage tests and the harness, or exited 0"; }
grep -E "^(harness|stage 06)" "$work/quick.log" | sed 's/^/  /'

# ---- 5. the stubbed GPU stages compile
gpu_stages=""
for n in $stubbed; do
  if [ "$((10#$n))" -ge 7 ]; then gpu_stages+=" $n"; fi
done
if [ -n "$gpu_stages" ] && [ "${FA_LAB_CUDA:-1}" != 0 ] && command -v nvcc >/dev/null; then
  archs="${FA_LAB_CUDA_ARCHS:-80}"
  if ! grep -Eqx "CMAKE_CUDA_ARCHITECTURES:[A-Z]+=$archs" "$build_cuda/CMakeCache.txt" 2>/dev/null; then
    step "configuring $build_cuda (CUDA, sm_$archs)"
    cmake -S "$tree" -B "$build_cuda" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFA_BUILD_DOCS=OFF -DFA_BUILD_TORCH=OFF \
      "-DCMAKE_CUDA_ARCHITECTURES=$archs" >"$work/configure-cuda.log" 2>&1 ||
      { cat "$work/configure-cuda.log"; fail "cmake configure with CUDA"; }
  fi
  for n in $gpu_stages; do
    # Only the stage's own object files: the stubs live there, and the CPU build above has
    # already compiled the shared harness.
    objects="$(ninja -C "$build_cuda" -t targets all | sed -n "s|^\(stages/[^:]*/fa_stage_$n\.dir/[^:]*\.o\): .*|\1|p")"
    [ -n "$objects" ] || fail "no object files of fa_stage_$n in $build_cuda (is stage $n in the CUDA build?)"
    step "compiling GPU stage $n with its regions stubbed ($(wc -w <<<"$objects") files)"
    # shellcheck disable=SC2086  # one argument per object file
    ninja -C "$build_cuda" -j "$jobs" $objects >"$work/build-cuda-$n.log" 2>&1 ||
      { grep -E "error" -A3 "$work/build-cuda-$n.log" | head -n 60; fail "GPU stage $n does not compile with its regions stubbed"; }
  done
elif [ -n "$gpu_stages" ]; then
  step "skipping the compile check of GPU stage(s)$gpu_stages (no nvcc, or FA_LAB_CUDA=0)"
fi

# ---- 6. the solutions pasted back into the same tree pass everything
step "pasting the solution regions back into the student tree"
python3 "$root/scripts/lab/make_lab.py" --repo "$root" --paste-back "$tree"
cmake --build "$build" -j "$jobs" >"$work/build-pasted.log" 2>&1 ||
  { grep -E "error|Error" -A3 "$work/build-pasted.log" | head -n 60; fail "the pasted-back tree does not build"; }
step "grading the pasted-back tree (expected: everything passes)"
python3 "$tree/scripts/lab/grade.py" --source-dir "$tree" --build-dir "$build" \
  --expect-not-implemented none -- -j "$jobs" --output-on-failure ||
  fail "with the solutions pasted back, not every test passes"

step "lab mode OK: stubbed stage(s) $stubbed fail as not implemented, everything else passes, and the solutions pass"
