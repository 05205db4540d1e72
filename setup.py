"""Build step for the native kernels: runs CMake on ``ops/`` and ships libonnxq_ops.so.

Metadata lives in pyproject.toml. If the native build fails (no compiler, no CMake), onnxq is
installed anyway and runs on the numpy reference engine; ``onnxq.cast`` says so once, at the
first cast with ``backend="auto"``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
LIBRARY = "libonnxq_ops.dylib" if sys.platform == "darwin" else "libonnxq_ops.so"


def _cmake() -> str | None:
    found = shutil.which("cmake")
    if found:
        return found
    try:  # the `cmake` wheel from PyPI (a build requirement)
        import cmake  # type: ignore[import-not-found]

        return str(Path(cmake.CMAKE_BIN_DIR) / "cmake")
    except ImportError:
        return None


def build_native() -> Path | None:
    """Configure and build ops/ into ops/build; return the library or None (with a message)."""
    if os.environ.get("ONNXQ_NO_NATIVE"):
        print("onnxq: ONNXQ_NO_NATIVE is set; skipping the native library", file=sys.stderr)
        return None
    cmake = _cmake()
    if cmake is None:
        print("onnxq: cmake not found; installing without the native library", file=sys.stderr)
        return None
    build = ROOT / "ops" / "build"
    # pip builds in throw-away environments: a cache naming an earlier run's cmake would break.
    (build / "CMakeCache.txt").unlink(missing_ok=True)
    configure = [cmake, "-S", str(ROOT / "ops"), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release"]
    # The GPU kernels (ops/gen_aot.py) are compiled by this interpreter when triton imports.
    configure.append(f"-DONNXQ_PYTHON={sys.executable}")
    if os.environ.get("ONNXQ_NO_GPU_KERNELS"):
        configure.append("-DONNXQ_GPU_KERNELS=OFF")
    if os.environ.get("ONNXRUNTIME_INCLUDE_DIR"):
        configure.append(f"-DONNXRUNTIME_INCLUDE_DIR={os.environ['ONNXRUNTIME_INCLUDE_DIR']}")
    try:
        subprocess.run(configure, check=True)
        subprocess.run([cmake, "--build", str(build), "-j", str(os.cpu_count() or 2)], check=True)
    except (OSError, subprocess.CalledProcessError) as err:
        print(
            f"onnxq: building the native library failed ({err}); onnxq is installed without it "
            f"and uses the numpy reference engine",
            file=sys.stderr,
        )
        return None
    lib = build / LIBRARY
    return lib if lib.is_file() else None


class BuildPyWithNative(build_py):
    """build_py that also builds the native library and places it inside the package."""

    def run(self) -> None:
        """Copy the Python sources, then build the library next to them."""
        super().run()
        lib = build_native()
        if lib is None:
            return
        targets = [Path(self.build_lib) / "onnxq" / LIBRARY]
        if getattr(self, "editable_mode", False):
            targets.append(ROOT / "onnxq" / LIBRARY)
        for target in targets:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(lib, target)


class BinaryDistribution(Distribution):
    """The wheel holds a native library, so it is platform specific."""

    def has_ext_modules(self) -> bool:
        """Always true: gives the wheel a platform tag."""
        return True


setup(cmdclass={"build_py": BuildPyWithNative}, distclass=BinaryDistribution)
