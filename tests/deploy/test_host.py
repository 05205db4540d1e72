"""examples/host: the C++ host (onnxruntime C API, no Python) against onnxq.runtime.session.

The host is built once per test session with examples/host/build.sh into a temporary folder; the
tests skip when cmake, a C++ compiler, the onnxruntime headers or the custom-op library are not
available. Outputs are compared bit for bit.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

import onnxq
from onnxq import runtime

pytest.importorskip("onnxruntime")
pytestmark = pytest.mark.needs_custom_ops

ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = ROOT / "examples" / "host" / "build.sh"


@pytest.fixture(scope="session")
def host(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The onnxq_host program, built once per session."""
    if shutil.which("cmake") is None:
        pytest.skip("cmake not found")
    if not any(shutil.which(c) for c in (os.environ.get("CXX", "c++"), "c++", "g++", "clang++")):
        pytest.skip("no C++ compiler found")
    build = tmp_path_factory.mktemp("onnxq_host_build")
    env = {**os.environ, "PYTHON": sys.executable}
    proc = subprocess.run(
        ["sh", str(BUILD_SCRIPT), str(build)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    if proc.returncode != 0:
        if "headers" in proc.stderr or "fetch_ort_headers" in proc.stderr:
            pytest.skip(f"onnxruntime headers unavailable: {proc.stderr.strip()[-300:]}")
        pytest.fail(f"building the host failed:\n{proc.stderr[-3000:]}")
    program = Path(proc.stdout.strip().splitlines()[-1])
    assert program.is_file(), proc.stdout
    return program


def _file_name(output: str) -> str:
    """The file the host writes an output to (its sanitising of names)."""
    name = re.sub(r"[^A-Za-z0-9._-]", "_", output)
    return ("output" + name if name in ("", ".", "..") else name) + ".npy"


def _run_host(
    host: Path, model: Path, inputs: dict[str, np.ndarray], work: Path, *extra: str
) -> subprocess.CompletedProcess[str]:
    work.mkdir(parents=True, exist_ok=True)
    args = [str(host), "--model", str(model), "--ops", runtime.library_path()]
    for name, value in inputs.items():
        path = work / f"in_{len(args)}.npy"
        np.save(path, value)
        args += ["--input", f"{name}={path}"]
    args += ["--output-dir", str(work / "out"), *extra]
    return subprocess.run(args, capture_output=True, text=True, timeout=120)


def _compare(host: Path, model: Path, inputs: dict[str, np.ndarray], work: Path) -> None:
    """Host outputs == onnxq.runtime.session outputs, bit for bit."""
    proc = _run_host(host, model, inputs, work)
    assert proc.returncode == 0, proc.stderr
    # The host runs the ops as the model holds them: compare with the run-time decode.
    sess = runtime.session(model, decode_weights="run")
    names = [o.name for o in sess.get_outputs()]
    expected = sess.run(None, inputs)
    assert sorted(p.name for p in (work / "out").iterdir()) == sorted(map(_file_name, names))
    for name, want in zip(names, expected, strict=True):
        got = np.load(work / "out" / _file_name(name))
        assert got.dtype == want.dtype, name
        assert got.shape == want.shape, name
        assert got.tobytes() == np.ascontiguousarray(want).tobytes(), f"{model.name}: {name}"


FORMATS = {
    "w-mxfp4": {"weights": "mxfp4"},
    "w-mxfp4-a-mxfp8e4": {"weights": "mxfp4", "activations": "mxfp8e4"},
}


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("builder", ["mlp", "transformer"])
def test_small_models(host: Path, tmp_path: Path, builder: str, fmt: str) -> None:
    from tests.models import builders

    model, inputs = builders.BUILDERS[builder]()
    path = tmp_path / f"{builder}.onnx"
    onnxq.quantize_model(model, path, **FORMATS[fmt])
    _compare(host, path, inputs, tmp_path)


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("name", ["ppocr", "minilm", "silero"])
def test_real_models(host: Path, tmp_path: Path, name: str, fmt: str) -> None:
    from tests.models import real

    try:
        source = real.model_path(name)
    except real.MissingModelError as err:
        pytest.skip(str(err))
    path = tmp_path / f"{name}.onnx"
    onnxq.quantize_model(str(source), path, **FORMATS[fmt])
    _compare(host, path, real.example_inputs(name), tmp_path)


def _identity_model(inputs: dict[str, np.ndarray]) -> onnx.ModelProto:
    """Each input passed through to an output named ``<input>/out`` (a name with a slash)."""
    to_onnx = helper.np_dtype_to_tensor_dtype
    nodes = [helper.make_node("Identity", [n], [f"{n}/out"]) for n in inputs]
    graph = helper.make_graph(
        nodes,
        "identity",
        [helper.make_tensor_value_info(n, to_onnx(v.dtype), v.shape) for n, v in inputs.items()],
        [
            helper.make_tensor_value_info(f"{n}/out", to_onnx(v.dtype), v.shape)
            for n, v in inputs.items()
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    return model


def test_npy_types_and_headers(host: Path, tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    inputs = {
        "f32": rng.standard_normal((2, 3, 4)).astype(np.float32),
        "f16": rng.standard_normal((5,)).astype(np.float16),
        "i64": np.array(16000, np.int64),  # a scalar
        "i32": rng.integers(-(2**31), 2**31 - 1, (3, 1), dtype=np.int32),
        "u8": rng.integers(0, 256, (7, 2), dtype=np.uint8),
        "empty": np.zeros((0, 4), np.float32),
        "flag": np.array([True, False, True]),
    }
    model = tmp_path / "identity.onnx"
    onnx.save(_identity_model(inputs), model)
    args = [str(host), "--model", str(model), "--ops", runtime.library_path()]
    for i, (name, value) in enumerate(inputs.items()):
        path = tmp_path / f"{name}.npy"
        with open(path, "wb") as f:  # alternate format 1.0 and 2.0 headers
            np.lib.format.write_array(f, value, version=(1, 0) if i % 2 else (2, 0))
        args += ["--input", f"{name}={path}"]
    proc = subprocess.run(
        [*args, "--output-dir", str(tmp_path / "out")], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    for name, value in inputs.items():
        path = tmp_path / "out" / f"{name}_out.npy"
        with open(path, "rb") as f:
            assert np.lib.format.read_magic(f) == (1, 0)
            f.seek(0)
            assert f.read(128).index(b"\n") % 64 == 63  # data aligned to 64 bytes
        got = np.load(path)
        assert got.dtype == value.dtype and got.shape == value.shape, name
        assert got.tobytes() == value.tobytes(), name


def _assert_one_line_error(proc: subprocess.CompletedProcess[str], *words: str) -> None:
    assert proc.returncode > 0, proc  # an exit status, not a signal
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("onnxq_host: error: "), lines[0]
    for word in words:
        assert word in lines[0], lines[0]


@pytest.fixture(scope="module")
def mlp_model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, np.ndarray]]:
    from tests.models import builders

    model, inputs = builders.mlp()
    path = tmp_path_factory.mktemp("host_mlp") / "mlp.onnx"
    onnxq.quantize_model(model, path, weights="mxfp4")
    return path, inputs


def test_missing_model(host: Path, tmp_path: Path, mlp_model: tuple[Path, dict]) -> None:
    _, inputs = mlp_model
    proc = _run_host(host, tmp_path / "nope.onnx", inputs, tmp_path)
    _assert_one_line_error(proc, "model not found", "nope.onnx")
    assert not (tmp_path / "out").exists()


def test_missing_library(host: Path, tmp_path: Path, mlp_model: tuple[Path, dict]) -> None:
    path, inputs = mlp_model
    np.save(tmp_path / "x.npy", inputs["x"])
    proc = subprocess.run(
        [
            str(host),
            "--model",
            str(path),
            "--ops",
            str(tmp_path / "libnope.so"),
            "--input",
            f"x={tmp_path / 'x.npy'}",
            "--output-dir",
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    _assert_one_line_error(proc, "custom-op library not found", "libnope.so")


def test_not_a_library(host: Path, tmp_path: Path, mlp_model: tuple[Path, dict]) -> None:
    path, inputs = mlp_model
    (tmp_path / "libbad.so").write_text("not a library\n")
    np.save(tmp_path / "x.npy", inputs["x"])
    proc = subprocess.run(
        [
            str(host),
            "--model",
            str(path),
            "--ops",
            str(tmp_path / "libbad.so"),
            "--input",
            f"x={tmp_path / 'x.npy'}",
            "--output-dir",
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    _assert_one_line_error(proc, "cannot register the custom-op library")


@pytest.mark.parametrize(
    "bad, words",
    [
        (lambda x: x[:, :-1], ["[4,64]", "[4,63]"]),  # wrong shape
        (lambda x: x[None], ["[4,64]", "[1,4,64]"]),  # wrong rank
        (lambda x: x.astype(np.float64), ["float32", "float64"]),  # wrong type
    ],
    ids=["shape", "rank", "type"],
)
def test_wrong_input(
    host: Path, tmp_path: Path, mlp_model: tuple[Path, dict], bad, words: list[str]
) -> None:
    path, inputs = mlp_model
    proc = _run_host(host, path, {"x": np.ascontiguousarray(bad(inputs["x"]))}, tmp_path)
    _assert_one_line_error(proc, "input 'x'", *words)


def test_wrong_input_names(host: Path, tmp_path: Path, mlp_model: tuple[Path, dict]) -> None:
    path, inputs = mlp_model
    _assert_one_line_error(_run_host(host, path, {}, tmp_path), "missing --input x=")
    proc = _run_host(host, path, {**inputs, "z": inputs["x"]}, tmp_path)
    _assert_one_line_error(proc, "no input 'z'")
    bad = tmp_path / "bad.npy"
    bad.write_bytes(b"hello")
    proc = subprocess.run(
        [
            str(host),
            "--model",
            str(path),
            "--ops",
            runtime.library_path(),
            "--input",
            f"x={bad}",
            "--output-dir",
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    _assert_one_line_error(proc, "not a .npy file")


def _has_cuda_ep() -> bool:
    import onnxruntime as ort

    return "CUDAExecutionProvider" in ort.get_available_providers()


def test_cuda_flag_without_a_cuda_onnxruntime(
    host: Path, tmp_path: Path, mlp_model: tuple[Path, dict]
) -> None:
    if _has_cuda_ep():
        pytest.skip("this onnxruntime has the CUDA execution provider")
    path, inputs = mlp_model
    proc = _run_host(host, path, inputs, tmp_path, "--cuda")
    _assert_one_line_error(proc, "--cuda", "onnxruntime built with CUDA")
    proc = _run_host(host, path, inputs, tmp_path, "--cuda=x")
    assert proc.returncode == 2 and "--cuda expects a device number" in proc.stderr


def test_cuda_flag_gives_the_cpu_bits(
    host: Path, tmp_path: Path, mlp_model: tuple[Path, dict]
) -> None:
    if not _has_cuda_ep():
        pytest.skip("onnxruntime has no CUDA execution provider (onnxruntime-gpu)")
    from tests.models import builders

    model, inputs = builders.mlp()
    qpath = tmp_path / "q.onnx"
    onnxq.quantize_model(model, qpath, weights="mxfp4", activations="mxfp8e4")
    x = inputs["x"]
    cpu = _run_host(host, qpath, {"x": x}, tmp_path / "cpu")
    gpu = _run_host(host, qpath, {"x": x}, tmp_path / "gpu", "--cuda", "0")
    assert cpu.returncode == 0 and gpu.returncode == 0, gpu.stderr
    for f in (tmp_path / "cpu" / "out").iterdir():
        assert np.load(f).tobytes() == np.load(tmp_path / "gpu" / "out" / f.name).tobytes()


def test_dynamic_shapes(host: Path, tmp_path: Path) -> None:
    """A model with symbolic dims (QuantizeMX -> DequantizeMX fed Shape(x), and the fused
    QuantizeDequantizeMX) runs in the host at several shapes, an empty one included, with the
    bits of onnxq.runtime.session."""
    from onnx import TensorProto

    from onnxq.graph.schemas import infer_shapes

    dims = ["batch", "seq", 64]
    nodes = [
        helper.make_node("QuantizeMX", ["x"], ["q", "s"], domain="onnxq", dtype="mxfp4"),
        helper.make_node("Shape", ["x"], ["x_shape"]),
        helper.make_node(
            "DequantizeMX", ["q", "s", "", "", "", "", "x_shape"], ["y"], domain="onnxq",
            dtype="mxfp4",
        ),
        helper.make_node("QuantizeDequantizeMX", ["x"], ["y_fused"], domain="onnxq", dtype="mx6"),
    ]  # fmt: skip
    graph = helper.make_graph(
        nodes,
        "dynamic",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, dims) for n in ("y", "y_fused")],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("onnxq", 1)]
    )
    model.ir_version = 10
    path = tmp_path / "dynamic.onnx"
    onnx.save(infer_shapes(model), path)  # the host runs no inference: types declared
    for i, shape in enumerate([(1, 3, 64), (4, 17, 64), (2, 0, 64)]):
        x = np.random.default_rng(i).standard_normal(shape).astype(np.float32)
        _compare(host, path, {"x": x}, tmp_path / f"run{i}")
        if x.size:
            want = onnxq.cast(x, "mxfp4", backend="reference")
            got = np.load(tmp_path / f"run{i}" / "out" / "y.npy")
            assert got.tobytes() == want.tobytes()
