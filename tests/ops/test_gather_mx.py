"""GatherMX: Y = Gather(decode(table), Indices, axis=0), decoding only the gathered rows.

The oracle is independent of the op: the numpy reference decode of the whole table
(``onnxq.upcast`` of the QTensor that ``onnxq.cast(..., mode="compress", backend="reference")``
made) followed by ``np.take``. The native kernel and the standard-ONNX fallback (the function
body, in a plain onnxruntime) both give its bits, over formats (every scaled family, unscaled,
codebooks, 2-D tiles), table shapes whose last tile is ragged along either axis, scalar, 1-D and
2-D indices (negative, repeated, int32 and int64) and every output type. Bad inputs are
``[GatherMX]`` errors, never a crash.
"""

from __future__ import annotations

import concurrent.futures
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxq
from onnxq import runtime
from onnxq.graph import schemas
from onnxq.graph.functions import build_function, embed_functions
from onnxq.graph.schemas import infer_shapes, input_names, register_schemas

pytestmark = pytest.mark.needs_custom_ops
ort = pytest.importorskip("onnxruntime")

SLOTS = input_names("GatherMX")  # Indices, Q, Scale, Zero, TenScale, Meta, Mask, Table
# (dtype, table shape, tile axis): every family, ragged last tiles along the rows (70 = 2 * 32
# + 6) and along dim 0 (45 rows in tiles of 32 along axis 0: a short last row group).
CASES = [
    ("mxfp4", (37, 70), -1),
    ("mxfp4", (45, 40), 0),
    ("mxfp6", (19, 33), -1),
    ("mxfp8e4", (23, 64), 1),
    ("mxint8", (40,), 0),
    ("bfp16", (9, 5, 40), -1),
    ("bfp8", (9, 5, 40), 1),
    ("mx9", (21, 50), -1),
    ("mx6", (33, 5, 40), -1),
    ("mx4", (40, 12), 0),
    ("nvfp4", (17, 33), -1),
    ("uint4_block32", (20, 45), 1),
    ("int8_channel", (11, 24), 0),
    ("int8_tensor", (13, 7), -1),
    ("uint8_tensor", (13, 7), 0),
    ("fp8e4_channel", (12, 10), -1),
    ("e4m3", (7, 9), -1),
    ("float16", (6, 5), 0),
    ("e2m1fnuz_e8m0_t4_t8", (10, 20), -1),  # 2-D tiles whose rows run along dim 0
    ("e2m1fnuz_e8m0_t4_t8", (6, 10, 20), -1),  # 2-D tiles inside each row
    ("e2m1fnuz_e8m0_t4_t8", (10, 20), 0),
    ("cb41fi_e2m2fnuz_e8m0_t32", (12, 64), -1),
    ("cb41fi_e2m2fnuz_e8m0_t32", (40, 8), 0),
]
OUT_NP = {TensorProto.FLOAT: np.float32, TensorProto.FLOAT16: np.float16}


def _pack(dt: str, shape: tuple[int, ...], axis: int, seed: int = 0) -> tuple[Any, np.ndarray]:
    """(QTensor made by the numpy reference, its reference decode in float32)."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * rng.choice([1e-3, 1.0, 50.0], size=shape)).astype(np.float32)
    q = onnxq.cast(x, dt, axis=axis, mode="compress", backend="reference")
    return q, onnxq.upcast(q, np.float32)


def _fields(q: Any) -> dict[str, np.ndarray]:
    got = {"Q": q.data, "Scale": q.scale, "Zero": q.zero, "TenScale": q.tenscale, "Meta": q.meta}
    return {k: np.ascontiguousarray(v) for k, v in got.items() if v is not None}


def _model(
    dt: str,
    shape: tuple[int, ...],
    axis: int,
    fields: dict[str, np.ndarray],
    index_type: int = TensorProto.INT64,
    out_type: int = TensorProto.FLOAT,
    constant: bool = True,
    index_shape: list[Any] | None = None,
) -> onnx.ModelProto:
    """idx -> GatherMX(table fields) -> Y (a bfloat16 Y read through an exact Cast to float)."""
    names = ["idx"] + [k if k in fields else "" for k in SLOTS[1:]]
    while not names[-1]:
        names.pop()
    tensors = [numpy_helper.from_array(v, k) for k, v in fields.items()]
    node = helper.make_node(
        "GatherMX",
        names,
        ["Y"],
        domain="onnxq",
        dtype=dt,
        axis=axis,
        shape=list(shape),
        output_type=out_type,
    )
    nodes, y_name, y_type = [node], "Y", out_type
    if out_type == TensorProto.BFLOAT16:
        nodes.append(helper.make_node("Cast", ["Y"], ["Yf"], to=TensorProto.FLOAT))
        y_name, y_type = "Yf", TensorProto.FLOAT
    inputs = [helper.make_tensor_value_info("idx", index_type, index_shape)]
    if not constant:
        inputs += [helper.make_tensor_value_info(t.name, t.data_type, t.dims) for t in tensors]
    graph = helper.make_graph(
        nodes,
        "gather_mx",
        inputs,
        [helper.make_tensor_value_info(y_name, y_type, None)],
        initializer=tensors if constant else [],
    )
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid("onnxq", 1)]
    return helper.make_model(graph, opset_imports=opsets)


def _bits(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a)
    return a.view(np.uint32 if a.dtype.itemsize == 4 else np.uint16)


def _want(q: Any, idx: np.ndarray, out_type: int) -> np.ndarray:
    """The reference decode in the output type (bfloat16 widened exactly to float32)."""
    if out_type == TensorProto.BFLOAT16:
        import ml_dtypes

        return np.take(onnxq.upcast(q, ml_dtypes.bfloat16), idx, axis=0).astype(np.float32)
    return np.take(onnxq.upcast(q, OUT_NP[out_type]), idx, axis=0)


def _indices(rows: int, seed: int) -> list[np.ndarray]:
    """Scalar, 1-D and 2-D [batch, seq] indices: negative, repeated, first and last rows."""
    rng = np.random.default_rng(seed)
    ends = np.array([0, rows - 1, -1, -rows, 0, 0])
    return [
        np.array(rows - 1),
        np.array(-rows),
        ends,
        rng.integers(-rows, rows, size=(3, 7)),
    ]


@pytest.mark.parametrize(("dt", "shape", "axis"), CASES)
def test_native_matches_reference(dt: str, shape: tuple[int, ...], axis: int) -> None:
    q, ref = _pack(dt, shape, axis)
    fields = _fields(q)
    for index_type, np_type in ((TensorProto.INT64, np.int64), (TensorProto.INT32, np.int32)):
        sess = runtime.session(_model(dt, shape, axis, fields, index_type), decode_weights="run")
        for idx in _indices(shape[0], seed=len(dt)):
            y = sess.run(None, {"idx": idx.astype(np_type)})[0]
            want = np.take(ref, idx, axis=0)
            assert y.shape == want.shape == idx.shape + shape[1:]
            assert np.array_equal(_bits(y), _bits(want)), (dt, shape, axis, idx)


@pytest.mark.parametrize("out_type", [TensorProto.FLOAT16, TensorProto.BFLOAT16])
@pytest.mark.parametrize(("dt", "shape", "axis"), [CASES[0], CASES[1], CASES[10], CASES[11]])
def test_half_outputs(dt: str, shape: tuple[int, ...], axis: int, out_type: int) -> None:
    q, _ = _pack(dt, shape, axis, seed=5)
    idx = np.random.default_rng(1).integers(-shape[0], shape[0], size=(4, 9))
    y = runtime.session(
        _model(dt, shape, axis, _fields(q), out_type=out_type), decode_weights="run"
    ).run(None, {"idx": idx})[0]
    want = _want(q, idx, out_type)
    assert y.dtype == want.dtype and np.array_equal(_bits(y), _bits(want))


def test_generic_codebook_takes_its_table() -> None:
    implicit = "cb41fi_e2m2fnuz_e8m0_t32"
    q, ref = _pack(implicit, (12, 64), -1, seed=2)
    fields = _fields(q)
    fields["Table"] = np.array(onnxq.datatype(implicit).nspec.table(), np.float32)
    generic = "cb41_e2m2fnuz_e8m0_t32"  # no mappings of its own: Table gives the implicit ones
    idx = np.array([[3, -1, 0], [11, 3, 5]])
    y = runtime.session(_model(generic, (12, 64), -1, fields), decode_weights="run").run(
        None, {"idx": idx}
    )[0]
    assert np.array_equal(_bits(y), _bits(np.take(ref, idx, axis=0)))


def test_fed_tables_and_empty_indices() -> None:
    """Packed inputs fed at run time give the same bits; no index gives an empty Y."""
    dt, shape, axis = "mx6", (33, 5, 40), -1
    q, ref = _pack(dt, shape, axis, seed=4)
    fields = _fields(q)
    sess = runtime.session(_model(dt, shape, axis, fields, constant=False), decode_weights="run")
    idx = np.array([[32, -33], [7, 7]])
    y = sess.run(None, {"idx": idx, **fields})[0]
    assert np.array_equal(_bits(y), _bits(np.take(ref, idx, axis=0)))
    empty = sess.run(None, {"idx": np.zeros((2, 0), np.int64), **fields})[0]
    assert empty.shape == (2, 0, 5, 40)


def test_large_gather_over_threads() -> None:
    """Many rows (the kernel splits them over the session's threads) from 8 threads at once."""
    dt, shape, axis = "mxfp4", (300, 96), -1
    q, ref = _pack(dt, shape, axis, seed=6)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 4
    sess = runtime.session(
        _model(dt, shape, axis, _fields(q)), sess_options=options, decode_weights="run"
    )
    batches = [np.random.default_rng(s).integers(-300, 300, size=(16, 64)) for s in range(16)]
    serial = [sess.run(None, {"idx": b})[0] for b in batches]
    for b, y in zip(batches, serial, strict=True):
        assert np.array_equal(_bits(y), _bits(np.take(ref, b, axis=0)))
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        for _ in range(2):
            parallel = list(pool.map(lambda b: sess.run(None, {"idx": b})[0], batches))
            for a, c in zip(serial, parallel, strict=True):
                assert np.array_equal(_bits(a), _bits(c))


@pytest.mark.parametrize(
    ("dt", "shape", "axis"), [CASES[0], CASES[1], CASES[6], CASES[8], CASES[11], CASES[18]]
)
def test_fallback_matches_reference(dt: str, shape: tuple[int, ...], axis: int) -> None:
    """The function body in a plain onnxruntime (no library) gives the reference's bits."""
    q, ref = _pack(dt, shape, axis, seed=7)
    model = embed_functions(_model(dt, shape, axis, _fields(q), TensorProto.INT32))
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for idx in _indices(shape[0], seed=3):
        y = sess.run(None, {"idx": idx.astype(np.int32)})[0]
        assert np.array_equal(_bits(y), _bits(np.take(ref, idx, axis=0)))


def test_fallback_refuses_sparse_tables() -> None:
    with pytest.raises(ValueError, match="N:M sparse"):
        build_function("GatherMX", {"dtype": "e2m1fnuz_e8m0_t32n2m4"}, [8, 64])


def test_schema_infers_y() -> None:
    """Y: Indices' dims (symbolic ones kept) then the table's row dims, in the output type."""
    q, _ = _pack("mxfp4", (37, 70), -1)
    model = _model(
        "mxfp4",
        (37, 70),
        -1,
        _fields(q),
        out_type=TensorProto.FLOAT16,
        index_shape=["batch", 5],
    )
    # Y feeds an Identity whose output is declared: Y's own type comes from inference.
    model.graph.node.append(helper.make_node("Identity", ["Y"], ["Z"]))
    del model.graph.output[:]
    model.graph.output.append(
        helper.make_tensor_value_info("Z", TensorProto.FLOAT16, ["batch", 5, 70])
    )
    register_schemas()
    onnx.checker.check_model(model, full_check=True)
    results = [infer_shapes(model)]
    if schemas._PY_INFERENCE:
        results.append(onnx.shape_inference.infer_shapes(model, strict_mode=True))
    for inferred in results:
        info = {v.name: v.type.tensor_type for v in inferred.graph.value_info}
        info.update({v.name: v.type.tensor_type for v in inferred.graph.output})
        assert info["Y"].elem_type == TensorProto.FLOAT16
        if schemas._PY_INFERENCE:
            dims = info["Y"].shape.dim
            assert [d.dim_param or d.dim_value for d in dims] == ["batch", 5, 70]
    assert schemas.output_types("GatherMX", {"dtype": "mxfp4", "shape": [37, 70]}, (2, 3)) == [
        (TensorProto.FLOAT, (2, 3, 70))
    ]


# -- errors: one line starting with [GatherMX], never a crash ---------------------------------


def _error(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> str:
    try:
        runtime.session(model, decode_weights="run").run(None, feeds)
    except Exception as err:  # onnxruntime raises its own exception types
        return str(err)
    raise AssertionError("no error")


@pytest.mark.parametrize(
    ("idx", "needle"),
    [
        (np.array([0, 37]), "index 37 (at flat position 1"),
        (np.array([[-38]]), "index -38"),
        (np.array([2**40]), f"index {2**40}"),
        (np.array([np.iinfo(np.int64).min]), str(np.iinfo(np.int64).min)),
        (np.array([np.iinfo(np.int32).max], np.int32), str(np.iinfo(np.int32).max)),
    ],
)
def test_out_of_range_indices(idx: np.ndarray, needle: str) -> None:
    q, _ = _pack("mxfp4", (37, 70), -1)
    index_type = TensorProto.INT32 if idx.dtype == np.int32 else TensorProto.INT64
    msg = _error(_model("mxfp4", (37, 70), -1, _fields(q), index_type), {"idx": idx})
    assert "[GatherMX]" in msg and needle in msg and "table of 37 rows" in msg, msg


@pytest.mark.parametrize("index_type", [TensorProto.FLOAT, TensorProto.UINT8, TensorProto.INT16])
def test_wrong_index_type(index_type: int) -> None:
    """onnxruntime refuses the node's types (the registrations take int32 and int64 only)."""
    q, _ = _pack("mxfp4", (37, 70), -1)
    model = _model("mxfp4", (37, 70), -1, _fields(q), index_type)
    model.graph.node[0].name = "embed"
    np_type = onnx.helper.tensor_dtype_to_np_dtype(index_type)
    msg = _error(model, {"idx": np.zeros(3, np_type)})
    assert "Type Error" in msg and "(embed)" in msg, msg


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"Q": np.zeros(5, np.uint8)}, "input Q is uint8 of shape (5,)"),
        ({"Scale": np.zeros((37, 2), np.uint8)}, "input Scale is uint8 of shape (37, 2)"),
        ({"Scale": np.zeros((37, 3), np.uint16)}, "input Scale is uint16"),
        ({"Scale": None}, "input Scale is required"),
        ({"Zero": np.zeros((37, 3), np.uint8)}, "input Zero (37, 3) is given"),
        ({"Mask": np.zeros(324, np.uint8)}, "input Mask (324,) is given"),
        ({"Table": np.zeros((2, 16), np.float32)}, "is not a codebook"),
    ],
)
def test_inconsistent_table_inputs(change: dict[str, Any], needle: str) -> None:
    q, _ = _pack("mxfp4", (37, 70), -1)
    fields = _fields(q)
    for key, value in change.items():
        if value is None:
            fields.pop(key)
        else:
            fields[key] = value
    msg = _error(_model("mxfp4", (37, 70), -1, fields), {"idx": np.array([1, 2])})
    assert msg.count("[GatherMX]") == 1 and needle in msg, msg


@pytest.mark.parametrize(
    ("dt", "attrs", "needle"),
    [
        ("e2m1fnuz_e8m0_t32n2m4", {}, "N:M sparsity"),
        ("mxfp4", {"shape": [2**30, 2**30]}, "at most 2^40 elements"),
        ("mxfp4", {"axis": 5}, "axis 5 is out of range"),
        ("mxfp4", {"output_type": 7}, "output_type"),
        ("cb41_e2m2fnuz_e8m0_t32", {}, "generic codebook"),
        ("nosuchtype", {}, "nosuchtype"),
    ],
)
def test_bad_attributes(dt: str, attrs: dict[str, Any], needle: str) -> None:
    q, _ = _pack("mxfp4", (37, 70), -1)
    model = _model("mxfp4", (37, 70), -1, _fields(q))
    node = model.graph.node[0]
    values = {"dtype": dt, "axis": -1, "shape": [37, 70], "output_type": 1, **attrs}
    del node.attribute[:]
    node.attribute.extend(helper.make_attribute(k, v) for k, v in values.items())
    options = ort.SessionOptions()
    options.register_custom_ops_library(runtime.library_path())
    with pytest.raises(Exception, match=r"\[GatherMX\]") as err:
        sess = ort.InferenceSession(model.SerializeToString(), options)
        sess.run(None, {"idx": np.array([1])})
    assert needle in str(err.value)


def test_huge_y_is_refused() -> None:
    """Y's element count is checked before the output is allocated."""
    shape = (2, 2**20)  # an all-zero packed table: 1 MiB of codes
    fields = {
        "Q": np.zeros(2**20, np.uint8),
        "Scale": np.zeros((2, 2**15), np.uint8),
    }
    model = _model("mxfp4", shape, -1, fields)
    idx = np.ones(2**21, np.int64)  # 2^21 rows of 2^20 = 2^41 elements
    msg = _error(model, {"idx": idx})
    assert "[GatherMX] Y of shape (2097152, 1048576) would hold more than 2^40" in msg, msg
