"""Standard-ONNX function fallbacks (onnxq.graph.functions) against the numpy reference.

Each model runs (a) in a plain onnxruntime session with no custom-op library and (b) in
`onnx.reference.ReferenceEvaluator` after `inline_for_reference`; results are compared with
`onnxq.upcast` / `onnxq.cast(..., mode="compress")` as uint32 bits.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import onnxq
from onnxq.formats.codebook import Codebook
from onnxq.formats.datatype import DataType
from onnxq.formats.scale import scale as scale_spec
from onnxq.graph import functions as fallback

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # 1/-0 in the evaluator

_DQ_INPUTS = {
    "Q": "data",
    "Scale": "scale",
    "Zero": "zero",
    "TenScale": "tenscale",
    "Meta": "meta",
    "Mask": "mask",
}
_CB_INPUTS = {"Q": "data", "Meta": "meta", "Scale": "scale"}
_NP_TYPES = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float16): TensorProto.FLOAT16}


def _tensor_info(name: str, arr: np.ndarray) -> onnx.ValueInfoProto:
    elem = helper.np_dtype_to_tensor_dtype(arr.dtype)
    return helper.make_tensor_value_info(name, elem, list(arr.shape))


def _model(nodes, inputs, outputs) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs)
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("onnxq", 1)]
    )
    fallback.embed_functions(model)
    onnx.checker.check_model(model, full_check=True)
    return model


def _run_both(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> tuple[list, list]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    got = session.run(None, feeds)
    ref = ReferenceEvaluator(fallback.inline_for_reference(model)).run(None, feeds)
    return got, [np.asarray(r) for r in ref]


def _bits(a: np.ndarray) -> np.ndarray:
    a = np.asarray(a)
    return a.view(np.uint16) if a.dtype.itemsize == 2 else a.view(np.uint32)


def _decoder_model(q, op: str = "DequantizeMX", table: np.ndarray | None = None, out=1):
    names = _DQ_INPUTS if op == "DequantizeMX" else _CB_INPUTS
    feeds: dict[str, np.ndarray] = {}
    ins: list[str] = []
    for formal, field in names.items():
        arr = getattr(q, field)
        if arr is None:
            ins.append("")
            continue
        feeds["in_" + formal] = np.ascontiguousarray(arr)
        ins.append("in_" + formal)
    if table is not None:
        feeds["in_Table"] = table
        ins.append("in_Table")
    while ins and not ins[-1]:
        ins.pop()
    node = helper.make_node(
        op,
        ins,
        ["Y"],
        domain="onnxq",
        dtype=q.dtype.code,
        axis=q.axis,
        shape=list(q.shape),
        output_type=out,
    )
    infos = [_tensor_info(k, v) for k, v in feeds.items()]
    y = helper.make_tensor_value_info("Y", out, list(q.shape))
    return _model([node], infos, [y]), feeds


def _data(shape, seed: int, spread: int = 12) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape) * np.exp2(rng.integers(-spread, spread, shape))
    x = x.astype(np.float32).reshape(-1)
    specials = [np.nan, -np.inf, -0.0, 2.0**-149, -(2.0**-130), 6.0, 0.25 + 2.0**-30, np.inf]
    x[: min(len(specials), x.size)] = specials[: x.size]
    return x.reshape(shape)


# (dtype, shape, axis): odd lengths (ragged tails), several axes.
_DECODE_CASES = [
    ("mxfp4", (3, 37), -1),
    ("mxfp6e2", (7, 33), 1),
    ("mxfp6e3", (2, 5, 9), 1),
    ("mxfp8e4", (5, 40), 0),
    ("mxfp8e5", (2, 3, 5), 2),
    ("mxint8", (2, 3, 33), 1),
    ("mxint4", (35,), 0),
    ("bfp16", (5, 17), 0),
    ("bfp8", (3, 70), -1),
    ("mx9", (4, 35), -1),
    ("mx6", (3, 19), 1),
    ("mx4", (2, 21), 0),
    ("int8_e8m0_t8_t8", (3, 11, 13), 0),
    ("int5_e8m0_t16s2_t16s2", (19, 21), -1),
    ("nvfp4", (3, 35), -1),
    ("int8_channel", (4, 9), 0),
    ("int4_channel", (3, 7), 1),
    ("int8_tensor", (6, 5), 0),
    ("fp8e4_channel", (5, 6), 1),
    ("uint8_tensor", (3, 5), 0),
    ("uint8_channel", (3, 5), 1),
    ("uint4_block32", (3, 40), -1),
    ("uint4_float16_bfloat16_t16", (2, 19), 1),
    ("e2m1fnuz_e8m0_t8n2m4", (3, 18), -1),
    ("e4m3fn", (4, 7), 0),
]


@pytest.mark.parametrize(("dtype", "shape", "axis"), _DECODE_CASES)
def test_dequantize_matches_upcast(dtype: str, shape: tuple[int, ...], axis: int) -> None:
    x = _data(shape, seed=len(dtype) * 7 + len(shape))
    q = onnxq.cast(x, dtype, mode="compress", axis=axis, backend="reference")
    want = _bits(onnxq.upcast(q))
    model, feeds = _decoder_model(q)
    got, ref = _run_both(model, feeds)
    np.testing.assert_array_equal(_bits(got[0]), want)
    np.testing.assert_array_equal(_bits(ref[0]), want)


def test_dequantize_nan_tiles_and_extremes() -> None:
    # int elements with NaN (E8M0 255), a whole NaN tile, tiny and huge tiles.
    x = np.zeros((4, 40), np.float32)
    x[0, 3] = np.nan
    x[1, :32] = np.nan
    x[2] = np.float32(2.0**-140) * np.arange(40)
    x[3] = np.float32(3.0e38) * np.linspace(-1, 1, 40, dtype=np.float32)
    for dtype in ("mxint8", "mx9", "mxfp4", "mxfp8e4"):
        for policy in ("element", "block"):
            q = onnxq.cast(x, dtype, mode="compress", nan_policy=policy, backend="reference")
            if policy == "block" or dtype in ("mxint8", "mx9"):
                assert (q.scale == 255).any()
            model, feeds = _decoder_model(q)
            got, ref = _run_both(model, feeds)
            want = _bits(onnxq.upcast(q))
            np.testing.assert_array_equal(_bits(got[0]), want)
            np.testing.assert_array_equal(_bits(ref[0]), want)


@pytest.mark.parametrize("out", [TensorProto.FLOAT16, TensorProto.BFLOAT16])
def test_dequantize_output_types(out: int) -> None:
    import ml_dtypes

    x = _data((3, 33), seed=5, spread=20)
    q = onnxq.cast(x, "mxfp8e5", mode="compress", backend="reference")
    np_type = np.float16 if out == TensorProto.FLOAT16 else ml_dtypes.bfloat16
    want = _bits(onnxq.upcast(q, np_type))
    model, feeds = _decoder_model(q, out=out)
    if out == TensorProto.BFLOAT16:  # onnxruntime's numpy bridge has no bfloat16: widen it
        cast = helper.make_node("Cast", ["Y"], ["Z"], to=TensorProto.FLOAT)
        model.graph.node.append(cast)
        model.graph.output.append(helper.make_tensor_value_info("Z", 1, list(q.shape)))
        del model.graph.output[0]
    got, ref = _run_both(model, feeds)
    if out == TensorProto.BFLOAT16:
        np.testing.assert_array_equal(_bits(got[0]) >> 16, want)
        np.testing.assert_array_equal(_bits(ref[0]) >> 16, want)
    else:
        np.testing.assert_array_equal(_bits(got[0]), want)
        np.testing.assert_array_equal(_bits(ref[0]), want)


# -- CodebookLookup ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("dtype", "shape", "axis"),
    [
        ("cb41fi_e2m2fnuz_e8m0_t8s4", (3, 29), -1),
        ("cb41fi_e2m2fnuz_e8m0_t8", (5, 13), 0),
        ("cb51ie_e2m3_mx6_e8m0_t16s2", (2, 3, 21), 2),
    ],
)
def test_codebook_lookup_implicit(dtype: str, shape: tuple[int, ...], axis: int) -> None:
    x = _data(shape, seed=3)
    q = onnxq.cast(x, dtype, mode="compress", axis=axis, backend="reference")
    model, feeds = _decoder_model(q, op="CodebookLookup")
    got, ref = _run_both(model, feeds)
    want = _bits(onnxq.upcast(q))
    np.testing.assert_array_equal(_bits(got[0]), want)
    np.testing.assert_array_equal(_bits(ref[0]), want)


def test_codebook_lookup_generic_table() -> None:
    book = Codebook.parse("cb31_e2m3fnuz")
    book = book.add_mappings([(0.0, 1.0, 2.0, 4.0), (0.0, 0.5, 3.0, 7.5)])
    dt = DataType(nspec=book, sspec=scale_spec("e8m0_t16"))
    x = _data((3, 37), seed=9)
    q = onnxq.cast(x, dt, mode="compress", backend="reference")
    table = np.asarray(book.table(), dtype=np.float32)
    model, feeds = _decoder_model(q, op="CodebookLookup", table=table)
    got, ref = _run_both(model, feeds)
    want = _bits(onnxq.upcast(q))
    np.testing.assert_array_equal(_bits(got[0]), want)
    np.testing.assert_array_equal(_bits(ref[0]), want)


# -- QuantizeMX -> DequantizeMX ---------------------------------------------------------------
_QUANT_CASES = [
    ("mxfp4", (3, 37), -1, {}),
    ("mxfp4", (3, 64), 1, {"nan_policy": "block", "scale_mode": "ceil"}),
    ("mxfp6e2", (7, 33), 1, {}),
    ("mxfp6e3", (9,), 0, {"round_mode": "zero"}),
    ("mxfp8e4", (5, 40), 0, {}),
    ("mxfp8e5", (2, 3, 5), 2, {"round_mode": "away"}),
    ("mxint8", (2, 3, 33), 1, {}),
    ("mxint8", (3, 40), 1, {"int_range": "full", "round_mode": "away"}),
    ("mxint4", (4, 21), 0, {"nan_policy": "block"}),
    ("bfp16", (5, 17), 0, {}),
    ("mx9", (4, 35), -1, {}),
    ("mx6", (3, 19), 1, {}),
    ("mx4", (2, 21), -1, {}),
    ("int8_e8m0_t8_t8", (3, 11, 13), 0, {}),
    ("int5_e8m0_t16s2_t16s2", (19, 21), -1, {}),
    ("e4m3fn_e8m0", (6, 7), 1, {}),
]


def _roundtrip_model(dtype: str, shape: tuple[int, ...], axis: int, attrs: dict):
    probe = onnxq.cast(
        np.ones(shape, np.float32), dtype, mode="compress", axis=axis, backend="reference"
    )
    has_meta = probe.meta is not None
    # All six outputs named (empty for absent): onnx's function shape inference needs them.
    outs = ["Q", "S", "", "", "M" if has_meta else "", ""]
    quant = helper.make_node(
        "QuantizeMX", ["X"], outs, domain="onnxq", dtype=dtype, axis=axis, **attrs
    )
    ins = ["Q", "S", "", "", "M"] if has_meta else ["Q", "S"]
    dequant = helper.make_node(
        "DequantizeMX", ins, ["Y"], domain="onnxq", dtype=dtype, axis=axis, shape=list(shape)
    )
    outputs = [helper.make_tensor_value_info("Y", TensorProto.FLOAT, list(shape))]
    outputs += [_tensor_info("Q", probe.data), _tensor_info("S", probe.scale)]
    if has_meta:
        outputs.append(_tensor_info("M", probe.meta))
    x_info = helper.make_tensor_value_info("X", TensorProto.FLOAT, list(shape))
    return _model([quant, dequant], [x_info], outputs)


@pytest.mark.parametrize(("dtype", "shape", "axis", "attrs"), _QUANT_CASES)
def test_quantize_roundtrip(dtype: str, shape: tuple[int, ...], axis: int, attrs: dict) -> None:
    x = _data(shape, seed=len(dtype) + sum(shape), spread=40)
    q = onnxq.cast(x, dtype, mode="compress", axis=axis, backend="reference", **attrs)
    want = [_bits(onnxq.upcast(q)), q.data, q.scale] + ([q.meta] if q.meta is not None else [])
    model = _roundtrip_model(dtype, shape, axis, attrs)
    got, ref = _run_both(model, {"X": x})
    for g, r, w in zip(got, ref, want, strict=True):
        np.testing.assert_array_equal(_bits(g) if g.dtype == np.float32 else g, w)
        np.testing.assert_array_equal(_bits(r) if r.dtype == np.float32 else r, w)


def test_quantize_float16_input() -> None:
    x = _data((3, 40), seed=11).astype(np.float16)
    q = onnxq.cast(x, "mxfp4", mode="compress", backend="reference")
    node = helper.make_node(
        "QuantizeMX", ["X"], ["Q", "S", "", "", "", ""], domain="onnxq", dtype="mxfp4"
    )
    model = _model(
        [node],
        [helper.make_tensor_value_info("X", TensorProto.FLOAT16, [3, 40])],
        [_tensor_info("Q", q.data), _tensor_info("S", q.scale)],
    )
    got, ref = _run_both(model, {"X": x})
    for outs in (got, ref):
        np.testing.assert_array_equal(outs[0], q.data)
        np.testing.assert_array_equal(outs[1], q.scale)


# -- specialization and refusals --------------------------------------------------------------
def test_same_op_two_specializations_in_one_model() -> None:
    x = _data((4, 40), seed=2)
    qa = onnxq.cast(x, "mxfp4", mode="compress", backend="reference")
    qb = onnxq.cast(x, "mxint8", mode="compress", axis=0, backend="reference")
    nodes = [
        helper.make_node("DequantizeMX", ["qa", "sa"], ["ya"], domain="onnxq", dtype="mxfp4",
                         axis=-1, shape=[4, 40]),
        helper.make_node("DequantizeMX", ["qb", "sb"], ["yb"], domain="onnxq", dtype="mxint8",
                         axis=0, shape=[4, 40]),
    ]  # fmt: skip
    feeds = {"qa": qa.data, "sa": qa.scale, "qb": qb.data, "sb": qb.scale}
    infos = [_tensor_info(k, v) for k, v in feeds.items()]
    outs = [helper.make_tensor_value_info(n, 1, [4, 40]) for n in ("ya", "yb")]
    model = _model(nodes, infos, outs)
    assert len(model.functions) == 2
    assert {f.overload for f in model.functions} == {n.overload for n in model.graph.node}
    got, ref = _run_both(model, feeds)
    for outs_ in (got, ref):
        np.testing.assert_array_equal(_bits(outs_[0]), _bits(onnxq.upcast(qa)))
        np.testing.assert_array_equal(_bits(outs_[1]), _bits(onnxq.upcast(qb)))


def test_equal_nodes_share_one_function() -> None:
    nodes = [
        helper.make_node("DequantizeMX", [f"q{i}", f"s{i}"], [f"y{i}"], domain="onnxq",
                         dtype="mxfp4", shape=[2, 32])
        for i in range(2)
    ]  # fmt: skip
    infos = []
    for i in range(2):
        infos += [
            helper.make_tensor_value_info(f"q{i}", TensorProto.UINT8, [32]),
            helper.make_tensor_value_info(f"s{i}", TensorProto.UINT8, [2, 1]),
        ]
    outs = [helper.make_tensor_value_info(f"y{i}", 1, [2, 32]) for i in range(2)]
    model = _model(nodes, infos, outs)
    assert len(model.functions) == 1


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"dtype": "nvfp4"}, "float scales"),
        ({"dtype": "uint8_tensor"}, "float scales"),
        ({"dtype": "cb41fi_e2m2fnuz_e8m0_t8"}, "codebook"),
        ({"dtype": "e4m3fn"}, "unscaled"),
        ({"dtype": "e2m1fnuz_e8m0_t8n2m4"}, "N:M"),
        ({"dtype": "mxfp4", "round_mode": "stochastic"}, "stochastic"),
        ({"dtype": "mxfp4", "scale_mode": "midmax"}, "midmax"),
        ({"dtype": "bfloat16_e8m0_t32"}, "bfloat16_e8m0_t32"),
    ],
)
def test_quantize_refuses_what_it_cannot_match(kwargs: dict, fragment: str) -> None:
    dtype = kwargs.pop("dtype")
    with pytest.raises(NotImplementedError, match=fragment):
        fallback.quantize_mx_function(dtype, -1, (4, 32), **kwargs)


def test_dequantize_refusals() -> None:
    with pytest.raises(ValueError, match="CodebookLookup"):
        fallback.dequantize_mx_function("cb41fi_e2m2fnuz_e8m0_t8", -1, (4, 32))
    with pytest.raises(NotImplementedError, match="int32"):
        fallback.dequantize_mx_function("int32_float32", -1, (4, 32))
    with pytest.raises(ValueError, match="output_type"):
        fallback.dequantize_mx_function("mxfp4", -1, (4, 32), output_type=11)


def test_overload_ignored_by_reference_evaluator_without_inlining() -> None:
    # Documents why inline_for_reference exists: the evaluator keys functions by (domain, name).
    x = _data((2, 32), seed=4)
    qa = onnxq.cast(x, "mxfp4", mode="compress", backend="reference")
    qb = onnxq.cast(x, "mxfp8e4", mode="compress", backend="reference")
    nodes = [
        helper.make_node("DequantizeMX", ["qa", "sa"], ["ya"], domain="onnxq", dtype="mxfp4",
                         shape=[2, 32]),
        helper.make_node("DequantizeMX", ["qb", "sb"], ["yb"], domain="onnxq", dtype="mxfp8e4",
                         shape=[2, 32]),
    ]  # fmt: skip
    feeds = {"qa": qa.data, "sa": qa.scale, "qb": qb.data, "sb": qb.scale}
    model = _model(
        nodes,
        [_tensor_info(k, v) for k, v in feeds.items()],
        [helper.make_tensor_value_info(n, 1, [2, 32]) for n in ("ya", "yb")],
    )
    try:
        plain = ReferenceEvaluator(model).run(None, feeds)
    except Exception:  # any failure shows the same thing
        return
    assert not np.array_equal(_bits(plain[0]), _bits(onnxq.upcast(qa)))


@pytest.mark.parametrize(
    ("dtype", "outs"), [("mxfp4", ["Q", "S"]), ("mx6", ["Q", "S", "", "", "M"])]
)
def test_quantize_node_with_fewer_outputs(dtype: str, outs: list[str]) -> None:
    # onnxruntime wants a function with exactly the node's output count: it is in the overload.
    x = _data((3, 40), seed=12)
    q = onnxq.cast(x, dtype, mode="compress", backend="reference")
    node = helper.make_node("QuantizeMX", ["X"], outs, domain="onnxq", dtype=dtype)
    fields = {"Q": q.data, "S": q.scale, "M": q.meta}
    model = _model(
        [node],
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [3, 40])],
        [_tensor_info(o, fields[o]) for o in outs if o],
    )
    assert model.functions[0].output == ["Q", "Scale", "Zero", "TenScale", "Meta"][: len(outs)]
    got, ref = _run_both(model, {"X": x})
    for results in (got, ref):
        for value, name in zip(results, [o for o in outs if o], strict=True):
            np.testing.assert_array_equal(value, fields[name])
