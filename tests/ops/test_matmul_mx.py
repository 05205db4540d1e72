"""MatMulMX (docs/ops.md): Y bit-exact with the documented float32 order on the decoded weight.

The oracle (tests/ops/mmx_common.py) decodes B with the numpy reference (`onnxq.upcast`) and
sums in numpy float32 in the documented order: -0.0, then + A[m, k] * B[k, n] for k in order,
one rounding per operation, then + Bias[n]; NaN canonical. Every format family the fused decode
covers, formats it does not (decoded whole first), odd and ragged shapes, zeros, subnormals,
NaN and Inf in A and in the weights, every ONNXQ_SIMD level, weights as graph inputs, one
session shared by 8 threads, and the errors for bad inputs. The large-M path (onnxruntime's
MatMul from ONNXQ_MMX_LARGE_M rows on, tests/ops/test_matmul_mx_large.py) is off here, so that
the documented order is checked at every M.
"""

from __future__ import annotations

import concurrent.futures

import numpy as np
import pytest
from onnx import TensorProto

from onnxq import runtime
from tests.ops import mmx_common as mc

pytestmark = pytest.mark.needs_custom_ops
pytest.importorskip("onnxruntime")

FUSED = ["mxfp4", "nvfp4", "uint4_block32", "mxfp8e4", "mxint8", "bfp16", "mx6", "mx9"]
WHOLE = ["mxfp6e2", "e2m1fnuz_e8m0_t32n2m4", "cb41fi_e2m2fnuz_e8m0_t32"]  # decoded whole


@pytest.fixture(autouse=True)
def _documented_order_at_every_m(monkeypatch: pytest.MonkeyPatch) -> None:
    """The large-M path off (read when a session creates the kernel)."""
    monkeypatch.setenv("ONNXQ_MMX_LARGE_M", "0")


SHAPES = [(1, 1, 1), (1, 33, 17), (3, 65, 33), (17, 300, 70), (2, 64, 128), (5, 96, 192)]


def _weights(k: int, n: int, seed: int) -> np.ndarray:
    """A weight with zeros, subnormals and a wide range."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((k, n)).astype(np.float32)
    w[: min(k, 3)] *= np.float32(1e-39)  # subnormal rows
    w[:, : min(n, 2)] = 0.0
    return w


def _run(model, a: np.ndarray, feeds: dict | None = None) -> np.ndarray:
    sess = runtime.session(model, decode_weights="run")
    return sess.run(None, {"A": a, **(feeds or {})})[0]


@pytest.mark.parametrize("dt", FUSED + WHOLE)
@pytest.mark.parametrize(("m", "k", "n"), SHAPES)
def test_bits_match_the_documented_order(dt: str, m: int, k: int, n: int) -> None:
    fields, b = mc.packed(_weights(k, n, m * 7 + k), dt)
    rng = np.random.default_rng(n)
    a = mc.special_a(rng.standard_normal((m, k)).astype(np.float32))
    bias = rng.standard_normal(n).astype(np.float32) if m % 2 else None
    y = _run(mc.model(dt, fields, (k, n), (m, k), bias), a)
    assert y.shape == (m, n) and y.dtype == np.float32
    assert mc.bits(y) == mc.bits(mc.oracle(a, b, bias))


@pytest.mark.parametrize("dt", ["mxfp4", "uint4_block32", "mxint8", "mx9"])
@pytest.mark.parametrize("simd", ["none", "base", "avx2", "avx512"])
def test_every_simd_level_gives_the_same_bits(
    dt: str, simd: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    k, n = 160, 130
    fields, b = mc.packed(_weights(k, n, 5), dt)
    a = np.random.default_rng(2).standard_normal((2, 3, k)).astype(np.float32)
    bias = np.linspace(-1, 1, n, dtype=np.float32)
    monkeypatch.setenv("ONNXQ_SIMD", simd)
    y = _run(mc.model(dt, fields, (k, n), (2, 3, k), bias), a)
    assert y.shape == (2, 3, n)
    assert mc.bits(y) == mc.bits(mc.oracle(a, b, bias))


@pytest.mark.parametrize("dt", ["mxfp4", "nvfp4", "uint4_block32", "mxfp8e4"])
def test_weights_fed_at_run_time_and_tiles_along_n(dt: str) -> None:
    k, n = 64, 192
    w = _weights(k, n, 9)
    a = np.random.default_rng(4).standard_normal((5, k)).astype(np.float32)
    fields, b = mc.packed(w, dt)
    fed = _run(mc.model(dt, fields, (k, n), (5, k), constant=False), a, fields)
    assert mc.bits(fed) == mc.bits(mc.oracle(a, b))
    fields_n, b_n = mc.packed(w, dt, axis=1)  # tiles along N: B decoded whole, same order
    y = _run(mc.model(dt, fields_n, (k, n), (5, k), axis=1), a)
    assert mc.bits(y) == mc.bits(mc.oracle(a, b_n))


def test_nan_and_inf_weights() -> None:
    k, n = 64, 64
    w = _weights(k, n, 1)
    w[5, 7], w[40, 9], w[33, 10] = np.nan, np.inf, -np.inf
    for dt in ("mxfp8e4", "mxfp4", "uint4_block32"):
        fields, b = mc.packed(w, dt)
        a = np.random.default_rng(3).standard_normal((3, k)).astype(np.float32)
        y = _run(mc.model(dt, fields, (k, n), (3, k)), a)
        assert mc.bits(y) == mc.bits(mc.oracle(a, b)), dt


def test_one_session_shared_by_8_threads() -> None:
    k, n = 576, 192
    fields, b = mc.packed(_weights(k, n, 8), "mxfp4")
    sess = runtime.session(mc.model("mxfp4", fields, (k, n), ("M", k)), decode_weights="run")
    feeds = [
        np.random.default_rng(i).standard_normal((i % 4 + 1, k)).astype(np.float32)
        for i in range(8)
    ]
    want = [mc.bits(mc.oracle(a, b)) for a in feeds]

    def runs(i: int) -> bool:
        return all(mc.bits(sess.run(None, {"A": feeds[i]})[0]) == want[i] for _ in range(10))

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        assert all(pool.map(runs, range(8)))


def _error(model, a: np.ndarray, feeds: dict | None = None) -> str:
    with pytest.raises(Exception) as err:  # onnxruntime raises its own error types
        _run(model, a, feeds)
    return str(err.value)


def test_bad_inputs_fail_with_a_matmulmx_error() -> None:
    k, n = 64, 32
    fields, _ = mc.packed(_weights(k, n, 2), "mxfp4")
    good = mc.model("mxfp4", fields, (k, n), ("M", "K"))
    msg = _error(good, np.zeros((2, k + 1), np.float32))  # A's last dim is not K
    assert "[MatMulMX]" in msg and "input A" in msg
    bad = dict(fields, Scale=fields["Scale"][:1].copy())  # the wrong tile grid
    msg = _error(mc.model("mxfp4", bad, (k, n), (2, k)), np.zeros((2, k), np.float32))
    assert "[MatMulMX]" in msg and "input Scale" in msg
    short = dict(fields, Q=fields["Q"][:-1].copy())
    msg = _error(mc.model("mxfp4", short, (k, n), (2, k)), np.zeros((2, k), np.float32))
    assert "[MatMulMX]" in msg and "input Q" in msg
    bias = np.zeros(n + 1, np.float32)
    msg = _error(mc.model("mxfp4", fields, (k, n), (2, k), bias), np.zeros((2, k), np.float32))
    assert "[MatMulMX]" in msg and "Bias" in msg


def test_bad_attributes_are_refused() -> None:
    fields, _ = mc.packed(_weights(64, 32, 2), "mxfp4")
    a = np.zeros((1, 64), np.float32)
    for kwargs, word in (
        ({"output_type": TensorProto.FLOAT16}, "output_type"),
        ({"axis": 2}, "axis"),
    ):
        msg = _error(mc.model("mxfp4", fields, (64, 32), (1, 64), **kwargs), a)
        assert "[MatMulMX]" in msg and word in msg


def test_empty_a_gives_an_empty_y() -> None:
    fields, _ = mc.packed(_weights(64, 32, 2), "mxfp4")
    y = _run(mc.model("mxfp4", fields, (64, 32), (0, 64)), np.zeros((0, 64), np.float32))
    assert y.shape == (0, 32)
