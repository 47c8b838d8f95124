#!/usr/bin/env python3
"""Lab mode: writes a student tree, generated from the solutions.

The stage sources are the only copy of the code. Around the lines a student should write,
a stage carries two plain comment lines (common/lab.h):

    // LAB BEGIN: <region name> — hint: <one-line hint>        (" - " works as the dash too)
    ...solution statements...
    // LAB END

This script copies the repository (the files git knows: tracked, plus untracked ones that
are not ignored; never build folders) to an output folder, and in every chosen stage
replaces each region's statements with a stub that fails with

    not implemented: stage 05, region "online update"

The LAB BEGIN/END lines stay around a stub, so the student sees where to write and the
hint; in the stages that are not chosen the marker lines are removed and the solution stays.

How a stub fails:
  * host code (.cpp, .h, and host functions of .cu files): the region becomes
    `FA_LAB_TODO("05", "online update");`, which throws fa::NotImplemented.
  * device code (a region inside a __global__ or __device__ function): a kernel cannot
    throw, so the region becomes a line `#define FA_LAB_PENDING_07_2 "online softmax"`
    and the stage's host launchers (the functions named in HOST_ENTRY_POINTS, by default
    `forward` and `backward`) get, at the top of their body, a guard
        #if defined(FA_LAB_PENDING_07_2)
          FA_LAB_TODO("07", FA_LAB_PENDING_07_2);
        #endif
    for every device region in their file or in a file it includes. When the student
    replaces the #define with code, the guard disappears by itself.

The generator refuses, with file:line, a marker that is malformed, never closed, nested,
outside a function body, not made of whole statements, or a region that declares a
variable the code after it still uses (its stub could not compile). It writes a file only
when its content changed, so an incremental build of a reused output folder stays short.

Usage:
  scripts/lab/make_lab.py --out /tmp/lab --stages 04,05   # stub the regions of stages 04, 05
  scripts/lab/make_lab.py --out /tmp/lab                  # every stage that has regions
  scripts/lab/make_lab.py --out /tmp/lab --stages none    # no stubs (markers removed)
  scripts/lab/make_lab.py --list                          # the regions, per stage
  scripts/lab/make_lab.py --check                         # validate the markers only
  scripts/lab/make_lab.py --paste-back /tmp/lab [--stages 05]
                                        # put the solutions back into a student tree
"""
from __future__ import annotations

import argparse
import datetime
import json
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

SOURCE_SUFFIXES = {".c", ".cc", ".cpp", ".cxx", ".h", ".hh", ".hpp", ".cu", ".cuh"}
STAGE_DIR = re.compile(r"^stages/(\d\d)_[^/]+/")
# The shared device layers (docs/design.md §2) belong to the lab of the stage that
# introduces them: stage 08's online softmax on fragments lives in common/sm80/, stage 10's
# wgmma descriptor and softmax on wgmma fragments in common/hopper/.
LAYER_STAGES = {"common/sm80/": "08", "common/hopper/": "10"}
MANIFEST = ".lab.json"

# Host functions of a GPU stage that launch its kernels, by stage number. A device region
# is guarded in every definition of these names (at namespace scope, in the stage's own
# folder) whose file contains or includes the region. Stages not listed use the default.
DEFAULT_HOST_ENTRY_POINTS = ("forward", "backward")
# Stages 10 and 11: every step file instantiates its kernel in its step_1Nx() function.
# These launchers sit in the file of the kernel they launch, so each is guarded only on the
# regions its file reaches (it names the region's function, or names a function of the
# included files that does, and so on): step_11d never calls add_dq, so a stub of "the dQ
# reduction" leaves 11d runnable. The default launchers (a launch file apart from the
# kernels' files, as in stage 09) are guarded on every region they include.
HOST_ENTRY_POINTS: dict[str, tuple[str, ...]] = {
    "10": ("step_10a", "step_10b", "step_10c", "step_10d", "step_10e", "step_10f"),
    "11": ("step_11a", "step_11b", "step_11c", "step_11d"),
}

# Words that can precede a name at the start of a statement without declaring it.
NOT_A_TYPE = {
    "return", "throw", "delete", "goto", "case", "else", "new", "co_return", "co_yield",
    "co_await", "sizeof", "do", "if", "for", "while", "switch", "break", "continue",
    "default", "typedef", "static_assert", "operator", "template", "typename",
}


class LabError(Exception):
    """A problem with the markers or the tree; the message starts with file:line."""


# --------------------------------------------------------------------------------------
# Reading C++: blank comments, literals and preprocessor lines, then follow the braces.
# --------------------------------------------------------------------------------------

def blank_non_code(text: str) -> str:
    """Returns `text` with comments, string/char literal contents and preprocessor lines
    replaced by spaces (newlines kept), so that braces and names can be read safely."""
    out = list(text)
    n = len(text)
    i = 0
    line_start = True

    def blank(a: int, b: int) -> None:
        for k in range(a, b):
            if out[k] != "\n":
                out[k] = " "

    while i < n:
        c = text[i]
        if c == "\n":
            line_start = True
            i += 1
            continue
        if line_start and c in " \t":
            i += 1
            continue
        if line_start and c == "#":  # a preprocessor line, with its continuations
            j = i
            while j < n:
                if text[j] == "\n" and text[j - 1] != "\\":
                    break
                j += 1
            blank(i, j)
            i = j
            continue
        line_start = False
        nxt = text[i + 1] if i + 1 < n else ""
        if c == "/" and nxt == "/":
            j = text.find("\n", i)
            j = n if j < 0 else j
            blank(i, j)
            i = j
        elif c == "/" and nxt == "*":
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            blank(i, j)
            i = j
        elif c == "R" and nxt == '"' and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")
                                           or text[i - 1] in "Lu8U"):
            m = re.match(r'R"([^()\\ ]{0,16})\(', text[i:])
            if not m:
                i += 1
                continue
            end = text.find(")" + m.group(1) + '"', i)
            j = n if end < 0 else end + len(m.group(1)) + 2
            blank(i + 1, j)
            i = j
        elif c == '"' or (c == "'" and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_"))):
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            blank(i + 1, min(j, n))
            i = j + 1
        else:
            i += 1
    return "".join(out)


@dataclass
class Function:
    """A function body opened outside any other function."""
    name: str
    declaration: str  # the text before its '{' (templates, qualifiers, parameters)
    open_line: int    # line of the opening brace (1-based)
    close_line: int = 0
    namespace_scope: bool = True  # not a member of a class

    @property
    def is_device(self) -> bool:
        return re.search(r"\b__(device|global)__\b", self.declaration) is not None


@dataclass
class LineState:
    depth: int            # braces open at the start of the line
    in_function: bool     # inside a function body at the start of the line
    pending: str          # an unfinished statement at the start of the line
    min_depth: int        # the lowest depth reached on this line (start included)
    function: Function | None  # the outermost function around the line start


def _function_name(decl: str) -> str:
    depth = 0
    for m in re.finditer(r"[()]|[A-Za-z_]\w*(?=\s*\()", decl):
        tok = m.group(0)
        if tok == "(":
            depth += 1
        elif tok == ")":
            depth -= 1
        elif depth == 0 and tok not in ("__launch_bounds__", "__attribute__", "alignas",
                                         "decltype", "noexcept", "__declspec", "requires"):
            return tok
    return ""


def analyse(code: str) -> tuple[list[LineState], list[Function]]:
    """Follows the braces of blanked code. Returns the state at the start of every line
    (index 0 is line 1) and the functions defined outside other functions."""
    states: list[LineState] = []
    functions: list[Function] = []
    stack: list[tuple[str, Function | None]] = []  # (kind, function) per open brace
    saved: list[tuple[int, list[str]]] = []  # (paren, pending) outside each open brace
    pending: list[str] = []  # the statement since the last ; { } outside parentheses
    paren = 0
    line = 1

    def outer_function() -> Function | None:
        for kind, fn in stack:
            if kind == "function":
                return fn
        return None

    def new_line_state() -> LineState:
        return LineState(len(stack), outer_function() is not None, "".join(pending).strip(),
                         len(stack), outer_function())

    states.append(new_line_state())
    for c in code:
        if c == "\n":
            line += 1
            states.append(new_line_state())
            pending.append(" ")
            continue
        if c == "(":
            paren += 1
        elif c == ")":
            paren -= 1
        if c == "{":
            decl = " ".join("".join(pending).split())
            if outer_function() is not None:
                kind, fn = "block", None
            elif re.search(r"\bnamespace\b", decl) or re.match(r'^extern\s*"', decl):
                kind, fn = "namespace", None
            elif "(" in decl:
                kind = "function"
                fn = Function(_function_name(decl), decl, line,
                              namespace_scope=all(k == "namespace" for k, _ in stack))
                functions.append(fn)
            elif re.search(r"\b(class|struct|union|enum)\b", decl):
                kind, fn = "class", None
            else:
                kind, fn = "init", None
            stack.append((kind, fn))
            saved.append((paren, pending))
            pending = []
            paren = 0
        elif c == "}":
            if stack:
                kind, fn = stack.pop()
                if fn is not None:
                    fn.close_line = line
                paren, outer = saved.pop()
                # A brace inside parentheses (a lambda or braced argument) continues the
                # statement around it; any other closing brace ends a statement.
                pending = outer + ["{}"] if paren > 0 else []
            else:
                pending, paren = [], 0
            states[-1].min_depth = min(states[-1].min_depth, len(stack))
        elif c == ";" and paren == 0:
            pending = []
        else:
            pending.append(c)
    return states, functions


# --------------------------------------------------------------------------------------
# Markers
# --------------------------------------------------------------------------------------

MARKER = re.compile(r"^\s*//\s*LAB\s+(BEGIN|END)\b")
BEGIN = re.compile(r"^(?P<indent>\s*)//\s*LAB\s+BEGIN:\s*(?P<name>.*?)\s+(?:—|-)\s+hint:\s*(?P<hint>.*?)\s*$")
END = re.compile(r"^\s*//\s*LAB\s+END\s*$")
DECLARATION = re.compile(
    r"^\s*(?:(?:const|constexpr|static|volatile|register|unsigned|signed|long|short|thread_local|"
    r"__shared__|__restrict__)\s+)*(?P<type>[A-Za-z_][\w:]*(?:\s*<[^;=(){}]*>)?)"
    r"(?:\s*[*&]+\s*|\s+)(?P<name>[A-Za-z_]\w*)\s*(?:=|\{|;|\[|\(|,)")


@dataclass
class Region:
    file: str       # path relative to the tree's root
    stage: str      # "05"
    name: str
    hint: str
    begin: int      # line of LAB BEGIN (1-based)
    end: int        # line of LAB END
    indent: str
    body: list[str]  # the lines between the markers, newlines included
    device: bool = False
    function: str = ""
    index: int = 0  # 1-based position among the stage's regions

    @property
    def where(self) -> str:
        return f"{self.file}:{self.begin}"

    @property
    def pending_macro(self) -> str:
        return f"FA_LAB_PENDING_{self.stage}_{self.index}"


def stage_of(path: str) -> str | None:
    m = STAGE_DIR.match(path)
    if m:
        return m.group(1)
    return next((stage for layer, stage in LAYER_STAGES.items() if path.startswith(layer)), None)


def parse_regions(path: str, text: str, stage: str | None = None) -> list[Region]:
    """The regions of one file. Raises LabError (file:line: what is wrong) for a marker
    that is malformed, unclosed, nested, outside a function or not whole statements."""
    lines = text.splitlines(keepends=True)
    marker_lines = [k for k, ln in enumerate(lines, 1) if MARKER.match(ln)]
    if not marker_lines:
        return []
    if stage is None:
        stage = stage_of(path)
    if stage is None:
        raise LabError(f"{path}:{marker_lines[0]}: a LAB marker outside a stage folder "
                       f"(markers belong in stages/NN_name/ or a layer of LAYER_STAGES)")
    states, _ = analyse(blank_non_code(text))
    regions: list[Region] = []
    open_region: Region | None = None
    for k in marker_lines:
        ln = lines[k - 1].rstrip("\r\n")
        if END.match(ln):
            if open_region is None:
                raise LabError(f"{path}:{k}: LAB END without a LAB BEGIN before it")
            open_region.end = k
            open_region.body = lines[open_region.begin:k - 1]
            _check_statements(path, open_region, states)
            regions.append(open_region)
            open_region = None
            continue
        m = BEGIN.match(ln)
        if not m or not m.group("name") or not m.group("hint"):
            if re.match(r"^\s*//\s*LAB\s+END\b", ln):
                raise LabError(f"{path}:{k}: malformed marker: LAB END takes nothing after it: {ln.strip()}")
            raise LabError(f"{path}:{k}: malformed marker: expected "
                           f"'// LAB BEGIN: <region name> — hint: <hint>', got: {ln.strip()}")
        if open_region is not None:
            raise LabError(f"{path}:{k}: nested LAB BEGIN: region \"{open_region.name}\" opened at "
                           f"line {open_region.begin} is not closed yet (regions cannot nest)")
        name = m.group("name")
        if re.search(r'["\\]', name):
            raise LabError(f"{path}:{k}: region name {name!r} may not contain quotes or backslashes")
        state = states[k - 1]
        if not state.in_function:
            raise LabError(f"{path}:{k}: region \"{name}\" is outside a function body "
                           f"(a region is a sequence of statements inside one function)")
        open_region = Region(path, stage, name, m.group("hint"), k, 0, m.group("indent"), [],
                             device=state.function.is_device, function=state.function.name)
    if open_region is not None:
        raise LabError(f"{path}:{open_region.begin}: LAB BEGIN of region \"{open_region.name}\" "
                       f"is never closed (no LAB END after it)")
    return regions


def _check_statements(path: str, r: Region, states: list[LineState]) -> None:
    """A region must be whole statements of one block: it starts and ends at a statement
    boundary, at the same brace depth, and never closes a brace it did not open."""
    first, last = states[r.begin - 1], states[r.end - 1]
    if first.pending:
        raise LabError(f"{path}:{r.begin}: region \"{r.name}\" starts inside a statement "
                       f"({first.pending[:40]!r} is unfinished): move LAB BEGIN to a statement boundary")
    if last.depth != first.depth or min(s.min_depth for s in states[r.begin - 1:r.end]) < first.depth:
        raise LabError(f"{path}:{r.end}: region \"{r.name}\" (begins at line {r.begin}) does not "
                       f"end in the block it began in: a region must be whole statements")
    if last.pending:
        raise LabError(f"{path}:{r.end}: region \"{r.name}\" ends inside a statement "
                       f"({last.pending[:40]!r} is unfinished): move LAB END after its ';'")


def check_outliving_names(path: str, text: str, regions: list[Region]) -> None:
    """Refuses a region that declares a name (at its own level) which code after the region,
    in the same block, still uses: with the region stubbed, that code would not compile."""
    code = blank_non_code(text).split("\n")
    states, _ = analyse("\n".join(code))
    for r in regions:
        depth = states[r.begin - 1].depth
        declared: dict[str, int] = {}
        for k in range(r.begin + 1, r.end):
            if states[k - 1].depth != depth or states[k - 1].pending:
                continue
            m = DECLARATION.match(code[k - 1])
            if m and m.group("type") not in NOT_A_TYPE:
                declared.setdefault(m.group("name"), k)
                # more names in the same declaration: `float a = 0, b;`
                rest = code[k - 1][m.end():]
                level = 0
                for tok in re.finditer(r"[(){}\[\]<>]|,\s*[*&]*\s*([A-Za-z_]\w*)\s*(?==|;|\{|\[|\(|,)|;", rest):
                    t = tok.group(0)
                    if t in "([{":
                        level += 1
                    elif t in ")]}":
                        level -= 1
                    elif t == ";":
                        break
                    elif t.startswith(",") and level == 0 and tok.group(1):
                        declared.setdefault(tok.group(1), k)
        if not declared:
            continue
        for k in range(r.end + 1, len(code) + 1):
            if states[k - 1].depth < depth:
                break  # the block that held the region has closed
            for name, decl_line in list(declared.items()):
                if re.search(rf"\b{re.escape(name)}\b", code[k - 1]):
                    m = DECLARATION.match(code[k - 1])
                    if m and m.group("name") == name and states[k - 1].depth == depth:
                        del declared[name]  # declared afresh: not a use of the region's
                        continue
                    raise LabError(
                        f"{path}:{decl_line}: region \"{r.name}\" declares '{name}', which line {k} "
                        f"(after LAB END at line {r.end}) still uses: the stubbed stage would not "
                        f"compile. Declare '{name}' before LAB BEGIN, or move LAB END below line {k}")
            if states[k - 1].min_depth < depth:
                break


# --------------------------------------------------------------------------------------
# The tree
# --------------------------------------------------------------------------------------

def git_files(repo: Path) -> list[str]:
    """Files git knows in `repo`: tracked, and untracked but not ignored (no build dirs)."""
    try:
        out = subprocess.run(["git", "-C", str(repo), "ls-files", "-z", "--cached", "--others",
                              "--exclude-standard"], check=True, capture_output=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        raise LabError(f"{repo}: cannot list the repository's files with git ({e})") from e
    files = sorted({f for f in out.decode().split("\0") if f})
    return [f for f in files if (repo / f).is_file() and not (repo / f).is_symlink()]


def is_source(path: str) -> bool:
    return Path(path).suffix in SOURCE_SUFFIXES


def read(path: Path) -> str:
    with open(path, encoding="utf-8", newline="") as f:
        return f.read()


@dataclass
class Tree:
    root: Path
    files: list[str]
    texts: dict[str, str] = field(default_factory=dict)  # sources that carry markers
    regions: dict[str, list[Region]] = field(default_factory=dict)  # by stage

    @property
    def stage_folders(self) -> dict[str, str]:
        folders = {}
        for f in self.files:
            m = re.match(r"^stages/((\d\d)_[^/]+)/", f)
            if m:
                folders[m.group(2)] = m.group(1)
        return folders


def load_tree(root: Path, files: list[str] | None = None, lint: bool = True) -> Tree:
    tree = Tree(root, files if files is not None else git_files(root))
    errors = []
    for f in tree.files:
        if not is_source(f):
            continue
        text = read(root / f)
        if "LAB" not in text:
            continue
        try:
            regions = parse_regions(f, text)
            if lint:
                check_outliving_names(f, text, regions)
        except LabError as e:
            errors.append(str(e))
            continue
        if regions:
            tree.texts[f] = text
            for r in regions:
                tree.regions.setdefault(r.stage, []).append(r)
    for stage, regions in tree.regions.items():
        seen: dict[str, Region] = {}
        for k, r in enumerate(regions, 1):
            r.index = k
            if r.name in seen:
                errors.append(f"{r.where}: region name \"{r.name}\" is used twice in stage {stage} "
                              f"(also at {seen[r.name].where}); names must be unique per stage")
            seen[r.name] = r
    if errors:
        raise LabError("\n".join(errors))
    return tree


def resolve_include(tree: Tree, from_file: str, name: str) -> str | None:
    """Where `#include "name"` in `from_file` points inside the tree: the including file's
    folder first, then the include folders every stage gets (stage folders and common/)."""
    known = set(tree.files)
    here = str(Path(from_file).parent / name)
    if here in known:
        return here
    for f in tree.files:
        if (f.startswith("stages/") or f.startswith("common/")) and f.endswith("/" + name) \
                and f.count("/") == name.count("/") + (2 if f.startswith("stages/") else 1):
            return f
    return None


def includes_before(tree: Tree, file: str, line: int) -> set[str]:
    """Files that `file` includes (directly or not) through `#include "..."` lines before
    `line`, as far as they are in the tree."""
    seen: set[str] = set()
    todo = [(file, line)]
    while todo:
        f, limit = todo.pop()
        try:
            text = tree.texts.get(f) or read(tree.root / f)
        except OSError:
            continue
        for k, ln in enumerate(text.splitlines(), 1):
            if k >= limit:
                break
            m = re.match(r'^\s*#\s*include\s+"([^"]+)"', ln)
            if m:
                target = resolve_include(tree, f, m.group(1))
                if target and target not in seen:
                    seen.add(target)
                    todo.append((target, 10 ** 9))
    return seen


IDENTIFIER = re.compile(r"[A-Za-z_]\w*")


def functions_reached(tree: Tree, file: str, reach: set[str]) -> set[str]:
    """Names of the functions that the code of `file` can reach: the identifiers of `file`,
    then those in the bodies of the functions of `reach` (the files it includes) that they
    name, and so on. A superset (a name is enough, overloads and scopes are not told apart)."""
    bodies: dict[str, list[str]] = {}
    for f in reach:
        try:
            code = blank_non_code(tree.texts.get(f) or read(tree.root / f))
        except OSError:
            continue
        lines = code.split("\n")
        for fn in analyse(code)[1]:
            bodies.setdefault(fn.name, []).append("\n".join(lines[fn.open_line - 1:fn.close_line or len(lines)]))
    todo = set(IDENTIFIER.findall(blank_non_code(tree.texts.get(file) or read(tree.root / file))))
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for body in bodies.get(name, []):
            todo.update(set(IDENTIFIER.findall(body)) - seen)
    return seen


@dataclass
class Guard:
    file: str
    function: str
    line: int  # the line with the function body's '{'
    regions: list[Region]


def plan_guards(tree: Tree, stages: set[str]) -> list[Guard]:
    """For each stubbed device region, the host entry points that must refuse to launch
    while it is a stub. Raises LabError when a device region would go unguarded."""
    device = [r for s in stages for r in tree.regions.get(s, []) if r.device]
    if not device:
        return []
    guards: list[Guard] = []
    covered: set[tuple[str, str]] = set()
    # Every stage's launchers, not only the stubbed stage's: a later stage that includes
    # an earlier stage's kernel header must refuse to launch too.
    for stage, folder in sorted(tree.stage_folders.items()):
        names = HOST_ENTRY_POINTS.get(stage, DEFAULT_HOST_ENTRY_POINTS)
        for f in tree.files:
            if not f.startswith(f"stages/{folder}/") or Path(f).suffix not in (".cu", ".cpp", ".cc"):
                continue
            text = tree.texts.get(f) or read(tree.root / f)
            if not re.search(r"\b(" + "|".join(map(re.escape, names)) + r")\s*\(", text):
                continue
            _, functions = analyse(blank_non_code(text))
            lines = text.splitlines()
            for fn in functions:
                if fn.name not in names or not fn.namespace_scope or fn.is_device:
                    continue
                if not lines[fn.open_line - 1].rstrip().endswith("{"):
                    raise LabError(f"{f}:{fn.open_line}: cannot put the lab guard into {fn.name}(): "
                                   f"its body must start with '{{' at the end of a line")
                # Its guard sees the #define of a region above it in the same file, or in
                # a file it includes before its body.
                reach = includes_before(tree, f, fn.open_line)
                used = functions_reached(tree, f, reach) if stage in HOST_ENTRY_POINTS else None
                mine = [r for r in device if (r.file in reach or (r.file == f and r.end < fn.open_line))
                        and (used is None or r.function in used)]
                if mine:
                    guards.append(Guard(f, fn.name, fn.open_line, mine))
                    covered.update((r.file, r.name) for r in mine)
    for r in device:
        if (r.file, r.name) not in covered:
            names = HOST_ENTRY_POINTS.get(r.stage, DEFAULT_HOST_ENTRY_POINTS)
            raise LabError(f"{r.where}: device region \"{r.name}\" (in {r.function}()) is not seen by "
                           f"any host entry point of stage {r.stage}: no {'() or '.join(names)}() is "
                           f"defined at namespace scope below it in its file, or in a file that "
                           f"includes it, so its stub could not fail. Name the stage's launcher in "
                           f"HOST_ENTRY_POINTS in scripts/lab/make_lab.py")
    return guards


def host_stub(r: Region) -> list[str]:
    i = r.indent
    return [f"{i}// Replace the next line with your code (keep the LAB BEGIN/END lines).\n",
            f'{i}FA_LAB_TODO("{r.stage}", "{r.name}");\n']


def device_stub(r: Region, launchers: list[str]) -> list[str]:
    i = r.indent
    who = " and ".join(f"{n}()" for n in sorted(set(launchers))) or "the launcher"
    return [f"{i}// Replace the #define below with your code (keep the LAB BEGIN/END lines). A kernel\n",
            f"{i}// cannot throw: while the #define is here, {who} throws \"not implemented\".\n",
            f'#define {r.pending_macro} "{r.name}"\n']


def guard_lines(g: Guard, indent: str) -> list[str]:
    out = [f"{indent}// Lab mode: refuse to launch while a kernel region is still a stub (make_lab.py).\n"]
    for k, r in enumerate(g.regions):
        out.append(f"#{'if' if k == 0 else 'elif'} defined({r.pending_macro})\n")
        out.append(f'{indent}FA_LAB_TODO("{r.stage}", {r.pending_macro});\n')
    out.append("#endif\n")
    return out


def add_lab_include(text: str) -> str:
    """Adds `#include "lab.h"` after the file's last unconditional #include, if missing."""
    if re.search(r'^\s*#\s*include\s+"lab\.h"', text, re.M):
        return text
    lines = text.splitlines(keepends=True)
    level, after = 0, None
    for k, ln in enumerate(lines):
        s = ln.strip()
        if re.match(r"#\s*(if|ifdef|ifndef)\b", s):
            level += 1
        elif re.match(r"#\s*endif\b", s):
            level -= 1
        elif re.match(r"#\s*include\b", s) and level == 0:
            after = k + 1
        elif re.match(r"#\s*pragma\s+once\b", s) and after is None:
            after = k + 1
    if after is None:
        after = 0
    return "".join(lines[:after] + ['#include "lab.h"  // lab mode: FA_LAB_TODO\n'] + lines[after:])


def render(tree: Tree, stubbed: set[str]) -> tuple[dict[str, str], list[Guard]]:
    """The new text of every source that changes: stubs in stubbed stages, markers removed
    elsewhere, guards in the host entry points of stubbed device regions."""
    guards = plan_guards(tree, stubbed)
    launchers: dict[tuple[str, str], list[str]] = {}
    for g in guards:
        for r in g.regions:
            launchers.setdefault((r.file, r.name), []).append(g.function)
    by_file: dict[str, list[Region]] = {}
    for regions in tree.regions.values():
        for r in regions:
            by_file.setdefault(r.file, []).append(r)
    guards_by_file: dict[str, list[Guard]] = {}
    for g in guards:
        guards_by_file.setdefault(g.file, []).append(g)

    out: dict[str, str] = {}
    for f in sorted(set(by_file) | set(guards_by_file)):
        text = tree.texts.get(f) or read(tree.root / f)
        lines = text.splitlines(keepends=True)
        inserts: dict[int, list[str]] = {}  # after line k (1-based), these lines
        replace: dict[int, tuple[int, list[str]]] = {}  # from line k to line e, these lines
        needs_include = False
        for r in by_file.get(f, []):
            if r.stage in stubbed:
                stub = device_stub(r, launchers.get((r.file, r.name), [])) if r.device else host_stub(r)
                needs_include |= not r.device
                replace[r.begin] = (r.end, [lines[r.begin - 1]] + stub + [lines[r.end - 1]])
            else:
                replace[r.begin] = (r.end, list(r.body))
        for g in guards_by_file.get(f, []):
            body_indent = re.match(r"\s*", lines[g.line]).group(0) if g.line < len(lines) else "  "
            inserts[g.line] = guard_lines(g, body_indent or "  ")
            needs_include = True
        new: list[str] = []
        k = 1
        while k <= len(lines):
            if k in replace:
                end, repl = replace[k]
                new.extend(repl)
                k = end + 1
                continue
            new.append(lines[k - 1])
            if k in inserts:
                new.extend(inserts[k])
            k += 1
        result = "".join(new)
        if needs_include:
            result = add_lab_include(result)
        out[f] = result
    return out, guards


def lab_test_script(text: str) -> str:
    """scripts/test.sh of a student tree: its ctest call goes through the grader, which
    runs the same CTest, writes a JUnit report and prints one line per stage."""
    if not re.search(r"^root=", text, re.M):
        raise LabError("scripts/test.sh: no 'root=' line: cannot point its ctest call at scripts/lab/grade.py")
    lines = text.splitlines(keepends=True)
    calls = [k for k, ln in enumerate(lines) if re.match(r"^\s*(exec\s+)?ctest\b", ln)]
    if not calls:
        raise LabError("scripts/test.sh: no line starts with 'ctest': cannot point it at scripts/lab/grade.py")
    k = calls[-1]
    indent = re.match(r"\s*", lines[k]).group(0)
    rest = re.sub(r"^\s*(exec\s+)?ctest\b", "", lines[k]).rstrip("\n")
    lines[k] = (f"{indent}# Lab tree (scripts/lab/make_lab.py): the grader runs this CTest, writes a JUnit\n"
                f"{indent}# report and prints one line per stage (passed / failed / not implemented).\n"
                f"{indent}python3 \"$root/scripts/lab/grade.py\" --build-dir . --{rest}\n")
    return "".join(lines)


def student_lines(rendered: dict[str, str]) -> dict[tuple[str, str], int]:
    """(stage, region) → the LAB BEGIN line in the student tree (stubs shift lines)."""
    where = {}
    for f, text in rendered.items():
        if is_source(f):
            for r in parse_regions(f, text):
                where[(r.stage, r.name)] = r.begin
    return where


def lab_readme(tree: Tree, stubbed: set[str], source: dict, lines: dict[tuple[str, str], int]) -> str:
    """LAB.md at the root of a student tree: what to write, where, and how to test it."""
    commit = (source.get("commit") or "unknown")[:12] + (" (with uncommitted changes)" if source.get("dirty") else "")
    out = [f"# Lab: stage{'s' if len(stubbed) != 1 else ''} {', '.join(sorted(stubbed)) or 'none'}\n\n",
           f"Generated by `scripts/lab/make_lab.py` from commit {commit}.\n\n"]
    if not stubbed:
        out.append("No region is stubbed: this tree is the solution, with the lab markers removed.\n")
        return "".join(out)
    out.append("Write the regions below. In the source, each lies between a `LAB BEGIN` line that "
               "gives its name and a hint, and a `LAB END` line; replace what is between them with "
               "your code and keep the two marker lines. Until then the stage fails its tests with "
               "`not implemented: stage NN, region \"NAME\"`.\n\n")
    out.append("| stage | region | where | hint |\n|---|---|---|---|\n")
    for s in sorted(stubbed):
        for r in tree.regions[s]:
            hint = r.hint.replace("|", "\\|")
            at = lines.get((r.stage, r.name), r.begin)
            out.append(f"| {s} | {r.name} | `{r.file}:{at}` in `{r.function}()` | {hint} |\n")
    eigen = sorted(s for s in stubbed for r in tree.regions[s] if "Eigen" in tree.texts.get(r.file, ""))
    if eigen and "docs/concepts/eigen.md" in tree.files:
        out.append(f"\nStage {', '.join(sorted(set(eigen)))} computes with Eigen: `docs/concepts/eigen.md` has the "
                   "few idioms its code uses (views of memory, products and `noalias()`, rows and "
                   "heads, arrays, reductions and NaN).\n")
    first = sorted(stubbed)[0]
    out.append("\nStart with the quick check: CPU only, in `build-quick/`, it builds the harness and the "
               "stages' test programs (not the GPU stages, the docs or the notebooks), runs their tests "
               "and prints one line per stage (and per part, for a stage whose forward is graded "
               "alone), with the failing comparison in full:\n\n    scripts/test.sh --quick\n\n"
               f"Then one stage at a time: this rebuilds everything of stage {first} (its library, its "
               "program, its test programs) and runs its tests only:\n\n"
               f"    scripts/test.sh --quick --stage {first}\n"
               f"    ./build-quick/tests/test_stage{first}                 # its test program, every case\n"
               f"    ./build-quick/stages/{tree.stage_folders[first]}/stage{first} --help   # the stage program\n\n"
               "Everything (GPU stages when nvcc is there, the docs, the notebooks, the tour), "
               "in `build/`, with the JUnit report `build/lab-results.xml`:\n\n    scripts/test.sh\n")
    if any(r.device for s in stubbed for r in tree.regions[s]):
        out.append("\nGPU stages: a kernel cannot throw, so a stubbed kernel region holds a line "
                   "`#define FA_LAB_PENDING_NN_K \"NAME\"`, and the stage's host launcher refuses "
                   "to run while that macro is defined. Replacing the `#define` with your code is "
                   "all it takes. Their tests need a GPU; without one they are skipped.\n")
    return "".join(out)


def lab_notes(out: Path, stubbed_regions: set[tuple[str, str]]) -> int:
    """The notes of the student tree quote its own sources (docs/notes.py sync): a stubbed
    region shows as its stub between its marker lines, which carry the hint, and the notes'
    lab-hint comments of the stubbed regions become paragraphs the student reads. Returns
    the number of notes rewritten."""
    if not (out / "docs" / "notes.py").is_file():
        return 0
    sys.path.insert(0, str(out / "docs"))
    try:
        import notes  # the student tree's docs/notes.py
    finally:
        sys.path.pop(0)
    tree, written = notes.Tree(out), 0
    for note in tree.notes.values():
        if note.legacy:
            continue
        text = notes.sync_text(note.text, note.path, tree, keep_lab_markers=True)
        text = notes.show_lab_hints(text, stubbed_regions)
        written += write_if_changed(note.path, text)
    return written


def write_if_changed(path: Path, text: str | None, src: Path | None = None) -> bool:
    data = text.encode("utf-8") if text is not None else src.read_bytes()
    if path.is_file() and path.read_bytes() == data:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_symlink():
        path.unlink()
    with open(path, "wb") as fh:
        fh.write(data)
    if src is not None:
        shutil.copymode(src, path)
    return True


def parse_stage_list(spec: str, tree: Tree) -> set[str]:
    with_regions = sorted(tree.regions)
    if spec == "all":
        return set(with_regions)
    if spec == "none":
        return set()
    chosen = set()
    for item in [s.strip() for s in spec.split(",") if s.strip()]:
        m = re.match(r"^(\d{1,2})(_\w+)?$", item)
        if not m:
            raise LabError(f"--stages: '{item}' is not a stage (use numbers like 04,05, 'all' or 'none')")
        number = f"{int(m.group(1)):02d}"
        if number not in tree.stage_folders:
            raise LabError(f"--stages: there is no stage {number} in this tree "
                           f"(stages: {', '.join(sorted(tree.stage_folders))})")
        if number not in tree.regions:
            raise LabError(f"--stages: stage {number} ({tree.stage_folders[number]}) has no LAB regions "
                           f"(stages with regions: {', '.join(with_regions) or 'none'})")
        chosen.add(number)
    return chosen


def source_commit(repo: Path) -> dict:
    def git(*args: str) -> str:
        r = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
        return r.stdout.strip() if r.returncode == 0 else ""
    return {"commit": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain"))}


def generate(repo: Path, out: Path, stubbed_spec: str, force: bool = False, quiet: bool = False) -> dict:
    repo, out = repo.resolve(), out.resolve()
    if out == repo or repo in out.parents:
        ignored = subprocess.run(["git", "-C", str(repo), "check-ignore", "-q", str(out)]).returncode == 0
        if out == repo or not ignored:
            raise LabError(f"--out {out}: inside the repository and not ignored by git "
                           f"(use a folder outside it, or one like {repo}/lab-05 that .gitignore covers)")
    previous = None
    if out.exists() and any(out.iterdir()):
        if (out / MANIFEST).is_file():
            previous = json.loads(read(out / MANIFEST))
        elif not force:
            raise LabError(f"--out {out}: the folder is not empty and holds no lab "
                           f"({MANIFEST}); pass --force to write into it anyway")
    tree = load_tree(repo)
    stubbed = parse_stage_list(stubbed_spec, tree)
    changed_sources, guards = render(tree, stubbed)
    if "scripts/test.sh" in tree.files:
        changed_sources["scripts/test.sh"] = lab_test_script(read(repo / "scripts/test.sh"))

    written = 0
    for f in tree.files:
        if f in changed_sources:
            written += write_if_changed(out / f, changed_sources[f], None)
            shutil.copymode(repo / f, out / f)
        else:
            written += write_if_changed(out / f, None, repo / f)
    removed = 0
    if previous:
        for f in set(previous.get("files", [])) - set(tree.files):
            if (out / f).is_file():
                (out / f).unlink()
                removed += 1

    notes_quoting = lab_notes(out, {(s, r.name) for s in stubbed for r in tree.regions[s]})
    lines = student_lines(changed_sources)
    manifest = {
        "generated_by": "scripts/lab/make_lab.py",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "source": source_commit(repo),
        "stubbed_stages": sorted(stubbed),
        "stage_folders": tree.stage_folders,
        "regions": [
            {"stage": r.stage, "name": r.name, "hint": r.hint, "file": r.file,
             "line": lines.get((r.stage, r.name)) if r.stage in stubbed else None,
             "solution_line": r.begin, "device": r.device, "function": r.function,
             "stubbed": r.stage in stubbed}
            for s in sorted(tree.regions) for r in tree.regions[s]
        ],
        "guards": [{"file": g.file, "function": g.function, "regions": [r.name for r in g.regions]}
                   for g in guards],
        "files": tree.files,
    }
    # The date changes on every run; keep the old manifest when nothing else did.
    if previous and {k: v for k, v in previous.items() if k != "date"} == \
            {k: v for k, v in manifest.items() if k != "date"}:
        manifest = previous
    write_if_changed(out / MANIFEST, json.dumps(manifest, indent=2, ensure_ascii=False) + "\n")
    if "LAB.md" not in tree.files:
        write_if_changed(out / "LAB.md", lab_readme(tree, stubbed, manifest["source"], lines))
    if not quiet:
        n = sum(len(tree.regions[s]) for s in stubbed)
        print(f"make_lab: wrote {out}: {n} region(s) stubbed in stage(s) "
              f"{', '.join(sorted(stubbed)) or 'none'}; {written} file(s) written ({notes_quoting} "
              f"notes then quoting the stubs), "
              f"{len(tree.files) - written} unchanged, {removed} removed")
        for s in sorted(stubbed):
            for r in tree.regions[s]:
                kind = "device" if r.device else "host"
                print(f"  stage {s} {tree.stage_folders[s]}: \"{r.name}\" ({kind}, "
                      f"{r.file}:{lines.get((r.stage, r.name), r.begin)})")
        for g in guards:
            print(f"  guard: {g.file}:{g.line} {g.function}() refuses to launch while "
                  f"{', '.join(r.pending_macro for r in g.regions)} is defined")
    return manifest


def paste_back(repo: Path, student: Path, spec: str, quiet: bool = False) -> list[Region]:
    """Puts the solutions of `repo` back into the stubbed regions of a student tree."""
    repo, student = repo.resolve(), student.resolve()
    solutions = load_tree(repo)
    files = sorted(str(p.relative_to(student)) for p in (student / "stages").rglob("*")
                   if p.is_file() and is_source(str(p)))
    mine = load_tree(student, files, lint=False)
    stages = parse_stage_list(spec, mine) if spec != "all" else set(mine.regions)
    wanted = {(r.stage, r.name): r for s in solutions.regions.values() for r in s}
    pasted: list[Region] = []
    by_file: dict[str, list[Region]] = {}
    for s in stages:
        for r in mine.regions.get(s, []):
            if (r.stage, r.name) not in wanted:
                raise LabError(f"{student / r.file}:{r.begin}: region \"{r.name}\" of stage {r.stage} "
                               f"has no solution in {repo}")
            by_file.setdefault(r.file, []).append(r)
    for f, regions in by_file.items():
        lines = read(student / f).splitlines(keepends=True)
        for r in sorted(regions, key=lambda r: r.begin, reverse=True):
            lines[r.begin:r.end - 1] = wanted[(r.stage, r.name)].body
            pasted.append(r)
        write_if_changed(student / f, "".join(lines))
    lab_notes(student, {(s, r.name) for s, rs in mine.regions.items() if s not in stages for r in rs})
    if not quiet:
        print(f"make_lab: pasted {len(pasted)} solution region(s) back into {student}")
        for r in sorted(pasted, key=lambda r: (r.stage, r.begin)):
            print(f"  stage {r.stage}: \"{r.name}\" ({r.file}:{r.begin})")
    return pasted


def print_list(tree: Tree) -> None:
    if not tree.regions:
        print("no LAB regions in this tree")
    for s in sorted(tree.regions):
        print(f"stage {s} {tree.stage_folders.get(s, '')}:")
        for r in tree.regions[s]:
            kind = "device" if r.device else "host"
            print(f"  \"{r.name}\" ({kind}, {r.function}(), {r.file}:{r.begin}-{r.end}, "
                  f"{len(r.body)} lines)\n      hint: {r.hint}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description="Write a student tree with the LAB regions of chosen stages replaced by stubs.",
        epilog="Example: scripts/lab/make_lab.py --out /tmp/lab --stages 04,05 && "
               "cd /tmp/lab && scripts/test.sh")
    ap.add_argument("--repo", type=Path, default=Path(__file__).resolve().parents[2],
                    help="the solution repository (default: this script's)")
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--out", type=Path, help="folder to write the student tree to")
    mode.add_argument("--list", action="store_true", help="print the regions per stage")
    mode.add_argument("--check", action="store_true", help="only validate the markers")
    mode.add_argument("--paste-back", type=Path, metavar="STUDENT_TREE",
                      help="put the solution regions back into a student tree")
    ap.add_argument("--stages", default="all",
                    help="stages whose regions become stubs: 04,05 | all (default) | none")
    ap.add_argument("--force", action="store_true", help="write into a non-empty folder that is not a lab")
    ap.add_argument("--quiet", action="store_true")
    a = ap.parse_args(argv)
    try:
        if a.list:
            print_list(load_tree(a.repo))
        elif a.check:
            tree = load_tree(a.repo)
            plan_guards(tree, set(tree.regions))
            n = sum(len(v) for v in tree.regions.values())
            print(f"make_lab: {n} region(s) in {len(tree.regions)} stage(s): markers are well-formed")
        elif a.paste_back:
            paste_back(a.repo, a.paste_back, a.stages, a.quiet)
        else:
            generate(a.repo, a.out, a.stages, a.force, a.quiet)
    except LabError as e:
        for ln in str(e).splitlines():
            print(f"make_lab: error: {ln}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
