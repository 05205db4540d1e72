"""Function fallbacks on unknown dims (onnxq.graph.functions, run-time sizes) against the oracle.

Models declare symbolic dims (``batch``, ``seq``...), run in a plain onnxruntime session (no
custom-op library: the model-local functions are the only implementation) on several runtime
shapes, ragged tails included, and are compared as bits with the numpy reference
(`onnxq.cast(..., backend="reference")`, virtual and compress modes).
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import onnxq
from onnxq.graph import functions as fallback
from onnxq.graph.functions import build_function, fallback_shape
from onnxq.graph.schemas import output_types

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # 1/-0 in the evaluator

_QX_OUTPUTS = ["Q", "Scale", "Zero", "TenScale", "Meta", "Mask"]
_FIELDS = {"Q": "data", "Scale": "scale", "TenScale": "tenscale", "Meta": "meta"}


def _data(shape: tuple[int, ...], seed: int) -> np.ndarray:
    """Wide-range values with NaN, Inf, zeros, -0 and subnormals at the front."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape) * np.exp2(rng.integers(-20, 20, shape))
    x = x.astype(np.float32).reshape(-1)
    specials = [np.nan, -np.inf, -0.0, 0.0, 2.0**-149, -(2.0**-130), 1e-41, np.inf, 6.0]
    x[: min(len(specials), x.size)] = specials[: x.size]
    if x.size > 70:
        x[32:64] = 0.0  # all-zero tiles (of 16 and of 32)
    return x.reshape(shape)


def _bits(a: np.ndarray) -> np.ndarray:
    a = np.asarray(a)
    return a.view(np.uint16) if a.dtype.itemsize == 2 else a.view(np.uint32)


def _finish(nodes, inputs, outputs, initializers=()) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("onnxq", 1)]
    )
    fallback.embed_functions(model)
    return model


def _pair_model(
    dtype: str,
    dims: list,
    axis: int = -1,
    *,
    fused: bool = False,
    elem: int = TensorProto.FLOAT,
    modes: dict | None = None,
    codes: bool = False,
) -> onnx.ModelProto:
    """X -> QuantizeMX -> DequantizeMX(Shape(X)) -> Y, or X -> QuantizeDequantizeMX -> Y."""
    attrs = {"dtype": dtype, "axis": axis, **(modes or {})}
    x = helper.make_tensor_value_info("X", elem, dims)
    outputs = [helper.make_tensor_value_info("Y", elem, dims)]
    if fused:
        nodes = [helper.make_node("QuantizeDequantizeMX", ["X"], ["Y"], domain="onnxq", **attrs)]
    else:
        nodes = [
            helper.make_node("QuantizeMX", ["X"], _QX_OUTPUTS, domain="onnxq", **attrs),
            helper.make_node("Shape", ["X"], ["x_shape"]),
            helper.make_node(
                "DequantizeMX",
                [*_QX_OUTPUTS, "x_shape"],
                ["Y"],
                domain="onnxq",
                dtype=dtype,
                axis=axis,
                output_type=elem,
            ),
        ]
        if codes:
            kinds = dict(zip(_QX_OUTPUTS, output_types("QuantizeMX", attrs), strict=True))
            outputs += [
                helper.make_tensor_value_info(n, kinds[n][0], None) for n in _FIELDS if kinds[n][0]
            ]
    return _finish(nodes, [x], outputs)


def _through_float32(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model with float32 I/O around its bfloat16 X and Y (the Python API lacks bfloat16)."""
    graph = model.graph
    dims = [d.dim_param or d.dim_value for d in graph.input[0].type.tensor_type.shape.dim]
    for node in graph.node:
        node.input[:] = ["X_b" if n == "X" else n for n in node.input]
        node.output[:] = ["Y_b" if n == "Y" else n for n in node.output]
    graph.node.insert(0, helper.make_node("Cast", ["X"], ["X_b"], to=TensorProto.BFLOAT16))
    graph.node.append(helper.make_node("Cast", ["Y_b"], ["Y"], to=TensorProto.FLOAT))
    del graph.input[:], graph.output[:]
    graph.input.append(helper.make_tensor_value_info("X", TensorProto.FLOAT, dims))
    graph.output.append(helper.make_tensor_value_info("Y", TensorProto.FLOAT, dims))
    return model


def _session(model: onnx.ModelProto) -> ort.InferenceSession:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


_FORMATS = ["mxfp8", "mxfp8e5", "mxfp6", "mxfp6e3", "mxfp4", "mxint8", "mxint4", "bfp16"]
_FORMATS += ["bfp8", "mx9", "mx6", "mx4", "nvfp4", "int4_e4m3fn_float32_t16"]


@pytest.mark.parametrize("fused", [False, True], ids=["pair", "fused"])
@pytest.mark.parametrize("dtype", _FORMATS)
def test_symbolic_batch_and_sequence(dtype: str, fused: bool) -> None:
    """[batch, seq, 96] on batch 1/3 and seq 1/7/129: one model, every shape, the oracle's bits."""
    session = _session(_pair_model(dtype, ["batch", "seq", 96], fused=fused))
    for k, shape in enumerate([(1, 1, 96), (3, 7, 96), (1, 129, 96), (3, 129, 96)]):
        x = _data(shape, seed=k + len(dtype))
        want = onnxq.cast(x, dtype, axis=-1, backend="reference")
        (got,) = session.run(None, {"X": x})
        np.testing.assert_array_equal(_bits(got), _bits(want))


@pytest.mark.parametrize("fused", [False, True], ids=["pair", "fused"])
@pytest.mark.parametrize("axis", [-1, 1, 0])
@pytest.mark.parametrize("dtype", ["mxfp8", "mxfp4", "mxint8", "bfp16", "mx9", "mx6"])
def test_ragged_tiled_dim_unknown(dtype: str, axis: int, fused: bool) -> None:
    """The tiled dim itself is symbolic and not a multiple of the tile (ragged tails)."""
    session = _session(_pair_model(dtype, ["a", "b", "c"], axis, fused=fused))
    for k, shape in enumerate([(1, 1, 1), (3, 7, 50), (2, 129, 17), (5, 3, 33)]):
        x = _data(shape, seed=100 + k)
        want = onnxq.cast(x, dtype, axis=axis, backend="reference")
        (got,) = session.run(None, {"X": x})
        np.testing.assert_array_equal(_bits(got), _bits(want))


@pytest.mark.parametrize(
    ("dtype", "axis"), [("mxfp4", -1), ("mx6", 1), ("mxint4", 0), ("nvfp4", -1), ("nvfp4", 0)]
)
def test_codes_match_compress_mode(dtype: str, axis: int) -> None:
    """QuantizeMX's Q, Scale and Meta on unknown dims are the reference's packed streams."""
    model = _pair_model(dtype, ["a", "b", "c"], axis, codes=True)
    session = _session(model)
    names = [o.name for o in model.graph.output]
    for k, shape in enumerate([(2, 3, 37), (1, 19, 5), (3, 1, 1)]):
        x = _data(shape, seed=200 + k)
        q = onnxq.cast(x, dtype, mode="compress", axis=axis, backend="reference")
        got = dict(zip(names, session.run(None, {"X": x}), strict=True))
        np.testing.assert_array_equal(_bits(got["Y"]), _bits(onnxq.upcast(q)))
        for name, field in _FIELDS.items():
            ref = getattr(q, field)
            if name not in got:  # the data type has no such output
                assert ref is None
                continue
            np.testing.assert_array_equal(got[name].reshape(-1), np.asarray(ref).reshape(-1))
        assert got["Scale"].shape == np.asarray(q.scale).shape


_MODES = [
    ("mxfp8", {"round_mode": "away", "scale_mode": "ceil"}),
    ("mxfp4", {"round_mode": "zero", "nan_policy": "block"}),
    ("mxint8", {"int_range": "full"}),
    ("mx9", {"round_mode": "away", "nan_policy": "block"}),
]


@pytest.mark.parametrize("fused", [False, True], ids=["pair", "fused"])
@pytest.mark.parametrize(("dtype", "modes"), _MODES)
def test_modes_on_unknown_dims(dtype: str, modes: dict, fused: bool) -> None:
    session = _session(_pair_model(dtype, ["n", 40], fused=fused, modes=modes))
    for k, rows in enumerate([1, 6]):
        x = _data((rows, 40), seed=300 + k)
        want = onnxq.cast(x, dtype, axis=-1, backend="reference", **modes)
        (got,) = session.run(None, {"X": x})
        np.testing.assert_array_equal(_bits(got), _bits(want))


@pytest.mark.parametrize("fused", [False, True], ids=["pair", "fused"])
@pytest.mark.parametrize("elem", [TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16])
def test_nvfp4_tensor_scale_edges(elem: int, fused: bool) -> None:
    """NVFP4: the tensor scale spans the whole run-time tensor; tiles whose scale rounds to 0,
    all-zero tiles, values near the type's maximum (the clamp on float32(q * sc * ts))."""
    np_type = {TensorProto.FLOAT: np.float32, TensorProto.FLOAT16: np.float16}.get(elem)
    model = _pair_model("nvfp4", ["n", "d"], fused=fused, elem=elem)
    if np_type is None:
        model = _through_float32(model)
    session = _session(model)
    top = {TensorProto.FLOAT: 3.0e38, TensorProto.FLOAT16: 65000.0}.get(elem, 3.0e38)
    rng = np.random.default_rng(11)
    for rows, cols in [(1, 16), (3, 40), (2, 7)]:
        x = rng.standard_normal((rows, cols)).astype(np.float32)
        x[0, 0] = top
        x[0, 1:3] = [-top * 0.99, np.nan]
        if cols > 16:
            x[-1, 16:32] = 1e-30 * np.sign(x[-1, 16:32])  # sc = 0: the tile reads +0
            x[-1, 16] = -0.0
        if rows > 1:
            x[1, :16] = 0.0
        if np_type is None:  # bfloat16 X, fed and read as float32 (exact casts)
            ml_dtypes = pytest.importorskip("ml_dtypes")
            xb = x.astype(ml_dtypes.bfloat16)
            want = onnxq.cast(xb, "nvfp4", axis=-1, backend="reference").astype(np.float32)
            (got,) = session.run(None, {"X": xb.astype(np.float32)})
            np.testing.assert_array_equal(_bits(got), _bits(want))
            continue
        x = x.astype(np_type)
        want = onnxq.cast(x, "nvfp4", axis=-1, backend="reference")
        (got,) = session.run(None, {"X": x})
        np.testing.assert_array_equal(_bits(got), _bits(want))


@pytest.mark.parametrize("fused", [False, True], ids=["pair", "fused"])
def test_float16_input(fused: bool) -> None:
    """float16 X: the saturation bound and the output type follow X's type."""
    model = _pair_model("mxfp8", ["n", "d"], fused=fused, elem=TensorProto.FLOAT16)
    session = _session(model)
    x = (_data((3, 45), seed=7) / np.float32(2.0**8)).astype(np.float16)
    x[1, :3] = [65504.0, -60000.0, 1e-7]
    want = onnxq.cast(x, "mxfp8", axis=-1, backend="reference")
    (got,) = session.run(None, {"X": x})
    assert got.dtype == np.float16
    np.testing.assert_array_equal(_bits(got), _bits(want))


def test_feeds_a_matmul() -> None:
    """[batch, seq, 96] -> QuantizeMX -> DequantizeMX(Shape(X)) -> MatMul with a weight."""
    rng = np.random.default_rng(5)
    w = rng.standard_normal((96, 8)).astype(np.float32)
    x_info = helper.make_tensor_value_info("X", TensorProto.FLOAT, ["batch", "seq", 96])
    nodes = [
        helper.make_node("QuantizeMX", ["X"], ["Q", "Scale"], domain="onnxq", dtype="mxfp4"),
        helper.make_node("Shape", ["X"], ["x_shape"]),
        helper.make_node(
            "DequantizeMX",
            ["Q", "Scale", "", "", "", "", "x_shape"],
            ["XQ"],
            domain="onnxq",
            dtype="mxfp4",
        ),
        helper.make_node("MatMul", ["XQ", "W"], ["Y"]),
    ]
    outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("Y", "XQ")]
    model = _finish(nodes, [x_info], outputs, [onnx.numpy_helper.from_array(w, "W")])
    session = _session(model)
    for shape in [(1, 1, 96), (3, 7, 96)]:
        x = rng.standard_normal(shape).astype(np.float32)
        y, xq = session.run(None, {"X": x})
        want = onnxq.cast(x, "mxfp4", axis=-1, backend="reference")
        np.testing.assert_array_equal(_bits(xq), _bits(want))
        np.testing.assert_allclose(y, want @ w, rtol=1e-5, atol=1e-5)


# Every decodable family on unknown dims: DequantizeMX fed by cast(compress) and a Shape input.
_DECODE_CASES = [
    ("mxfp4", (3, 37), -1),
    ("mxfp6e3", (2, 5, 9), 1),
    ("mxfp8e5", (2, 3, 5), 2),
    ("mxint4", (35,), 0),
    ("bfp16", (5, 17), 0),
    ("mx4", (2, 21), 0),
    ("mx9", (4, 35), -1),
    ("nvfp4", (3, 35), -1),
    ("int8_channel", (4, 9), 0),
    ("int8_tensor", (6, 5), 0),
    ("fp8e4_channel", (5, 6), 1),
    ("uint8_tensor", (3, 5), 0),
    ("uint4_block32", (3, 40), -1),
    ("uint4_float16_bfloat16_t16", (2, 19), 1),
    ("e4m3fn", (4, 7), 0),
]


@pytest.mark.parametrize(("dtype", "shape", "axis"), _DECODE_CASES)
def test_dequantize_reads_shape_input(dtype: str, shape: tuple[int, ...], axis: int) -> None:
    x = _data(shape, seed=len(dtype) * 3 + len(shape))
    q = onnxq.cast(x, dtype, mode="compress", axis=axis, backend="reference")
    feeds: dict[str, np.ndarray] = {}
    ins = []
    fields = ["data", "scale", "zero", "tenscale", "meta", "mask"]
    for formal, field in zip(_QX_OUTPUTS, fields, strict=True):
        arr = getattr(q, field)
        if arr is None:
            ins.append("")
            continue
        feeds["in_" + formal] = np.ascontiguousarray(arr)
        ins.append("in_" + formal)
    feeds["in_Shape"] = np.array(shape, dtype=np.int64)
    node = helper.make_node(
        "DequantizeMX", [*ins, "in_Shape"], ["Y"], domain="onnxq", dtype=q.dtype.code, axis=axis
    )
    infos = [
        helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), None)
        for k, v in feeds.items()
    ]
    infos[-1] = helper.make_tensor_value_info("in_Shape", TensorProto.INT64, [len(shape)])
    y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)
    model = _finish([node], infos, [y])
    assert model.functions[0].overload.endswith(f"_r{len(shape)}_f32")
    (got,) = _session(model).run(None, feeds)
    np.testing.assert_array_equal(_bits(got), _bits(onnxq.upcast(q)))
    ref = ReferenceEvaluator(fallback.inline_for_reference(model)).run(None, feeds)[0]
    np.testing.assert_array_equal(_bits(np.asarray(ref)), _bits(onnxq.upcast(q)))


@pytest.mark.parametrize("fused", [False, True], ids=["pair", "fused"])
def test_reference_evaluator(fused: bool) -> None:
    """The onnx reference evaluator computes the same bits on the inlined model."""
    model = fallback.inline_for_reference(_pair_model("mx6", ["n", "d"], fused=fused))
    for shape in [(2, 19), (1, 3)]:
        x = _data(shape, seed=9)
        (got,) = ReferenceEvaluator(model).run(None, {"X": x})
        want = onnxq.cast(x, "mx6", axis=-1, backend="reference")
        np.testing.assert_array_equal(_bits(np.asarray(got)), _bits(want))


def test_overloads_name_rank_and_share_one_function() -> None:
    static = build_function("QuantizeMX", {"dtype": "mxfp8", "axis": -1}, [4, 64])
    dynamic = build_function("QuantizeMX", {"dtype": "mxfp8", "axis": -1}, [None, 64])
    rank3 = build_function("QuantizeMX", {"dtype": "mxfp8", "axis": -1}, [None, None, 64])
    assert "_s4x64_" in static.overload
    assert "_r2_" in dynamic.overload and "_r3_" in rank3.overload
    assert len({static.overload, dynamic.overload, rank3.overload}) == 3
    axis0 = build_function("QuantizeMX", {"dtype": "mxfp8", "axis": 0}, [None, 64])
    assert axis0.overload != dynamic.overload
    fused = build_function("QuantizeDequantizeMX", {"dtype": "mxfp8", "axis": -1}, [2, 64])
    assert "_r2_" in fused.overload  # one body for every shape of the rank
    model = _pair_model("mxfp8", ["n", 64], fused=True)
    assert len(model.functions) == 1


@pytest.mark.parametrize(
    ("op", "dtype", "why"),
    [
        ("QuantizeMX", "int8_e8m0_t8_t8", "2-D tiles"),
        ("DequantizeMX", "int8_e8m0_t8_t8", "2-D tiles"),
        ("QuantizeDequantizeMX", "int8_e8m0_t8_t8", "2-D tiles"),
        ("DequantizeMX", "e2m1fnuz_e8m0_t8n2m4", "N:M sparsity"),
        ("CodebookLookup", "cb41fi_e2m2fnuz_e8m0_t8", "codebook"),
    ],
)
def test_weight_layouts_refused_on_unknown_dims(op: str, dtype: str, why: str) -> None:
    with pytest.raises(NotImplementedError, match=why):
        build_function(op, {"dtype": dtype, "axis": -1}, [None, 64])


def test_fallback_shape_of_dequantize_nodes() -> None:
    """DequantizeMX's rank comes from the attribute, the Shape node or the Shape tensor."""
    shapes = {"X": [None, 7, 64], "s_len": [3]}
    shape_node = helper.make_node("Shape", ["X"], ["s"])
    part = helper.make_node("Shape", ["X"], ["s_part"], start=1)
    producers = {"s": shape_node, "s_part": part}

    def dq(shape_in: str, **attrs) -> onnx.NodeProto:
        ins = ["Q", "Scale", "", "", "", "", shape_in]
        return helper.make_node("DequantizeMX", ins, ["Y"], domain="onnxq", dtype="mxfp8", **attrs)

    assert fallback_shape(dq("s"), shapes, producers) == [None, None, None]
    assert fallback_shape(dq("s_part"), shapes, producers) == [None, None]
    assert fallback_shape(dq("s_len"), shapes, producers) == [None, None, None]
    assert fallback_shape(dq("unknown"), shapes, producers) is None
    assert fallback_shape(dq("s", shape=[-1, 7, 64]), shapes, producers) == [None] * 3
    assert fallback_shape(dq("s", shape=[2, 7, 64]), shapes, producers) == [2, 7, 64]
    with pytest.raises(ValueError, match="no Shape input"):  # nothing gives X's shape
        fallback_shape(dq("", shape=[-1, 8, 1, 1]), shapes, producers)
    qx = helper.make_node("QuantizeMX", ["X"], ["Q", "Scale"], domain="onnxq", dtype="mxfp8")
    assert fallback_shape(qx, shapes, producers) == [None, 7, 64]


def _no_opt() -> ort.SessionOptions:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return options


def _plain(model: onnx.ModelProto) -> ort.InferenceSession:
    return ort.InferenceSession(
        model.SerializeToString(), _no_opt(), providers=["CPUExecutionProvider"]
    )


@pytest.mark.needs_custom_ops
@pytest.mark.parametrize("name", ["mlp", "transformer"])
def test_nvfp4_activations_run_the_same_bits_with_and_without_the_library(name: str) -> None:
    """NVFP4 activations now have a fallback: the library, a plain onnxruntime and the
    standard target (inlined bodies) agree bit for bit."""
    runtime = pytest.importorskip("onnxq.runtime")
    from onnxq.graph.quantize import quantize_model
    from tests.models import builders

    model, inputs = builders.BUILDERS[name]()
    q = quantize_model(model, weights="mxfp4", activations="nvfp4")
    # The default fusions leave MatMul (MatMulMX, opt-in, sums in its own order and its
    # fallback in onnxruntime's: the products would differ).
    assert "MatMulMX" not in {n.op_type for n in q.graph.node}
    assert "onnxq_no_fallback" not in {p.key for p in q.metadata_props}
    infos = {v.name: v for v in q.graph.value_info}
    decoded = [n.output[0] for n in q.graph.node if n.op_type == "DequantizeMX"]
    q.graph.output.extend(infos[n] for n in decoded)
    names = [o.name for o in q.graph.output]
    lib = runtime.session(q, sess_options=_no_opt()).run(names, inputs)
    plain = ort.InferenceSession(
        q.SerializeToString(), _no_opt(), providers=["CPUExecutionProvider"]
    )
    for key, a, b in zip(names, lib, plain.run(names, inputs), strict=True):
        np.testing.assert_array_equal(_bits(a), _bits(b), err_msg=key)
    std = quantize_model(model, weights="mxfp4", activations="nvfp4", target="standard")
    assert all(n.domain != "onnxq" for n in std.graph.node)
    outs = [o.name for o in model.graph.output]
    got = ort.InferenceSession(
        std.SerializeToString(), _no_opt(), providers=["CPUExecutionProvider"]
    )
    for key, a in zip(outs, got.run(outs, inputs), strict=True):
        np.testing.assert_array_equal(_bits(a), _bits(lib[names.index(key)]), err_msg=key)


def _bare(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model as the pass leaves it before the fallbacks: no functions, no overloads."""
    del model.functions[:]
    for node in model.graph.node:
        node.overload = ""
    return model


@pytest.mark.parametrize("fused", [False, True], ids=["pair", "fused"])
@pytest.mark.parametrize("target", ["onnxq", "standard"])
def test_pass_embeds_and_inlines_the_run_time_bodies(fused: bool, target: str) -> None:
    from onnxq.graph.quantize import _with_fallbacks

    model = _bare(_pair_model("mx6", ["batch", "seq", 40], fused=fused))
    types = {"X": (TensorProto.FLOAT, [None, None, 40])}  # as shape inference reports them
    model, missing = _with_fallbacks(model, types, target)
    assert missing == []
    if target == "standard":
        assert not model.functions and all(n.domain != "onnxq" for n in model.graph.node)
        assert "onnxq" not in {o.domain for o in model.opset_import}
    else:
        assert {f.overload.split("_r3_")[0] for f in model.functions} == {"int5_e8m0_t16s2_a2"}
    session = _session(model)
    for k, shape in enumerate([(1, 1, 40), (3, 7, 40), (2, 129, 40)]):
        x = _data(shape, seed=400 + k)
        (got,) = session.run(None, {"X": x})
        want = onnxq.cast(x, "mx6", axis=-1, backend="reference")
        np.testing.assert_array_equal(_bits(got), _bits(want))


def test_pass_lists_nodes_of_unknown_rank() -> None:
    """X of unknown rank: no fallback for either node, each listed with the reason."""
    from onnxq.graph.quantize import _embed

    model = _bare(_pair_model("mxfp8", ["n", 40]))
    missing = _embed(model, {})
    assert len(missing) == 2  # QuantizeMX, and DequantizeMX whose Shape reads that X
    assert all("rank" in m["reason"] for m in missing)
    assert not model.functions


def _symbolic_matmul() -> onnx.ModelProto:
    w = np.random.default_rng(0).standard_normal((64, 8)).astype(np.float32)
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, ["batch", "seq", 64])
    y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["batch", "seq", 8])
    node = helper.make_node("MatMul", ["X", "W"], ["Y"])
    graph = helper.make_graph([node], "g", [x], [y], [onnx.numpy_helper.from_array(w, "W")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_early_check_asks_the_builders_with_unknown_dims() -> None:
    """pass_checks.no_fallback predicts what _embed does: 2-D tiles on symbolic dims have no
    fallback (refused up front, naming the reason); NVFP4 and MX formats have one."""
    from onnxq.graph.quantize import quantize_model

    model = _symbolic_matmul()
    with pytest.raises(NotImplementedError, match="2-D tiles on a tensor with unknown dims"):
        quantize_model(model, weights="mxfp8", activations="int8_e8m0_t8_t8")
    for fmt in ("mxfp8", "nvfp4", "mx6"):
        q = quantize_model(model, weights="mxfp8", activations=fmt)
        assert "onnxq_no_fallback" not in {p.key for p in q.metadata_props}
