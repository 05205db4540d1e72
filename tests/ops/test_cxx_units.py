"""The C++ unit tests (ops/tests/unit_tests.cc): the parser and the bit packing, without Python.

Builds the CMake target onnxq_unit_tests (the library's own sources at -O1, no onnxruntime, no
GPU kernels) into ops/build-units, or ONNXQ_UNIT_BUILD, and runs it. Skips when cmake or a C++
compiler is missing.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _build() -> Path:
    """The unit test program, configured and built (incrementally) in its own build folder."""
    cmake = shutil.which("cmake")
    if cmake is None:
        pytest.skip("cmake not found")
    if not any(shutil.which(c) for c in (os.environ.get("CXX", "c++"), "c++", "g++", "clang++")):
        pytest.skip("no C++ compiler found")
    build = Path(os.environ.get("ONNXQ_UNIT_BUILD", ROOT / "ops" / "build-units"))
    configure = [cmake, "-S", str(ROOT / "ops"), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release"]
    configure += ["-DONNXQ_GPU_KERNELS=OFF", "-DONNXQ_CUSTOM_OPS=OFF"]
    proc = subprocess.run(configure, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:  # a cache from another cmake or source folder: start afresh
        (build / "CMakeCache.txt").unlink(missing_ok=True)
        proc = subprocess.run(configure, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    jobs = os.environ.get("ONNXQ_UNIT_JOBS", "2")
    proc = subprocess.run(
        [cmake, "--build", str(build), "--target", "onnxq_unit_tests", "-j", jobs],
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    program = build / "onnxq_unit_tests"
    assert program.is_file(), f"{program} was not built"
    return program


def test_the_cxx_unit_tests_pass() -> None:
    program = _build()
    proc = subprocess.run([str(program)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    found = re.search(r"onnxq_unit_tests: (\d+) checks, 0 failed", proc.stdout)
    assert found, proc.stdout
    assert int(found.group(1)) > 0
