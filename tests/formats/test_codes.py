"""Both parsers (Python's onnxq.datatype, C++'s parse_dtype) against tests/format_codes.tsv.

The C++ parser is reached two ways: the C ABI's onnxq_parse_dtype and the `dtype` attribute
of a QuantizeMX node when onnxruntime creates the session. docs/formats.md has the grammar.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import onnxq
from onnxq import runtime
from onnxq.cast import native

TABLE = Path(__file__).with_name("format_codes.tsv")


def _rows() -> list[tuple[str, str, str]]:
    rows = []
    for line in TABLE.read_text(encoding="ascii").splitlines():
        if not line or line.startswith("#") or line.startswith("code\t"):
            continue
        raw, result, detail = line.split("\t")
        code = raw.encode("ascii").decode("unicode_escape")
        assert result in ("accept", "refuse"), line
        rows.append((code, result, detail))
    return rows


ROWS = _rows()
IDS = [ascii(code)[1:-1][:50] or "empty" for code, _, _ in ROWS]


def test_the_table_covers_both_outcomes() -> None:
    results = [r for _, r, _ in ROWS]
    assert results.count("accept") >= 20 and results.count("refuse") >= 40


@pytest.mark.parametrize(("code", "result", "detail"), ROWS, ids=IDS)
def test_python_parser(code: str, result: str, detail: str) -> None:
    if result == "accept":
        assert onnxq.datatype(code).code == detail
        return
    with pytest.raises(ValueError) as err:
        onnxq.datatype(code)
    message = str(err.value)
    assert detail in message and "\n" not in message, message


@pytest.mark.needs_native
@pytest.mark.parametrize(("code", "result", "detail"), ROWS, ids=IDS)
def test_native_parser(code: str, result: str, detail: str) -> None:
    if result == "accept":
        # C++'s reading of the code equals Python's reading of the hand-written canonical code.
        assert native.parse_dtype(code) == native.format_fields(onnxq.datatype(detail))
        return
    with pytest.raises(ValueError) as err:
        native.parse_dtype(code)
    message = str(err.value)
    assert message and "\n" not in message, message


def _quantize_model(code: str) -> bytes:
    from onnx import TensorProto, helper

    node = helper.make_node("QuantizeMX", ["x"], ["q"], domain="onnxq", dtype=code)
    graph = helper.make_graph(
        [node],
        "q",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, (2, 32))],
        [helper.make_tensor_value_info("q", TensorProto.UINT8, None)],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("onnxq", 1)]
    )
    return model.SerializeToString()


def _session_error(code: str) -> str:
    """Create a plain onnxruntime session with the custom ops; "" when it works."""
    ort = pytest.importorskip("onnxruntime")
    options = ort.SessionOptions()
    options.register_custom_ops_library(runtime.library_path())
    try:
        ort.InferenceSession(_quantize_model(code), options, providers=["CPUExecutionProvider"])
    except Exception as err:  # onnxruntime raises its own exception types
        return str(err)
    return ""


@pytest.mark.needs_custom_ops
@pytest.mark.parametrize(("code", "result", "detail"), ROWS, ids=IDS)
def test_onnxruntime_session(code: str, result: str, detail: str) -> None:
    error = _session_error(code)
    if result == "accept":
        assert error == "", error
    else:
        assert "[QuantizeMX] dtype" in error, error


# Codes that hung or blew up before the limits (C++ searched down from 2^2046 one code at a
# time; Python built 2^9999999998). A subprocess with a timeout, so a regression fails instead
# of stalling the suite; no timing is asserted.
HOSTILE = [
    "e11m20b0",
    "e11m52b0_e8m0_t32",
    "e9999999999m2",
    "e" + "9" * 4000 + "m2_e8m0_t32",
    "int8_e8m0_t" + "9" * 100000,
    "mxfp4" + " x" * 1_000_000,
]


def test_hostile_codes_are_refused_promptly() -> None:
    script = textwrap.dedent(
        f"""
        import onnxq
        from onnxq import runtime
        from onnxq.cast import native
        codes = {HOSTILE!r}
        for code in codes:
            try:
                onnxq.datatype(code)
            except ValueError as err:
                assert "\\n" not in str(err)
            else:
                raise SystemExit("python accepted " + code[:40])
            if native.available():
                try:
                    native.parse_dtype(code)
                except ValueError:
                    pass
                else:
                    raise SystemExit("C++ accepted " + code[:40])
        print("refused", len(codes))
        """
    )
    done = subprocess.run(
        [sys.executable, "-"], input=script, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:] + done.stdout
    assert f"refused {len(HOSTILE)}" in done.stdout


@pytest.mark.needs_custom_ops
def test_hostile_codes_in_a_session_are_refused_promptly() -> None:
    script = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_codes import _session_error
        for code in {HOSTILE[:2]!r}:
            assert "[QuantizeMX] dtype" in _session_error(code), code
        print("ok")
        """
    )
    done = subprocess.run(
        [sys.executable, "-"], input=script, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr[-2000:]


@pytest.mark.needs_native
def test_every_preset_parses_the_same_in_both() -> None:
    builtin = [name for name in onnxq.datatypes() if not name.startswith("test")]
    for name in builtin:
        assert native.parse_dtype(name) == native.format_fields(onnxq.datatype(name)), name


# -- the CLI: a code the ops cannot load is refused before anything is written -------------


def _run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "onnxq", *args], capture_output=True, text=True, timeout=120
    )


def _gemm(path: Path) -> None:
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weight = np.random.default_rng(0).standard_normal((8, 32)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["x", "w"], ["y"], transB=1)],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, (4, 32))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, (4, 8))],
        [numpy_helper.from_array(weight, "w")],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


@pytest.mark.parametrize(
    "fmt", ["e6m5_e11m0", "e11m52b0", "e9999999999m2", "mxfp4\xa0", "int\u0662_e8m0_t32"]
)
def test_cli_quantize_refuses_codes_the_ops_cannot_load(tmp_path: Path, fmt: str) -> None:
    model = tmp_path / "m.onnx"
    _gemm(model)
    done = _run_cli("quantize", str(model), "-o", str(tmp_path / "q.onnx"), "--weights", fmt)
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]


@pytest.mark.parametrize(
    "dtype", ["e9999999999m2", "e11m52b0_e8m0_t32", "mxfp4\x00garbage", b"mxfp4\xff\xfe"]
)
def test_cli_inspect_refuses_a_hostile_dtype_attribute(tmp_path: Path, dtype: str | bytes) -> None:
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    node = helper.make_node(
        "DequantizeMX",
        ["q", "s"],
        ["y"],
        domain="onnxq",
        dtype=dtype,
        axis=-1,
        shape=[32],
        output_type=TensorProto.FLOAT,
    )
    graph = helper.make_graph(
        [node],
        "g",
        [],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, (32,))],
        [
            numpy_helper.from_array(np.zeros(16, np.uint8), "q"),
            numpy_helper.from_array(np.full(1, 127, np.uint8), "s"),
        ],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("onnxq", 1)]
    )
    path = tmp_path / "tiny.onnx"
    onnx.save(model, path)
    done = _run_cli("inspect", str(path))
    assert done.returncode == 2, done.stdout + done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "bad dtype" in done.stderr


@pytest.mark.needs_custom_ops
def test_string_attributes_keep_an_embedded_nul() -> None:
    # Read with c_str(), "even\0stochastic" was cut to "even" and ran; now it is refused whole.
    ort = pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper

    node = helper.make_node(
        "QuantizeMX", ["x"], ["q"], domain="onnxq", dtype="mxfp4", round_mode="even\x00stochastic"
    )
    graph = helper.make_graph(
        [node],
        "q",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, (2, 32))],
        [helper.make_tensor_value_info("q", TensorProto.UINT8, None)],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("onnxq", 1)]
    )
    options = ort.SessionOptions()
    options.register_custom_ops_library(runtime.library_path())
    with pytest.raises(Exception, match=r"unknown round_mode 'even\\x00stochastic'"):
        ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
