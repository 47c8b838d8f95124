#!/usr/bin/env bash
# The README's "test" command: set up (if needed), build, and run every test with CTest
# (GPU tests are skipped without a GPU; the docs and notebooks run as tests too).
#   scripts/test.sh [extra ctest arguments]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/setup.sh" "$root/build"
cd "$root/build"
ctest --output-on-failure -j "$(nproc)" "$@"
