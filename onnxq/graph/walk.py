"""Walking an ONNX graph: a node's attributes as values, and every subgraph inside a graph.

The one place that knows how subgraphs hang off nodes (If, Loop, Scan bodies in GRAPH and
GRAPHS attributes) and how attribute protos become Python values.
"""

import heapq
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


def _subgraph_reads(node: onnx.NodeProto) -> set[str]:
    """Every name a node's subgraphs (at any depth) read: a superset of their outer reads."""
    reads: set[str] = set()
    for sub in node_subgraphs(node):
        for graph in walk_graphs(sub):
            for inner in graph.node:
                reads.update(inner.input)
    return reads


def sort_nodes(graph: onnx.GraphProto) -> bool:
    """Put ``graph``'s nodes (and its subgraphs') in topological order, in place.

    onnxruntime runs a graph whose nodes are out of order, and converters write such graphs
    (onnxruntime's own float16 converter appends its input Casts at the end); onnx.checker
    and the passes that walk nodes in order need them sorted. The order is stable: a node
    moves only after what it reads (its subgraphs' reads of this graph's values included).
    A graph that has no such order (a cycle, a value made twice) is left as it is, for the
    checker to report.

    Returns:
        True when a node moved.
    """
    moved = False
    for sub_graph in (s for n in graph.node for s in node_subgraphs(n)):
        moved = sort_nodes(sub_graph) or moved
    producer: dict[str, int] = {}
    for i, node in enumerate(graph.node):
        for name in node.output:
            if name:
                if name in producer:
                    return moved
                producer[name] = i
    needs = [
        {producer[n] for n in (*node.input, *_subgraph_reads(node)) if n in producer} - {i}
        for i, node in enumerate(graph.node)
    ]
    if all(all(j < i for j in deps) for i, deps in enumerate(needs)):
        return moved
    users: dict[int, list[int]] = {}
    waiting = [len(deps) for deps in needs]
    for i, deps in enumerate(needs):
        for j in deps:
            users.setdefault(j, []).append(i)
    ready = [i for i, w in enumerate(waiting) if w == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for k in users.get(i, ()):
            waiting[k] -= 1
            if waiting[k] == 0:
                heapq.heappush(ready, k)
    if len(order) != len(needs):  # a cycle
        return moved
    nodes = [graph.node[i] for i in order]
    copies = [onnx.NodeProto() for _ in nodes]
    for copy, node in zip(copies, nodes, strict=True):
        copy.CopyFrom(node)
    del graph.node[:]
    graph.node.extend(copies)
    return True
