"""The pages of the docs site that Doxygen writes for the build's own folders, found and
removed after Doxygen (docs/gen_pages.py reader). Python standard library only.
"""
from __future__ import annotations

import hashlib
from pathlib import Path


def remove_build_folders(repo: Path, html_dir: Path, gen: Path) -> int:
    """Removes the pages Doxygen writes for the build's folders (GEN and the folders above
    it that do not hold the repository): empty, linked only by each other. A folder's page is
    dir_<md5 of its path from the inputs' common prefix>.html, so every form of the path is
    tried (but a form that names a folder of the repository). Returns how many went."""

    def forms(path: Path):
        parts = path.resolve().parts[1:]
        return {"/".join(parts[k:]) + "/" for k in range(len(parts))} | {"/" + "/".join(parts) + "/"}

    gen, repo = gen.resolve(), repo.resolve()
    build = [gen] + [p for p in gen.rglob("*") if p.is_dir()]
    build += [a for a in gen.parents if a != Path(a.anchor) and a not in repo.parents and a != repo]
    ours = [repo] + list(repo.parents)
    for top in (repo / "common", repo / "stages"):
        ours += [top] + [p for p in top.rglob("*") if p.is_dir()]
    keep = set().union(*(forms(p) for p in ours))
    gone = {"dir_" + hashlib.md5(f.encode()).hexdigest()
            for p in build for f in forms(p) if f not in keep}
    removed = 0
    for page in html_dir.glob("dir_*.html"):
        if page.stem in gone:
            page.unlink()
            page.with_suffix(".js").unlink(missing_ok=True)
            removed += 1
    return removed
