#!/usr/bin/env python3
"""Figures of the notes that no measurement produces, drawn from code so that they stay
exact (the measured figures are scripts/results/plot_results.py's):

    docs/figures.py           writes docs/figures/causal_tiles.svg
    docs/figures.py --check   exit 1 if the committed file differs from what this draws

docs/gen_pages.py runs the check before every docs build. Python standard library only.
"""
import sys
from pathlib import Path

FIGURES = Path(__file__).resolve().parent / "figures"


def svg_causal_tiles() -> str:
    """Two tile maps: N_q = N_k (8 × 8 tiles) and N_q < N_k (3 × 8), bottom-right causal."""
    cell, gap = 26, 60
    maps = [("N_q = N_k = 8 tiles", 8, 8), ("N_q = 3 tiles, N_k = 8 tiles", 3, 8)]
    colors = {"full": "#4c9be8", "band": "#f5b041", "skip": "#eeeeee"}
    W = 40 + sum(nk * cell for _, _, nk in maps) + gap * (len(maps) - 1) + 40
    legend_y = 52 + max(nq for _, nq, _ in maps) * cell + 20
    H = legend_y + 3 * 20 + 10
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
           f'viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">',
           f'<rect width="{W}" height="{H}" fill="white"/>']
    x_off = 40
    for title, nq, nk in maps:
        out.append(f'<text x="{x_off}" y="24">{title}</text>')
        out.append(f'<text x="{x_off}" y="42" fill="#555">key tiles j →, query tiles i ↓</text>')
        for i in range(nq):
            for j in range(nk):
                # Tile size B on both sides, N_q = nq·B, N_k = nk·B: row r sees keys
                # c ≤ r + (N_k − N_q). Tile (i, j) is fully visible when its last key is
                # visible to its first row, (j+1)B − 1 ≤ iB + (nk − nq)B, i.e. j < i + t;
                # fully hidden when its first key is hidden from its last row, j > i + t.
                t = nk - nq
                kind = "full" if j < i + t else ("skip" if j > i + t else "band")
                x, y = x_off + j * cell, 52 + i * cell
                out.append(f'<rect x="{x}" y="{y}" width="{cell - 2}" height="{cell - 2}" '
                           f'fill="{colors[kind]}" stroke="#888"/>')
        x_off += nk * cell + gap
    for k, (kind, text) in enumerate((("full", "computed, no mask (off-band)"),
                                      ("band", "computed with the element mask (on-band)"),
                                      ("skip", "skipped: every key is in the future"))):
        x, y = 40, legend_y + 20 * k
        out.append(f'<rect x="{x}" y="{y}" width="14" height="14" fill="{colors[kind]}" stroke="#888"/>')
        out.append(f'<text x="{x + 20}" y="{y + 12}">{text}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


DRAWN = {"causal_tiles.svg": svg_causal_tiles}


def stale(folder: Path = FIGURES):
    """The figures whose committed file is missing or differs from what is drawn now."""
    return [name for name, draw in DRAWN.items()
            if not (folder / name).is_file() or (folder / name).read_text(encoding="utf-8") != draw()]


def main(argv) -> int:
    if "--check" in argv:
        bad = stale()
        for name in bad:
            print(f"docs/figures/{name} is not what docs/figures.py draws: run python3 docs/figures.py "
                  f"and commit it", file=sys.stderr)
        return 1 if bad else 0
    FIGURES.mkdir(exist_ok=True)
    for name, draw in DRAWN.items():
        (FIGURES / name).write_text(draw(), encoding="utf-8")
        print(f"wrote docs/figures/{name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
