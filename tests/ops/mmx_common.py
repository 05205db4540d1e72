"""Shared by the MatMulMX tests: packed weights, MatMulMX models and the numpy oracle.

The oracle is docs/ops.md's order worked with numpy float32 ufuncs on the weight decoded by
`onnxq.upcast` (the numpy reference decode, independent of the library): each ``Y[m, n]``
starts at ``-0.0`` and adds ``A[m, k] * B[k, n]`` for ``k = 0 .. K-1`` in order (one rounding
per multiply, one per add), then adds ``Bias[n]``; NaNs are made the canonical quiet NaN.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import onnxq

SLOTS = ("Q", "Scale", "Zero", "TenScale", "Meta", "Mask")


def packed(
    w: np.ndarray, dt: str, axis: int = 0, scale_mode: str = "floor"
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """(DequantizeMX's inputs for ``w``, the weight decoded by the numpy reference)."""
    q = onnxq.cast(w, dt, axis=axis, mode="compress", backend="reference", scale_mode=scale_mode)
    fields = {"Q": q.data, "Scale": q.scale, "Zero": q.zero, "TenScale": q.tenscale}
    fields.update({"Meta": q.meta, "Mask": q.mask})
    fields = {k: np.ascontiguousarray(v) for k, v in fields.items() if v is not None}
    return fields, np.asarray(onnxq.upcast(q), np.float32)


def oracle(a: np.ndarray, b: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    """docs/ops.md's MatMulMX order, in numpy float32 (a: [..., K], b: [K, N])."""
    k_dim, n_dim = b.shape
    a2 = a.reshape(-1, k_dim).astype(np.float32)
    acc = np.full((a2.shape[0], n_dim), -0.0, np.float32)
    with np.errstate(all="ignore"):
        for k in range(k_dim):
            acc = acc + a2[:, k : k + 1] * b[k : k + 1, :]
        if bias is not None:
            acc = acc + bias.astype(np.float32)
    acc[np.isnan(acc)] = np.float32(np.nan)
    bits = acc.view(np.uint32)
    bits[np.isnan(acc)] = 0x7FC00000
    return acc.reshape(*a.shape[:-1], n_dim)


def special_a(a: np.ndarray) -> np.ndarray:
    """``a`` with its first values set to zeros, subnormals, infinities, NaN and a huge value."""
    a = a.copy()
    flat = a.reshape(-1)
    specials = [0.0, -0.0, 1e-45, -3e-39, np.inf, -np.inf, np.nan, 3e38]
    flat[: min(flat.size, len(specials))] = specials[: min(flat.size, len(specials))]
    return a


def model(
    dt: str,
    fields: dict[str, np.ndarray],
    shape: tuple[int, int],
    a_shape: tuple[int | str, ...],
    bias: np.ndarray | None = None,
    axis: int = 0,
    constant: bool = True,
    output_type: int = TensorProto.FLOAT,
    trans_b: int | None = None,
) -> onnx.ModelProto:
    """Y = MatMulMX(A, packed B, Bias?): B's fields as initializers (or graph inputs).

    ``trans_b``: the attribute (None leaves it out); with 1, ``shape`` and the fields are W's
    (W = B^T, ``[N, K]``).
    """
    tensors = {k: v for k, v in fields.items()}
    if bias is not None:
        tensors["Bias"] = bias
    names = ["A"] + [k if k in fields else "" for k in SLOTS] + ["Bias" if bias is not None else ""]
    while not names[-1]:
        names.pop()
    node = helper.make_node(
        "MatMulMX",
        names,
        ["Y"],
        domain="onnxq",
        dtype=dt,
        axis=axis,
        shape=list(shape),
        output_type=output_type,
        **({} if trans_b is None else {"trans_b": trans_b}),
    )
    inits = [numpy_helper.from_array(v, k) for k, v in tensors.items()]
    a = helper.make_tensor_value_info("A", TensorProto.FLOAT, list(a_shape))
    fed = [helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in inits]
    y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)
    graph = helper.make_graph(
        [node],
        "matmul_mx",
        [a] if constant else [a, *fed],
        [y],
        initializer=inits if constant else [],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("onnxq", 1)]
    return helper.make_model(graph, opset_imports=opsets)


def bits(y: np.ndarray) -> bytes:
    """The bytes of a float32 array (bit-exact comparisons)."""
    return np.ascontiguousarray(y, np.float32).tobytes()
