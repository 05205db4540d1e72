"""The graph quantizer (issue 4): every builder model, several formats, both storages.

Bit-exactness is checked on the onnxq nodes' outputs (the dequantized weights and
activations, exposed as graph outputs) across the library, the function fallbacks in a plain
onnxruntime and the onnx reference evaluator. Final outputs also pass through standard ops
(MatMul, Conv, LSTM) whose float accumulation order differs between runtimes, and onnxruntime
picks other kernels for constant weights, so they are compared bit-exactly between the
library and the fallbacks with graph optimizations off, and to the reference evaluator within
a few float32 ulps.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import onnxq
from onnxq.graph.functions import inline_for_reference
from onnxq.graph.quantize import plan, quantize_model
from onnxq.graph.recipe import Recipe, load_recipe
from tests.models import builders

runtime = pytest.importorskip("onnxq.runtime")

CODEBOOK = "cb41fi_e2m2fnuz_e8m0_t32"
# (weights, activations): every pair has function fallbacks for all its nodes.
CASES = [
    ("mxfp4", None),
    ("mxfp8e4", "mxfp8e4"),
    ("mx6", "mxfp4"),
    ("bfp16", "bfp16"),
    (CODEBOOK, "mx6"),
]
SMALL = ("mlp", "cnn", "if_constant", "embedding", "transformer")


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(a, np.float32)).view(np.uint32)


def _expose(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[str]]:
    """A copy whose graph outputs include every main-graph onnxq node output (float)."""
    out = copy.deepcopy(model)
    infos = {v.name: v for v in out.graph.value_info}
    names = [n.output[0] for n in out.graph.node if n.op_type in ("DequantizeMX", "CodebookLookup")]
    out.graph.output.extend(copy.deepcopy(infos[n]) for n in names)
    return out, names


def _no_opt() -> ort.SessionOptions:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return options


def _run_three(model: onnx.ModelProto, inputs: dict[str, np.ndarray], small: bool) -> list[dict]:
    exposed, _ = _expose(model)
    names = [o.name for o in exposed.graph.output]
    results = [
        dict(
            zip(
                names,
                runtime.session(exposed, sess_options=_no_opt()).run(names, inputs),
                strict=True,
            )
        )
    ]
    plain = ort.InferenceSession(
        exposed.SerializeToString(), _no_opt(), providers=["CPUExecutionProvider"]
    )
    results.append(dict(zip(names, plain.run(names, inputs), strict=True)))
    if small:
        with np.errstate(all="ignore"):
            ref = ReferenceEvaluator(inline_for_reference(copy.deepcopy(exposed)))
            results.append(dict(zip(names, ref.run(names, inputs), strict=True)))
    return results


@pytest.mark.needs_custom_ops
@pytest.mark.parametrize("storage", ["packed", "fake"])
@pytest.mark.parametrize(("weights", "activations"), CASES)
@pytest.mark.parametrize("name", sorted(builders.BUILDERS))
def test_each_model_runs_the_same_bits_in_three_runtimes(
    name: str, weights: str, activations: str | None, storage: str
) -> None:
    model, inputs = builders.BUILDERS[name]()
    q = quantize_model(
        model, weights=weights, activations=activations, weight_storage=storage, fuse=False
    )
    meta = {p.key: p.value for p in q.metadata_props}
    assert "onnxq_no_fallback" not in meta
    assert "onnxq_skipped" not in meta
    small = name in SMALL and (storage == "packed" or activations is not None)
    lib, plain, *ref = _run_three(q, inputs, small)
    outputs = [o.name for o in model.graph.output]
    for key, value in lib.items():
        assert np.array_equal(_bits(value), _bits(plain[key])), key
        if ref and key not in outputs:
            assert np.array_equal(_bits(value), _bits(ref[0][key])), key
    for key in outputs if ref else ():
        np.testing.assert_allclose(lib[key], ref[0][key], rtol=1e-5, atol=1e-5)


@pytest.mark.needs_custom_ops
@pytest.mark.parametrize("weights", ["mxfp4", "mx6", CODEBOOK])
@pytest.mark.parametrize("name", sorted(builders.BUILDERS))
def test_fake_storage_holds_the_packed_weights_values(name: str, weights: str) -> None:
    model, inputs = builders.BUILDERS[name]()
    packed = quantize_model(model, weights=weights, fuse=False)
    fake = quantize_model(model, weights=weights, weight_storage="fake")
    exposed, names = _expose(packed)
    got = dict(zip(names, runtime.session(exposed).run(names, inputs), strict=True))
    fake_values = {}
    for graph in [fake.graph] + [a.g for n in fake.graph.node for a in n.attribute if a.g.name]:
        fake_values |= {t.name: numpy_helper.to_array(t) for t in graph.initializer}
        for node in graph.node:
            if node.op_type == "Constant":
                fake_values[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
    for key, value in got.items():
        # A conv weight with a short reduction axis is decoded as a matrix (`W__tiled`) and
        # reshaped to the weight (docs/ops.md); fake storage holds the reshaped values.
        weight = key.removesuffix("__tiled")
        want = fake_values[weight].reshape(value.shape)
        assert np.array_equal(_bits(value), _bits(want)), key
    # Same kernels for both (no constant-weight prepacking): the outputs agree bit for bit.
    lib_packed = runtime.session(packed, sess_options=_no_opt(), decode_weights="run").run(
        None, inputs
    )
    plain_fake = ort.InferenceSession(
        _as_runtime_weights(fake).SerializeToString(), _no_opt(), providers=["CPUExecutionProvider"]
    ).run(None, inputs)
    for a, b in zip(lib_packed, plain_fake, strict=True):
        assert np.array_equal(_bits(a), _bits(b))


def _as_runtime_weights(model: onnx.ModelProto) -> onnx.ModelProto:
    """Feed the main graph's float initializers through Identity, as DequantizeMX does."""
    out = copy.deepcopy(model)
    nodes = []
    for t in out.graph.initializer:
        if t.data_type == onnx.TensorProto.FLOAT and len(t.dims) >= 2:
            old = t.name
            t.name = f"{old}__const"
            nodes.append(helper.make_node("Identity", [t.name], [old]))
    rest = list(out.graph.node)
    del out.graph.node[:]
    out.graph.node.extend([*nodes, *rest])
    return out


def test_weights_in_subgraphs_constants_transposes_and_shared_ones_are_found() -> None:
    model, _ = builders.if_constant()
    the_plan = plan(model, Recipe(weights=onnxq.datatype("mxfp4")))
    found = {w.tensor: w for w in the_plan.weights}
    assert set(found) == {"const_w", "shared_w", "wt", "then_w", "else_w", "outer_w"}
    assert found["shared_w"].consumers == ("main/shared_a", "main/shared_b")
    assert found["wt"].axis == 1  # MatMul B axis 0 of wt^T is wt's axis 1
    assert all(w.axis == 0 for k, w in found.items() if k != "wt")
    q = quantize_model(model, weights="mxfp4", fuse=False)
    dq = [n for n in q.graph.node if n.op_type == "DequantizeMX"]
    assert sorted(n.output[0] for n in dq) == sorted(found)  # each quantized once
    assert not any(n.op_type == "Constant" for n in q.graph.node)
    json.loads({p.key: p.value for p in q.metadata_props}["onnxq_recipe"])


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("mlp", {"w0": 0, "w1": 0, "head_w": 1}),
        ("cnn", {"conv0_w": 1, "conv1_w": 1, "deconv_w": 0}),
        ("lstm", {"W": 2, "R": 2}),
        ("gru", {"W": 2, "R": 2}),
        ("embedding", {"table": 1, "proj": 0}),
    ],
)
def test_weight_tiles_run_along_the_reduction_axis(name: str, expected: dict[str, int]) -> None:
    model, _ = builders.BUILDERS[name]()
    the_plan = plan(
        model, Recipe(weights=onnxq.datatype("mxfp4"), activations=onnxq.datatype("mxfp8"))
    )
    assert {w.tensor: w.axis for w in the_plan.weights} == expected
    acts = {a.tensor: a.axis for a in the_plan.activations}
    if name == "cnn":
        assert acts == {"x": 1, "r0": 1, "c1": 1}
    if name == "mlp":
        assert acts == {"x": 1, "h0": 1, "h1": 1}


@pytest.mark.parametrize(("fuse", "op"), [(True, "QuantizeDequantizeMX"), (False, "QuantizeMX")])
def test_one_activation_quantizer_per_tensor_however_many_consumers(fuse: bool, op: str) -> None:
    model, _ = builders.transformer()
    q = quantize_model(model, activations="mxfp8e4", fuse=fuse)
    quantized = [n.input[0] for n in q.graph.node if n.op_type == op]
    assert quantized.count("ln0") == 1  # read by the Q, K and V projections
    assert sorted(quantized) == sorted(set(quantized))


@pytest.mark.needs_custom_ops
def test_packed_mxfp4_file_is_at_most_16_percent_of_the_float_file(tmp_path: Path) -> None:
    model, inputs = builders.mlp(width=512, layers=4, batch=2)
    src = tmp_path / "mlp.onnx"
    onnx.save(model, src)
    out = tmp_path / "mlp.q.onnx"
    q = quantize_model(src, out, weights="mxfp4")
    assert out.stat().st_size <= 0.16 * src.stat().st_size
    y = runtime.session(str(out)).run(None, inputs)[0]
    assert np.array_equal(_bits(y), _bits(runtime.session(q).run(None, inputs)[0]))
    onnx.checker.check_model(str(out), full_check=True)
    assert not list(tmp_path.glob("*.tmp"))


def test_output_equal_to_input_is_refused_unless_overwrite(tmp_path: Path) -> None:
    model, _ = builders.mlp()
    src = tmp_path / "m.onnx"
    onnx.save(model, src)
    before = src.read_bytes()
    with pytest.raises(ValueError, match="--overwrite"):
        quantize_model(src, src, weights="mxfp4")
    assert src.read_bytes() == before
    quantize_model(src, src, weights="mxfp4", overwrite=True)
    assert onnx.load(src).metadata_props


def test_metadata_ir_version_and_opset() -> None:
    model, _ = builders.mlp()
    model.opset_import[0].version = 17
    q = quantize_model(model, weights="mx6", activations="mxfp8e4")
    meta = {p.key: p.value for p in q.metadata_props}
    assert meta["onnxq_version"] == onnxq.__version__
    assert json.loads(meta["onnxq_recipe"])["weights"] == "mx6"
    assert q.ir_version == 10
    assert {o.domain: o.version for o in q.opset_import} == {"": 21, "onnxq": 1}
    assert model.opset_import[0].version == 17  # the input is not modified


@pytest.mark.parametrize(
    ("activations", "modes", "words"),
    [
        ("uint4_block32", {}, ["uint4_block32", "zero points"]),
        ("mxfp8e4", {"scale_mode": "midmax"}, ["mxfp8e4", "midmax"]),
        ("mxint8", {"round_mode": "stochastic"}, ["mxint8", "stochastic"]),
    ],
)
def test_formats_without_a_fallback_are_refused_unless_custom_ops_only(
    activations: str, modes: dict[str, str], words: list[str]
) -> None:
    model, _ = builders.mlp()
    recipe = {"activations": activations, **modes}
    with pytest.raises(NotImplementedError, match="--custom-ops-only") as err:
        quantize_model(model, recipe=recipe)
    assert "activation 'x'" in str(err.value) and all(w in str(err.value) for w in words)
    q = quantize_model(model, recipe=recipe, custom_ops_only=True)
    meta = {p.key: p.value for p in q.metadata_props}
    missing = json.loads(meta["onnxq_no_fallback"])
    assert {m["node"] for m in missing} == {"x__qdq", "h0__qdq", "h1__qdq"}  # fused (default)
    assert "custom-op library" in meta["onnxq_custom_ops_only"]
    keyed = quantize_model(model, recipe={**recipe, "custom_ops_only": True})  # the recipe key
    assert "onnxq_custom_ops_only" in {p.key for p in keyed.metadata_props}


def test_recipe_overrides_excludes_and_yaml(tmp_path: Path) -> None:
    model, _ = builders.transformer()
    path = tmp_path / "r.yaml"
    path.write_text(
        "weights: mxfp4\nactivations: mxfp8e4\nexclude: ['ffn/*']\n"
        "op_type_overrides:\n  MatMul: {round_mode: away}\n"
        "node_overrides:\n  attn/q: {weights: mx6, activations: null, weight_axis: 1}\n"
    )
    the_plan = plan(model, load_recipe(path))
    weights = {w.tensor: w for w in the_plan.weights}
    assert set(weights) == {"wq", "wk", "wv", "wo"}
    assert (weights["wq"].dtype.name, weights["wq"].axis) == ("mx6", 1)
    assert weights["wk"].round_mode == "away"
    assert "f1r" not in {a.tensor for a in the_plan.activations}


@pytest.mark.parametrize(
    ("recipe", "message"),
    [
        ({"weigths": "mxfp4"}, "unknown key 'weigths'"),
        ({"weights": "mxfp5"}, "recipe.weights: unknown format 'mxfp5'"),
        ({"weights": "mxfp4", "exclude": ["nope*"]}, "pattern 'nope\\*' matches no node"),
        (
            {"weights": "mxfp4", "node_overrides": {"layer9/matmul": {"weights": "mx6"}}},
            "node 'layer9/matmul' does not exist",
        ),
        ({"weights": "mxfp4", "add_op_types": ["Softmax"]}, "op type 'Softmax' is not supported"),
        (
            {"weights": "mxfp4", "node_overrides": {"head": {"round": "even"}}},
            "unknown key 'round'",
        ),
        ({"round_mode": "up"}, "recipe.round_mode: unknown round_mode 'up'"),
    ],
)
def test_bad_recipes_raise_naming_the_key(recipe: dict, message: str) -> None:
    model, _ = builders.mlp()
    with pytest.raises(ValueError, match=message):
        quantize_model(model, recipe=recipe)


def test_nothing_to_quantize_and_bad_arguments_raise() -> None:
    model, _ = builders.mlp()
    with pytest.raises(ValueError, match="--weights"):
        quantize_model(model)
    with pytest.raises(ValueError, match="weight_storage 'zip'"):
        quantize_model(model, weights="mxfp4", weight_storage="zip")  # type: ignore[arg-type]
    with pytest.raises(NotImplementedError, match="standard"):  # no standard form: zero points
        quantize_model(model, weights="mxfp4", activations="uint4_block32", target="standard")
    with pytest.raises(ValueError, match="does not exist"):
        quantize_model("/nonexistent/model.onnx", weights="mxfp4")
