"""MatMulMX with ``trans_b=1`` (docs/ops.md): Q holds W = B^T ``[N, K]``, Y = A x W^T (+ Bias).

The oracle is the same as for ``trans_b=0`` (tests/ops/mmx_common.py): W decoded by the numpy
reference (`onnxq.upcast`), transposed, then docs/ops.md's order in numpy float32 (-0.0, then
+ A[m, k] * W[n, k] for k in order, one rounding per operation, then + Bias[n]; NaN
canonical). That is DequantizeMX -> Transpose -> MatMul in the documented order. Covered: every
format family the fused decode covers (W tiled along K, its axis 1) and formats it does not
(decoded whole first), W tiled along N (decoded whole), M in {1, 2, 3, 5, 17}, odd K and N
(ragged tails: N not a multiple of 64 columns, K not of the tile), zeros, subnormals, NaN and
Inf in A and in W, every ONNXQ_SIMD level, W fed at run time (no prepacked copy), the function
fallback in a plain onnxruntime, shape inference, and the errors for bad inputs and attributes.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import onnxq
from onnxq import runtime
from onnxq.graph.functions import embed_functions
from tests.ops import mmx_common as mc

pytestmark = pytest.mark.needs_custom_ops
ort = pytest.importorskip("onnxruntime")

FUSED = ["mxfp4", "nvfp4", "uint4_block32", "mxfp8e4", "mxint8", "bfp16", "mx6", "mx9"]
WHOLE = ["mxfp6e2", "e2m1fnuz_e8m0_t32n2m4", "cb41fi_e2m2fnuz_e8m0_t32"]  # decoded whole
# (M, K, N): M in {1, 2, 3, 5, 17}; N = 64 * blocks + a ragged tail, K off the tile size.
SHAPES = [(1, 1, 1), (1, 70, 130), (2, 33, 17), (3, 65, 64), (5, 300, 70), (17, 96, 192)]


def _w(n: int, k: int, seed: int) -> np.ndarray:
    """W [N, K] with zero rows of B (columns of W), subnormal rows of B and a wide range."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((n, k)).astype(np.float32)
    w[:, : min(k, 3)] *= np.float32(1e-39)  # subnormal B rows (k < 3)
    w[: min(n, 2)] = 0.0  # zero B columns
    return w


def _packed_t(w: np.ndarray, dt: str, axis: int = 1) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """(W's packed fields, B = decode(W)^T by the numpy reference)."""
    fields, wdec = mc.packed(w, dt, axis=axis)
    return fields, np.ascontiguousarray(wdec.T)


def _model(dt: str, fields: dict, w_shape: tuple[int, int], a_shape, **kw) -> onnx.ModelProto:
    return mc.model(dt, fields, w_shape, a_shape, axis=kw.pop("axis", 1), trans_b=1, **kw)


def _run(model: onnx.ModelProto, a: np.ndarray, feeds: dict | None = None) -> np.ndarray:
    return runtime.session(model).run(None, {"A": a, **(feeds or {})})[0]


@pytest.mark.parametrize("dt", FUSED + WHOLE)
@pytest.mark.parametrize(("m", "k", "n"), SHAPES)
def test_bits_match_the_documented_order(dt: str, m: int, k: int, n: int) -> None:
    fields, b = _packed_t(_w(n, k, m * 7 + k), dt)
    rng = np.random.default_rng(n)
    a = mc.special_a(rng.standard_normal((m, k)).astype(np.float32))
    bias = rng.standard_normal(n).astype(np.float32) if m % 2 else None
    y = _run(_model(dt, fields, (n, k), (m, k), bias=bias), a)
    assert y.shape == (m, n) and y.dtype == np.float32
    assert mc.bits(y) == mc.bits(mc.oracle(a, b, bias))


@pytest.mark.parametrize("dt", ["mxfp4", "uint4_block32", "mxint8", "mx9", "nvfp4"])
@pytest.mark.parametrize("simd", ["none", "base", "avx2", "avx512"])
def test_every_simd_level_gives_the_same_bits(
    dt: str, simd: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    n, k = 130, 160
    fields, b = _packed_t(_w(n, k, 5), dt)
    a = np.random.default_rng(2).standard_normal((2, 3, k)).astype(np.float32)
    bias = np.linspace(-1, 1, n, dtype=np.float32)
    monkeypatch.setenv("ONNXQ_SIMD", simd)
    for m_rows in ((2, 3, k), (1, k), (4, k)):  # the register path (M <= 4) and the panels
        x = a.reshape(-1, k)[: int(np.prod(m_rows[:-1]))].reshape(m_rows)
        y = _run(_model(dt, fields, (n, k), m_rows, bias=bias), x)
        assert y.shape == (*m_rows[:-1], n)
        assert mc.bits(y) == mc.bits(mc.oracle(x, b, bias)), m_rows


@pytest.mark.parametrize("dt", ["mxfp4", "nvfp4", "uint4_block32", "mxfp8e4", "mx6"])
def test_w_fed_at_run_time_and_tiles_along_n(dt: str) -> None:
    n, k = 192, 64
    w = _w(n, k, 9)
    for m in (1, 3, 5):
        a = np.random.default_rng(m).standard_normal((m, k)).astype(np.float32)
        fields, b = _packed_t(w, dt)  # no prepacked copy: W's own layout, per column of B
        fed = _run(_model(dt, fields, (n, k), (m, k), constant=False), a, fields)
        assert mc.bits(fed) == mc.bits(mc.oracle(a, b))
        fields_n, b_n = _packed_t(w, dt, axis=0)  # W tiled along N: decoded whole, same order
        y = _run(_model(dt, fields_n, (n, k), (m, k), axis=0), a)
        assert mc.bits(y) == mc.bits(mc.oracle(a, b_n))


def test_nan_and_inf_weights() -> None:
    n, k = 64, 64
    w = _w(n, k, 1)
    w[7, 5], w[9, 40], w[10, 33] = np.nan, np.inf, -np.inf
    for dt in ("mxfp8e4", "mxfp4", "uint4_block32"):
        fields, b = _packed_t(w, dt)
        a = np.random.default_rng(3).standard_normal((3, k)).astype(np.float32)
        y = _run(_model(dt, fields, (n, k), (3, k)), a)
        assert mc.bits(y) == mc.bits(mc.oracle(a, b)), dt


def test_a_large_lm_head_like_product() -> None:
    """Many 64-column blocks and one row of A (the decode step's LM head, scaled down)."""
    n, k = 64 * 40 + 5, 576
    fields, b = _packed_t(_w(n, k, 4), "mxfp4")
    a = np.random.default_rng(6).standard_normal((1, 1, k)).astype(np.float32)
    y = _run(_model("mxfp4", fields, (n, k), (1, 1, k)), a)
    assert mc.bits(y) == mc.bits(mc.oracle(a, b))


@pytest.mark.parametrize("dt", ["mxfp4", "uint4_block32", "mx6"])
def test_fallback_in_plain_onnxruntime(dt: str) -> None:
    """The embedded function (decode W, Gemm transB=1) runs without the library."""
    n, k = 70, 96
    fields, b = _packed_t(_w(n, k, 3), dt)
    a = np.random.default_rng(5).standard_normal((2, 3, k)).astype(np.float32)
    bias = np.linspace(-1, 1, n, dtype=np.float32)
    model = _model(dt, fields, (n, k), (2, 3, k), bias=bias)
    for opset in model.opset_import:
        if opset.domain == "":
            opset.version = 21  # the functions' opset (bitwise ops)
    model = embed_functions(model)
    (fn,) = [f for f in model.functions if f.name == "MatMulMX"]
    assert fn.overload.endswith("_tb")
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    plain = sess.run(None, {"A": a})[0]
    assert plain.shape == (2, 3, n)
    np.testing.assert_allclose(plain, mc.oracle(a, b, bias), rtol=1e-5, atol=1e-5)


def test_shape_inference_reads_trans_b() -> None:
    fields, _ = _packed_t(_w(48, 64, 2), "mxfp4")
    model = onnxq.graph.infer_shapes(_model("mxfp4", fields, (48, 64), ("M", 64)))
    (y,) = [o for o in model.graph.output if o.name == "Y"] or model.graph.value_info
    dims = y.type.tensor_type.shape.dim
    assert dims[0].dim_param == "M" and dims[1].dim_value == 48
    types = onnxq.graph.schemas.output_types(
        "MatMulMX", {"dtype": "mxfp4", "shape": [48, 64], "axis": 1, "trans_b": 1}, (3, 64)
    )
    assert types == [(onnx.TensorProto.FLOAT, (3, 48))]
    with pytest.raises(ValueError, match=r"\[MatMulMX\].*K = 64"):
        onnxq.graph.schemas.output_types(
            "MatMulMX", {"dtype": "mxfp4", "shape": [48, 64], "axis": 1, "trans_b": 1}, (3, 48)
        )
    with pytest.raises(ValueError, match=r"\[MatMulMX\].*trans_b"):
        onnxq.graph.schemas.output_types(
            "MatMulMX", {"dtype": "mxfp4", "shape": [48, 64], "axis": 1, "trans_b": 2}, (3, 64)
        )


def _error(model: onnx.ModelProto, a: np.ndarray, feeds: dict | None = None) -> str:
    with pytest.raises(Exception) as err:  # onnxruntime raises its own error types
        runtime.session(model).run(None, {"A": a, **(feeds or {})})
    return str(err.value)


def test_bad_inputs_fail_with_a_matmulmx_error() -> None:
    n, k = 32, 64
    fields, _ = _packed_t(_w(n, k, 2), "mxfp4")
    good = _model("mxfp4", fields, (n, k), ("M", "K"))
    msg = _error(good, np.zeros((2, n), np.float32))  # A's last dim is N, not K
    assert "[MatMulMX]" in msg and "input A" in msg and "K = 64" in msg
    grid = dict(fields, Scale=fields["Scale"].reshape(-1).reshape(2, n).copy())  # B's grid
    msg = _error(_model("mxfp4", grid, (n, k), (2, k)), np.zeros((2, k), np.float32))
    assert "[MatMulMX]" in msg and "input Scale" in msg
    short = dict(fields, Q=fields["Q"][:-1].copy())
    msg = _error(_model("mxfp4", short, (n, k), (2, k)), np.zeros((2, k), np.float32))
    assert "[MatMulMX]" in msg and "input Q" in msg
    bias = np.zeros(k, np.float32)  # K, not N
    msg = _error(_model("mxfp4", fields, (n, k), (2, k), bias=bias), np.zeros((2, k), np.float32))
    assert "[MatMulMX]" in msg and "Bias" in msg


def test_bad_attributes_are_refused() -> None:
    fields, _ = _packed_t(_w(32, 64, 2), "mxfp4")
    a = np.zeros((1, 64), np.float32)
    for trans_b in (2, -1):
        model = mc.model("mxfp4", fields, (32, 64), (1, 64), axis=1, trans_b=trans_b)
        msg = _error(model, a)
        assert "[MatMulMX]" in msg and "trans_b" in msg
    msg = _error(_model("mxfp4", fields, (32, 64), (1, 64), axis=2), a)
    assert "[MatMulMX]" in msg and "axis" in msg
    three = mc.model("mxfp4", fields, (1, 32, 64), (1, 64), axis=2, trans_b=1)
    msg = _error(three, a)
    assert "[MatMulMX]" in msg and "[N, K]" in msg


@pytest.mark.parametrize("shape", [(2**31, 2**31), (1, 2**40), (2**20, 2**21)])
def test_hostile_shapes_fail_cleanly(shape: tuple[int, int]) -> None:
    """A shape far beyond the packed inputs: a clean [MatMulMX] error, no crash."""
    fields, _ = _packed_t(_w(32, 64, 2), "mxfp4")
    msg = _error(_model("mxfp4", fields, shape, ("M", "K")), np.zeros((1, 64), np.float32))
    assert "[MatMulMX]" in msg


def test_empty_a_gives_an_empty_y() -> None:
    fields, _ = _packed_t(_w(32, 64, 2), "mxfp4")
    y = _run(_model("mxfp4", fields, (32, 64), (0, 64)), np.zeros((0, 64), np.float32))
    assert y.shape == (0, 32)
