#!/usr/bin/env python3
"""Refreshes the generated tables of a stage's notes: every block between
    <!-- results: COMMAND -->
    <!-- end of results -->
is replaced by what COMMAND (run from the repository root) prints.

  python3 scripts/results/fill_results.py stages/11_hopper_bwd/README.md [--check]

With --check nothing is written; the exit status is 1 when a block is out of date.
"""
import pathlib
import re
import shlex
import subprocess
import sys

BLOCK = re.compile(r"(<!-- results: (?P<cmd>.*?) -->\n)(?P<body>.*?)(<!-- end of results -->)", re.S)


def main(argv):
    check = "--check" in argv
    paths = [a for a in argv if a != "--check"]
    root = pathlib.Path(__file__).resolve().parents[2]
    stale = 0
    for path in paths:
        p = pathlib.Path(path)
        text = p.read_text()

        def fill(m):
            out = subprocess.run(shlex.split(m.group("cmd")), cwd=root, check=True, capture_output=True,
                                 text=True).stdout
            return m.group(1) + "\n" + out.strip() + "\n\n" + m.group(4)

        new = BLOCK.sub(fill, text)
        if new != text:
            stale += 1
            if check:
                print(f"{path}: generated tables are out of date (run scripts/results/fill_results.py {path})")
            else:
                p.write_text(new)
                print(f"{path}: tables refreshed")
    return 1 if check and stale else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
