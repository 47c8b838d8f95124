#!/usr/bin/env python3
"""Grades a build: runs CTest with a JUnit report and prints one line per stage.

    scripts/lab/grade.py [--build-dir build] [--junit FILE] [-- extra ctest arguments]

In a lab tree (made by scripts/lab/make_lab.py) this is what scripts/test.sh ends with. It runs
`ctest --output-junit FILE` in the build folder (FILE defaults to <build>/lab-results.xml,
the report an autograder reads), then reads the report and prints, for example:

    harness: passed
    stage 04_two_pass_online: passed
    stage 05_one_pass_fused: not implemented (region "online update")
    stage 07_smem_cuda: skipped (no GPU)
    other tests: 6 passed; waiting on stage 05: tour, cli_runs, python_abi

A stage is "not implemented" when its test program failed and printed the message of a
lab stub (`not implemented: stage 05, region "online update"`); "failed" when it failed for
any other reason. Tests that are not per stage (the tour, the command line, the C ABI, the
docs, the notebooks) run every stage, so they fail while a stage is stubbed: the summary
says which stage they wait on, and counts them as failed only when something else broke.

Exit status: 0 when every test passed (or was skipped), 1 otherwise. With
--expect-not-implemented (for CI), 0 exactly when the stubbed stages are the given ones
and nothing else failed.
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NOT_IMPLEMENTED = re.compile(r'not implemented: stage (\d\d), region "([^"]*)"')


@dataclass
class Result:
    name: str
    status: str        # "passed" | "failed" | "skipped" | "not run"
    output: str = ""
    message: str = ""  # CTest's reason for a skip or a failure
    stubs: dict[str, list[str]] = field(default_factory=dict)  # stage → regions it reported

    @property
    def comparison(self) -> list[str]:
        """The first failing comparison against the reference, whole: the case it ran (the
        line doctest logs with the problem and seed) and every tensor's line (O, L, and for a
        backward dQ, dK, dV), each with its errors, worst element and verdict."""
        lines = self.output.splitlines()
        for k, ln in enumerate(lines):
            if not re.search(r"\bmax_abs=.*\bFAIL\s*$", ln):
                continue
            start = k
            while start > 0 and re.search(r"\bmax_abs=", lines[start - 1]):
                start -= 1
            end = k
            while end + 1 < len(lines) and re.search(r"\bmax_abs=", lines[end + 1]):
                end += 1
            case = next((lines[j].split("logged:", 1)[1].strip() for j in range(start - 1, max(-1, start - 12), -1)
                         if "logged:" in lines[j]), "")
            return ([case] if case else []) + [" ".join(x.split())[:220] for x in lines[start:end + 1]]
        return []

    @property
    def first_error(self) -> str:
        """The first line of the output that looks like the reason for a failure: a failed
        comparison against the reference (with its worst element) if there is one."""
        lines = self.output.splitlines()
        for ln in lines:
            if re.search(r"\bmax_abs=.*\bFAIL\s*$", ln):
                return " ".join(ln.split())[:200]
        for ln in lines:
            if re.search(r"\b(ERROR|FAIL|FAILED|Error|error|Traceback|Assertion|threw|Segmentation)\b", ln) \
                    and not re.search(r"\b0 failed\b|status: SUCCESS", ln):
                return " ".join(ln.split())[:160]
        return self.message or "see the test output"


def read_junit(path: Path) -> dict[str, Result]:
    results: dict[str, Result] = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        name = case.get("name", "")
        out = case.findtext("system-out") or ""
        if case.find("failure") is not None or case.get("status") == "fail":
            status = "failed"
            message = (case.find("failure").get("message") if case.find("failure") is not None else "") or ""
        elif case.find("skipped") is not None or case.get("status") == "notrun":
            message = case.find("skipped").get("message", "") if case.find("skipped") is not None else ""
            # A SKIP_RETURN_CODE skip (GPU test on a machine without a GPU) is fine; a test
            # CTest could not start at all (missing program) is not.
            status = "skipped" if "SKIP_RETURN_CODE" in message or "skipped" in out.lower() else "not run"
        else:
            status, message = "passed", ""
        r = Result(name, status, out, message)
        for stage, region in NOT_IMPLEMENTED.findall(out):
            regions = r.stubs.setdefault(stage, [])
            if region not in regions:
                regions.append(region)
        results[name] = r
    return results


def stage_folders(root: Path) -> dict[str, str]:
    """Stage number → folder name, from the tree (a lab tree's manifest if present)."""
    folders = {}
    stages = root / "stages"
    if stages.is_dir():
        for d in sorted(stages.iterdir()):
            m = re.match(r"^(\d\d)_", d.name)
            if m and (d / "CMakeLists.txt").is_file():
                folders[m.group(1)] = d.name
    return folders


def stubbed_regions(root: Path, folders: dict[str, str]) -> dict[str, list[str]]:
    """Per stage, the regions whose stub is still in the source (a stage's tests stop at
    the first stub they meet, so the output alone does not show them all)."""
    found: dict[str, list[str]] = {}
    for number, folder in folders.items():
        for f in sorted((root / "stages" / folder).rglob("*")):
            if not f.is_file() or f.suffix not in (".cpp", ".cc", ".h", ".hpp", ".cu", ".cuh"):
                continue
            text = f.read_text(encoding="utf-8", errors="replace")
            pattern = (rf'^\s*FA_LAB_TODO\("{number}",\s*"([^"]*)"\)'
                       rf'|^\s*#\s*define\s+FA_LAB_PENDING_{number}_\d+\s+"([^"]*)"')
            for m in re.finditer(pattern, text, re.M):
                name = m.group(1) or m.group(2)
                if name not in found.setdefault(number, []):
                    found[number].append(name)
    return found


def quoted(regions: list[str]) -> str:
    word = "region" if len(regions) == 1 else "regions"
    return f"{word} " + ", ".join(f'"{r}"' for r in regions)


def verdict_of(r: Result | None, number: str, known: bool) -> tuple[str, str]:
    """(state, text) of one stage test."""
    if r is None and known:
        return "not selected", "not selected (not among the tests this run was asked for)"
    if r is None:
        return "missing", "not built here (no test program: GPU stages need a CUDA build)"
    if r.status == "passed":
        return "passed", "passed"
    if r.status == "skipped":
        return "skipped", "skipped (no GPU)"
    if r.status == "failed" and number in r.stubs:
        text = f"not implemented ({quoted(r.stubs[number])})"
        others = sorted(s for s in r.stubs if s != number)
        if others:
            text += f"; also waits on stage {', '.join(others)}"
        return "not implemented", text
    if r.status == "failed" and r.stubs:
        return "waiting", "failed: it runs a stubbed stage: " + ", ".join(
            f"stage {s} ({quoted(v)})" for s, v in sorted(r.stubs.items()))
    return "failed", f"failed ({r.first_error})" if not r.comparison else "failed, on the case and comparison below:"


def summarise(results: dict[str, Result], folders: dict[str, str],
              pending: dict[str, list[str]] | None = None,
              known: set[str] | None = None) -> tuple[list[str], dict]:
    """The summary lines, and per stage / other test what they came to (for --expect).
    `known`: every test the build has (ctest -N), so that one this run did not select is
    told apart from one the build lacks."""
    pending = pending or {}
    known = known if known is not None else set(results)
    lines: list[str] = []
    verdict = {"stages": {}, "harness": None, "others": {}}

    h = results.get("harness")
    if h is None and "harness" in known:
        verdict["harness"] = "not selected"
        lines.append("harness: not selected (not among the tests this run was asked for)")
    elif h is None:
        verdict["harness"] = "missing"
        lines.append("harness: missing (no test named harness in this build)")
    elif h.status == "failed" and h.stubs:
        verdict["harness"] = "waiting"
        lines.append("harness: failed: it runs a stubbed stage: " + ", ".join(
            f"stage {s} ({quoted(v)})" for s, v in sorted(h.stubs.items())))
    else:
        verdict["harness"] = h.status
        lines.append(f"harness: {h.status}" + (f" ({h.first_error})" if h.status != "passed" else ""))

    for number, folder in folders.items():
        # A stage's tests: stageNN (all of them) and, for a CPU stage with a backward,
        # stageNN_forward (its forward alone), each graded on its own line.
        parts = [("", f"stage{number}")]
        if f"stage{number}_forward" in results or f"stage{number}_forward" in known:
            parts = [(", forward alone", f"stage{number}_forward"), (", all its tests", f"stage{number}")]
        elif not ({f"stage{number}"} & (set(results) | known)) and \
                f"stage{number}_cpu" in set(results) | known:
            # A GPU stage with a CPU part (stage 12's CPU ring): a build without CUDA grades that.
            parts = [(", CPU part", f"stage{number}_cpu")]
        for label, test in parts:
            r = results.get(test)
            state, text = verdict_of(r, number, test in known)
            if r is not None and state in ("not implemented", "waiting", "failed"):
                left = [x for x in pending.get(number, []) if x not in r.stubs.get(number, [])]
                if left and test in (f"stage{number}", f"stage{number}_cpu"):
                    text += f"; still stubbed in the source: {quoted(left)}"
            verdict["stages"][test[len("stage"):]] = {"state": state, "stubs": r.stubs if r else {}}
            lines.append(f"stage {folder}{label}: {text}")
            if r is not None and state == "failed":
                lines += ["    " + x for x in r.comparison]

    stage_tests = ({f"stage{n}" for n in folders} | {f"stage{n}_forward" for n in folders}
                   | {f"stage{n}_cpu" for n in folders if f"{n}_cpu" in verdict["stages"]} | {"harness"})
    others = {n: r for n, r in results.items() if n not in stage_tests}
    unselected = sorted(n for n in known - set(results) if n not in stage_tests)
    if others or unselected:
        passed = [n for n, r in others.items() if r.status in ("passed", "skipped")]
        waiting: dict[str, list[str]] = {}
        broken = []
        for n, r in others.items():
            if r.status in ("passed", "skipped"):
                verdict["others"][n] = {"state": r.status, "stubs": {}}
            elif r.status == "failed" and r.stubs:
                verdict["others"][n] = {"state": "waiting", "stubs": r.stubs}
                for s in r.stubs:
                    waiting.setdefault(s, []).append(n)
            else:
                verdict["others"][n] = {"state": "failed", "stubs": r.stubs}
                broken.append(n)
        parts = [f"{len(passed)} passed"]
        for s, names in sorted(waiting.items()):
            parts.append(f"waiting on stage {s}: {', '.join(names)}")
        if broken:
            parts.append("FAILED: " + ", ".join(f"{n} ({others[n].first_error})" for n in broken))
        if unselected:
            parts.append(f"{len(unselected)} not selected")
        lines.append("other tests: " + "; ".join(parts))
    return lines, verdict


def known_tests(build: Path, results: dict[str, Result]) -> set[str]:
    """Every test of the build (ctest -N), so that a test this run did not select (ctest
    -R …) reads "not selected", not "not built here"."""
    r = subprocess.run(["ctest", "--test-dir", str(build), "-N"], capture_output=True, text=True)
    return set(re.findall(r"Test\s+#\d+: (\S+)", r.stdout)) | set(results)


def check_expectation(verdict: dict, expected: set[str], folders: dict[str, str]) -> list[str]:
    """What differs from 'exactly the stages in `expected` are not implemented, and every
    other test passes or fails only by waiting on those stages'."""
    problems = []
    if verdict["harness"] != "passed":
        problems.append(f"harness: {verdict['harness']} (expected passed)")
    for key, v in verdict["stages"].items():  # "06", "06_forward" for a forward alone, "12_cpu"
        number = key[:2]
        if number in expected:
            # A GPU stage without a GPU (skipped) or without nvcc (missing) cannot show it; nor
            # can a stage that runs another stubbed stage before reaching its own stub (stage
            # 12's ring runs stage 06 on every block before it merges), as long as every stage
            # it waits on is one expected to be stubbed.
            shown = ("not implemented", "skipped", "missing")
            if v["state"] == "waiting" and set(v["stubs"]) <= expected:
                shown += ("waiting",)
            if v["state"] not in shown:
                problems.append(f"stage {key}: {v['state']} (expected not implemented)")
        elif v["state"] == "waiting" and set(v["stubs"]) <= expected:
            pass  # a stage without regions that runs a stubbed one (stage 14's CPU step runs 05)
        elif v["state"] not in ("passed", "skipped", "missing"):
            problems.append(f"stage {key}: {v['state']} (expected passed)")
        stray = set(v["stubs"]) - expected
        if stray:
            problems.append(f"stage {key}: reported stubs of stage(s) {', '.join(sorted(stray))}, "
                            f"which should not be stubbed")
    for name, v in verdict["others"].items():
        if v["state"] == "failed":
            problems.append(f"{name}: failed for a reason other than a stub")
        stray = set(v["stubs"]) - expected
        if stray:
            problems.append(f"{name}: reported stubs of stage(s) {', '.join(sorted(stray))}, "
                            f"which should not be stubbed")
    return problems


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ctest_args: list[str] = []
    if "--" in argv:
        k = argv.index("--")
        argv, ctest_args = argv[:k], argv[k + 1:]
    ap = argparse.ArgumentParser(description="Run CTest with a JUnit report; print one line per stage.")
    ap.add_argument("--build-dir", type=Path, default=ROOT / "build", help="the CMake build folder (default: build)")
    ap.add_argument("--junit", type=Path, help="the JUnit report to write (default: <build>/lab-results.xml)")
    ap.add_argument("--no-run", action="store_true", help="only read an existing report")
    ap.add_argument("--expect-not-implemented", metavar="STAGES",
                    help="for CI: '04,05', 'none', or 'manifest' (the lab's stubbed stages); exit 0 "
                         "exactly when those stages are the ones not implemented and nothing else fails")
    ap.add_argument("--source-dir", type=Path, default=ROOT, help="the tree the build is of (default: this one)")
    a = ap.parse_args(argv)

    build = a.build_dir.resolve()
    junit = (a.junit or build / "lab-results.xml").resolve()
    if not a.no_run:
        if not (build / "CTestTestfile.cmake").is_file():
            print(f"grade: {build} is not a configured build folder (run scripts/setup/setup.sh first)", file=sys.stderr)
            return 2
        if junit.exists():
            junit.unlink()
        # CTest's own output (every failing test's output with --output-on-failure) goes to
        # a log; the summary below says what it came to.
        log = build / "lab-ctest.log"
        cmd = ["ctest", "--test-dir", str(build), "--output-junit", str(junit), *ctest_args]
        print(f"grade: running ctest {' '.join(ctest_args)} (its output: {log})", flush=True)
        start = time.time()
        with log.open("w", encoding="utf-8") as fh:
            subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT)  # failures are reported below
        print(f"grade: ctest took {time.time() - start:.0f} s")
    if not junit.is_file():
        print(f"grade: no JUnit report at {junit} (did CTest run?)", file=sys.stderr)
        return 2

    folders = stage_folders(a.source_dir)
    results = read_junit(junit)
    lines, verdict = summarise(results, folders, stubbed_regions(a.source_dir, folders), known_tests(build, results))
    print(f"\n== lab summary ({len(results)} tests; JUnit report: {junit}) ==")
    for ln in lines:
        print(ln)

    if a.expect_not_implemented is not None:
        spec = a.expect_not_implemented
        if spec == "manifest":
            manifest = a.source_dir / ".lab.json"
            if not manifest.is_file():
                print(f"grade: --expect-not-implemented manifest: no {manifest}", file=sys.stderr)
                return 2
            expected = set(json.loads(manifest.read_text(encoding="utf-8"))["stubbed_stages"])
        elif spec == "none":
            expected = set()
        else:
            expected = {f"{int(s):02d}" for s in spec.split(",") if s.strip()}
        problems = check_expectation(verdict, expected, folders)
        want = ", ".join(sorted(expected)) or "none"
        if problems:
            print(f"grade: expectation NOT met (not implemented should be exactly: {want}):")
            for p in problems:
                print(f"  {p}")
            for name in sorted({p.split(":")[0] for p in problems}):
                test = results.get(name) or results.get("stage" + name.replace("stage ", ""))
                if test and test.output:
                    print(f"---- last lines of the output of {test.name} ----")
                    print("\n".join(test.output.rstrip().splitlines()[-25:]))
            return 1
        print(f"grade: expectation met: not implemented are exactly stage(s) {want}; everything else passes")
        return 0
    ok = all(r.status in ("passed", "skipped") for r in results.values())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
