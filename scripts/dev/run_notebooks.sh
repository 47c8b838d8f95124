#!/usr/bin/env bash
# Executes every notebook in notebooks/ against the real stages, and fails on any error and
# on any output to stderr (a warning), so that the committed outputs are clean.
#
#   scripts/dev/run_notebooks.sh             run each into a temporary copy (the tree is untouched)
#   scripts/dev/run_notebooks.sh --inplace   run and save the outputs into notebooks/*.ipynb
#                                        (how the committed outputs are made)
#   scripts/dev/run_notebooks.sh [--inplace] notebooks/02_tiled_forward.ipynb ...   only these
#
# The notebooks load libfa_c.so through notebooks/fa.py (the fa_attention package): from $FA_LIB when it is set (CTest
# sets it to the library of its build), else from build/stages/libfa_c.so. Python packages:
# notebooks/requirements.txt. $PYTHON overrides the interpreter.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
python="${PYTHON:-python3}"

inplace=0
notebooks=()
for arg in "$@"; do
  case "$arg" in
    --inplace) inplace=1 ;;
    -h|--help) sed -n '2,12p' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) notebooks+=("$(cd "$(dirname "$arg")" && pwd)/$(basename "$arg")") ;;
  esac
done
if ((${#notebooks[@]} == 0)); then
  notebooks=("$root"/notebooks/[0-9][0-9]_*.ipynb)
fi

lib="${FA_LIB:-$root/build/stages/libfa_c.so}"
if [ ! -f "$lib" ]; then
  echo "run_notebooks: $lib does not exist: build the fa_c target first (or set FA_LIB)" >&2
  exit 1
fi
export FA_LIB="$lib"
export MPLBACKEND=Agg

"$python" - "$inplace" "$root/notebooks" "${notebooks[@]}" <<'PY'
import pathlib, sys, tempfile, time

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

inplace, workdir, paths = sys.argv[1] == "1", sys.argv[2], sys.argv[3:]
failed = []
out_dir = None if inplace else pathlib.Path(tempfile.mkdtemp(prefix="fa_notebooks_"))
total = time.time()
for path in map(pathlib.Path, paths):
    nb = nbformat.read(path, as_version=4)
    start = time.time()
    client = NotebookClient(nb, timeout=600, kernel_name="python3", record_timing=False,
                            resources={"metadata": {"path": workdir}})
    try:
        client.execute()
        status = "ok"
    except CellExecutionError as e:
        failed.append(path.name)
        status = "FAILED"
        print(str(e), file=sys.stderr)
    # Outputs must be clean: anything a cell wrote to stderr (a warning, a deprecation) fails.
    for k, cell in enumerate(nb.cells):
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream" and out.get("name") == "stderr":
                text = "".join(out.get("text", "")).strip()
                print(f"run_notebooks: {path.name}, cell {k}: wrote to stderr:\n{text[:800]}", file=sys.stderr)
                if status == "ok":
                    failed.append(path.name)
                    status = "WARNED"
    target = path if inplace else out_dir / path.name
    nbformat.write(nb, target)
    print(f"run_notebooks: {path.name:<28} {status:<7} {time.time() - start:6.1f} s  -> {target}")
print(f"run_notebooks: {len(paths)} notebooks, {len(failed)} failed, {time.time() - total:.1f} s")
sys.exit(1 if failed else 0)
PY
