"""Builds the optional C++ extension `mlxcel_py.cpu._qmm` (csrc/: the row-exact quantized matmul for
MLX on x86 CPUs) with CMake against the pinned mlx and nanobind. Everything else is in
pyproject.toml. If the build fails (no compiler, no CMake, not x86_64) the package still installs
and runs with float32 weights on the CPU. Why it was not built is written beside the package
(`mlxcel_py/cpu/KERNEL_NOT_BUILT`), so `mlxcel --version` can say so after a quiet `pip install`.
"""

import os
import platform
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_ext import build_ext

try:
    from mlx.extension import CMakeBuild, CMakeExtension
except ImportError:  # mlx missing from the build environment: nothing to build against
    CMakeBuild, CMakeExtension = build_ext, None


class OptionalCMakeBuild(CMakeBuild):
    """CMakeBuild that reports a failed build in one line instead of failing the install."""

    def run(self):
        if CMakeExtension is None or platform.machine().lower() not in ("x86_64", "amd64"):
            self._skip("the row-exact kernel is for x86_64 with mlx available at build time")
            return
        if os.environ.get("MLXCEL_NO_KERNEL"):
            self._skip("MLXCEL_NO_KERNEL is set")
            return
        try:
            super().run()
        except Exception as exc:  # CalledProcessError, missing cmake (FileNotFoundError), ...
            self._skip(f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
            return
        self._note(None)

    def _skip(self, why):
        print(
            f"mlxcel-py: the row-exact CPU kernel was not built ({why}); CPU weights will be float32", file=sys.stderr
        )
        self._note(why)

    def _note(self, why):
        """The reason (or its absence) in the source tree (editable installs) and the build tree (wheels)."""
        for root in (Path(__file__).resolve().parent, Path(self.build_lib)):
            note = root / "mlxcel_py" / "cpu" / NOTE
            if why is None:
                note.unlink(missing_ok=True)
            elif note.parent.is_dir():
                note.write_text(why + "\n")


NOTE = "KERNEL_NOT_BUILT"


ext_modules = [CMakeExtension("mlxcel_py.cpu._qmm", sourcedir="csrc")] if CMakeExtension else []
setup(ext_modules=ext_modules, cmdclass={"build_ext": OptionalCMakeBuild})
