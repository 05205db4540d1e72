"""benchmarks/kernel_variants.py: counting the kernel compiles of the GPU tests without a GPU."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parents[3]


def test_search_candidates_share_one_compile() -> None:
    # Scale search casts a tile three times (floor, one code up, one down) and decodes each;
    # the candidates differ only in the run-time s_step, so the worked mxfp4 tile (an actual
    # and a virtual cast, float32) compiles one quantize and one dequantize kernel.
    node = "tests/cast/triton/test_search.py::test_golden_floor_minus_one_mxfp4"
    tool = ROOT / "benchmarks" / "kernel_variants.py"
    done = subprocess.run(
        [sys.executable, str(tool), "--workers", "0", node],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert [line for line in lines if line.endswith(" specialisations")] == ["2 specialisations"]
    rows = [line for line in lines if line.startswith("| `")]
    assert rows == ["| `_quant_kernel` | 1 | - |", "| `_dequant_kernel` | 1 | - |"], rows
