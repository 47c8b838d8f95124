#!/usr/bin/env bash
# Installs what the project needs on a Debian machine, only what is missing, then
# configures and builds. Run by tour.sh and test.sh; a second call is fast.
#
#   scripts/setup/setup.sh [build-dir]           (default: build) everything: CUDA when nvcc is
#                                          there, the docs, the notebooks' Python packages
#   scripts/setup/setup.sh --quick [build-dir]   (default: build-quick) CPU only: no CUDA, no docs,
#                                          no Python packages; configures, builds nothing
#                                          (scripts/test.sh --quick builds what it runs)
#   scripts/setup/setup.sh --tour [build-dir]    (default: build) what the tour needs: the compilers'
#                                          packages, then the tour program (every stage, CUDA
#                                          ones included), the stages' own programs and
#                                          libfa_c.so (target fa_tour: all of stages/ that
#                                          --tests builds); no docs, Python packages or tests.
#                                          A later full setup installs the rest into the same
#                                          build folder (it reconfigures, so what it installed
#                                          is found)
#   scripts/setup/setup.sh --tests [build-dir]   (default: build) as the first form, but builds
#                                          only what the tests run (target fa_tested: all but
#                                          the timing programs no test runs, such as bench06)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
quick=0
tour=0
targets=()
if [ "${1:-}" = "--quick" ]; then
  quick=1
  shift
elif [ "${1:-}" = "--tour" ]; then
  tour=1
  shift
elif [ "${1:-}" = "--tests" ]; then
  targets=(--target fa_tested)
  shift
fi
build="${1:-$root/build}"
((quick == 0)) || build="${1:-$root/build-quick}"

# Debian packages: compilers and CMake are assumed (build-essential, cmake); the rest is
# installed when missing. nvcc (the CUDA Toolkit) is optional: without it the GPU stages
# are not built and the tour says so. chromium: the docs test renders pages headless
# (formulas typeset, figures readable).
packages=(libeigen3-dev doctest-dev libcli11-dev ninja-build cmake g++)
((quick == 1 || tour == 1)) || packages+=(doxygen libjs-mathjax python3-pip chromium)
need=()
for pkg in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || need+=("$pkg")
done
if ((${#need[@]})); then
  echo "setup: installing ${need[*]}"
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

if ((quick == 1)); then
  if [ ! -f "$build/CMakeCache.txt" ]; then
    cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFA_ENABLE_CUDA=OFF \
      -DFA_BUILD_DOCS=OFF -DFA_BUILD_TORCH=OFF >/dev/null
  fi
  exit 0
fi

# nvcc is often installed outside PATH.
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi

if ((tour == 1)); then
  if [ ! -f "$build/CMakeCache.txt" ]; then
    cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
  fi
  cmake --build "$build" -j "$(nproc)" --target fa_tour
  exit 0
fi

# Python packages for the ctypes test and the notebooks (from PyPI), when missing.
if ! python3 -c "import numpy, matplotlib, nbclient, nbformat, ipykernel, markdown_it, mdit_py_plugins" 2>/dev/null; then
  echo "setup: installing Python packages from notebooks/requirements.txt"
  python3 -m pip install -q --disable-pip-version-check -r "$root/notebooks/requirements.txt"
fi

# PyTorch (from PyPI, about 60 s on a fresh machine): the native op (python/csrc) is built
# against it, and the op's tests and the GPT capstone's CPU run need it. Looked up, not
# imported (an import takes 1.4 s; the configure asks torch itself for its headers).
if ! python3 -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('torch') is None)" 2>/dev/null; then
  echo "setup: installing torch from PyPI"
  python3 -m pip install -q --disable-pip-version-check torch
fi

# Configured every time (a few seconds): what was installed since the last call (torch, the
# docs' tools after a tour's set-up) is then found.
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" -j "$(nproc)" "${targets[@]}"
