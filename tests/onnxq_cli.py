"""The onnxq command line as users run it: a subprocess, its exit status and its output."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_onnxq(*argv: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``python -m onnxq ARGV...`` from this checkout, no stdin; stdout and stderr captured."""
    return subprocess.run(
        [sys.executable, "-m", "onnxq", *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdin=subprocess.DEVNULL,
    )
