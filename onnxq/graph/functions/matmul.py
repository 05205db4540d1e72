"""The MatMulMX fallback: DequantizeMX's body, then onnxruntime's own product.

``Y = A x decode(B) (+ Bias)``: the decode is `dequantize_mx_function`'s body (the same bits as
the custom op's decode), the product a ``Gemm`` on A reshaped to ``[rows, K]`` (Bias is its
optional C, so a call that leaves Bias out passes an empty name), reshaped back to A's leading
dims and N. With ``trans_b=1`` the decoded tensor is W = B^T ``[N, K]`` and the Gemm has
``transB=1``. The product's float32 summation order is the runtime's (onnxruntime's MLAS GEMM),
not the custom op's documented order: the two agree to rounding, not bit for bit.
"""

from __future__ import annotations

from collections.abc import Sequence

import onnx
from onnx import TensorProto, helper

from onnxq.formats.datatype import DataType
from onnxq.graph.functions.dequantize import dequantize_mx_function
from onnxq.graph.functions.signature import OPSET, _check_geometry, overload_name
from onnxq.graph.schemas import DOMAIN, OPS, input_names, output_names

__all__ = ["matmul_mx_function"]

_B = "mmx_b"  # the decoded weight inside the body


def matmul_mx_function(
    dtype: DataType | str,
    axis: int,
    shape: Sequence[int],
    output_type: int = TensorProto.FLOAT,
    trans_b: int = 0,
) -> onnx.FunctionProto:
    """The MatMulMX body for one data type, axis, packed shape and output type.

    ``shape`` is B's ``[K, N]``, or W's ``[N, K]`` with ``trans_b=1`` (Q holds W = B^T).

    Raises:
        NotImplementedError: B's format has no bit-exact standard-ONNX decode.
        ValueError: B not 2-D, a bad axis or trans_b, or an output type other than float.
    """
    dims, ax = _check_geometry(shape, axis)
    if int(trans_b) not in (0, 1):
        raise ValueError(f"MatMulMX: trans_b {trans_b} must be 0 or 1")
    if len(dims) != 2:
        what = "W's [N, K]" if trans_b else "B's [K, N]"
        raise ValueError(f"MatMulMX: shape {list(dims)} must be {what}")
    if int(output_type) != TensorProto.FLOAT:
        raise ValueError(f"MatMulMX: output_type {output_type}: only 1 (float) is supported")
    dq = dequantize_mx_function(dtype, ax, dims, output_type)
    nodes = []
    for node in dq.node:
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        for i, name in enumerate(copy.output):
            if name == "Y":
                copy.output[i] = _B
        for i, name in enumerate(copy.input):
            if name == "Y":
                copy.input[i] = _B
        nodes.append(copy)
    k, n = dims[::-1] if trans_b else dims

    def const(name: str, values: list[int]) -> onnx.NodeProto:
        return helper.make_node(
            "Constant",
            [],
            [name],
            value=helper.make_tensor(name, TensorProto.INT64, [len(values)], values),
        )

    nodes += [
        const("mmx_rows_k", [-1, k]),
        const("mmx_n", [n]),
        const("mmx_zero", [0]),
        const("mmx_last", [-1]),
        helper.make_node("Reshape", ["A", "mmx_rows_k"], ["mmx_a2"]),
        helper.make_node(
            "Gemm", ["mmx_a2", _B, "Bias"], ["mmx_y2"], **({"transB": 1} if trans_b else {})
        ),
        helper.make_node("Shape", ["A"], ["mmx_ashape"]),
        helper.make_node("Slice", ["mmx_ashape", "mmx_zero", "mmx_last"], ["mmx_lead"]),
        helper.make_node("Concat", ["mmx_lead", "mmx_n"], ["mmx_yshape"], axis=0),
        helper.make_node("Reshape", ["mmx_y2", "mmx_yshape"], ["Y"]),
    ]
    attrs = {"dtype": dtype, "axis": ax, "output_type": int(output_type), "trans_b": int(trans_b)}
    overload = overload_name("MatMulMX", attrs, dims)
    fn = helper.make_function(
        DOMAIN,
        "MatMulMX",
        list(input_names("MatMulMX")),
        list(output_names("MatMulMX")),
        nodes,
        [helper.make_opsetid("", OPSET)],
        list(OPS["MatMulMX"].attributes),
        doc_string=f"onnxq MatMulMX for {overload}: standard-ONNX fallback",
    )
    fn.overload = overload
    return fn
