#!/usr/bin/env bash
# The README's "run" command: set up (if needed), build, and run every stage this machine
# can run on one default problem, checked against the reference, in one table.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/setup/setup.sh" --tour "$root/build"  # the tour, the stages' programs, libfa_c.so (scripts/test.sh builds the tests)
exec "$root/build/stages/tour" "$@"
