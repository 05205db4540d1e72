"""Walking an ONNX graph: a node's attributes as values, and every subgraph inside a graph.

The one place that knows how subgraphs hang off nodes (If, Loop, Scan bodies in GRAPH and
GRAPHS attributes) and how attribute protos become Python values.
"""

from collections.abc import Iterator
from typing import Any

import onnx


def node_attrs(node: onnx.NodeProto) -> dict[str, Any]:
    """The node's attributes by name as Python values; byte strings decoded as UTF-8."""
    values = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    return {k: v.decode() if isinstance(v, bytes) else v for k, v in values.items()}


def node_subgraphs(node: onnx.NodeProto) -> Iterator[onnx.GraphProto]:
    """The graphs held directly by the node's attributes (not their nested subgraphs)."""
    for attr in node.attribute:
        if attr.HasField("g"):
            yield attr.g
        yield from attr.graphs


def walk_graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """The graph and every subgraph nested inside it, depth first, parents before children."""
    yield graph
    for node in graph.node:
        for sub in node_subgraphs(node):
            yield from walk_graphs(sub)


def stored_tensors(model: onnx.ModelProto) -> dict[str, onnx.TensorProto]:
    """Every initializer and Constant value in the model (subgraphs included), by name."""
    found: dict[str, onnx.TensorProto] = {}
    for graph in walk_graphs(model.graph):
        for tensor in graph.initializer:
            found[tensor.name] = tensor
        for node in graph.node:
            if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
                for attr in node.attribute:
                    if attr.name == "value" and attr.type == onnx.AttributeProto.TENSOR:
                        found[node.output[0]] = attr.t
    return found


def value_info_names(model: onnx.ModelProto) -> set[str]:
    """The names the model's value_info declares (subgraphs included)."""
    return {v.name for g in walk_graphs(model.graph) for v in g.value_info}


def trim_value_info(model: onnx.ModelProto, keep: set[str], domain: str) -> None:
    """Drop the value_info that shape inference added: keep ``keep`` and ``domain`` outputs.

    onnxruntime infers standard ops' shapes itself but changes its fusions when a model brings
    them (MiniLM-L3 gained three SkipLayerNormalization nodes, 4-6% slower on one thread), so
    a quantized model keeps the float model's declarations plus its custom ops' output types.
    """
    for g in walk_graphs(model.graph):
        custom = {o for n in g.node if n.domain == domain for o in n.output}
        kept = [v for v in g.value_info if v.name in keep or v.name in custom]
        if len(kept) != len(g.value_info):
            del g.value_info[:]
            g.value_info.extend(kept)
