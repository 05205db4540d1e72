"""What the packing layouts compile to for sm_90 (benchmarks/kernel_report.py, no GPU needed).

docs/triton.md explains the packing layouts by their compiled code: the flattened block's byte
stores pass through shared memory, NVFP4's 3-D block loads 4 bytes at a time, and groups of one
16-byte load's codes avoid both. These tests keep those statements true for the installed
Triton; the timings themselves are `benchmarks/gpu.py`'s.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("torch", "triton")),
    reason="torch/triton not installed",
)


def kernel(preset: str, dtype: str, pack_group: str | None = None) -> dict[str, str]:
    """kernel_report's lines for one compress kernel, as name -> text."""
    cmd = [sys.executable, str(ROOT / "benchmarks" / "kernel_report.py"), preset, dtype, "compress"]
    if pack_group:
        cmd += ["--pack-group", pack_group]
    # a fresh interpreter: this one may run Triton's interpreter (TRITON_INTERPRET=1)
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "PYTHONPATH")}
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = dict(line.split(": ", 1) for line in proc.stdout.splitlines()[1:])
    return out


def stores(report: dict[str, str]) -> dict[str, int]:
    return ast.literal_eval(report["global_stores"])


def test_six_bit_codes_from_bfloat16() -> None:
    flat = kernel("mxfp6e2", "bfloat16")
    load = kernel("mxfp6e2", "bfloat16", "load")
    # flat: three byte stores per group of four codes, after a shared-memory conversion
    assert stores(flat).get("st.global.b8", 0) > 4 and "st.global.b16" not in stores(flat)
    # load: a thread's eight codes are three 16-bit stores; the one byte store is the scale's
    assert stores(load).get("st.global.b16", 0) >= 3 and stores(load).get("st.global.b8") == 1
    assert int(load["st_shared"]) < int(flat["st_shared"])
    assert int(load["bar_sync"]) < int(flat["bar_sync"])


def test_nvfp4_loads() -> None:
    three_d = kernel("nvfp4", "bfloat16")  # the default: a (tiles, groups, 2) block
    load = kernel("nvfp4", "bfloat16", "load")
    loads_3d = ast.literal_eval(three_d["global_loads"])
    loads = ast.literal_eval(load["global_loads"])
    assert "ld.global.v4.b32" not in loads_3d  # 4 bytes a load
    assert loads.get("ld.global.v4.b32", 0) >= 2  # 16 bytes a load
