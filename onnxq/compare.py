"""Comparing a quantized model with its float model: error metrics and intermediate tensors.

`error_metrics` measures one output against its float reference (cosine similarity, SQNR,
max abs error); `looks_like_scores` and `top1_agreement` add top-1 agreement for logits and
probabilities. `layer_candidates` and `expose_outputs` make the intermediate tensors both
graphs compute into graph outputs, so one run yields every layer's values
(``onnxq compare --layers``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

import numpy as np
import onnx

from onnxq.graph.schemas import infer_shapes

__all__ = [
    "FLOAT_TYPES",
    "error_metrics",
    "expose_outputs",
    "layer_candidates",
    "looks_like_scores",
    "producers",
    "top1_agreement",
]

FLOAT_TYPES = frozenset(
    {
        onnx.TensorProto.FLOAT,
        onnx.TensorProto.FLOAT16,
        onnx.TensorProto.DOUBLE,
        onnx.TensorProto.BFLOAT16,
    }
)
_SCORE_NAME = re.compile(r"logit|prob|score|class|softmax", re.IGNORECASE)


def error_metrics(ref: np.ndarray, got: np.ndarray) -> dict[str, float]:
    """Cosine similarity, SQNR (dB) and max abs error of ``got`` against ``ref``.

    Returns ``{"cos": ..., "sqnr": ..., "max_abs": ...}``; SQNR is +inf when the arrays are
    equal and -inf when ``ref`` is all zeros and ``got`` is not.
    """
    a = np.asarray(ref, np.float64).ravel()
    b = np.asarray(got, np.float64).ravel()
    signal = float(np.dot(a, a))
    noise = float(np.sum((a - b) ** 2))
    norms = math.sqrt(signal * float(np.dot(b, b)))
    if norms:
        cos = float(np.dot(a, b)) / norms
    else:
        cos = 1.0 if signal == noise == 0 else 0.0
    if noise == 0:
        sqnr = math.inf
    elif signal == 0:
        sqnr = -math.inf
    else:
        sqnr = 10 * math.log10(signal / noise)
    err = float(np.max(np.abs(a - b))) if a.size else 0.0
    return {"cos": cos, "sqnr": sqnr, "max_abs": err}


def looks_like_scores(name: str, a: np.ndarray, producer: str | None) -> bool:
    """True for logits or probabilities.

    That is: float, rank >= 2 with a class axis last, and a Softmax producer, a name that
    says so, or rows that are probability distributions.
    """
    if a.ndim < 2 or a.shape[-1] < 2 or not np.issubdtype(a.dtype, np.floating) or not a.size:
        return False
    if producer in ("Softmax", "LogSoftmax") or _SCORE_NAME.search(name):
        return True
    v = a.astype(np.float64)
    return bool(np.all(v >= 0) and np.allclose(v.sum(-1), 1.0, atol=1e-3))


def top1_agreement(ref: np.ndarray, got: np.ndarray) -> float:
    """The fraction of rows (class axis last) whose largest value sits at the same class."""
    return float(np.mean(np.argmax(ref, -1) == np.argmax(got, -1)))


def producers(graph: onnx.GraphProto) -> dict[str, str]:
    """Op type that makes each tensor of ``graph``, seen through Identity nodes."""
    made = {out: node for node in graph.node for out in node.output if out}
    result = {}
    for name, node in made.items():
        while node.op_type == "Identity" and node.input and node.input[0] in made:
            node = made[node.input[0]]
        result[name] = node.op_type
    return result


def layer_candidates(f_model: onnx.ModelProto, q_model: onnx.ModelProto) -> list[str]:
    """Tensors made by nodes of both main graphs, in the float graph's order.

    Graph outputs and Constant values are left out.
    """
    outputs = {o.name for o in f_model.graph.output}
    q_made = {o for node in q_model.graph.node for o in node.output if o}
    constants = {
        o for node in f_model.graph.node if node.op_type == "Constant" for o in node.output
    }
    outputs |= constants
    names = [
        o
        for node in f_model.graph.node
        for o in node.output
        if o and o in q_made and o not in outputs
    ]
    return list(dict.fromkeys(names))


def expose_outputs(model: onnx.ModelProto, names: Sequence[str]) -> list[str]:
    """Make the float tensors among ``names`` graph outputs of ``model`` (in place).

    Only tensors whose type shape inference knows are added; returns their names.
    """
    try:
        inferred = infer_shapes(model)  # types onnxq outputs on every onnx release
    except Exception:
        return []
    types = {v.name: v.type.tensor_type.elem_type for v in inferred.graph.value_info}
    added = [n for n in names if types.get(n) in FLOAT_TYPES]
    for n in added:
        model.graph.output.append(onnx.helper.make_tensor_value_info(n, types[n], None))
    return added
