"""MatMulMX's large-M path (docs/ops.md "MatMulMX", "Many rows"): onnxruntime's MatMul bits.

From ``ONNXQ_MMX_LARGE_M`` rows of A on (default 64) the kernel decodes B and runs onnxruntime's
own MatMul on it, then adds Bias: Y must then have the bits of the unfused graph
``DequantizeMX -> MatMul -> Add`` in the same onnxruntime. The reference here is independent of
the kernel: a plain onnxruntime session (no custom ops) of ``MatMul`` (and ``Add``) on the weight
decoded by the numpy reference (``onnxq.upcast``) as an initializer, run as the unfused graph
runs: MatMul and Add as two nodes (no graph optimizations: onnxruntime would fuse a rank-2
MatMul + Add into a Gemm) and B not prepacked (``session.disable_prepacking``: in the unfused
graph B is DequantizeMX's output, which onnxruntime never prepacks). Below the threshold the
documented no-FMA order still holds (the numpy oracle, tests/ops/mmx_common.py).
"""

from __future__ import annotations

import concurrent.futures

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxq import runtime
from tests.ops import mmx_common as mc

pytestmark = pytest.mark.needs_custom_ops
ort = pytest.importorskip("onnxruntime")

DEFAULT_T = 64  # docs/ops.md: the default threshold (ort_kernel_mmx_large.h kMmxLargeDefault)
FUSED = ["mxfp4", "nvfp4", "uint4_block32", "mxfp8e4", "mxint8", "bfp16", "mx6", "mx9"]
WHOLE = ["mxfp6e2", "e2m1fnuz_e8m0_t32n2m4", "cb41fi_e2m2fnuz_e8m0_t32"]  # decoded whole


@pytest.fixture(autouse=True)
def _default_threshold(monkeypatch: pytest.MonkeyPatch) -> None:
    """The default threshold unless a test sets its own (read when a session makes the kernel)."""
    monkeypatch.delenv("ONNXQ_MMX_LARGE_M", raising=False)


def _weights(k: int, n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((k, n)).astype(np.float32)
    w[: min(k, 2)] *= np.float32(1e-39)  # subnormal rows
    w[:, :1] = 0.0
    return w


def _unfused(a: np.ndarray, b: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
    """MatMul (+ Add) of a plain onnxruntime on the decoded weight, as the unfused graph runs."""
    nodes = [helper.make_node("MatMul", ["A", "B"], ["T" if bias is not None else "Y"])]
    inits = [numpy_helper.from_array(b, "B")]
    if bias is not None:
        nodes.append(helper.make_node("Add", ["T", "bias"], ["Y"]))
        inits.append(numpy_helper.from_array(bias, "bias"))
    graph = helper.make_graph(
        nodes,
        "unfused",
        [helper.make_tensor_value_info("A", TensorProto.FLOAT, list(a.shape))],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.add_session_config_entry("session.disable_prepacking", "1")
    sess = ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    return sess.run(None, {"A": a})[0]


def _run(model: onnx.ModelProto, a: np.ndarray, feeds: dict | None = None) -> np.ndarray:
    return runtime.session(model).run(None, {"A": a, **(feeds or {})})[0]


SHAPES = [((DEFAULT_T, 67), 67, 33), ((2, 70, 300), 300, 70), ((129, 96), 96, 192)]


@pytest.mark.parametrize("dt", FUSED + WHOLE)
@pytest.mark.parametrize(("a_shape", "k", "n"), SHAPES)
@pytest.mark.parametrize("constant", [True, False])
def test_bits_match_the_unfused_graph(
    dt: str, a_shape: tuple[int, ...], k: int, n: int, constant: bool
) -> None:
    w = _weights(k, n, k + n)
    w[3, 5], w[k - 1, n - 1] = np.inf, np.nan  # decoded as what the format makes of them
    fields, b = mc.packed(w, dt)
    rng = np.random.default_rng(k)
    a = mc.special_a(rng.standard_normal(a_shape).astype(np.float32))
    bias = rng.standard_normal(n).astype(np.float32) if n % 2 else None
    feeds = {} if constant else {**fields, **({"Bias": bias} if bias is not None else {})}
    y = _run(mc.model(dt, fields, (k, n), a_shape, bias, constant=constant), a, feeds)
    assert y.shape == (*a_shape[:-1], n) and y.dtype == np.float32
    assert mc.bits(y) == mc.bits(_unfused(a, b, bias))


def test_the_real_unfused_graph_gives_the_same_bits() -> None:
    """DequantizeMX -> MatMul -> Add with the library, A [batch, seq, K] of unknown dims."""
    k, n, dt = 384, 160, "mxfp4"
    fields, _ = mc.packed(_weights(k, n, 3), dt)
    bias = np.linspace(-2, 2, n, dtype=np.float32)
    names = [s if s in fields else "" for s in mc.SLOTS]
    while not names[-1]:
        names.pop()
    nodes = [
        helper.make_node(
            "DequantizeMX", names, ["W"], domain="onnxq", dtype=dt, axis=0, shape=[k, n]
        ),
        helper.make_node("MatMul", ["A", "W"], ["T"]),
        helper.make_node("Add", ["T", "Bias"], ["Y"]),
    ]
    inits = [numpy_helper.from_array(v, s) for s, v in fields.items()]
    inits.append(numpy_helper.from_array(bias, "Bias"))
    graph = helper.make_graph(
        nodes,
        "unfused",
        [helper.make_tensor_value_info("A", TensorProto.FLOAT, ["batch", "seq", k])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)],
        initializer=inits,
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("onnxq", 1)]
    # decode_weights='run': DequantizeMX stays in the graph, so B is not a constant onnxruntime
    # could pre-pack (the load-time decode would make it one, with other bits).
    unfused = runtime.session(helper.make_model(graph, opset_imports=opsets), decode_weights="run")
    fused = runtime.session(mc.model(dt, fields, (k, n), ("batch", "seq", k), bias))
    a = np.random.default_rng(5).standard_normal((2, 70, k)).astype(np.float32)
    want = unfused.run(None, {"A": a})[0]
    assert mc.bits(fused.run(None, {"A": a})[0]) == mc.bits(want)


@pytest.mark.parametrize("threshold", [None, 5])
def test_threshold_boundary(threshold: int | None, monkeypatch: pytest.MonkeyPatch) -> None:
    """T - 1 rows: the documented order (numpy oracle); T rows: the unfused graph's bits."""
    if threshold is not None:
        monkeypatch.setenv("ONNXQ_MMX_LARGE_M", str(threshold))
    t = threshold or DEFAULT_T
    k, n, dt = 300, 70, "mxfp4"
    fields, b = mc.packed(_weights(k, n, 11), dt)
    bias = np.linspace(-1, 1, n, dtype=np.float32)
    sess = runtime.session(mc.model(dt, fields, (k, n), ("M", k), bias))
    rng = np.random.default_rng(7)
    below = rng.standard_normal((t - 1, k)).astype(np.float32)
    at = rng.standard_normal((t, k)).astype(np.float32)
    assert mc.bits(sess.run(None, {"A": below})[0]) == mc.bits(mc.oracle(below, b, bias))
    y_at = sess.run(None, {"A": at})[0]
    assert mc.bits(y_at) == mc.bits(_unfused(at, b, bias))
    # The two orders differ here (K = 300 is past MLAS's K blocks), so the check can fail.
    assert mc.bits(y_at) != mc.bits(mc.oracle(at, b, bias))
    # Runs below the threshold after the cache is made still take the documented order.
    assert mc.bits(sess.run(None, {"A": below})[0]) == mc.bits(mc.oracle(below, b, bias))


def test_zero_turns_the_path_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ONNXQ_MMX_LARGE_M", "0")
    k, n = 300, 70
    fields, b = mc.packed(_weights(k, n, 12), "nvfp4")
    a = np.random.default_rng(8).standard_normal((2, 70, k)).astype(np.float32)
    y = _run(mc.model("nvfp4", fields, (k, n), (2, 70, k)), a)
    assert mc.bits(y) == mc.bits(mc.oracle(a, b))


@pytest.mark.parametrize("value", ["", "x", "-3"])
def test_a_bad_threshold_means_the_default(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ONNXQ_MMX_LARGE_M", value)
    k, n = 96, 64
    fields, b = mc.packed(_weights(k, n, 13), "mxfp4")
    sess = runtime.session(mc.model("mxfp4", fields, (k, n), ("M", k)))
    a = np.random.default_rng(9).standard_normal((DEFAULT_T, k)).astype(np.float32)
    assert mc.bits(sess.run(None, {"A": a})[0]) == mc.bits(_unfused(a, b, None))
    small = a[: DEFAULT_T - 1]
    assert mc.bits(sess.run(None, {"A": small})[0]) == mc.bits(mc.oracle(small, b))


@pytest.mark.parametrize("constant", [True, False])
def test_one_session_shared_by_8_threads(constant: bool) -> None:
    """The first large-M runs race to decode the cached B: every thread gets the serial bits."""
    k, n, dt = 576, 192, "mxfp4"
    fields, b = mc.packed(_weights(k, n, 8), dt)
    bias = np.linspace(-1, 1, n, dtype=np.float32)
    model = mc.model(dt, fields, (k, n), ("M", k), bias, constant=constant)
    feeds = {} if constant else {**fields, "Bias": bias}
    rows = [DEFAULT_T + 3 * i if i % 2 else DEFAULT_T - 1 - i for i in range(8)]
    inputs = [
        np.random.default_rng(i).standard_normal((m, k)).astype(np.float32)
        for i, m in enumerate(rows)
    ]
    want = [
        mc.bits(_unfused(a, b, bias) if len(a) >= DEFAULT_T else mc.oracle(a, b, bias))
        for a in inputs
    ]
    sess = runtime.session(model)  # fresh: B not decoded yet

    def runs(i: int) -> bool:
        return all(
            mc.bits(sess.run(None, {"A": inputs[i], **feeds})[0]) == want[i] for _ in range(6)
        )

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        assert all(pool.map(runs, range(8)))


@pytest.mark.parametrize("dt", ["mxfp4", "nvfp4", "mxint8", "mx6"])
@pytest.mark.parametrize("constant", [True, False])
def test_trans_b_takes_the_transposed_decode(dt: str, constant: bool) -> None:
    """trans_b=1 (Q holds W = B^T [N, K], tiled along K): the unfused Transpose -> MatMul bits."""
    k, n = 300, 70
    w = _weights(n, k, 21).copy()  # W [N, K]
    fields, w_dec = mc.packed(w, dt, axis=1)
    b = np.ascontiguousarray(w_dec.T)
    bias = np.linspace(-1, 1, n, dtype=np.float32)
    model = mc.model(dt, fields, (n, k), ("M", k), bias, axis=1, constant=constant, trans_b=1)
    feeds = {} if constant else {**fields, "Bias": bias}
    sess = runtime.session(model)
    rng = np.random.default_rng(22)
    at = mc.special_a(rng.standard_normal((DEFAULT_T + 5, k)).astype(np.float32))
    y = sess.run(None, {"A": at, **feeds})[0]
    assert mc.bits(y) == mc.bits(_unfused(at, b, bias))
    assert mc.bits(y) != mc.bits(mc.oracle(at, b, bias))  # the path ran (K is past MLAS's blocks)
    below = at[: DEFAULT_T - 1]
    assert mc.bits(sess.run(None, {"A": below, **feeds})[0]) == mc.bits(mc.oracle(below, b, bias))
