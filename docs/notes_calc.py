"""Computed numbers in the notes: `<!-- calc: EXPR -->VALUE`.

The hardware arithmetic of a note (multiply-adds of an instruction, clocks, ratios, register
splits) is written as an expression over the cards' figures in `docs/hardware.csv`, and the
number a reader sees follows the marker:

    An m16n8k16 is <!-- calc: 16*8*16 -->2048 multiply-adds; at
    <!-- calc: H100.mac_bf16 -->2048 per clock per SM ...
    <!-- calc: H100.bf16_tflops * 1e12 / (H100.sms * H100.boost_mhz * 1e6) as .0f -->4096 FLOP

EXPR is arithmetic (+ - * / // % **, parentheses, numbers) on the table's figures, named
CARD.QUANTITY (`H100.sms`, `A100.mac_bf16`: the columns and rows of hardware.csv), and the
functions floor, ceil, min, max, round. An optional `as SPEC` formats the value:
  (none)   an integer (the value must be one): 4 digits as they are, 5 or more grouped by
           commas (2048, 65,536)
  frac     a fraction with a denominator of at most 64 (1/2, 1, 3/4)
  a Python format spec (`.2f`, `,.0f`, `.0%`)
`docs/notes.py sync` writes the value after each marker; `docs/notes.py check` (CTest
notes_format) reports a value that differs, so a number typed by hand cannot drift from the
table. Markers stay out of math (`$…$`) and never open a line (CommonMark would read the line
as an HTML block); in code (a fenced block, a code span) a marker is
quoted text, not a marker. The site shows the value only.

Python standard library only.
"""
from __future__ import annotations

import ast
import csv
import math
import re
from fractions import Fraction
from pathlib import Path

# The marker and the value it governs: a number as written by format_value (digits with
# optional comma groups, decimals, a fraction, a percent sign), possibly negative.
CALC_RE = re.compile(r"<!--[ \t]*calc:[ \t]*(?P<expr>.+?)[ \t]*-->"
                     r"(?P<value>-?\d+(?:,\d{3})*(?:\.\d+)?(?:/\d+)?%?)?")
FUNCTIONS = {"floor": math.floor, "ceil": math.ceil, "min": min, "max": max, "round": round}


class CalcError(Exception):
    """An expression that cannot be evaluated or formatted; the message says which."""


def load_cards(path: Path) -> dict[str, dict[str, float | str]]:
    """hardware.csv → {card: {quantity: value}}; empty cells are left out."""
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f))
    header = rows[0]
    cards = header[2:header.index("source")]
    table: dict[str, dict[str, float | str]] = {c: {} for c in cards}
    for row in rows[1:]:
        if not row or not row[0]:
            continue
        for card, cell in zip(cards, row[2:2 + len(cards)]):
            cell = cell.strip()
            if not cell:
                continue
            try:
                table[card][row[0]] = float(cell) if "." in cell or "e" in cell else int(cell)
            except ValueError:
                table[card][row[0]] = cell
    return table


def evaluate(expr: str, cards: dict[str, dict[str, float | str]]) -> float:
    """The value of one expression (a small safe subset of Python)."""
    try:
        tree = ast.parse(expr, mode="eval")
    except SyntaxError as e:
        raise CalcError(f"'{expr}' is not an expression ({e.msg})") from None
    ops = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
           ast.Div: lambda a, b: a / b, ast.FloorDiv: lambda a, b: a // b,
           ast.Mod: lambda a, b: a % b, ast.Pow: lambda a, b: a ** b}

    def ev(node):
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in ops:
            a, b = ev(node.left), ev(node.right)
            if isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)) and b == 0:
                raise CalcError(f"'{expr}' divides by zero")
            return ops[type(node.op)](a, b)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            v = ev(node.operand)
            return -v if isinstance(node.op, ast.USub) else v
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            card, qty = node.value.id, node.attr
            if card not in cards:
                raise CalcError(f"'{expr}': no card '{card}' in hardware.csv (cards: {', '.join(cards)})")
            value = cards[card].get(qty)
            if not isinstance(value, (int, float)):
                raise CalcError(f"'{expr}': hardware.csv has no number for {card}.{qty}")
            return value
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in FUNCTIONS
                and not node.keywords):
            return FUNCTIONS[node.func.id](*[ev(a) for a in node.args])
        raise CalcError(f"'{expr}': '{ast.unparse(node)}' is not allowed (numbers, CARD.QUANTITY, "
                        f"+ - * / // % **, {', '.join(FUNCTIONS)})")

    return ev(tree)


def format_value(value: float, spec: str | None) -> str:
    """The number as the note shows it (see the module's docstring)."""
    if spec is None:
        if abs(value - round(value)) > 1e-9 * max(1.0, abs(value)):
            raise CalcError(f"the value {value!r} is not an integer: give a format (`as .2f`, `as frac`)")
        n = int(round(value))
        return f"{n:,}" if abs(n) >= 10000 else str(n)
    if spec == "frac":
        f = Fraction(value).limit_denominator(64)
        if abs(float(f) - value) > 1e-9 * max(1.0, abs(value)):
            raise CalcError(f"the value {value!r} is not a fraction with a denominator of at most 64")
        return str(f.numerator) if f.denominator == 1 else f"{f.numerator}/{f.denominator}"
    try:
        return format(value, spec)
    except ValueError as e:
        raise CalcError(f"format '{spec}': {e}") from None


def compute(marker_expr: str, cards) -> str:
    """The text a marker's value must be: `EXPR` or `EXPR as SPEC`."""
    expr, _, spec = marker_expr.partition(" as ")
    return format_value(evaluate(expr.strip(), cards), spec.strip() or None)


def _prose_lines(lines: list[str]) -> list[bool]:
    """Whether each line is prose (outside a fenced code block)."""
    prose, fence = [], None
    for line in lines:
        m = re.match(r"^[ \t]*(```+|~~~+)", line)
        if fence is None and m:
            fence = m.group(1)[0] * 3
            prose.append(False)
        elif fence is not None:
            prose.append(False)
            if line.strip().startswith(fence):
                fence = None
        else:
            prose.append(True)
    return prose


def calc_text(text: str, cards, where: str = "") -> tuple[str, list[str]]:
    """`text` with every calc marker's value recomputed, and the problems: a value that
    differs (file:line: marker, written, computed) or an expression that fails."""
    lines = text.split("\n")
    problems: list[str] = []
    prose = _prose_lines(lines)
    for k, line in enumerate(lines):
        if not prose[k] or "calc:" not in line:
            continue

        code = [c.span() for c in re.finditer(r"`[^`]*`", line)]
        if re.match(r"^[ \t]*(?:[-*+][ \t]+|\d+\.[ \t]+)?<!--[ \t]*calc:", line):
            problems.append(f"{where}:{k + 1}: a calc marker starts the line: CommonMark reads a line that "
                            f"opens with '<!--' as an HTML block and breaks the paragraph; put a word before it")

        def fill(m: re.Match) -> str:
            if any(a <= m.start() < b for a, b in code):  # quoted in a code span: not a marker
                return m.group(0)
            try:
                want = compute(m.group("expr"), cards)
            except CalcError as e:
                problems.append(f"{where}:{k + 1}: calc: {e}")
                return m.group(0)
            have = m.group("value")
            if have != want:
                problems.append(f"{where}:{k + 1}: the number after <!-- calc: {m.group('expr')} --> is "
                                f"{have or 'missing'}, the table gives {want}: run `python3 docs/notes.py sync`")
            return m.group(0)[:m.start("value") - m.start(0)] + want if have is not None else m.group(0) + want

        lines[k] = CALC_RE.sub(fill, line)
    return "\n".join(lines), problems


def strip_markers(line: str) -> str:
    """A prose line for the site (its code spans already taken out): the markers go, the
    values stay."""
    return re.sub(r"<!--[ \t]*calc:.*?-->", "", line)
