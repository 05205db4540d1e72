"""Activations on any shape: the plan, the rewritten graph, and bad input.

Every float input of a target op is quantized whatever its dims (symbolic, ``-1``, unknown,
zero); only an activation of unknown rank stays float, with its reason in ``onnxq_skipped``,
the CLI summary and ``onnxq inspect``. Models with no shape information, failing shape
inference, old opsets and zero-size dims are quantized as far as they can be, never with a
traceback, and the input file is never modified. The share of target-op inputs quantized is
read off the quantized model by `tests.graph.activation_share`, not by the planner.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxq.formats.datatype import datatype
from onnxq.graph import quantize as quantize_module
from onnxq.graph.plan import plan
from onnxq.graph.quantize import quantize_model
from onnxq.graph.recipe import Recipe
from onnxq.graph.schemas import DOMAIN, input_index
from tests.graph.activation_share import activation_share
from tests.onnxq_cli import run_onnxq

_F = TensorProto.FLOAT


def _w(shape: tuple[int, ...], name: str, seed: int = 0) -> onnx.TensorProto:
    data = np.random.default_rng(seed).standard_normal(shape) / np.sqrt(shape[0])
    return numpy_helper.from_array(data.astype(np.float32), name)


def _attention(x_dims: list[int | str | None], opset: int = 21) -> onnx.ModelProto:
    """x [B,S,32] -> h = x@w; a = h@h^T (both inputs computed); y = a@h."""
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"], name="proj"),
        helper.make_node("Transpose", ["h"], ["ht"], name="t", perm=[0, 2, 1]),
        helper.make_node("MatMul", ["h", "ht"], ["a"], name="scores"),
        helper.make_node("MatMul", ["a", "h"], ["y"], name="mix"),
    ]
    graph = helper.make_graph(
        nodes,
        "attention",
        [helper.make_tensor_value_info("x", _F, x_dims)],
        [helper.make_tensor_value_info("y", _F, x_dims)],
        [_w((32, 32), "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 7 if opset < 14 else 10
    return model


def _cnn(batch: int | str, opset: int = 21) -> onnx.ModelProto:
    """Conv -> Relu -> Flatten -> Gemm -> MatMul, batch ``batch`` (the classifier's -1)."""
    nodes = [
        helper.make_node("Conv", ["x", "k"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("Flatten", ["r"], ["f"], name="flat"),
        helper.make_node("Gemm", ["f", "g"], ["z"], name="fc", transB=1),
        helper.make_node("MatMul", ["z", "m"], ["y"], name="head"),
    ]
    graph = helper.make_graph(
        nodes,
        "cnn",
        [helper.make_tensor_value_info("x", _F, [batch, 3, 4, 4])],
        [helper.make_tensor_value_info("y", _F, [batch, 8])],
        [_w((8, 3, 3, 3), "k"), _w((16, 128), "g", 1), _w((16, 8), "m", 2)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 7 if opset < 14 else 10
    return model


def _minus_one(model: onnx.ModelProto) -> onnx.ModelProto:
    """Declare the batch dims as ``dim_value: -1``, as the PP-OCR classifier does."""
    for info in (*model.graph.input, *model.graph.output):
        info.type.tensor_type.shape.dim[0].Clear()
        info.type.tensor_type.shape.dim[0].dim_value = -1
    return model


def _ops(model: onnx.ModelProto, op_type: str) -> list[onnx.NodeProto]:
    return [n for n in model.graph.node if n.op_type == op_type]


def _meta(model: onnx.ModelProto) -> dict[str, str]:
    return {p.key: p.value for p in model.metadata_props}


# -- plan -------------------------------------------------------------------------------------
def test_symbolic_dims_plan_every_target_input_with_its_axis() -> None:
    chosen = Recipe.from_mapping({"activations": "mxfp8"})
    found = plan(_attention(["batch", "seq", 32]), chosen)
    axes = sorted((a.tensor, a.axis) for a in found.activations)
    # x, h and a are MatMul A inputs (last axis, 2); ht and h as B of a@h reduce axis 1.
    assert axes == [("a", 2), ("h", 1), ("h", 2), ("ht", 1), ("x", 2)]
    assert found.skipped == ()
    x = next(a for a in found.activations if a.tensor == "x")
    assert x.shape == [None, None, 32] and x.dims == ("batch", "seq", 32) and not x.static


def test_minus_one_dims_are_unknown_not_errors() -> None:
    found = plan(_minus_one(_cnn(1)), Recipe.from_mapping({"activations": "mxfp8"}))
    shapes = {a.tensor: a.shape for a in found.activations}
    assert shapes == {"x": [None, 3, 4, 4], "f": [None, 128], "z": [None, 16]}


def test_unknown_rank_is_skipped_with_its_reason() -> None:
    model = _attention(["b", "s", 32])
    model.graph.node[1].domain = "acme"  # a Transpose nobody can infer: ht has no rank
    model.opset_import.append(helper.make_opsetid("acme", 1))
    found = plan(model, Recipe.from_mapping({"activations": "mxfp8"}))
    # ht has no rank, so neither has a = h @ ht; h and x are still planned.
    assert [(s.tensor, s.consumers) for s in found.skipped] == [
        ("ht", ("scores",)),
        ("a", ("mix",)),
    ]
    assert all("unknown rank" in s.reason for s in found.skipped)
    assert sorted(a.tensor for a in found.activations) == ["h", "h", "x"]


def test_an_axis_override_out_of_range_names_the_node() -> None:
    chosen = Recipe.from_mapping(
        {"activations": "mxfp8", "node_overrides": {"mix": {"activation_axis": 3}}}
    )
    with pytest.raises(ValueError, match=r"node 'mix': activation axis 3 is out of range"):
        plan(_attention(["b", "s", 32]), chosen)


# -- the rewrite ------------------------------------------------------------------------------
def test_fused_rewrite_declares_symbolic_shapes() -> None:
    q = quantize_model(_attention(["batch", "seq", 32]), activations="mxfp8", custom_ops_only=True)
    fused = _ops(q, "QuantizeDequantizeMX")
    assert len(fused) == 5 and all(n.domain == DOMAIN for n in fused)
    assert not _ops(q, "QuantizeMX") and not _ops(q, "DequantizeMX")
    declared = {v.name: v.type.tensor_type for v in q.graph.value_info}
    for node in fused:
        out = declared[node.output[0]]
        assert out.elem_type == _F
        dims = [d.dim_param or d.dim_value for d in out.shape.dim]
        assert dims[0] == "batch" and len(dims) == 3
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        assert attrs["dtype"].decode() == datatype("mxfp8").code
        assert attrs["axis"] in (1, 2)
    assert activation_share(q)[:2] == (5, 5)
    assert _meta(q)["onnxq_quantized"] == '{"weights": 0, "activations": 5}'
    onnx.checker.check_model(q, full_check=True)


def test_pair_rewrite_reads_a_runtime_shape_only_when_needed() -> None:
    dynamic = quantize_model(
        _attention(["b", "s", 32]), activations="mxfp8", fuse=False, custom_ops_only=True
    )
    shapes = {n.output[0]: n.input[0] for n in _ops(dynamic, "Shape")}
    dqs = [n for n in _ops(dynamic, "DequantizeMX")]
    assert len(dqs) == 5 == len(_ops(dynamic, "QuantizeMX")) == len(shapes)
    at = input_index("DequantizeMX", "Shape")
    for dq in dqs:
        assert len(dq.input) == at + 1 and dq.input[at] in shapes
        assert "shape" not in {a.name for a in dq.attribute}
    static = quantize_model(_attention([2, 5, 32]), activations="mxfp8", fuse=False)
    assert not _ops(static, "Shape")
    for dq in _ops(static, "DequantizeMX"):
        shape = next(a for a in dq.attribute if a.name == "shape")
        assert list(shape.ints) in ([2, 5, 32], [2, 32, 5], [2, 5, 5])
    assert activation_share(static)[:2] == activation_share(dynamic)[:2] == (5, 5)


def test_recipe_key_fuse_false_keeps_the_pair() -> None:
    q = quantize_model(_attention([2, 5, 32]), recipe={"activations": "mxfp8", "fuse": False})
    assert _ops(q, "QuantizeMX") and not _ops(q, "QuantizeDequantizeMX")
    assert '"fuse":false' in _meta(q)["onnxq_recipe"]
    with pytest.raises(ValueError, match=r"recipe\.fuse: unknown fusion 'no'; known: matmul_mx"):
        Recipe.from_mapping({"fuse": "no"})


def test_classifier_minus_one_batch_quantizes_weights_and_activations() -> None:
    q = quantize_model(_minus_one(_cnn(1)), weights="bfp16", activations="bfp16")
    for dq in _ops(q, "DequantizeMX"):  # weights: dims from the initializers
        assert all(d > 0 for d in next(a.ints for a in dq.attribute if a.name == "shape"))
    assert activation_share(q)[:2] == (3, 3)
    assert _meta(q)["onnxq_quantized"] == '{"weights": 3, "activations": 3}'


def test_zero_size_dims_are_quantized() -> None:
    q = quantize_model(_cnn(0), activations="mxfp8", fuse=False, custom_ops_only=True)
    assert activation_share(q)[:2] == (3, 3)
    assert len(_ops(q, "Shape")) == 3  # a zero dim is read at run time, never an attribute


@pytest.mark.parametrize("opset", [7, 9, 11, 12])
def test_old_opsets_are_converted_and_quantized(opset: int) -> None:
    model = _cnn("n", opset=opset)
    q = quantize_model(model, weights="mxfp8", activations="mxfp8", custom_ops_only=True)
    assert activation_share(q)[:2] == (3, 3)
    assert next(o.version for o in q.opset_import if o.domain == "") == 21


def test_failing_shape_inference_uses_the_declared_shapes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def fails(_model: onnx.ModelProto) -> onnx.ModelProto:
        raise onnx.shape_inference.InferenceError("[ShapeInferenceError] broken on purpose")

    monkeypatch.setattr(quantize_module, "infer_shapes", fails)
    with pytest.warns(UserWarning, match="shape inference fails"):
        q = quantize_model(_attention(["b", "s", 32]), activations="mxfp8", custom_ops_only=True)
    # x is declared; h, ht and a have no declared shape: skipped with the reason.
    assert activation_share(q)[:2] == (1, 5)
    skipped = {s["tensor"] for s in json.loads(_meta(q)["onnxq_skipped"])}
    assert skipped == {"h", "ht", "a"}


def test_no_shape_information_keeps_what_the_rank_allows() -> None:
    model = _attention([None, None, None])  # every dim unknown, no value_info
    q = quantize_model(model, activations="mxfp8", custom_ops_only=True)
    assert activation_share(q)[:2] == (5, 5)


def test_calibrated_tensor_scales_work_on_dynamic_shapes(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    for i, seq in enumerate((4, 7)):
        np.savez(tmp_path / f"s{i}.npz", x=rng.standard_normal((2, seq, 32)).astype(np.float32))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        q = quantize_model(
            _attention(["b", "s", 32]), activations="int8_tensor", calibration=str(tmp_path)
        )
    assert len(_ops(q, "QuantizeLinear")) == 5 == len(_ops(q, "DequantizeLinear"))
    assert activation_share(q)[:2] == (5, 5)


# -- the CLI on bad input ---------------------------------------------------------------------
def _cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return run_onnxq(*argv)


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_cli_lists_skips_and_never_modifies_the_input(tmp_path: Path) -> None:
    model = _attention(["b", "s", 32])
    model.graph.node[1].domain = "acme"
    model.opset_import.append(helper.make_opsetid("acme", 1))
    src, out = tmp_path / "m.onnx", tmp_path / "q.onnx"
    onnx.save(model, src)
    before = _digest(src)
    done = _cli("quantize", str(src), "-o", str(out), "--activations", "mxfp8", "--custom-ops-only")
    assert done.returncode == 0, done.stderr
    assert "3 activations quantized" in done.stdout
    assert "2 activation(s) left float" in done.stdout
    shown = _cli("inspect", str(out))
    assert shown.returncode == 0, shown.stderr
    assert "activations: 3 quantized, 2 left float" in shown.stdout
    assert "left float: ht (read by scores): unknown rank" in shown.stdout
    assert _digest(src) == before


def _untyped_input() -> onnx.ModelProto:
    """x0 -> acme.Id (no schema: x has no type) -> MatMul(x, w): x's rank is unknown."""
    nodes = [
        helper.make_node("Id", ["x0"], ["x"], name="id", domain="acme"),
        helper.make_node("MatMul", ["x", "w"], ["y"], name="only"),
    ]
    graph = helper.make_graph(
        nodes,
        "untyped",
        [helper.make_tensor_value_info("x0", _F, ["b", 32])],
        [helper.make_tensor_value_info("y", _F, ["b", 32])],
        [_w((32, 32), "w")],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("acme", 1)]
    )
    model.ir_version = 10
    return model


@pytest.mark.parametrize("case", ["no_shape_field", "only_unknown_rank"])
def test_cli_bad_shapes_exit_2_in_one_line(tmp_path: Path, case: str) -> None:
    if case == "no_shape_field":  # onnx requires the field: refused, in one line
        model = _attention(["b", "s", 32])
        model.graph.input[0].type.tensor_type.ClearField("shape")
    else:  # only activations asked for, and the one there is has no rank: nothing to do
        model = _untyped_input()
    src, out = tmp_path / "m.onnx", tmp_path / "q.onnx"
    onnx.save(model, src)
    before = _digest(src)
    done = _cli("quantize", str(src), "-o", str(out), "--activations", "mxfp8")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1
    if case == "only_unknown_rank":
        assert "unknown rank" in done.stderr
    assert not out.exists() and _digest(src) == before
    weights = _cli("quantize", str(src), "-o", str(out), "--weights", "mxfp8")
    if case == "only_unknown_rank":  # the weight is still quantized
        assert weights.returncode == 0, weights.stderr
    assert _digest(src) == before


def test_cli_no_fuse_writes_pairs_and_inspect_counts_them(tmp_path: Path) -> None:
    src, fused, pairs = tmp_path / "m.onnx", tmp_path / "f.onnx", tmp_path / "p.onnx"
    onnx.save(_attention(["b", "s", 32]), src)
    for out, extra in ((fused, ()), (pairs, ("--no-fuse",))):
        done = _cli("quantize", str(src), "-o", str(out), "--activations", "mxfp8", *extra)
        assert done.returncode == 0, done.stderr
        assert "5 activations quantized" in done.stdout and "left float" not in done.stdout
        shown = _cli("inspect", str(out))
        assert "activations: 5 quantized, 0 left float" in shown.stdout, shown.stdout
        assert "?x?x32" in shown.stdout  # dims known only at run time
    assert _ops(onnx.load(str(fused)), "QuantizeDequantizeMX")
    q = onnx.load(str(pairs))
    assert not _ops(q, "QuantizeDequantizeMX") and len(_ops(q, "Shape")) == 5
    assert "--no-fuse" in _cli("quantize", "--help").stdout
