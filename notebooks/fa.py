"""The numpy API of the fa_attention package (python/fa_attention/core.py), for the notebooks.

`import fa` with notebooks/ on sys.path gives the same functions as `import fa_attention`,
with no install: this file puts the repository's python/ folder first on sys.path.
"""
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "python"))

from fa_attention.core import *  # noqa: E402,F401,F403
from fa_attention.core import __all__  # noqa: E402,F401
