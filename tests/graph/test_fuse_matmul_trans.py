"""The transposed MatMulMX fusion (onnxq.graph.fuse_matmul): W read as B = W^T, tied tables.

A decoded W ``[N, K]`` tiled along K read through ``Transpose(perm=[1, 0])`` by a MatMul, or by
a Gemm with ``transB=1``, becomes ``MatMulMX(trans_b=1)`` on W's packed inputs; a tied embedding
table (the decode also read by a Gather) becomes GatherMX + MatMulMX on the one packed table,
with no DequantizeMX left. Checked: the nodes made, the packed table stored once, the bits with
the library (the gathered rows equal the unfused model's bit for bit, the products equal the
documented order on the numpy reference decode, tests/ops/mmx_common.py) and without it (the
function fallbacks in a plain onnxruntime: the gathered rows bit for bit, the products close).
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxq.graph.fuse
from onnxq.graph.fuse import FUSIONS
from onnxq.graph.fuse_matmul import fusable, fuse_matmul
from onnxq.graph.inspect import inspect_model
from onnxq.graph.quantize import quantize_model
from onnxq.graph.walk import node_attrs
from tests.graph.tied import tied_model
from tests.ops import mmx_common as mc

ort = pytest.importorskip("onnxruntime")
runtime = pytest.importorskip("onnxq.runtime")

VOCAB, DIM = 200, 96  # 200 = 3 blocks of 64 columns + a ragged 8


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(a, np.float32)).view(np.uint32)


def _ops(model: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in model.graph.node]


_TIED_FEEDS = {"ids": np.array([[0, 17, VOCAB - 1]], np.int64)}


def _tied_model() -> onnx.ModelProto:
    return tied_model(_TIED_FEEDS["ids"], VOCAB, DIM, with_hidden=True)


def _linear(via: str, c: str | None = None) -> onnx.ModelProto:
    """x [2, K] -> a Linear with W [N, K]: MatMul(x, Transpose(W)) or Gemm(x, W, transB=1)."""
    rng = np.random.default_rng(3)
    w = numpy_helper.from_array(rng.standard_normal((VOCAB, DIM)).astype(np.float32), "W")
    inits = [w]
    if via == "transpose":
        nodes = [
            helper.make_node("Transpose", ["W"], ["Wt"], perm=[1, 0]),
            helper.make_node("MatMul", ["x", "Wt"], ["y"]),
        ]
    else:
        inputs = ["x", "W"]
        if c is not None:
            shape = (VOCAB,) if c == "vector" else (2, VOCAB)
            bias = rng.standard_normal(shape).astype(np.float32)
            inits.append(numpy_helper.from_array(bias, "c"))
            inputs.append("c")
        nodes = [helper.make_node("Gemm", inputs, ["y"], transB=1)]
    graph = helper.make_graph(
        nodes,
        "linear",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, DIM])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, VOCAB])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def _library(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    return runtime.session(model).run(None, feeds)


def _plain(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def _decoded(model: onnx.ModelProto, name: str, dt: str) -> np.ndarray:
    """The weight ``name`` of the float model as the pass stores it, decoded by numpy."""
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    # The pass's weights use scale mode search (docs/formats.md, "Scale modes"), along K.
    return mc.packed(inits[name], dt, axis=1, scale_mode="search")[1]


def test_fusable_transposed_layouts() -> None:
    attrs = {"axis": 1, "shape": [64, 32]}
    for dt in ("mxfp4", "nvfp4", "uint4_block32", "mxfp8e4", "mxint8", "bfp16", "mx6", "mx9"):
        assert fusable({**attrs, "dtype": dt}, trans_b=True), dt
        assert not fusable({**attrs, "dtype": dt}), dt  # read as B itself: tiles along N
        assert not fusable({**attrs, "dtype": dt, "axis": 0}, trans_b=True), dt  # along N
    assert not fusable({"dtype": "cb41fi_e2m2fnuz_e8m0_t32", **attrs}, trans_b=True)


@pytest.mark.needs_custom_ops
@pytest.mark.parametrize("dt", ["mxfp4", "nvfp4", "uint4_block32", "mxfp8e4", "mx6"])
def test_tied_table_is_stored_once_and_keeps_its_bits(dt: str) -> None:
    model, feeds = _tied_model(), _TIED_FEEDS
    fused = quantize_model(model, weights=dt, fuse="all")
    unfused = quantize_model(model, weights=dt, fuse=False)
    assert sorted(_ops(fused)) == ["GatherMX", "MatMulMX"]  # no decode, no Transpose
    gather, matmul = sorted(fused.graph.node, key=lambda n: n.op_type)
    assert node_attrs(matmul)["trans_b"] == 1 and "trans_b" not in node_attrs(gather)
    assert list(gather.input[1:]) == list(matmul.input[1:])  # the same packed initializers
    assert len(fused.graph.initializer) == len(unfused.graph.initializer)
    meta = json.loads({p.key: p.value for p in fused.metadata_props}["onnxq_fused"])
    assert meta == {"matmul_mx": 1, "gather": 1}
    onnx.checker.check_model(fused, full_check=True)
    summary = inspect_model(fused)  # the shared table is listed (and counted) once
    assert [t.name for t in summary.tensors] == [t.name for t in inspect_model(unfused).tensors]
    h, logits = _library(fused, feeds)
    h_ref, logits_ref = _library(unfused, feeds)
    assert np.array_equal(_bits(h), _bits(h_ref))  # GatherMX: the unfused rows, bit for bit
    table = _decoded(model, "E", dt)
    assert np.array_equal(_bits(logits), _bits(mc.oracle(h, table.T)))  # the documented order
    np.testing.assert_allclose(logits, logits_ref, rtol=1e-4, atol=1e-4)  # (MLAS sums)
    h_plain, logits_plain = _plain(fused, feeds)  # the function fallbacks, no library
    assert np.array_equal(_bits(h_plain), _bits(h_ref))
    np.testing.assert_allclose(logits_plain, logits_ref, rtol=1e-4, atol=1e-4)


@pytest.mark.needs_custom_ops
def test_tied_table_without_the_gather_fusion() -> None:
    """Only the MatMul fusion: the decode stays for the Gather, the Transpose goes."""
    model, feeds = _tied_model(), _TIED_FEEDS
    fused = quantize_model(model, weights="mxfp4", fuse=["matmul_mx"])
    assert sorted(_ops(fused)) == ["DequantizeMX", "Gather", "MatMulMX"]
    assert json.loads({p.key: p.value for p in fused.metadata_props}["onnxq_fused"]) == {
        "matmul_mx": 1
    }
    h, logits = _library(fused, feeds)
    assert np.array_equal(_bits(logits), _bits(mc.oracle(h, _decoded(model, "E", "mxfp4").T)))


@pytest.mark.needs_custom_ops
@pytest.mark.parametrize(("via", "c"), [("transpose", None), ("gemm", None), ("gemm", "vector")])
def test_linear_weights_read_transposed(via: str, c: str | None) -> None:
    model = _linear(via, c)
    fused = quantize_model(model, weights="mxfp4", fuse="all")
    assert _ops(fused) == ["MatMulMX"] and node_attrs(fused.graph.node[0])["trans_b"] == 1
    x = np.random.default_rng(1).standard_normal((2, DIM)).astype(np.float32)
    (y,) = _library(fused, {"x": x})
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    bias = inits["c"] if c else None
    assert np.array_equal(_bits(y), _bits(mc.oracle(x, _decoded(model, "W", "mxfp4").T, bias)))
    (ref,) = _library(quantize_model(model, weights="mxfp4", fuse=False), {"x": x})
    (plain,) = _plain(fused, {"x": x})
    np.testing.assert_allclose(plain, ref, rtol=1e-4, atol=1e-4)


def test_what_stays_unfused() -> None:
    # A Gemm C of [M, N] is no bias: the Gemm keeps the decode.
    q = quantize_model(_linear("gemm", "matrix"), weights="mxfp4", fuse="all")
    assert "MatMulMX" not in _ops(q) and "Gemm" in _ops(q)
    # The Transpose read by something else too: the MatMul fuses, the Transpose and decode stay.
    model = _tied_model()
    model.graph.output.append(helper.make_tensor_value_info("Et", TensorProto.FLOAT, [DIM, VOCAB]))
    q = quantize_model(model, weights="mxfp4", fuse="all")
    assert sorted(_ops(q)) == ["DequantizeMX", "Gather", "MatMulMX", "Transpose"]
    # A transpose with another perm (a 2-D Transpose is [1, 0]; an identity perm is not one).
    q = quantize_model(_tied_model(), weights="mxfp4", fuse=False)
    for node in q.graph.node:
        if node.op_type == "Transpose":
            del node.attribute[:]
            node.attribute.append(helper.make_attribute("perm", [0, 1]))
    assert fuse_matmul(q) == 0


@pytest.mark.needs_custom_ops
def test_tied_table_fuses_whatever_the_order_of_the_fusions(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The Gather fusion first: it cannot take the table yet; the next round does."""
    # A reordered copy of the table (reordering the table itself in place would outlive the test).
    reordered = {"gather": FUSIONS["gather"], "matmul_mx": FUSIONS["matmul_mx"]}
    monkeypatch.setattr(onnxq.graph.fuse, "FUSIONS", reordered)
    fused = quantize_model(_tied_model(), weights="mxfp4", fuse="all")
    assert sorted(_ops(fused)) == ["GatherMX", "MatMulMX"]
    meta = json.loads({p.key: p.value for p in fused.metadata_props}["onnxq_fused"])
    assert meta == {"matmul_mx": 1, "gather": 1}
