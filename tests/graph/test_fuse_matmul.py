"""The MatMulMX fusion (onnxq.graph.fuse_matmul): which pairs it fuses, and the fused model's bits.

A fused model runs with the custom ops (bit-exact with the documented order on the weights the
numpy reference decodes, tests/ops/mmx_common.py) and without them (the function fallback:
DequantizeMX's body and onnxruntime's Gemm, close to the unfused model).
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxq
from onnxq import runtime
from onnxq.graph.fuse_matmul import fusable, fuse_matmul
from onnxq.graph.quantize import quantize_model
from tests.models import builders
from tests.ops import mmx_common as mc

K, N = 96, 80


def _model(gemm_c: str | None = None, extra_reader: bool = False) -> onnx.ModelProto:
    """x [M, K] -> MatMul(w0) -> Gemm(w1, c?) -> y (plus an optional second reader of w0)."""
    rng = np.random.default_rng(0)
    w0 = rng.standard_normal((K, N)).astype(np.float32)
    w1 = rng.standard_normal((N, N)).astype(np.float32)
    inits = [numpy_helper.from_array(w0, "w0"), numpy_helper.from_array(w1, "w1")]
    gemm_in = ["h", "w1"]
    if gemm_c is not None:
        shape = (N,) if gemm_c == "vector" else (1, N) if gemm_c == "row" else (3, N)
        inits.append(numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), "c"))
        gemm_in.append("c")
    nodes = [
        helper.make_node("MatMul", ["x", "w0"], ["h"], name="mm"),
        helper.make_node("Gemm", gemm_in, ["y"], name="gemm"),
    ]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    if extra_reader:
        nodes.append(helper.make_node("Identity", ["w0"], ["w0_copy"]))
        outputs.append(helper.make_tensor_value_info("w0_copy", TensorProto.FLOAT, None))
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, K])
    graph = helper.make_graph(nodes, "fuse", [x], outputs, initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _counts(model: onnx.ModelProto) -> dict[str, int]:
    found: dict[str, int] = {}
    for node in model.graph.node:
        found[node.op_type] = found.get(node.op_type, 0) + 1
    return found


def test_fusable_formats() -> None:
    attrs = {"axis": 0, "shape": [64, 32]}
    for dt in ("mxfp4", "nvfp4", "uint4_block32", "mxfp8e4", "mxint8", "bfp16", "mx6", "mx9"):
        assert fusable({**attrs, "dtype": dt}), dt
        assert not fusable({**attrs, "dtype": dt, "axis": 1}), dt  # tiles along N
        assert not fusable({**attrs, "dtype": dt, "output_type": TensorProto.FLOAT16}), dt
    for dt in ("e2m1fnuz_e8m0_t32n2m4", "cb41fi_e2m2fnuz_e8m0_t32", "int4", "no such format"):
        assert not fusable({**attrs, "dtype": dt}), dt
    assert not fusable({"dtype": "mxfp4", "axis": 0, "shape": [2, 64, 32]})


@pytest.mark.parametrize("gemm_c", [None, "vector", "row", "matrix"])
def test_counts(gemm_c: str | None) -> None:
    q = quantize_model(_model(gemm_c), weights="mxfp4", fuse="all")
    counts = _counts(q)
    fused_gemm = gemm_c != "matrix"  # a C of [M, N] is not a bias: the Gemm stays
    assert counts.get("MatMulMX", 0) == 1 + fused_gemm
    assert counts.get("DequantizeMX", 0) == (0 if fused_gemm else 1)
    assert "MatMul" not in counts and counts.get("Gemm", 0) == (0 if fused_gemm else 1)
    meta = {p.key: p.value for p in q.metadata_props}
    assert '"matmul_mx": ' + str(1 + fused_gemm) in meta["onnxq_fused"]
    unfused = quantize_model(_model(gemm_c), weights="mxfp4", fuse=False)
    assert "MatMulMX" not in _counts(unfused) and _counts(unfused)["DequantizeMX"] == 2


def test_not_fused_when_the_weight_has_another_reader_or_format() -> None:
    q = quantize_model(_model(extra_reader=True), weights="mxfp4", fuse="all")
    assert _counts(q)["MatMulMX"] == 1 and _counts(q)["DequantizeMX"] == 1  # w0 stays
    q = quantize_model(_model(), weights="e2m1fnuz_e8m0_t32n2m4", custom_ops_only=True, fuse="all")
    assert "MatMulMX" not in _counts(q)
    assert fuse_matmul(q) == 0


def _run_lib(model: onnx.ModelProto, feed: dict) -> list[np.ndarray]:
    return runtime.session(model).run(None, feed)


def _run_plain(model: onnx.ModelProto, feed: dict) -> list[np.ndarray]:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feed)


@pytest.mark.needs_custom_ops
@pytest.mark.parametrize("dt", ["mxfp4", "nvfp4", "uint4_block32", "mxfp8e4", "mx6"])
@pytest.mark.parametrize("gemm_c", [None, "row"])
def test_fused_model_bits_and_fallback(dt: str, gemm_c: str | None) -> None:
    model = _model(gemm_c)
    fused = quantize_model(model, weights=dt, fuse="all")
    unfused = quantize_model(model, weights=dt, fuse=False)
    x = np.random.default_rng(1).standard_normal((3, K)).astype(np.float32)
    lib = _run_lib(fused, {"x": x})[0]
    plain = _run_plain(fused, {"x": x})[0]  # the function fallback, no custom ops
    ref = _run_lib(unfused, {"x": x})[0]
    np.testing.assert_allclose(lib, ref, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(plain, ref, rtol=1e-4, atol=1e-4)
    # Bit-exact: both products in the documented order on the reference decode.
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    # The pass's weights use scale mode search (docs/formats.md, "Scale modes").
    _, b0 = mc.packed(inits["w0"], dt, scale_mode="search")
    _, b1 = mc.packed(inits["w1"], dt, scale_mode="search")
    bias = inits["c"].reshape(N) if gemm_c else None
    want = mc.oracle(mc.oracle(x, b0), b1, bias)
    assert mc.bits(lib) == mc.bits(want)


@pytest.mark.needs_custom_ops
def test_transformer_fused_runs_close_to_unfused() -> None:
    model, inputs = builders.transformer()
    fused = quantize_model(model, weights="mxfp4", fuse="all")
    unfused = quantize_model(model, weights="mxfp4", fuse=False)
    assert _counts(fused).get("MatMulMX", 0) > 0
    for got in (_run_lib(fused, inputs), _run_plain(fused, inputs)):
        for a, b in zip(got, _run_lib(unfused, inputs), strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-3)
    onnx.checker.check_model(onnxq.graph.infer_shapes(fused))
