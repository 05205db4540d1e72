"""A quantized model declares what the float model declared plus its onnxq outputs' types.

Shape inference (onnx's version converter, `infer_shapes` before a session) writes a
value_info for every tensor. onnxruntime infers those itself, but it fuses differently when a
model brings them (MiniLM-L3 gained SkipLayerNormalization nodes and ran 4-6% slower on one
thread), so the graph pass and the session model drop them again
(`onnxq.graph.walk.trim_value_info`); onnxq outputs keep theirs, which onnxruntime needs.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxq.graph.ort_session import session
from onnxq.graph.quantize import quantize_model
from tests.graph.handed import handed_model

pytestmark = pytest.mark.needs_custom_ops


def _model(declared: bool) -> onnx.ModelProto:
    """ids -> Gather(table) -> MatMul(w) -> Relu -> MatMul(w2) -> y, ai.onnx opset 17."""
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.standard_normal((50, 64)).astype(np.float32), "table"),
        numpy_helper.from_array(rng.standard_normal((64, 64)).astype(np.float32), "w"),
        numpy_helper.from_array(rng.standard_normal((64, 32)).astype(np.float32), "w2"),
    ]
    nodes = [
        helper.make_node("Gather", ["table", "ids"], ["emb"], name="gather"),
        helper.make_node("MatMul", ["emb", "w"], ["h"], name="mm1"),
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        helper.make_node("MatMul", ["r", "w2"], ["y"], name="mm2"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["b", "s"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", "s", 32])],
        inits,
        value_info=(
            [helper.make_tensor_value_info("h", TensorProto.FLOAT, ["b", "s", 64])]
            if declared
            else []
        ),
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _onnxq_outputs(model: onnx.ModelProto) -> set[str]:
    return {o for n in model.graph.node if n.domain == "onnxq" for o in n.output if o}


@pytest.mark.parametrize("declared", [False, True])
def test_quantized_model_declares_only_onnxq_outputs_and_the_originals(declared: bool) -> None:
    q = quantize_model(_model(declared), weights="mxfp4", activations="mxfp8")
    names = {v.name for v in q.graph.value_info}
    custom = _onnxq_outputs(q)
    assert custom, "the pass should have written onnxq nodes"
    assert custom - {o.name for o in q.graph.output} <= names  # onnxruntime needs these
    assert names <= custom | ({"h"} if declared else set())
    assert ("h" in names) == declared  # a declaration of the float model stays
    ids = np.array([[1, 7, 49]], dtype=np.int64)
    assert session(q).run(None, {"ids": ids})[0].shape == (1, 3, 32)


def test_session_model_declares_only_onnxq_outputs() -> None:
    """Weights decoded at load; GatherMX stays a custom op, so inference runs and is trimmed."""
    q = quantize_model(_model(False), weights="mxfp4")
    assert any(n.op_type == "GatherMX" for n in q.graph.node)
    loaded = handed_model(q)
    names = {v.name for v in loaded.graph.value_info}
    custom = _onnxq_outputs(loaded)
    assert custom == {"emb"}  # GatherMX's output; the decoded weights are initializers now
    assert "emb" in names
    assert names <= custom | {v.name for v in q.graph.value_info}  # nothing inferred added
    assert not names & {"h", "r"}  # what inference types (the standard ops' outputs)
