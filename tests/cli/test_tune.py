"""``onnxq tune`` as a subprocess: a search that writes its three files, and every bad input.

Bad input exits with status 2 and one line on stderr, and leaves no output (not even a hidden
temporary file) in the output folder.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from tests.tuning import synthetic

ROOT = Path(__file__).resolve().parents[2]
# port 1 on this machine: nothing listens, so the address is refused at once
_RAY_REFUSAL = (
    "does not answer" if importlib.util.find_spec("ray") is not None else "needs the ray package"
)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tune_cli")
    onnx.save(synthetic.model(), str(folder / "m.onnx"))
    stacked = np.stack([s["x"] for s in synthetic.samples()])
    np.savez(folder / "in.npz", x=stacked)
    np.savez(folder / "wrong_name.npz", y=stacked)
    np.savez(folder / "wrong_shape.npz", x=stacked[:, :, :32])
    (folder / "empty").mkdir()
    return folder


def _tune(folder: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    args = [sys.executable, "-m", "onnxq", "tune", str(folder / "m.onnx"), "-o", str(out)]
    return subprocess.run(
        [*args, *extra], capture_output=True, text=True, env=env, cwd=folder, timeout=300
    )


def test_tune_writes_model_recipe_and_report(files: Path, tmp_path: Path) -> None:
    out = tmp_path / "q.onnx"
    run = _tune(files, out, "--inputs", str(files / "in.npz"), "--budget", "sqnr>=28.8")
    assert run.returncode == 0, run.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "q.onnx",
        "q.recipe.yaml",
        "q.tune.json",
    ]
    report = json.loads((tmp_path / "q.tune.json").read_text())
    assert [r["format"] for r in report["layers"]] == ["mxfp4", "mxfp6", "mxfp4", "mxfp4"]
    assert "bits per weight: 4.750" in run.stdout


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--budget", "sqnr>=200", "--candidates", "mxfp4,bfp16"], "out of reach"),
        (["--budget", "psnr>=30"], "unknown metric 'psnr'"),
        (["--budget", "cosine<=0.9"], "cosine is a floor"),
        (["--budget", "sqnr>=28", "--candidates", "mxfp5x"], "unknown candidate format"),
        (["--budget", "sqnr>=28", "--inputs-set", "empty"], "hold no sample"),
        (["--budget", "sqnr>=28", "--inputs-set", "wrong_name.npz"], "model takes ['x']"),
        (["--budget", "sqnr>=28", "--inputs-set", "wrong_shape.npz"], "does not fit the model"),
        (["--budget", "sqnr>=28", "--ray", "127.0.0.1:1"], _RAY_REFUSAL),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(
    files: Path, tmp_path: Path, extra: list[str], message: str
) -> None:
    inputs = str(files / "in.npz")
    if "--inputs-set" in extra:
        i = extra.index("--inputs-set")
        inputs = str(files / extra[i + 1])
        extra = extra[:i] + extra[i + 2 :]
    run = _tune(files, tmp_path / "q.onnx", "--inputs", inputs, *extra)
    assert run.returncode == 2, run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("onnxq: error: "), run.stderr
    assert message.lower() in lines[0].lower()
    assert list(tmp_path.iterdir()) == []  # no output, no temporary file
