"""How many float inputs of target ops a quantized model quantizes, read off the model alone.

Independent of the planner (`onnxq.graph.plan`): a target-op input is an *activation* when it
depends on a graph input (of the main graph or of a subgraph; weights depend only on
initializers and Constants); it is *quantized* when it is produced by an onnxq activation
node (QuantizeDequantizeMX, or DequantizeMX whose codes come from a QuantizeMX) or a
QuantizeLinear -> DequantizeLinear pair whose input is that activation, or by a Pad whose
data input is quantized so (the graph pass quantizes before a Pad that leaves the tile axis
alone: `onnxq.graph.commute`).
"""

from __future__ import annotations

import onnx

TARGETS = {  # op type -> the input positions that are reduced (what the pass may quantize)
    "MatMul": (0, 1),
    "Gemm": (0, 1),
    "Conv": (0, 1),
    "ConvTranspose": (0, 1),
    "LSTM": (0, 1, 2),
    "GRU": (0, 1, 2),
    "RNN": (0, 1, 2),
}
FUSED_TARGETS = {"MatMulMX": (0,)}  # onnxq's MatMul on a packed B: A is the activation


def _graphs(graph: onnx.GraphProto) -> list[onnx.GraphProto]:
    found = [graph]
    for node in graph.node:
        for attr in node.attribute:
            subs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
            for sub in subs:
                found += _graphs(sub)
    return found


def _dynamic(graphs: list[onnx.GraphProto]) -> set[str]:
    """Names that depend on some graph input (subgraph inputs included), to a fixed point."""
    inits = {t.name for g in graphs for t in g.initializer}
    dynamic = {i.name for g in graphs for i in g.input if i.name not in inits}
    nodes = [n for g in graphs for n in g.node]
    changed = True
    while changed:
        changed = False
        for node in nodes:
            has_sub = any(a.type in (a.GRAPH, a.GRAPHS) for a in node.attribute)
            if (has_sub or any(i in dynamic for i in node.input if i)) and not all(
                o in dynamic for o in node.output if o
            ):
                dynamic.update(o for o in node.output if o)
                changed = True
    return dynamic


def activation_share(model: onnx.ModelProto) -> tuple[int, int, list[str]]:
    """(quantized, activations, the activations left float) over every target-op input."""
    graphs = _graphs(model.graph)
    producer = {o: n for g in graphs for n in g.node for o in n.output if o}
    dynamic = _dynamic(graphs)

    def source(name: str) -> tuple[str, bool]:
        """The float tensor behind ``name`` and whether an activation quantizer made it."""
        node = producer.get(name)
        if node is None:
            return name, False
        if node.op_type == "Pad" and node.domain in ("", "ai.onnx") and node.input[0]:
            inner, done = source(node.input[0])
            if done:
                return inner, True
        if node.domain == "onnxq" and node.op_type == "QuantizeDequantizeMX":
            return node.input[0], True
        q = producer.get(node.input[0]) if node.input else None
        if node.op_type == "DequantizeMX" and q is not None and q.op_type == "QuantizeMX":
            return q.input[0], True
        if node.op_type == "DequantizeLinear" and q is not None and q.op_type == "QuantizeLinear":
            return q.input[0], True
        return name, False

    quantized, total, missed = 0, 0, []
    for g in graphs:
        for node in g.node:
            if node.domain == "onnxq" and node.op_type in FUSED_TARGETS:
                positions = FUSED_TARGETS[node.op_type]
            elif node.domain in ("", "ai.onnx") and node.op_type in TARGETS:
                positions = TARGETS[node.op_type]
            else:
                continue
            for index in positions:
                if index >= len(node.input) or not node.input[index]:
                    continue
                name, done = source(node.input[index])
                if name not in dynamic:
                    continue  # a weight
                total += 1
                quantized += done
                if not done:
                    missed.append(f"{node.name or node.op_type} input {index}: {name}")
    return quantized, total, missed
