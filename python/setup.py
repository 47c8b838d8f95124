"""`pip install ./python` (non-editable): builds the package's two native libraries with the
project's CMake, against the torch that is installed, and puts them into the package.

    pip install --no-build-isolation ./python     # --no-build-isolation: build against *this* torch

libfa_c.so (the C ABI over every stage) is always built; libfa_torch.so (the native PyTorch op,
python/csrc) when python3 can import torch. The build folder is build-python/ at the
repository's root, so a second install rebuilds only what changed. The package is built for
any x86-64 machine (-DFA_PORTABLE=ON), not this one's instruction set. FA_CMAKE_ARGS adds CMake
arguments (e.g. "-DFA_ENABLE_CUDA=OFF" for the CPU stages only, or
"-DCMAKE_CUDA_ARCHITECTURES=90"). An editable install (`pip install -e ./python`) builds
nothing: it uses the repository's build/ or build-gpu/ (fa_attention.library_candidates()).
"""
import os
import pathlib
import shlex
import shutil
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = pathlib.Path(__file__).resolve().parent.parent


class BuildWithCMake(build_py):
    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return
        build = ROOT / "build-python"
        generator = ["-G", "Ninja"] if shutil.which("ninja") else []
        subprocess.run(["cmake", "-S", str(ROOT), "-B", str(build), *generator, "-DCMAKE_BUILD_TYPE=Release",
                        "-DFA_BUILD_DOCS=OFF", "-DFA_PORTABLE=ON", *shlex.split(os.environ.get("FA_CMAKE_ARGS", ""))], check=True)
        have_torch = subprocess.run(["cmake", "--build", str(build), "--target", "help"], capture_output=True,
                                    text=True, check=True).stdout.find("fa_torch") >= 0
        targets = ["fa_c"] + (["fa_torch"] if have_torch else [])
        subprocess.run(["cmake", "--build", str(build), "-j", str(os.cpu_count() or 2), "--target", *targets],
                       check=True)
        package = pathlib.Path(self.build_lib) / "fa_attention"
        shutil.copy2(build / "stages" / "libfa_c.so", package / "libfa_c.so")
        if have_torch:
            shutil.copy2(build / "python" / "libfa_torch.so", package / "libfa_torch.so")


setup(cmdclass={"build_py": BuildWithCMake})
