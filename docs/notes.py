#!/usr/bin/env python3
"""The course notes: plain Markdown in the repository, Doxygen Markdown on the site.

A note (a stage's README.md, docs/*.md, docs/concepts/*.md) is written so that it reads as
it is, on GitHub, in an editor or any Markdown viewer, math and code included; the docs build
converts a copy of it, line for line, into what Doxygen reads. The format:

    # Stage 05: one fused pass <a id="stage_05"></a>      title; the anchor is the page name
    ## How the tests catch a mistake <a id="stage_05_tests"></a>   a section with a stable anchor
    $m' = \\max(m, s)$   inline math      $$ O = PV $$   display math (may span lines)
    <!-- snippet: one_pass_fused.cpp fused pass -->      code quoted from a source file: the
    ```cpp                                               fenced block under the marker holds the
    ...                                                  snippet's current text (`notes.py sync`
    ```                                                  writes it; the docs test fails if stale)
    [stage 04](../04_two_pass_online/README.md)          a link to a note (or note.md#anchor)
    [naive.cpp](naive.cpp)                               a link to a source file (its annotated
                                                         page on the site)
    [Concepts](concepts/index.md "subpage")              a sub-page in the site's page tree
    <!-- toc -->                                         the site's table of contents
    <!-- include: stage_table.md -->                     a generated table (site only)
    ![caption](../results/figures/roofline.svg)          a figure (an image line of its own)
    <!-- lab-hint: 05 online update                      prose that a lab tree shows where
    What the region must do, in words. -->               stage 05's region "online update" is
                                                         stubbed (hidden elsewhere)
    is <!-- calc: 16*8*16 -->2048 multiply-adds          a number computed from the cards'
                                                         figures (docs/hardware.csv): `sync`
                                                         writes it, `check` fails if it differs
                                                         (docs/notes_calc.py)

A literal dollar sign is written `\\$`. Links to other files of the repository (CSV,
notebooks, scripts) become their path in code type on the site.

    notes.py doxygen --repo ROOT --out DIR   every note converted for Doxygen into DIR, under
                                             its path in the repository (line numbers kept)
    notes.py sync [--check] [--repo ROOT] [FILES]
                                             refresh the code under every snippet marker from
                                             the sources and every calc value from the cards'
                                             table (--check: exit 1 and list stale ones)
    notes.py check [--repo ROOT] [--strict]  every note: snippets current, no Doxygen-only
                                             syntax in a note of this format (--strict: and no
                                             note left in the old Doxygen format)
    notes.py migrate FILES                   rewrite notes written in Doxygen Markdown (\\f$,
                                             \\snippet, \\ref, {#label}) into this format

Python standard library only.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
# The two halves of the format, re-exported: callers (docs/gen_pages.py, tests/check_docs.py,
# scripts/lab/make_lab.py) import this module only.
from notes_tree import (DOXYGEN_ONLY_RE, SOURCE_EXTS, Note, NoteError, Tree, note_files,  # noqa: E402,F401
                        read_note, split_fences, strip_code, sync_text)
from notes_doxygen import migrate_text, to_doxygen  # noqa: E402,F401
from notes_calc import calc_text, load_cards  # noqa: E402

HARDWARE_CSV = "docs/hardware.csv"


def cards_of(repo: Path) -> dict:
    """The cards' figures (docs/hardware.csv) that calc markers compute from; none if absent."""
    path = repo / HARDWARE_CSV
    return load_cards(path) if path.is_file() else {}


def sync_all(text: str, note_path: Path, tree: Tree) -> str:
    """Snippets refreshed from the sources and calc values from the cards' table."""
    return calc_text(sync_text(text, note_path, tree), cards_of(tree.repo))[0]


# ----------------------------------------------------------------------------- labs
LAB_HINT_RE = re.compile(r"^[ \t]*<!--[ \t]*lab-hint:[ \t]*(\d\d)[ \t]+(.+?)[ \t]*$", re.M)
LAB_BEGIN_RE = re.compile(r"^\s*//\s*LAB BEGIN:\s*(.+?)\s+(?:—|-)\s+hint:", re.M)


# The shared device layers belong to the lab of the stage that introduces them (as in
# scripts/lab/make_lab.py's LAYER_STAGES).
LAYER_STAGES = {"common/sm80": "08", "common/hopper": "10"}


def lab_regions(repo: Path) -> dict[str, set[str]]:
    """Stage number → the names of its lab regions (the LAB BEGIN lines of its sources and of
    the layer it introduces under common/)."""
    found: dict[str, set[str]] = {}
    folders = [(f, f.name[:2]) for f in sorted((repo / "stages").glob("[0-9][0-9]_*"))]
    folders += [(repo / layer, stage) for layer, stage in LAYER_STAGES.items() if (repo / layer).is_dir()]
    for folder, stage in folders:
        for p in folder.rglob("*"):
            if p.is_file() and p.suffix in SOURCE_EXTS:
                for m in LAB_BEGIN_RE.finditer(p.read_text(encoding="utf-8", errors="replace")):
                    found.setdefault(stage, set()).add(m.group(1))
    return found


def show_lab_hints(text: str, stubbed: set[tuple[str, str]]) -> str:
    """For a lab tree: each lab-hint comment of a stubbed (stage, region) becomes a quoted
    paragraph the student sees; the others stay hidden comments."""
    lines, out, k = text.split("\n"), [], 0
    fenced = {i for i, _, f in split_fences(lines) if f}
    while k < len(lines):
        m = LAB_HINT_RE.match(lines[k])
        if not m or k in fenced or (m.group(1), m.group(2)) not in stubbed:
            out.append(lines[k])
            k += 1
            continue
        end = k
        while "-->" not in lines[end]:
            end += 1
        body = [ln.strip() for ln in lines[k + 1:end + 1]]
        body[-1] = body[-1].replace("-->", "").rstrip()
        out.append(f'> **Lab: you write this.** Stage {m.group(1)}\'s region "{m.group(2)}" is '
                   f"stubbed in this tree: the code above shows its `LAB BEGIN` line with a hint.")
        out += [("> " + ln) if ln else ">" for ln in body]
        k = end + 1
    return "\n".join(out)


# ----------------------------------------------------------------------------- checks
def check_note(tree: Tree, note: Note) -> list[str]:
    """Problems of one note: stale snippets, calc values that differ from the cards' table,
    Doxygen-only syntax in a plain note, and what the conversion refuses (missing link
    targets, images, snippet files)."""
    if note.legacy:
        return []
    problems = calc_text(note.text, cards_of(tree.repo), note.rel)[1]
    for m in DOXYGEN_ONLY_RE.finditer(strip_code(note.text)):
        line = note.text[:note.text.find(m.group(0))].count("\n") + 1
        problems.append(f"{note.rel}:{line}: Doxygen-only syntax '{m.group(0).strip()}' in a "
                        f"plain-Markdown note (see docs/notes.py for the format)")
    regions = lab_regions(tree.repo)
    lines = note.text.split("\n")
    fenced = {i for i, _, f in split_fences(lines) if f}
    for k, line in enumerate(lines):
        m = LAB_HINT_RE.match(line)
        if m and k not in fenced and m.group(2) not in regions.get(m.group(1), set()):
            problems.append(f"{note.rel}:{k + 1}: lab-hint for stage {m.group(1)} region '{m.group(2)}', "
                            f"which no LAB BEGIN line of stage {m.group(1)} names")
    try:
        # A lab tree's notes quote the stubs it was made with, not the student's code.
        lab_tree = (tree.repo / ".lab.json").is_file()
        fresh = note.text if lab_tree else sync_text(note.text, note.path, tree)
        # A lab tree quotes its stubs with their marker lines (scripts/lab/make_lab.py).
        if fresh != note.text and sync_text(note.text, note.path, tree, keep_lab_markers=True) == note.text:
            fresh = note.text
        if fresh != note.text:
            old, new = note.text.split("\n"), fresh.split("\n")
            k = next((k for k in range(min(len(old), len(new))) if old[k] != new[k]), min(len(old), len(new)))
            problems.append(f"{note.rel}:{k + 1}: the code under a snippet marker differs from the "
                            f"source: run `python3 docs/notes.py sync {note.rel}` and commit")
        _, errors = to_doxygen(tree, note)
        problems += errors
    except NoteError as e:
        problems.append(str(e))
    return problems


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("doxygen")
    d.add_argument("--repo", type=Path, default=Path(__file__).resolve().parent.parent)
    d.add_argument("--out", type=Path, required=True)
    s = sub.add_parser("sync")
    s.add_argument("--repo", type=Path, default=Path(__file__).resolve().parent.parent)
    s.add_argument("--check", action="store_true")
    s.add_argument("files", nargs="*", type=Path)
    c = sub.add_parser("check")
    c.add_argument("--repo", type=Path, default=Path(__file__).resolve().parent.parent)
    c.add_argument("--strict", action="store_true")
    m = sub.add_parser("migrate")
    m.add_argument("--repo", type=Path, default=Path(__file__).resolve().parent.parent)
    m.add_argument("files", nargs="+", type=Path)
    a = ap.parse_args(argv)
    tree = Tree(a.repo)

    if a.cmd == "doxygen":
        failed = []
        for note in tree.notes.values():
            text, errors = to_doxygen(tree, note)
            failed += errors
            target = a.out / note.rel
            target.parent.mkdir(parents=True, exist_ok=True)
            if not target.exists() or target.read_text(encoding="utf-8") != text:
                target.write_text(text, encoding="utf-8")
        for e in failed:
            print(f"notes: {e}", file=sys.stderr)
        return 1 if failed else 0

    if a.cmd == "sync":
        paths = [p.resolve() for p in a.files] or [n.path for n in tree.notes.values()]
        stale = []
        for p in paths:
            note = tree.notes.get(p.relative_to(tree.repo).as_posix()) or read_note(p, tree.repo)
            if note.legacy:
                continue
            fresh = sync_all(note.text, note.path, tree)
            if fresh != note.text:
                stale.append(note.rel)
                if not a.check:
                    note.path.write_text(fresh, encoding="utf-8")
        verb = "stale" if a.check else "refreshed"
        for r in stale:
            print(f"notes: {verb}: {r}")
        return 1 if (a.check and stale) else 0

    if a.cmd == "check":
        problems, legacy = [], []
        for note in tree.notes.values():
            problems += check_note(tree, note)
            if note.legacy:
                legacy.append(note.rel)
        if legacy:
            msg = (f"still in Doxygen Markdown ({len(legacy)}): {', '.join(legacy)}; convert with "
                   f"`python3 docs/notes.py migrate FILE`")
            (problems.append if a.strict else print)(f"notes: {msg}")
        for p in problems:
            print(f"notes: FAIL: {p}")
        print(f"notes: {len(tree.notes)} notes, {len(problems)} problem(s)")
        return 1 if problems else 0

    for p in a.files:
        p = p.resolve()
        note = read_note(p, tree.repo)
        if not note.legacy:
            print(f"notes: {note.rel} is already plain Markdown")
            continue
        p.write_text(migrate_text(note.text, p, tree), encoding="utf-8")
        print(f"notes: migrated {note.rel}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except NoteError as e:
        print(f"notes: {e}", file=sys.stderr)
        sys.exit(1)
