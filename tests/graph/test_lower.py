"""``target="standard"``: weights as plain ai.onnx nodes, the same bits as ``target="onnxq"``.

Every builder of ``tests/models/`` is quantized with both targets; the standard model has no onnxq
node, function or opset import, passes the full checker, runs in a plain onnxruntime (no
custom-op library) and in the onnx reference evaluator, and its dequantized weights (exposed
as graph outputs) equal the onnxq target's (run through its function fallbacks) and
``onnxq.cast`` bit for bit.
"""

from __future__ import annotations

import copy

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import onnxq
import onnxq.runtime
from onnxq.graph.functions import inline_for_reference
from onnxq.graph.lower import lower_weight, lowering
from onnxq.graph.quantize import plan, quantize_model
from onnxq.graph.recipe import Recipe
from tests.models import builders

CODEBOOK = "cb41fi_e2m2fnuz_e8m0_t32"
FORMATS = [
    "mxfp8e4",
    "mxint8",
    "mxfp4",
    "mxfp6e2",
    "mx6",
    "nvfp4",
    CODEBOOK,
    "int4_e8m0_t32",
    "int8_float32_t0",
]
DEQUANTIZE_LINEAR = {"mxfp8e4", "mxint8", "int4_e8m0_t32", "int8_float32_t0"}
# The reference evaluator runs the recurrent models' loops in Python: slow, skipped there.
REFERENCE = ("mlp", "cnn", "if_constant", "embedding", "transformer")


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(a, np.float32)).view(np.uint32)


def _no_opt() -> ort.SessionOptions:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return options


def _graphs(graph: onnx.GraphProto) -> list[onnx.GraphProto]:
    found = [graph]
    for node in graph.node:
        for attr in node.attribute:
            for sub in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else attr.graphs:
                found += _graphs(sub)
    return found


def _weight_names(q_onnxq: onnx.ModelProto) -> dict[str, onnx.ValueInfoProto]:
    """The dequantized weights of an onnxq-target model: name -> its value info."""
    infos = {v.name: v for v in q_onnxq.graph.value_info}
    ops = ("DequantizeMX", "CodebookLookup")
    return {n.output[0]: infos[n.output[0]] for n in q_onnxq.graph.node if n.op_type in ops}


def _expose(model: onnx.ModelProto, infos: dict[str, onnx.ValueInfoProto]) -> onnx.ModelProto:
    out = copy.deepcopy(model)
    out.graph.output.extend(copy.deepcopy(list(infos.values())))
    return out


def _run(model: onnx.ModelProto, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    names = [o.name for o in model.graph.output]
    session = ort.InferenceSession(
        model.SerializeToString(), _no_opt(), providers=["CPUExecutionProvider"]
    )
    return dict(zip(names, session.run(names, inputs), strict=True))


@pytest.mark.parametrize("weights", FORMATS)
@pytest.mark.parametrize("name", sorted(builders.BUILDERS))
def test_standard_target_matches_onnxq_target_bit_for_bit(name: str, weights: str) -> None:
    model, inputs = builders.BUILDERS[name]()
    std = quantize_model(model, weights=weights, target="standard")
    # Unfused: every decoded weight stays a DequantizeMX output to compare (fusion: its tests).
    ref = quantize_model(model, weights=weights, target="onnxq", fuse=False)
    # No custom op anywhere: nodes, functions, opset imports.
    assert all(n.domain in ("", "ai.onnx") for g in _graphs(std.graph) for n in g.node)
    assert not std.functions
    assert {o.domain for o in std.opset_import} == {""}
    onnx.checker.check_model(std, full_check=True)
    meta = {p.key: p.value for p in std.metadata_props}
    assert meta["onnxq_version"] == onnxq.__version__ and "onnxq_recipe" in meta
    ops = {n.op_type for n in std.graph.node}
    assert ("DequantizeLinear" in ops) == (weights in DEQUANTIZE_LINEAR)
    assert ("Gather" in ops) or weights in DEQUANTIZE_LINEAR or name == "embedding"
    # The dequantized weights, exposed as outputs, and the model outputs.
    infos = _weight_names(ref)
    assert infos
    got = _run(_expose(std, infos), inputs)
    want = _run(_expose(ref, infos), inputs)  # plain onnxruntime: the function fallbacks
    for key in want:
        assert np.array_equal(_bits(got[key]), _bits(want[key])), key
    if name in REFERENCE:
        exposed = _expose(std, infos)
        names = [o.name for o in exposed.graph.output]
        with np.errstate(all="ignore"):
            evaluated = ReferenceEvaluator(inline_for_reference(exposed)).run(names, inputs)
        for key, value in zip(names, evaluated, strict=True):
            if key in infos:
                assert np.array_equal(_bits(value), _bits(got[key])), key
            else:
                np.testing.assert_allclose(value, got[key], rtol=1e-5, atol=1e-5)
    # And against the cast engine directly.
    for entry in plan(model, Recipe(weights=onnxq.datatype(weights))).weights:
        names = (entry.tensor, f"{entry.tensor}__tiled", f"{entry.tensor}__w")
        out = next(n for n in names if n in infos)
        array = numpy_helper.to_array(entry.source.tensor)
        if entry.tiled_shape is not None:  # a short reduction axis (onnxq.graph.tiling)
            array = array.reshape(entry.tiled_shape)
        assert entry.scale_mode == "search"  # the weights' default (docs/formats.md)
        expected = onnxq.cast(array, entry.dtype, axis=entry.axis, scale_mode=entry.scale_mode)
        assert np.array_equal(_bits(got[out]), _bits(expected)), entry.tensor


@pytest.mark.parametrize(
    "dtype",
    [
        "mxfp8e4",
        "mxfp8e5",
        "mxint8",
        "bfp16",
        "int4_e8m0_t32",
        "mxfp4",
        "mxfp6e2",
        "mx9",
        "mx4",
        "nvfp4",
        "e4m3fn_e8m0_t16_t16",
        "int8_e8m0_t16n2m4",
        "uint4_bfloat16_bfloat16_t0_t32",
        "float16_e8m0_t32",
        "int12_e8m0_t32",
        "e4m3fn",
    ],
)
@pytest.mark.parametrize("output_type", [TensorProto.FLOAT, TensorProto.FLOAT16])
def test_lower_weight_is_exact_for_tiny_and_tail_tiles(dtype: str, output_type: int) -> None:
    rng = np.random.default_rng(7)
    shape, axis = (6, 70), 1  # a partial last tile
    if output_type == TensorProto.FLOAT:
        # ~2^-128: E8M0 scales near their bottom, products rounded to float32 subnormals.
        w = (rng.standard_normal(shape) * np.ldexp(1.0, -128)).astype(np.float32)
    else:  # float16 subnormals
        w = (rng.standard_normal(shape) * 1e-6).astype(np.float16)
    w[0] = rng.standard_normal(70) * 100
    inits, nodes = lower_weight("w", w, dtype, axis, output_type=output_type)
    out = helper.make_tensor_value_info("w", output_type, list(shape))
    graph = helper.make_graph(nodes, "g", [], [out], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    onnx.checker.check_model(model, full_check=True)
    want = np.asarray(onnxq.cast(w, dtype, axis=axis))
    got = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for value in (got.run(None, {})[0], ReferenceEvaluator(model).run(None, {})[0]):
        assert value.dtype == want.dtype
        assert np.array_equal(value.view(np.uint8), want.view(np.uint8))
    assert lowering(dtype, shape, axis) in {n.op_type for n in nodes}


def test_bfloat16_weights_keep_their_type() -> None:
    w = np.random.default_rng(3).standard_normal((4, 64)).astype(ml_dtypes.bfloat16)
    inits, nodes = lower_weight("w", w, "mxfp4", 1, output_type=TensorProto.BFLOAT16)
    graph = helper.make_graph(
        nodes, "g", [], [helper.make_tensor_value_info("w", TensorProto.BFLOAT16, [4, 64])], inits
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    got = ReferenceEvaluator(model).run(None, {})[0]
    want = np.asarray(onnxq.cast(w, "mxfp4", axis=1))
    assert np.array_equal(np.asarray(got).view(np.uint16), want.view(np.uint16))


def test_standard_target_fake_storage_has_no_custom_op() -> None:
    model, inputs = builders.mlp()
    std = quantize_model(model, weights="mxfp4", target="standard", weight_storage="fake")
    assert {o.domain for o in std.opset_import} == {""}
    assert all(n.domain == "" for n in std.graph.node)
    fake = quantize_model(model, weights="mxfp4", weight_storage="fake")
    for a, b in zip(_run(std, inputs).values(), _run(fake, inputs).values(), strict=True):
        assert np.array_equal(_bits(a), _bits(b))


def test_standard_target_refuses_inexpressible_activations_and_unstorable_formats() -> None:
    model, _ = builders.mlp()
    # uint4_block32's QuantizeMX has no standard-ONNX fallback (float scales, zero points).
    with pytest.raises(NotImplementedError, match="no standard-ONNX form"):
        quantize_model(model, weights="mxfp4", activations="uint4_block32", target="standard")
    with pytest.raises(NotImplementedError, match="cannot quantize activation"):
        quantize_model(model, weights="mxfp4", activations="int8_channel", target="standard")
    with pytest.raises(NotImplementedError, match="no same-valued ONNX type"):
        quantize_model(model, weights="e6m9_e8m0_t32", target="standard")
    with pytest.raises(ValueError, match="expected 'onnxq' or 'standard'"):
        quantize_model(model, weights="mxfp4", target="qdq")  # type: ignore[arg-type]


def test_packed_standard_file_shrinks_for_mxfp8() -> None:
    model, _ = builders.mlp(width=256)
    std = quantize_model(model, weights="mxfp8e4", target="standard")
    assert std.ByteSize() < model.ByteSize() * 0.35  # 8-bit codes + one scale per 32


@pytest.mark.parametrize("name", ["cnn", "lstm"])
def test_optimized_sessions_agree_when_dequantize_linear_is_folded(name: str) -> None:
    # onnxruntime keeps DequantizeLinear unfolded for its QDQ fusions, so an optimized session
    # picks other Conv/LSTM kernels (last-bit differences in the outputs, the weights are the
    # same); with session.disable_quant_qdq=1 it folds them and every output bit agrees.
    model, inputs = builders.BUILDERS[name]()
    std = quantize_model(model, weights="mxint8", target="standard")
    ref = quantize_model(model, weights="mxint8", fuse=False)
    results = []
    for m in (std, ref):
        options = ort.SessionOptions()
        options.add_session_config_entry("session.disable_quant_qdq", "1")
        session = ort.InferenceSession(
            m.SerializeToString(), options, providers=["CPUExecutionProvider"]
        )
        results.append(session.run(None, inputs))
    for a, b in zip(*results, strict=True):
        assert np.array_equal(_bits(a), _bits(b))


@pytest.mark.parametrize("activations", ["mxfp8e4", "mx6", "mxint8"])
@pytest.mark.parametrize("name", ["mlp", "transformer", "cnn", "if_constant"])
def test_block_activations_inline_to_standard_ops_with_the_same_bits(
    name: str, activations: str
) -> None:
    # target="standard" replaces each QuantizeMX/DequantizeMX pair by its bit-exact
    # standard-ONNX function body, so the model needs no library and computes what the onnxq
    # target computes.
    model, inputs = builders.BUILDERS[name]()
    std = quantize_model(model, weights="mxfp4", activations=activations, target="standard")
    onnx.checker.check_model(std, full_check=True)
    domains = {n.domain for n in std.graph.node} | {o.domain for o in std.opset_import}
    assert "onnxq" not in domains and not std.functions
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    plain = ort.InferenceSession(
        std.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    onnxq_model = quantize_model(model, weights="mxfp4", activations=activations)
    library_options = ort.SessionOptions()
    library_options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    with_library = onnxq.runtime.session(onnxq_model, sess_options=library_options)
    for got, want in zip(plain.run(None, inputs), with_library.run(None, inputs), strict=True):
        assert np.array_equal(got.view(np.uint8), want.view(np.uint8))
