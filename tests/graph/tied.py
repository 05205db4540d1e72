"""A tied-embedding model for the fusion tests: one table feeds a Gather and the output head."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def tied_model(ids: np.ndarray, vocab: int, dim: int, with_hidden: bool = False) -> onnx.ModelProto:
    """ids -> Gather(E) -> h -> MatMul(h, Transpose(E)) -> logits (and h with ``with_hidden``)."""
    rng = np.random.default_rng(11)
    table = numpy_helper.from_array(rng.standard_normal((vocab, dim)).astype(np.float32), "E")
    nodes = [
        helper.make_node("Gather", ["E", "ids"], ["h"], axis=0),
        helper.make_node("Transpose", ["E"], ["Et"], perm=[1, 0]),
        helper.make_node("MatMul", ["h", "Et"], ["logits"]),
    ]
    shape = list(ids.shape)
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [*shape, vocab])]
    if with_hidden:
        outputs.insert(0, helper.make_tensor_value_info("h", TensorProto.FLOAT, [*shape, dim]))
    graph = helper.make_graph(
        nodes,
        "tied",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, shape)],
        outputs,
        [table],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
