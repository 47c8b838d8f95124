#!/usr/bin/env python3
"""The include rule of docs/design.md §2: layers by folder, no sideways includes.

    python3 tests/check_includes.py [--repo ROOT]      exit 0 when the tree keeps the rule
    python3 tests/check_includes.py --self-test        plants a sideways include in a copy

A stage (stages/NN_name/) includes its own files, common/ (the harness and the device
layers, by folder: "sm80/mma.cuh", "hopper/wgmma.cuh") and, of another stage, only an
entry-point header (ENTRY_POINTS: the header that declares a stage's forward/backward).
common/ includes nothing of a stage: a layer that needs a stage's file is not a layer.
The files directly in stages/ (the stage list, the C ABI, the tour) list every stage and
are exempt. Python standard library only; reads sources, compiles nothing.
"""
import argparse
import re
import shutil
import sys
import tempfile
from pathlib import Path

SOURCES = {".c", ".cc", ".cpp", ".h", ".hpp", ".cu", ".cuh"}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
STAGE = re.compile(r"^stages/(\d\d_[^/]+)/")

# The public header of each stage's entry points: what another stage may include. Stage 09
# runs 08's forward, 11 runs 10's, 12 runs 06 (CPU ring) and 08/09 (GPU ring) on each rank.
ENTRY_POINTS = {
    "01_naive": {"naive.h"},
    "02_safe_softmax": {"safe_softmax.h"},
    "03_three_pass": {"three_pass.h"},
    "04_two_pass_online": {"two_pass_online.h"},
    "05_one_pass_fused": {"one_pass_fused.h"},
    "06_tiled_cpu": {"tiled_cpu.h"},
    "07_smem_cuda": {"smem_cuda.h"},
    "08_tensor_core_fwd": {"tensor_core_fwd.h"},
    "09_tensor_core_bwd": {"tensor_core_bwd.h"},
    "10_hopper_fwd": {"hopper_fwd.h"},
    "11_hopper_bwd": {"hopper_bwd.h"},
    "12_ring_attention": {"ring_attention.h", "ring_gpu.h"},
    "13_masks": {"masks.h"},
    "14_decode": {"decode.h"},
}


def sources(root: Path, top: str):
    return sorted(p for p in (root / top).rglob("*") if p.suffix in SOURCES and p.is_file())


def resolve(root: Path, includer: Path, name: str) -> Path | None:
    """Where `#include "name"` lands as the build sees it: the includer's folder, common/,
    then any stage folder (every stage library puts its folder on the path)."""
    for base in [includer.parent, root / "common"]:
        if (base / name).is_file():
            return (base / name).resolve()
    hits = sorted(p for p in (root / "stages").glob(f"[0-9][0-9]_*/{name}") if p.is_file())
    return hits[0].resolve() if hits else None


def violations(root: Path) -> list[str]:
    root = root.resolve()
    found = []
    for top in ("stages", "common"):
        for f in sources(root, top):
            rel = f.relative_to(root).as_posix()
            mine = STAGE.match(rel)
            if top == "stages" and not mine:
                continue  # stage_list.cpp, fa_c.cpp, tour.cpp: they list every stage
            text = f.read_text(encoding="utf-8", errors="replace")
            for m in INCLUDE.finditer(text):
                target = resolve(root, f, m.group(1))
                if target is None:
                    continue  # a system or generated header
                line = text.count("\n", 0, m.start()) + 1
                where = STAGE.match(target.relative_to(root).as_posix()) if target.is_relative_to(root) else None
                if where is None:
                    continue  # common/ or outside the tree
                if top == "common":
                    found.append(f"{rel}:{line}: common/ includes stage {where.group(1)}'s "
                                 f"{m.group(1)}: a shared layer must not depend on a stage")
                elif where.group(1) != mine.group(1) and target.name not in ENTRY_POINTS.get(where.group(1), ()):
                    allowed = ", ".join(sorted(ENTRY_POINTS.get(where.group(1), ()))) or "none"
                    found.append(f"{rel}:{line}: stage {mine.group(1)} includes {m.group(1)} of stage "
                                 f"{where.group(1)}: only its entry-point header ({allowed}) may be included "
                                 f"across stages; move what both need to common/ (docs/design.md §2)")
    return found


def self_test(root: Path) -> int:
    """The rule holds in the tree, and a planted sideways include (stage 11 reaching into
    stage 10's pipeline.cuh) and a planted layer-to-stage include are both reported."""
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "repo"
        for top in ("stages", "common"):
            shutil.copytree(root / top, copy / top, ignore=shutil.ignore_patterns("*.md", "*.csv", "*.svg"))
        if violations(copy):
            print("self-test: the unchanged copy already breaks the rule", file=sys.stderr)
            return 1
        planted = copy / "stages/11_hopper_bwd/planted.cu"
        planted.write_text('#include "pipeline.cuh"\n#include "hopper_fwd.h"\n')
        layer = copy / "common/hopper/planted.cuh"
        layer.write_text('#include "tensor_core_fwd.h"\n')
        got = violations(copy)
        want = ["stages/11_hopper_bwd/planted.cu:1:", "common/hopper/planted.cuh:1:"]
        missing = [w for w in want if not any(g.startswith(w) for g in got)]
        extra = [g for g in got if not any(g.startswith(w) for w in want)]
        if missing or extra:
            print(f"self-test: missing {missing}, unexpected {extra}", file=sys.stderr)
            return 1
    print("self-test: a planted sideways include and a planted layer-to-stage include are reported")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repo", type=Path, default=Path(__file__).resolve().parent.parent)
    ap.add_argument("--self-test", action="store_true")
    a = ap.parse_args()
    if a.self_test:
        return self_test(a.repo)
    found = violations(a.repo)
    for v in found:
        print(v, file=sys.stderr)
    if not found:
        print("include rule: every stage includes its own files, common/ and entry-point headers only")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
