"""The GatherMX fusion (onnxq.graph.fuse_gather): Gather of a packed table -> GatherMX.

A fused model must compute the unfused model's bits: with the custom-op library (GatherMX's
kernel against DequantizeMX's kernel followed by Gather) and without it (the function
fallbacks in a plain onnxruntime). What the fusion must leave alone: tables read elsewhere too
(tied embeddings, graph outputs), tables fed as graph inputs, N:M sparse formats and tables
tiled along dim 0 in groups longer than MAX_GROUP_ROWS.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxq
from onnxq.graph.functions import embed_functions
from onnxq.graph.fuse import FUSIONS
from onnxq.graph.fuse_gather import MAX_GROUP_ROWS, fuse_gather, rows_per_group
from onnxq.graph.inspect import inspect_model
from onnxq.graph.quantize import quantize_model
from onnxq.graph.walk import node_attrs
from tests.graph.tied import tied_model
from tests.models import builders
from tests.models.real import MissingModelError, example_inputs, minilm_path

# Only the Gather fusion runs here (the default fusions): a MatMulMX sums in its own order, so
# the fused and unfused models would differ in the projection's bits, not in the gathered rows'.
ort = pytest.importorskip("onnxruntime")
runtime = pytest.importorskip("onnxq.runtime")

FORMATS = ["mxfp4", "uint4_block32", "mx6", "nvfp4", "cb41fi_e2m2fnuz_e8m0_t32"]


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(a, np.float32)).view(np.uint32)


def _ops(model: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in model.graph.node]


def _plain(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """A plain onnxruntime, no custom-op library: the embedded function fallbacks run."""
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def _library(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return runtime.session(model).run(None, feeds)


def _same(a: list[np.ndarray], b: list[np.ndarray]) -> None:
    assert len(a) == len(b)
    for u, v in zip(a, b, strict=True):
        assert u.shape == v.shape and np.array_equal(_bits(u), _bits(v))


def test_the_fusion_is_in_the_table() -> None:
    assert FUSIONS["gather"] is fuse_gather


@pytest.mark.needs_custom_ops
@pytest.mark.parametrize("weights", FORMATS)
def test_embedding_model_fuses_with_the_same_bits(weights: str) -> None:
    model, feeds = builders.embedding()
    fused = quantize_model(model, weights=weights)
    plain = quantize_model(model, weights=weights, fuse=False)
    assert _ops(fused).count("GatherMX") == 1 and "Gather" not in _ops(fused)
    assert "Gather" in _ops(plain) and "GatherMX" not in _ops(plain)
    # The table's decoder is gone; the projection's stays.
    decoders = [n for n in fused.graph.node if n.op_type in ("DequantizeMX", "CodebookLookup")]
    assert [n.output[0] for n in decoders] == ["proj"]
    meta = {p.key: p.value for p in fused.metadata_props}
    assert json.loads(meta["onnxq_fused"]) == {"gather": 1}
    assert any(f.name == "GatherMX" for f in fused.functions)  # its fallback is embedded
    onnx.checker.check_model(fused, full_check=True)
    _same(_library(fused, feeds), _library(plain, feeds))
    _same(_plain(fused, feeds), _plain(plain, feeds))


@pytest.mark.needs_custom_ops
@pytest.mark.parametrize("fuse", [True, ["gather"], "gather"])
def test_tied_embeddings_stay_unfused(fuse: bool | str | list[str]) -> None:
    """The default fusions (gather only): the decoded table feeds a MatMul too, which is not
    fused, so the decode stays and the Gather reads it (model as with no fusion at all)."""
    ids = np.random.default_rng(11).integers(0, 64, (2, 5))
    model, feeds = tied_model(ids, 64, 32), {"ids": ids}
    fused = quantize_model(model, weights="mxfp4", fuse=fuse)
    assert sorted(_ops(fused)) == ["DequantizeMX", "Gather", "MatMul", "Transpose"]
    assert "onnxq_fused" not in {p.key for p in fused.metadata_props}
    _same(
        _library(fused, feeds), _library(quantize_model(model, weights="mxfp4", fuse=False), feeds)
    )


def _packed_gather(
    dtype: str, shape: tuple[int, ...], axis: int, *, table_output: bool = False
) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """ids -> Gather(DequantizeMX(packed initializers)) -> y, written by hand."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal(shape).astype(np.float32)
    q = onnxq.cast(x, dtype, axis=axis, mode="compress", backend="reference")
    fields = {"Q": q.data, "Scale": q.scale, "Zero": q.zero, "TenScale": q.tenscale}
    fields.update({"Meta": q.meta, "Mask": q.mask})
    order = ("Q", "Scale", "Zero", "TenScale", "Meta", "Mask")
    names = [f"t_{k}" if fields[k] is not None else "" for k in order]
    while not names[-1]:
        names.pop()
    inits = [
        numpy_helper.from_array(np.ascontiguousarray(fields[k]), f"t_{k}")
        for k in order
        if fields[k] is not None
    ]
    nodes = [
        helper.make_node(
            "DequantizeMX", names, ["table"], domain="onnxq", dtype=dtype, axis=axis,
            shape=list(shape), output_type=TensorProto.FLOAT,
        ),
        helper.make_node("Gather", ["table", "ids"], ["y"], axis=0),
    ]  # fmt: skip
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    if table_output:
        outputs.append(helper.make_tensor_value_info("table", TensorProto.FLOAT, list(shape)))
    graph = helper.make_graph(
        nodes,
        "packed_gather",
        [helper.make_tensor_value_info("ids", TensorProto.INT32, [3, 4])],
        outputs,
        inits,
    )
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid("onnxq", 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    ids = rng.integers(-shape[0], shape[0], (3, 4)).astype(np.int32)
    return model, {"ids": ids}


@pytest.mark.needs_custom_ops
@pytest.mark.parametrize(
    ("dtype", "shape", "axis", "fuses"),
    [
        ("mxfp4", (70, 48), 0, True),  # row groups of 32 along dim 0 (the last one 6 rows)
        ("e2m1fnuz_e8m0_t64", (300, 8), 0, True),  # 64 rows: MAX_GROUP_ROWS
        ("e2m1fnuz_e8m0_t128", (300, 8), 0, False),  # 128 rows a group: decoding is not cut
        ("e2m1fnuz_e8m0_t32n2m4", (20, 64), -1, False),  # N:M sparse
        ("mxfp4", (20, 64), -1, True),
    ],
)
def test_what_the_fusion_takes(dtype: str, shape: tuple[int, ...], axis: int, fuses: bool) -> None:
    model, feeds = _packed_gather(dtype, shape, axis)
    before = _library(embed_functions(onnx.ModelProto.FromString(model.SerializeToString())), feeds)
    count = fuse_gather(model)
    assert count == (1 if fuses else 0)
    assert ("GatherMX" in _ops(model)) == fuses and ("DequantizeMX" in _ops(model)) != fuses
    embed_functions(model)
    _same(_library(model, feeds), before)
    _same(_plain(model, feeds), before)


def test_rows_per_group() -> None:
    assert rows_per_group("mxfp4", -1, [30522, 384]) == 1
    assert rows_per_group("mxfp4", 0, [70, 48]) == 32
    assert rows_per_group("mxfp4", 0, [20, 48]) == 20  # one short group
    assert rows_per_group("e2m1fnuz_e8m0_t4_t8", -1, [10, 20]) == 4  # 2-D tile rows on dim 0
    assert rows_per_group("e2m1fnuz_e8m0_t4_t8", -1, [6, 10, 20]) == 1
    assert rows_per_group("int8_tensor", 0, [9, 9]) == 1
    assert rows_per_group("int8_channel", 0, [100, 9]) == 100  # the whole axis is one tile
    assert MAX_GROUP_ROWS == 64


def test_readers_elsewhere_and_graph_inputs_stay() -> None:
    model, _ = _packed_gather("mxfp4", (20, 64), -1, table_output=True)
    assert fuse_gather(model) == 0  # the decoded table is a graph output
    model, _ = _packed_gather("mxfp4", (20, 64), -1)
    q = model.graph.initializer[0]
    model.graph.input.append(helper.make_tensor_value_info(q.name, q.data_type, list(q.dims)))
    assert fuse_gather(model) == 0  # Q can be overridden by the caller: not constant
    model, _ = _packed_gather("mxfp4", (20, 64), -1)
    model.graph.node[1].attribute[0].i = 1  # Gather along axis 1: not a row lookup
    assert fuse_gather(model) == 0


def test_inspect_counts_a_fused_table_once() -> None:
    """GatherMX decodes a stored table: inspect lists it (once) with the unfused bytes."""
    model, _ = _packed_gather("mxfp4", (20, 64), -1)
    before = inspect_model(model)
    model.graph.node.append(helper.make_node("Gather", ["table", "ids"], ["y2"], axis=0))
    model.graph.output.append(helper.make_tensor_value_info("y2", TensorProto.FLOAT, None))
    model.graph.initializer.append(numpy_helper.from_array(np.array([1, 2]), "fixed"))
    model.graph.node[1].input[1] = "fixed"  # constant indices are not part of the table
    assert fuse_gather(model) == 2
    after = inspect_model(model)
    assert [t.kind for t in after.tensors] == ["weight"]
    (table,) = after.tensors
    assert table.shape == (20, 64) and table.stored == before.tensors[0].stored
    assert table.nbytes == before.tensors[0].nbytes
    assert after.float_bytes == before.float_bytes + 16  # the 2 int64 indices


def test_two_gathers_share_the_packed_table() -> None:
    model, _ = _packed_gather("mxfp4", (20, 64), -1)
    model.graph.node.append(helper.make_node("Gather", ["table", "ids"], ["g2"], axis=0))
    model.graph.node.append(helper.make_node("Identity", ["g2"], ["y2"]))
    model.graph.output.append(helper.make_tensor_value_info("y2", TensorProto.FLOAT, None))
    assert fuse_gather(model) == 2
    assert _ops(model) == ["GatherMX", "GatherMX", "Identity"]
    assert model.graph.node[0].input[1:] == model.graph.node[1].input[1:]
    types = {v.name: v.type.tensor_type for v in model.graph.value_info}
    assert "table" not in types
    assert types["g2"].elem_type == TensorProto.FLOAT  # declared for onnxruntime
    assert [d.dim_value for d in types["g2"].shape.dim] == [3, 4, 64]


@pytest.mark.needs_custom_ops
def test_minilm_fused_equals_unfused() -> None:
    """The real MiniLM-L3: three embedding tables fuse; the outputs keep their bits."""
    try:
        path = minilm_path()
    except MissingModelError as err:
        pytest.skip(str(err))
    model = onnx.load(str(path))
    feeds = example_inputs("minilm", batch=2)
    fused = quantize_model(model, weights="mxfp4")
    plain = quantize_model(model, weights="mxfp4", fuse=False)
    gathers = [n for n in fused.graph.node if n.op_type == "GatherMX"]
    assert len(gathers) == 3
    assert node_attrs(gathers[0])["shape"] == [30522, 384]  # the word embeddings
    _same(_library(fused, feeds), _library(plain, feeds))
    _same(_plain(fused, feeds), _plain(plain, feeds))
