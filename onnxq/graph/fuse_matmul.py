"""Fusion: DequantizeMX of a constant weight read only as B by MatMul (or Gemm) -> MatMulMX.

A DequantizeMX node whose inputs are all initializers (not graph inputs, which a caller may
override), whose output is read by exactly one node, as input B of a ``MatMul`` (or of a ``Gemm``
with ``alpha = beta = 1``, no transposes and a C that is absent or a constant float32 ``[N]`` /
``[1, N]``), and is no graph output, becomes one ``MatMulMX(A, Q, Scale, ..., Bias?)`` node
(docs/ops.md "MatMulMX"). Only the formats and layouts the fused kernel decodes inside its GEMM
are fused (`fusable`): 1-D tiles along K (axis 0 of a 2-D B), element codes of at most 8 bits,
exponent scales of at most 8 bits without zero point or tensor scale (MX, BFP, MX9/MX6), or
float scales of at most 16 bits with an optional zero point of at most 8 bits (NVFP4, int4
with zero points); float32 output. Everything else (codebooks, 2-D tiles, N:M sparsity, tiles
along N, float16/bfloat16 outputs) keeps DequantizeMX + MatMul, with the same bits as before.

Measured (benchmarks/matmul_mx.py): MatMulMX beats the float MatMul on the decode step of a small
LM (a few rows) and costs more than it on many rows, where the float GEMM's FMA and tuning win;
`fuse_matmul` is on by default (``quantize_model(fuse=True)``) for every covered format: a
weights-only model's alternative is DequantizeMX + MatMul, which is slower than both.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from onnxq.formats.codebook import Codebook
from onnxq.formats.datatype import datatype
from onnxq.graph.schemas import DOMAIN
from onnxq.graph.walk import node_attrs, walk_graphs

__all__ = ["fusable", "fuse_matmul"]


def fusable(attrs: dict[str, Any]) -> bool:
    """Whether MatMulMX's fused decode covers a DequantizeMX node with these attributes."""
    shape = list(attrs.get("shape", []))
    if len(shape) != 2 or int(attrs.get("axis", -1)) % 2 != 0:
        return False
    if int(attrs.get("output_type", TensorProto.FLOAT)) != TensorProto.FLOAT:
        return False
    try:
        dt = datatype(str(attrs.get("dtype", "")))
    except ValueError:
        return False
    n, s = dt.nspec, dt.sspec
    if isinstance(n, Codebook) or s is None or n.bits > 8:
        return False
    if len(s.tiles) != 1 or s.tiles[0].sparse_m:
        return False
    if s.scale.is_exponent:
        return s.zero is None and s.tenscale is None and s.scale.bits <= 8
    if s.tiles[0].subtile or s.scale.bits > 16:
        return False
    if s.zero is not None:
        return s.zero.bits <= 8
    return s.tenscale is None or s.scale.bits <= 8


def _readers(model: onnx.ModelProto) -> dict[str, list[tuple[onnx.NodeProto, int]]]:
    """Every value's readers (node, input position), subgraphs included; graph outputs as None."""
    found: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
    for graph in walk_graphs(model.graph):
        for node in graph.node:
            for i, name in enumerate(node.input):
                if name:
                    found.setdefault(name, []).append((node, i))
        for out in graph.output:
            found.setdefault(out.name, []).append((onnx.NodeProto(), -1))
    return found


def _bias(
    consumer: onnx.NodeProto, inits: dict[str, onnx.TensorProto], n: int
) -> tuple[bool, onnx.TensorProto | None]:
    """(whether the consumer fits, the Bias initializer [N] to use or None)."""
    if consumer.op_type == "MatMul":
        return len(consumer.input) == 2, None
    attrs = node_attrs(consumer)
    if float(attrs.get("alpha", 1.0)) != 1.0 or int(attrs.get("transA", 0)):
        return False, None
    if int(attrs.get("transB", 0)):
        return False, None
    if len(consumer.input) < 3 or not consumer.input[2]:
        return True, None
    if float(attrs.get("beta", 1.0)) != 1.0:
        return False, None
    c = inits.get(consumer.input[2])
    if c is None or c.data_type != TensorProto.FLOAT or list(c.dims) not in ([n], [1, n]):
        return False, None
    return True, numpy_helper.from_array(
        numpy_helper.to_array(c).reshape(n).astype(np.float32), consumer.input[2] + "_mmx_bias"
    )


def fuse_matmul(model: onnx.ModelProto) -> int:
    """Fuse every covered DequantizeMX -> MatMul/Gemm pair of the main graph; how many."""
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    overridable = {i.name for i in graph.input}
    readers = _readers(model)
    # A from a static QuantizeLinear -> DequantizeLinear pair (calibrated activations) stays
    # unfused: onnxruntime's QDQ propagation through the fallback's Reshape builds an invalid
    # QuantizeLinear (int8 output, uint8 zero point) when the model runs without the library.
    static_qdq = {o for n in graph.node if n.op_type == "DequantizeLinear" for o in n.output}
    fused = 0
    for dq in list(graph.node):
        if dq.domain != DOMAIN or dq.op_type != "DequantizeMX" or len(dq.output) != 1:
            continue
        named = [name for name in dq.input if name]
        if (
            len(dq.input) > 6
            or not named
            or any(name not in inits or name in overridable for name in named)
        ):
            continue
        attrs = node_attrs(dq)
        if not fusable(attrs):
            continue
        users = readers.get(dq.output[0], [])
        if len(users) != 1 or users[0][1] != 1:
            continue
        consumer = users[0][0]
        if consumer.domain not in ("", "ai.onnx") or consumer.op_type not in ("MatMul", "Gemm"):
            continue
        if consumer not in graph.node:
            continue  # read inside a subgraph
        if consumer.input[0] in static_qdq:
            continue
        ok, bias = _bias(consumer, inits, int(attrs["shape"][1]))
        if not ok:
            continue
        if bias is not None and bias.name not in inits:
            graph.initializer.append(bias)
            inits[bias.name] = bias
        packed = list(dq.input) + [""] * (6 - len(dq.input))
        inputs = [consumer.input[0], *packed, bias.name if bias is not None else ""]
        while not inputs[-1]:
            inputs.pop()
        node = onnx.helper.make_node(
            "MatMulMX",
            inputs,
            list(consumer.output),
            name=consumer.name or f"{dq.name}_matmul",
            domain=DOMAIN,
            **{k: attrs[k] for k in ("dtype", "axis", "shape", "output_type") if k in attrs},
        )
        at = list(graph.node).index(consumer)
        graph.node.remove(consumer)
        graph.node.insert(at, node)
        graph.node.remove(dq)
        fused += 1
    if fused:
        _drop_unused(model)
    return fused


def _drop_unused(model: onnx.ModelProto) -> None:
    """Remove the initializers no node or graph output reads any more (replaced Gemm Cs)."""
    used = set(_readers(model))
    graph = model.graph
    keep = [
        t for t in graph.initializer if t.name in used or t.name in {i.name for i in graph.input}
    ]
    if len(keep) != len(graph.initializer):
        del graph.initializer[:]
        graph.initializer.extend(keep)
