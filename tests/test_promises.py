"""Promises the package makes about its outputs and keywords, held against what it does.

- ``quantize_model(progress=True)`` draws a bar (it raised TypeError).
- Output files honour the umask (they were 0600 whatever the umask).
- A run killed with ``kill -9`` leaves nothing a user has to clean up, and never pairs a model
  with another run's external data (the data file was renamed before the model).
- The README's BFP zero-block exponent matches the code and docs/layouts.md.
"""

from __future__ import annotations

import io
import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import onnxq
from onnxq import _output
from onnxq.graph.quantize import quantize_model
from tests.models import builders

ROOT = Path(__file__).resolve().parents[1]


def _save_external(model: onnx.ModelProto, path: Path, location: str) -> None:
    copy = onnx.ModelProto()
    copy.CopyFrom(model)  # onnx.save rewrites the tensors it moves out
    onnx.save(copy, path, save_as_external_data=True, location=location, size_threshold=0)


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


# -- progress --------------------------------------------------------------------------------
def test_progress_true_draws_a_bar_on_stderr(monkeypatch: pytest.MonkeyPatch) -> None:
    model, _ = builders.mlp()
    err = io.StringIO()  # not a terminal: progress=True still draws, the user asked for it
    monkeypatch.setattr(sys, "stderr", err)
    quantize_model(model, weights="mxfp4", progress=True)
    drawn = err.getvalue()
    assert "[" in drawn and "3/3" in drawn, drawn  # mlp has three weights
    assert drawn.endswith("\r")  # erased at the end


def test_progress_false_is_silent_and_other_values_are_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    model, _ = builders.mlp()
    quantize_model(model, weights="mxfp4", progress=False)
    assert capsys.readouterr().err == ""
    calls: list[tuple[int, int, str]] = []
    quantize_model(model, weights="mxfp4", progress=lambda *a: calls.append(a))
    assert [c[:2] for c in calls] == [(1, 3), (2, 3), (3, 3)]
    with pytest.raises(TypeError, match="progress must be"):
        quantize_model(model, weights="mxfp4", progress=1)  # type: ignore[arg-type]


# -- file modes ------------------------------------------------------------------------------
@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002])
def test_output_files_honour_the_umask(umask: int, tmp_path: Path) -> None:
    model, _ = builders.mlp()
    src = tmp_path / "m.onnx"
    _save_external(model, src, "m.onnx.data")
    old = os.umask(umask)
    try:
        quantize_model(src, tmp_path / "q.onnx", weights="mxfp4")
        quantize_model(model, tmp_path / "single.onnx", weights="mxfp4")
    finally:
        os.umask(old)
    want = 0o666 & ~umask
    written = sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("m.onnx"))
    assert written[0] == "q.onnx" and written[1].startswith("q.onnx.") and len(written) == 3
    for name in written:
        assert (tmp_path / name).stat().st_mode & 0o777 == want, (name, oct(umask))


def test_cli_save_honours_the_umask(tmp_path: Path) -> None:
    model, _ = builders.mlp()
    src = tmp_path / "m.onnx"
    onnx.save(model, src)
    out = tmp_path / "o.npz"
    code = "import os, sys; os.umask(0o027); from onnxq.cli import main; sys.exit(main())"
    done = subprocess.run(
        [sys.executable, "-c", code, "run", str(src), "--save", str(out)],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert out.stat().st_mode & 0o777 == 0o640


# -- killed runs -----------------------------------------------------------------------------
_HOLD = """
import sys, time
from pathlib import Path
from onnxq import _output
with _output.new_file(Path(sys.argv[1])) as (f, path):
    f.write(b"half a model")
    f.flush()
    print(path, flush=True)
    time.sleep(120)
"""


def _holder(target: Path) -> tuple[subprocess.Popen[str], Path]:
    proc = subprocess.Popen(
        [sys.executable, "-c", _HOLD, str(target)], env=_env(), stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    return proc, Path(proc.stdout.readline().strip())


def test_a_killed_writer_leaves_only_a_hidden_file_that_the_next_run_removes(
    tmp_path: Path,
) -> None:
    proc, temp = _holder(tmp_path / "q.onnx")
    try:
        _output.sweep(tmp_path)  # a live writer's file stays
        assert temp.exists()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert temp.name.startswith(".q.onnx.") and temp.exists()
    model, _ = builders.mlp()
    quantize_model(model, tmp_path / "other.onnx", weights="mxfp4")  # any run into the folder
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.onnx"]


# A quantize run that kills itself (SIGKILL) at one point of the commit sequence.
_KILLED_RUN = """
import os, signal, sys
from onnxq import _output
from onnxq.graph import model_io as qz
from onnxq.graph.quantize import quantize_model
where = sys.argv[3]
if where == "before the model":
    real = _output.replace
    def replace(temp, target):
        if target.name == "q.onnx":
            os.kill(os.getpid(), signal.SIGKILL)
        real(temp, target)
    _output.replace = replace
else:
    qz._remove_stale_data = lambda *a: os.kill(os.getpid(), signal.SIGKILL)
quantize_model(sys.argv[1], sys.argv[2], weights="mxint8")
"""


def _weights(path: Path) -> dict[str, np.ndarray]:
    model = onnx.load(str(path))  # loads the external data the model refers to
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


@pytest.mark.parametrize("where", ["before the model", "after the model"])
def test_a_run_killed_during_the_commit_keeps_model_and_data_paired(
    where: str, tmp_path: Path
) -> None:
    model, _ = builders.mlp()
    src = tmp_path / "m.onnx"
    _save_external(model, src, "m.onnx.data")
    out = tmp_path / "q.onnx"
    quantize_model(src, out, weights="mxfp4")
    first = _weights(out)
    done = subprocess.run(
        [sys.executable, "-c", _KILLED_RUN, str(src), str(out), where], env=_env(), timeout=120
    )
    assert done.returncode == -signal.SIGKILL
    second = _weights(out)  # whichever model is there loads with its own data
    want = quantize_model(model, weights="mxint8") if where == "after the model" else None
    if want is None:
        assert second.keys() == first.keys()
        for name, value in first.items():
            np.testing.assert_array_equal(second[name], value, err_msg=name)
    else:
        got = {t.name: numpy_helper.to_array(t) for t in want.graph.initializer}
        for name, value in got.items():
            np.testing.assert_array_equal(second[name], value, err_msg=name)
    # The next run cleans up what the killed one left: one model, one data file.
    quantize_model(src, out, weights="mxfp4")
    left = sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("m.onnx"))
    assert (
        len(left) == 2
        and left[0] == "q.onnx"
        and re.fullmatch(r"q\.onnx(\.[0-9a-f]{8})?\.data", left[1])
    ), left


def test_an_existing_data_file_is_never_replaced(tmp_path: Path) -> None:
    """The input's data named like the output's data file stays untouched."""
    model, _ = builders.mlp()
    src = tmp_path / "m.onnx"
    _save_external(model, src, "q.onnx.data")
    before = (tmp_path / "q.onnx.data").read_bytes()
    quantize_model(src, tmp_path / "q.onnx", weights="mxfp4")
    assert (tmp_path / "q.onnx.data").read_bytes() == before
    onnx.checker.check_model(str(tmp_path / "q.onnx"), full_check=True)
    assert _weights(src)  # the input still loads with its data


# -- documentation ---------------------------------------------------------------------------
def test_readme_bfp_zero_block_exponent_matches_the_code_and_layouts_doc() -> None:
    # An all-zero block has the smallest E8M0 scale, code 0 = 2^-127; the BFP shared exponent
    # is floor(log2 max) + 1 = (code - 127) + 1 = -126.
    stored = onnxq.bfp.quantize(np.zeros(16, np.float32))[0]
    assert int(stored[0]) == -126
    readme = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    layouts = " ".join((ROOT / "docs" / "layouts.md").read_text(encoding="utf-8").split())
    claims = re.findall(r"all-zero block stores (-?\d+)", readme + " " + layouts)
    assert claims and all(int(c) == -126 for c in claims), claims


def test_quantize_help_and_readme_document_custom_ops_only() -> None:
    from onnxq import cli

    helps = textwrap.dedent(
        cli.build_parser()
        ._subparsers._group_actions[0]  # type: ignore[union-attr]
        .choices["quantize"]
        .format_help()
    )
    assert "--custom-ops-only" in helps and "--allow-empty" in helps
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "--custom-ops-only" in readme and "custom_ops_only" in readme


def test_inspect_shows_a_custom_op_only_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from onnxq import cli

    model, _ = builders.mlp()
    out = tmp_path / "q.onnx"
    quantize_model(model, out, activations="uint4_block32", custom_ops_only=True)
    assert cli.main(["inspect", str(out)]) == 0
    shown = capsys.readouterr().out
    assert "onnxq_custom_ops_only: 3 onnxq node(s) have no standard-ONNX fallback" in shown
    assert "onnxq_target: onnxq" in shown


def test_export_sweeps_what_a_killed_export_left(tmp_path: Path) -> None:
    from onnxq.deploy import export

    model, _ = builders.mlp()
    q = quantize_model(model, weights="mxfp8e4")
    out = tmp_path / "hw"
    out.mkdir()
    stale = out / ".weights.bin.0123abcd.onnxq-tmp"  # no process holds its lock any more
    stale.write_bytes(b"half")
    export.export(q, out)  # the folder counts as empty: only a dead run's temporary is in it
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "weights.bin"]
    assert export.load(out)


def test_without_file_locks_writes_work_and_nothing_is_swept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A filesystem without flock (ENOLCK): a temporary may belong to a live run, so it stays."""
    import errno

    def no_locks(fd: int, op: int) -> None:
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(_output.fcntl, "flock", no_locks)
    stale = tmp_path / ".q.onnx.0123abcd.onnxq-tmp"
    stale.write_bytes(b"?")
    model, _ = builders.mlp()
    quantize_model(model, tmp_path / "q.onnx", weights="mxfp4")
    assert sorted(p.name for p in tmp_path.iterdir()) == [stale.name, "q.onnx"]
