"""A small model whose layers' sensitivities are known by construction (for the tune tests).

Four chained 64x64 MatMuls ``a``, ``b``, ``c``, ``d``. The weights of ``a``, ``c`` and ``d``
are values of the FP4 (E2M1) grid times 2^-3, and every block of 32 along the reduction axis
holds the grid's maximum 6 * 2^-3: MXFP4's shared scale is then 2^-3 exactly (floor(log2 0.75)
- emax 2 = -3) and every value is representable, so these layers are exact in MXFP4 and in
every wider candidate. ``b``'s magnitudes are log-uniform over ten octaves, which four-bit
elements cannot hold: it alone decides the error. So the expected assignment is ``a``, ``c``,
``d`` in mxfp4 and ``b`` in the cheapest candidate that meets the budget by itself, which
`b_alone_sqnr` computes with numpy (independently of onnxq.tuning).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import onnxq
from onnxq.compare import error_metrics

NAMES = ("a", "b", "c", "d")
_GRID = np.array([0.5, 1, 1.5, 2, 3, 4, 6])


def weights(seed: int = 1) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)

    def exact() -> np.ndarray:
        w = rng.choice(_GRID, (64, 64)) * rng.choice([-1, 1], (64, 64))
        w[::32, :] = 6  # each block of 32 along K holds the maximum
        return (w / 8).astype(np.float32)

    sensitive = rng.choice([-1, 1], (64, 64)) * 2.0 ** rng.uniform(-10, 0, (64, 64))
    return [exact(), sensitive.astype(np.float32), exact(), exact()]


def model(seed: int = 1) -> onnx.ModelProto:
    nodes, inits, x = [], [], "x"
    for i, (name, w) in enumerate(zip(NAMES, weights(seed), strict=True)):
        inits.append(numpy_helper.from_array(w, f"w{i}"))
        nodes.append(helper.make_node("MatMul", [x, f"w{i}"], [f"h{i}"], name=name))
        x = f"h{i}"
    graph = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 64])],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, [None, 64])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def samples(n: int = 8, seed: int = 2) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal((8, 64)).astype(np.float32)} for _ in range(n)]


def chain(x: np.ndarray, ws: list[np.ndarray]) -> np.ndarray:
    for w in ws:
        x = (x.astype(np.float64) @ w.astype(np.float64)).astype(np.float32)
    return x


def sqnr(ws_q: list[np.ndarray], data: list[dict[str, np.ndarray]], seed: int = 1) -> float:
    """SQNR of the chain with weights ``ws_q`` against float, pooled over ``data`` (numpy)."""
    ws = weights(seed)
    ref = np.concatenate([chain(s["x"], ws).ravel() for s in data])
    got = np.concatenate([chain(s["x"], ws_q).ravel() for s in data])
    return error_metrics(ref, got)["sqnr"]


def b_alone_sqnr(fmt: str, data: list[dict[str, np.ndarray]]) -> float:
    ws = weights()
    ws[1] = onnxq.cast(ws[1], fmt, axis=0)  # MatMul B: tiles along K (axis 0)
    return sqnr(ws, data)


def conv_model(seed: int = 3) -> onnx.ModelProto:
    """Three convs whose reduction axes are shorter than a 32-value tile (random weights).

    ``dw``: depthwise 3x3 over 16 channels (W [16, 1, 3, 3]); ``full``: 3x3, 16 -> 16 channels
    (W [16, 16, 3, 3]: tiled as a matrix in 32-value tiles, in its own shape in 16-value ones);
    ``pw``: 1x1, 16 -> 8 (W [8, 16, 1, 1]: its row is no longer than its axis, never tiled);
    then a MatMul ``head``. Input [N, 16, 8, 8], output [N, 8, 8, 4].
    """
    rng = np.random.default_rng(seed)
    w = {
        "w_dw": rng.standard_normal((16, 1, 3, 3)),
        "w_full": rng.standard_normal((16, 16, 3, 3)) * 0.3,
        "w_pw": rng.standard_normal((8, 16, 1, 1)) * 0.3,
        "w_head": rng.standard_normal((8, 4)),
    }
    inits = [numpy_helper.from_array(v.astype(np.float32), k) for k, v in w.items()]
    nodes = [
        helper.make_node("Conv", ["x", "w_dw"], ["h0"], name="dw", group=16, pads=[1] * 4),
        helper.make_node("Relu", ["h0"], ["r0"], name="relu0"),
        helper.make_node("Conv", ["r0", "w_full"], ["h1"], name="full", pads=[1] * 4),
        helper.make_node("Relu", ["h1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w_pw"], ["h2"], name="pw"),
        helper.make_node("Transpose", ["h2"], ["t2"], name="nhwc", perm=[0, 2, 3, 1]),
        helper.make_node("MatMul", ["t2", "w_head"], ["y"], name="head"),
    ]
    graph = helper.make_graph(
        nodes,
        "convs",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 16, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 8, 8, 4])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def conv_samples(n: int = 8, seed: int = 4) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal((2, 16, 8, 8)).astype(np.float32)} for _ in range(n)]
