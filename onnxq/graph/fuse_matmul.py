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

Transposed weights: a decoded W ``[N, K]`` tiled along K (its axis 1, a Linear weight or an
embedding table) read as B = W^T, through ``Transpose(perm=[1, 0])`` by MatMul / Gemm or
directly by a ``Gemm`` with ``transB=1`` (and the C rules above), becomes ``MatMulMX(trans_b=1)``
on the same packed inputs, one per such product. The Transpose goes when all its readers fused;
the DequantizeMX goes when nothing else reads it. A tied embedding table (the decode also read
by ``Gather(axis=0)`` nodes) keeps its DequantizeMX for the Gathers here; `fuse_gather`, which
runs next in ``FUSIONS``, turns them into GatherMX nodes and drops it: both ops then read the
one packed initializer and nothing decodes the whole table.

Measured (benchmarks/matmul_mx.py): MatMulMX beats the float MatMul on the decode step of a small
LM (a few rows) and costs more than it on many rows, where the float GEMM's FMA and tuning win;
with constant decoding at session creation (`onnxq.runtime`), an unfused packed weight runs at
float speed. So `fuse_matmul` is opt-in (not in ``DEFAULT_FUSIONS``): ``quantize_model(fuse=
"all")`` or ``fuse=["matmul_mx", "gather"]``, CLI ``--fuse all``, recipe ``fuse: all``. It suits
memory-bound decoding (an LM decode step at batch 1: 0.40x float) and costs about 1.2x float from
64 rows of A on; the row count is usually a dynamic dim, unknown at quantize time.
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


def fusable(attrs: dict[str, Any], trans_b: bool = False) -> bool:
    """Whether MatMulMX's fused decode covers a DequantizeMX node with these attributes.

    ``trans_b``: the decoded tensor is W = B^T ``[N, K]`` (read through a Transpose, or by a
    Gemm with ``transB=1``): its tiles must run along K, its axis 1.
    """
    shape = list(attrs.get("shape", []))
    if len(shape) != 2 or int(attrs.get("axis", -1)) % 2 != (1 if trans_b else 0):
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
    consumer: onnx.NodeProto, inits: dict[str, onnx.TensorProto], n: int, reads_w: bool = False
) -> tuple[bool, onnx.TensorProto | None]:
    """(whether the consumer fits, the Bias initializer [N] to use or None).

    ``reads_w``: the consumer reads W = B^T itself (a Gemm must then have ``transB=1``).
    """
    if consumer.op_type == "MatMul":
        return len(consumer.input) == 2 and not reads_w, None
    attrs = node_attrs(consumer)
    if float(attrs.get("alpha", 1.0)) != 1.0 or int(attrs.get("transA", 0)):
        return False, None
    if bool(int(attrs.get("transB", 0))) != reads_w:
        return False, None
    if len(consumer.input) < 3 or not consumer.input[2]:
        return True, None
    if float(attrs.get("beta", 1.0)) != 1.0:
        return False, None
    c = inits.get(consumer.input[2])
    if c is None or c.data_type != TensorProto.FLOAT or list(c.dims) not in ([n], [1, n]):
        return False, None
    if list(c.dims) == [n]:
        return True, c  # Bias as it is (its data may live in an external file)
    if c.data_location == TensorProto.EXTERNAL:
        return False, None  # a [1, N] C in an external file: not read here
    return True, numpy_helper.from_array(
        numpy_helper.to_array(c).reshape(n).astype(np.float32), consumer.input[2] + "_mmx_bias"
    )


class _Pass:
    """One run of the fusion over a model's main graph (the state its helpers share)."""

    def __init__(self, model: onnx.ModelProto) -> None:
        self.graph = model.graph
        self.inits = {t.name: t for t in self.graph.initializer}
        self.overridable = {i.name for i in self.graph.input}
        self.readers = _readers(model)
        # A from a static QuantizeLinear -> DequantizeLinear pair (calibrated activations)
        # stays unfused: onnxruntime's QDQ propagation through the fallback's Reshape builds an
        # invalid QuantizeLinear (int8 output, uint8 zero point) when the model runs without
        # the library.
        self.static_qdq = {
            o for n in self.graph.node if n.op_type == "DequantizeLinear" for o in n.output
        }
        self.removed: set[str] = set()  # outputs of the nodes removed

    def _product(self, node: onnx.NodeProto, slot: int) -> bool:
        """Whether ``node`` reads a weight as its B (input 1) in a way the pass can take."""
        return (
            slot == 1
            and node.domain in ("", "ai.onnx")
            and node.op_type in ("MatMul", "Gemm")
            and node in self.graph.node  # not inside a subgraph
            and node.input[0] not in self.static_qdq
        )

    def replace(
        self,
        dq: onnx.NodeProto,
        consumer: onnx.NodeProto,
        attrs: dict,
        trans_b: bool,
        reads_w: bool = False,
    ) -> bool:
        """``consumer`` (MatMul / Gemm) becomes MatMulMX on dq's packed inputs.

        Its B is dq's decode, or that decode's transpose with ``trans_b``; ``reads_w``: a Gemm
        ``transB=1`` reading the decode itself.
        """
        n = int(attrs["shape"][0 if trans_b else 1])
        ok, bias = _bias(consumer, self.inits, n, reads_w)
        if not ok:
            return False
        if bias is not None and bias.name not in self.inits:
            self.graph.initializer.append(bias)
            self.inits[bias.name] = bias
        packed = list(dq.input) + [""] * (6 - len(dq.input))
        inputs = [consumer.input[0], *packed, bias.name if bias is not None else ""]
        while not inputs[-1]:
            inputs.pop()
        keep = ("dtype", "axis", "shape", "output_type")
        node = onnx.helper.make_node(
            "MatMulMX",
            inputs,
            list(consumer.output),
            name=consumer.name or f"{dq.name}_matmul",
            domain=DOMAIN,
            **{k: attrs[k] for k in keep if k in attrs},
            **({"trans_b": 1} if trans_b else {}),
        )
        at = list(self.graph.node).index(consumer)
        self.graph.node.remove(consumer)
        self.graph.node.insert(at, node)
        return True

    def remove(self, node: onnx.NodeProto) -> None:
        self.graph.node.remove(node)
        self.removed.update(o for o in node.output if o)

    def packed_weight(self, dq: onnx.NodeProto) -> bool:
        """A DequantizeMX of initializers only (no Shape input, none a graph input)."""
        if dq.domain != DOMAIN or dq.op_type != "DequantizeMX" or len(dq.output) != 1:
            return False
        named = [name for name in dq.input if name]
        return (
            len(dq.input) <= 6
            and bool(named)
            and all(name in self.inits and name not in self.overridable for name in named)
        )

    def plain(self, dq: onnx.NodeProto, attrs: dict) -> int:
        """decode(B) read only as B by one MatMul / Gemm (no transposes)."""
        users = self.readers.get(dq.output[0], [])
        if len(users) != 1 or not self._product(*users[0]):
            return 0
        if not self.replace(dq, users[0][0], attrs, trans_b=False):
            return 0
        self.remove(dq)
        return 1

    def transposed(self, dq: onnx.NodeProto, attrs: dict) -> int:
        """decode(W) read as B^T by MatMul / Gemm (``Transpose(perm=[1, 0])`` or ``transB=1``).

        Every such product becomes MatMulMX ``trans_b=1``; a Transpose whose readers all fused
        goes, and so does the decode when nothing else reads it (a tied table's Gathers keep
        it: `fuse_gather` takes them next).
        """
        fused = 0
        left = 0  # readers of decode(W) that stay
        for node, slot in self.readers.get(dq.output[0], []):
            if slot == 1 and node.op_type == "Gemm" and self._product(node, slot):
                if self.replace(dq, node, attrs, trans_b=True, reads_w=True):
                    fused += 1
                    continue
            perm = node_attrs(node).get("perm") if node.op_type == "Transpose" else None
            if (
                perm is None
                or list(perm) != [1, 0]
                or node.domain not in ("", "ai.onnx")
                or node not in self.graph.node
            ):
                left += 1
                continue
            stays = 0
            for user, uslot in self.readers.get(node.output[0], []):
                took = self._product(user, uslot) and self.replace(dq, user, attrs, trans_b=True)
                fused += took
                stays += not took
            if stays:
                left += 1
            else:
                self.remove(node)
        if fused and not left:
            self.remove(dq)
        return fused


def fuse_matmul(model: onnx.ModelProto) -> int:
    """Fuse every covered DequantizeMX -> MatMul/Gemm pair of the main graph; how many."""
    run = _Pass(model)
    fused = 0
    for dq in list(model.graph.node):
        if not run.packed_weight(dq):
            continue
        attrs = node_attrs(dq)
        if fusable(attrs):
            fused += run.plain(dq, attrs)
        elif fusable(attrs, trans_b=True):
            fused += run.transposed(dq, attrs)
    if fused:
        keep = [v for v in model.graph.value_info if v.name not in run.removed]
        del model.graph.value_info[:]
        model.graph.value_info.extend(keep)
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
