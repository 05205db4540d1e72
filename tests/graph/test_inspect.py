"""onnxq.graph.inspect and onnxq.compare on hand-built graphs, with sizes counted by hand."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxq.compare import (
    error_metrics,
    expose_outputs,
    layer_candidates,
    looks_like_scores,
    producers,
    top1_agreement,
)
from onnxq.graph.inspect import (
    DECODE_OPS,
    MalformedNodeError,
    cuda_placement,
    data_files,
    file_bytes,
    format_name,
    inspect_model,
    quantized_tensor,
    tensor_bytes,
)


def _zeros(name: str, dims: list[int], elem: int = TensorProto.UINT8) -> onnx.TensorProto:
    return helper.make_tensor(name, elem, dims, [0] * math.prod(dims))


def _decoder(dtype: object = "mxfp4", inputs: tuple[str, ...] = ("q", "s")) -> onnx.NodeProto:
    node = helper.make_node(
        "DequantizeMX", list(inputs), ["w"], domain="onnxq", shape=[2, 32], axis=-1
    )
    if dtype is not None:
        node.attribute.append(helper.make_attribute("dtype", dtype))
    return node


def _model() -> onnx.ModelProto:
    """A packed mxfp4 weight, an int8 DequantizeLinear weight, an mxfp8 activation, a bias.

    Stored bytes: q 32 (64 e2m1 codes) + s 2 (two E8M0 scales) + x 32 (int8) + x_scale 4
    + bias 40 = 110. As float: w 2x32 float32 = 256, v 4x8 float32 = 128, bias 40 = 424.
    """
    nodes = [
        _decoder(),
        helper.make_node("DequantizeLinear", ["x", "x_scale"], ["v"], name="dql"),
        helper.make_node("QuantizeMX", ["a"], ["aq", "as"], domain="onnxq", dtype="mxfp8"),
        helper.make_node(
            "DequantizeMX", ["aq", "as"], ["a_dq"], domain="onnxq", dtype="mxfp8", shape=[1, 32]
        ),
    ]
    inits = [
        _zeros("q", [32]),
        _zeros("s", [2]),
        _zeros("x", [4, 8], TensorProto.INT8),
        helper.make_tensor("x_scale", TensorProto.FLOAT, [], [0.5]),
        numpy_helper.from_array(np.zeros(10, np.float32), "bias"),
    ]
    graph = helper.make_graph(nodes, "g", [], [], inits)
    model = helper.make_model(graph)
    model.metadata_props.add(key="onnxq_target", value="onnxq")
    model.metadata_props.add(key="author", value="someone")
    return model


def test_decode_ops_come_from_the_op_table() -> None:
    assert DECODE_OPS == ("DequantizeMX", "CodebookLookup", "MatMulMX", "GatherMX")


def test_inspect_model_lists_weights_and_activations_with_their_sizes() -> None:
    found = inspect_model(_model())
    assert (found.nodes, found.stored_tensors) == (4, 5)
    assert found.metadata == {"onnxq_target": "onnxq"}
    assert (found.stored_bytes, found.float_bytes) == (110, 424)
    w, v, a = found.tensors
    assert (w.name, w.kind, w.format, w.shape, w.numel) == ("w", "weight", "mxfp4", (2, 32), 64)
    assert (w.stored, w.nbytes, w.bits_per_value, w.output_bits) == (("q", "s"), 34, 4.25, 32)
    assert (v.kind, v.format, v.shape, v.numel) == ("weight", "int8 tensor", (4, 8), 32)
    assert (v.stored, v.nbytes, v.bits_per_value) == (("x", "x_scale"), 36, 9.0)
    assert (a.name, a.kind, a.format, a.shape, a.stored) == (
        "a_dq",
        "activation",
        "mxfp8",
        (1, 32),
        (),
    )
    assert (a.nbytes, a.bits_per_value) == (None, 8.25)


def test_dequantize_linear_formats() -> None:
    stored = {"x": _zeros("x", [4, 8], TensorProto.INT8), "s": _zeros("s", [4], TensorProto.FLOAT)}
    blocked = helper.make_node("DequantizeLinear", ["x", "s"], ["y"], block_size=2, axis=1)
    per_axis = helper.make_node("DequantizeLinear", ["x", "s"], ["y"], axis=0)
    computed = helper.make_node("DequantizeLinear", ["c", "s"], ["y"])
    assert quantized_tensor(blocked, stored).format == "int8 block 2"
    assert quantized_tensor(per_axis, stored).format == "int8 axis 0"
    assert quantized_tensor(computed, stored) is None
    assert quantized_tensor(helper.make_node("Relu", ["x"], ["y"]), stored) is None


def test_nodes_in_subgraphs_count() -> None:
    inner = _model().graph
    inner.ClearField("initializer")
    cond = helper.make_node("If", ["c"], ["o"], then_branch=inner, else_branch=inner)
    model = _model()
    model.graph.node.append(cond)
    assert len(inspect_model(model).tensors) == 9


def _gpu_kernels() -> bool:
    from onnxq.cast import cuda_aot

    try:
        return cuda_aot.info()[0] > 0
    except RuntimeError:  # no native library
        return False


def test_cuda_placement_counts_subgraphs_and_lists_the_nodes_on_the_cpu() -> None:
    if not _gpu_kernels():
        pytest.skip("the native library has no GPU kernels")
    model = _model()  # mxfp4 and mxfp8: on the kernels (DequantizeLinear is not an onnxq op)
    inner = _model().graph
    inner.ClearField("initializer")
    inner.node[0].attribute[-1].s = b"int8_e8m0_t8_t4"  # 2-D tiles: no kernel
    inner.node[2].attribute.append(helper.make_attribute("round_mode", "stochastic"))
    inner.node.append(helper.make_node("QuantizeMX", ["b"], ["bq", "bs"], domain="onnxq"))
    model.graph.node.append(
        helper.make_node("If", ["c"], ["o"], then_branch=inner, else_branch=_model().graph)
    )
    found = cuda_placement(model)
    assert (found.kernels, found.nodes, found.unknown) == (7, 10, "")
    reasons = {why.split(" (")[0]: names for why, names in found.cpu.items()}
    assert reasons["dtype 'int8_e8m0_t8_t4' has no CUDA kernel in this library"] == ["DequantizeMX"]
    stochastic = "stochastic rounding has no CUDA kernel"
    assert [n for w, n in found.cpu.items() if w.startswith(stochastic)] == [["QuantizeMX"]]
    # a node without dtype: the ops refuse it, so does the report
    assert [w for w in found.cpu if w.startswith("refused by the ops: ")] != []


def test_cuda_placement_of_gathermx_follows_its_table() -> None:
    # GatherMX's placement depends on its table's shape and axis attributes: rows of whole
    # tiles on the kernels, tiles along the rows on the CPU, no shape refused as by the op
    if not _gpu_kernels():
        pytest.skip("the native library has no GPU kernels")

    def gather(name: str, **attrs: object) -> onnx.NodeProto:
        return helper.make_node(
            "GatherMX", ["i", "q", "s"], [name], name, domain="onnxq", dtype="mxfp4", **attrs
        )

    nodes = [gather("rows", shape=[10, 33]), gather("along", shape=[64, 6], axis=0)]
    nodes.append(gather("unshaped"))
    graph = helper.make_graph(nodes, "g", [], [])
    found = cuda_placement(helper.make_model(graph))
    assert (found.kernels, found.nodes) == (1, 3)
    (along,) = [w for w, names in found.cpu.items() if names == ["along"]]
    assert along.startswith("its tiles run along the table's rows (axis 0 of [64, 6])"), along
    (unshaped,) = [w for w, names in found.cpu.items() if names == ["unshaped"]]
    assert unshaped.startswith("refused by the ops: GatherMX needs its table's shape")


def test_cuda_placement_of_a_library_without_gpu_kernels_is_every_node_on_the_cpu(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # a library built without GPU kernels registers no CUDA ops: onnxruntime's CUDA provider
    # leaves every onnxq node to the CPU provider, which is known, not unknown
    from onnxq.cast import cuda_aot

    why = "this onnxq library was built without GPU kernels (test)"
    monkeypatch.setattr(cuda_aot, "info", lambda: (0, why))
    found = cuda_placement(_model())
    assert found.unknown == "" and found.kernels == 0 and found.nodes > 0
    assert all(w.endswith(why) for w in found.cpu), found.cpu
    assert found.cpu_at_run == sum(len(v) for w, v in found.cpu.items() if w == why)


def test_cuda_placement_without_the_library_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    from onnxq.cast import cuda_aot

    def missing() -> tuple[int, str]:
        raise RuntimeError("the onnxq native library is not built")

    monkeypatch.setattr(cuda_aot, "info", missing)
    found = cuda_placement(_model())
    assert found.unknown == "the onnxq native library is not built" and found.nodes == 0
    assert cuda_placement(onnx.ModelProto()).unknown == ""  # no onnxq node: nothing to say


@pytest.mark.parametrize(
    ("dtype", "message"),
    [(None, "has no dtype attribute"), ("bogus", "bad dtype"), (b"mxfp4\xff", "bad dtype")],
)
def test_malformed_decoders_are_refused(dtype: object, message: str) -> None:
    with pytest.raises(MalformedNodeError, match=message):
        quantized_tensor(_decoder(dtype), {})


def test_a_non_utf8_attribute_the_reader_does_not_use_is_ignored() -> None:
    node = _decoder()
    node.attribute.append(helper.make_attribute("note", b"\xfe\xff"))
    assert quantized_tensor(node, {}).format == "mxfp4"


def test_tensor_bytes_from_dims_and_type() -> None:
    assert tensor_bytes(_zeros("a", [3, 5], TensorProto.INT4)) == 8  # 15 nibbles
    assert tensor_bytes(_zeros("b", [3], TensorProto.FLOAT16)) == 6
    assert tensor_bytes(helper.make_tensor("c", TensorProto.STRING, [2], [b"ab", b"cde"])) == 5


def test_format_name_prefers_the_shortest_preset() -> None:
    assert format_name("e2m1fnuz_e8m0_t32") == "mxfp4"
    assert format_name("not a format") == "not a format"


def test_file_bytes_counts_external_data_once(tmp_path: Path) -> None:
    model = _model()
    for name in ("q", "x"):
        tensor = next(t for t in model.graph.initializer if t.name == name)
        tensor.data_location = TensorProto.EXTERNAL
        tensor.external_data.add(key="location", value="data.bin")
    (tmp_path / "m.onnx").write_bytes(b"12345")
    (tmp_path / "data.bin").write_bytes(b"123")
    assert data_files(model) == ["data.bin"]
    assert file_bytes(tmp_path / "m.onnx", model) == 8


# -- onnxq.compare ---------------------------------------------------------------------------
def test_error_metrics_by_hand() -> None:
    m = error_metrics(np.array([3.0, 4.0]), np.array([3.0, 3.0]))
    assert m["cos"] == pytest.approx(21 / (5 * math.sqrt(18)))
    assert m["sqnr"] == pytest.approx(10 * math.log10(25))
    assert m["max_abs"] == 1.0


def test_scores_and_top1() -> None:
    probs = np.array([[0.2, 0.8], [0.6, 0.4]], np.float32)
    assert looks_like_scores("y", probs, None)  # rows sum to 1
    assert looks_like_scores("logits", probs * 5, None)
    assert looks_like_scores("y", probs * 5, "Softmax")
    assert not looks_like_scores("y", probs * 5, "MatMul")
    assert not looks_like_scores("logits", probs[0], None)  # no class axis
    assert top1_agreement(probs, probs[:, ::-1]) == 0.0
    assert top1_agreement(probs, probs) == 1.0


def _chain(names: list[str]) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info(names[-1], TensorProto.FLOAT, [2])
    nodes, prev = [], "x"
    for i, name in enumerate(names):
        op = "Relu" if i == 0 else "Identity"
        nodes.append(helper.make_node(op, [prev], [name]))
        prev = name
    graph = helper.make_graph(nodes, "g", [x], [y])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def test_producers_look_through_identity() -> None:
    assert producers(_chain(["a", "b", "c"]).graph) == {"a": "Relu", "b": "Relu", "c": "Relu"}


def test_layers_shared_by_both_graphs_become_outputs() -> None:
    f, q = _chain(["a", "b", "c"]), _chain(["a", "z", "c"])
    assert layer_candidates(f, q) == ["a"]  # c is an output, b is not in q
    assert expose_outputs(f, ["a", "missing"]) == ["a"]
    assert [o.name for o in f.graph.output] == ["c", "a"]
