"""Reading a quantized model back: its quantized tensors, their formats and sizes.

`inspect_model` lists every tensor a model stores quantized (a weight decoded by a DequantizeMX,
CodebookLookup or DequantizeLinear node from stored inputs) or quantizes at run time (an
activation decoded by an onnxq op from a computed input, or quantized and decoded in one
QuantizeDequantizeMX node), the activations the quantizer left in float with the reason
(``onnxq_skipped``), and the weights' bytes as float and as stored. Nothing here reads
external data: sizes come from each tensor's dims and type. ``onnxq inspect`` prints what it
returns. `cuda_placement` says which of its onnxq nodes onnxruntime's CUDA provider would run
on the library's GPU kernels, and why the others would run on the CPU.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import onnx

from onnxq.formats.datatype import datatype, datatypes
from onnxq.graph.load_decode import foldable
from onnxq.graph.schemas import DOMAIN, OPS
from onnxq.graph.tiling import reshaped_outputs
from onnxq.graph.walk import node_attrs, stored_tensors, walk_graphs

__all__ = [
    "CONSTANT_WEIGHT",
    "DECODE_OPS",
    "CudaPlacement",
    "MalformedNodeError",
    "ModelSummary",
    "QuantizedTensor",
    "cuda_placement",
    "data_files",
    "file_bytes",
    "format_name",
    "inspect_model",
    "quantized_tensor",
    "skipped_activations",
    "tensor_bytes",
]

# The onnxq ops that decode a quantized tensor: packed codes Q in, values Y out.
DECODE_OPS = tuple(n for n, s in OPS.items() if "Q" in s.inputs and s.outputs == ("Y",))
# The onnxq op that quantizes an activation and decodes it in one node (docs/ops.md).
FUSED_ACTIVATION_OP = "QuantizeDequantizeMX"
_STANDARD = ("", "ai.onnx")
# Sub-byte element types that numpy's itemsize would overstate.
_ELEM_BITS = {onnx.TensorProto.INT4: 4, onnx.TensorProto.UINT4: 4}
if hasattr(onnx.TensorProto, "FLOAT4E2M1"):
    _ELEM_BITS[onnx.TensorProto.FLOAT4E2M1] = 4


class MalformedNodeError(ValueError):
    """A decoding node whose attributes no onnxq op would accept (no or a bad ``dtype``)."""


@dataclasses.dataclass(frozen=True)
class QuantizedTensor:
    """One quantized tensor of a model: a stored weight or a run-time activation.

    ``name`` is the decoding node's first output; ``format`` a preset name or data type code
    (``"int8 block 32"``, ``"int8 axis 1"`` or ``"int8 tensor"`` for DequantizeLinear);
    ``shape`` the decoded dims, -1 for a dim known only at run time (``numel`` is then 0);
    ``output_bits`` the bits per value of the decoded float output; ``stored`` the names of
    the node's stored inputs (empty for activations). ``nbytes`` is the stored bytes of a
    weight (None for activations); ``bits_per_value`` is ``8 * nbytes / numel`` for a weight
    and the format's bits per value for an activation (None when unknown or ``numel`` is 0).
    A weight tiled in another shape and restored by a ``Reshape`` (conv weights with a short
    reduction axis, `onnxq.graph.tiling`) has the Reshape's output as ``name`` and ``shape``
    and the decoded shape as ``tiled_shape`` (None otherwise).
    """

    name: str
    kind: str  # "weight" or "activation"
    format: str
    shape: tuple[int, ...]
    numel: int
    output_bits: int
    stored: tuple[str, ...]
    nbytes: int | None
    bits_per_value: float | None
    tiled_shape: tuple[int, ...] | None = None


@dataclasses.dataclass(frozen=True)
class ModelSummary:
    """What `inspect_model` finds: counts, onnxq metadata, quantized tensors and weight bytes.

    ``float_bytes`` is the bytes every stored tensor would take with the quantized weights
    decoded to their output type; ``stored_bytes`` the bytes stored tensors take as they are.
    """

    nodes: int  # nodes of the main graph
    stored_tensors: int  # initializers and Constant values, subgraphs included
    metadata: dict[str, str]  # the metadata_props whose keys start with "onnxq"
    tensors: list[QuantizedTensor]
    float_bytes: int
    stored_bytes: int
    skipped: list[dict[str, str]] = dataclasses.field(default_factory=list)

    @property
    def activations(self) -> int:
        """How many activations the model quantizes at run time."""
        return sum(t.kind == "activation" for t in self.tensors)


def tensor_bytes(tensor: onnx.TensorProto) -> int:
    """Bytes a tensor's data takes, from its dims and type (no data is read)."""
    if tensor.data_type == onnx.TensorProto.STRING:
        return sum(len(s) for s in tensor.string_data)
    bits = _ELEM_BITS.get(tensor.data_type)
    if bits is None:
        try:
            bits = 8 * onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
        except (KeyError, ValueError, TypeError):  # an unknown element type: what is stored
            return len(tensor.raw_data)
    return math.ceil(math.prod(tensor.dims) * bits / 8)


def data_files(model: onnx.ModelProto) -> list[str]:
    """The external data files the model's initializers name (relative paths, sorted)."""
    names = {
        e.value
        for g in walk_graphs(model.graph)
        for t in g.initializer
        for e in t.external_data
        if e.key == "location"
    }
    return sorted(names)


def file_bytes(path: Path, model: onnx.ModelProto) -> int:
    """Size of the model file plus the external data files it references (missing ones: 0)."""
    total = path.stat().st_size
    for name in data_files(model):
        data = path.parent / name
        total += data.stat().st_size if data.is_file() else 0
    return total


def format_name(text: str) -> str:
    """A format as users name it: the preset for a code that has one (shortest alias)."""
    try:
        code = datatype(text).code
    except (ValueError, TypeError):
        return text
    names = sorted((len(n), n) for n, dt in datatypes().items() if dt.code == code)
    return names[0][1] if names else text


def skipped_activations(metadata: Mapping[str, str]) -> list[dict[str, str]]:
    """The ``onnxq_skipped`` entries (tensor, consumers, reason) of a model's metadata.

    The metadata is untrusted: anything but a JSON list of mappings gives one entry saying so.
    """
    text = metadata.get("onnxq_skipped")
    if text is None:
        return []
    try:
        entries = json.loads(text)
    except ValueError:
        entries = None
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        return [{"tensor": "?", "consumers": "", "reason": "unreadable onnxq_skipped metadata"}]
    keys = ("tensor", "consumers", "reason")
    return [{k: str(e.get(k, "")) for k in keys} for e in entries]


def _value_dims(graph: onnx.GraphProto) -> dict[str, tuple[int, ...]]:
    """Declared dims of the graph's tensors, -1 for a dim not known before run time."""
    dims = {}
    for info in (*graph.input, *graph.value_info, *graph.output):
        t = info.type.tensor_type
        if t.HasField("shape"):
            dims[info.name] = tuple(
                d.dim_value if d.HasField("dim_value") and d.dim_value >= 0 else -1
                for d in t.shape.dim
            )
    return dims


def inspect_model(model: onnx.ModelProto) -> ModelSummary:
    """The quantized tensors, skipped activations and weight sizes of ``model`` (subgraphs too).

    Raises:
        MalformedNodeError: an onnxq decoding node has no ``dtype`` or a bad one.
    """
    stored = stored_tensors(model)
    packed: set[str] = set()
    tensors = []
    float_bytes = 0
    for graph in walk_graphs(model.graph):
        reshaped = reshaped_outputs(graph, stored)
        shapes = _value_dims(graph)
        for node in graph.node:
            found = quantized_tensor(node, stored, shapes)
            if found is None:
                continue
            fused = node.op_type in ("GatherMX", "MatMulMX")
            if fused and found.stored and set(found.stored) <= packed:
                continue  # fused nodes that share one packed table (tied embeddings): listed once
            restored = reshaped.get(found.name) if found.stored else None
            if restored is not None and math.prod(restored[1]) == found.numel:
                found = dataclasses.replace(
                    found, name=restored[0], shape=restored[1], tiled_shape=found.shape
                )
            if found.stored:
                packed.update(found.stored)
                float_bytes += found.numel * found.output_bits // 8
            tensors.append(found)
    float_bytes += sum(tensor_bytes(t) for n, t in stored.items() if n not in packed)
    meta = {p.key: p.value for p in model.metadata_props if p.key.lower().startswith("onnxq")}
    return ModelSummary(
        nodes=len(model.graph.node),
        stored_tensors=len(stored),
        metadata=meta,
        tensors=tensors,
        float_bytes=float_bytes,
        stored_bytes=sum(tensor_bytes(t) for t in stored.values()),
        skipped=skipped_activations(meta),
    )


@dataclasses.dataclass
class CudaPlacement:
    """Where onnxruntime's CUDA provider would run a model's onnxq nodes (`cuda_placement`).

    ``kernels``: the nodes on the library's GPU kernels; ``cpu``: the names of the others by
    reason (a format, mode or GatherMX table without kernels takes the node's CPU kernel on
    host copies; MatMulMX has no CUDA kernel; a library built without GPU kernels registers
    none, so every node is there); ``unknown``: why nothing could be said (the library is
    missing or too old), else "".
    """

    kernels: int = 0
    cpu: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    unknown: str = ""

    @property
    def nodes(self) -> int:
        """The onnxq nodes of the model."""
        return self.kernels + sum(len(v) for v in self.cpu.values())

    @property
    def cpu_at_run(self) -> int:
        """The nodes on the CPU at each run under `onnxq.runtime.session` (no constant weights)."""
        return sum(len(v) for w, v in self.cpu.items() if not w.startswith(CONSTANT_WEIGHT))


# How `cuda_placement` marks the decoder of a constant weight
CONSTANT_WEIGHT = "a constant weight (onnxq.runtime.session decodes it once, at creation)"


_MODE_ATTRS = ("round_mode", "scale_mode", "nan_policy", "int_range")


def cuda_placement(model: onnx.ModelProto) -> CudaPlacement:
    """Which onnxq nodes (subgraphs too) the library's GPU kernels run on the CUDA provider.

    Decided from each node's op type, ``dtype`` and mode attributes as the library decides at
    session creation (`onnxq.cast.cuda_aot.node_support`); needs no GPU. The shapes do not
    matter (tiles along any axis run on the kernels) but for GatherMX, whose table's shape
    and axis attributes are passed too. A node the ops would refuse is listed under its error.
    A decoder of a constant weight in the main graph is listed as such: `onnxq.runtime.session`
    decodes it once, when the session is created.
    """
    nodes = [
        node
        for graph in walk_graphs(model.graph)
        for node in graph.node
        if node.domain == DOMAIN and node.op_type in OPS
    ]
    found = CudaPlacement()
    if not nodes:
        return found
    # what onnxq.runtime.session decodes at creation: main-graph decoders (foldable returns
    # copies, so by output name)
    folded = {fold.node.output[0] for fold in foldable(model)}
    weights = {id(n) for n in model.graph.node if n.output and n.output[0] in folded}
    try:
        from onnxq.cast import cuda_aot

        count, text = cuda_aot.info()
        if count and not hasattr(cuda_aot._lib(), "onnxq_cuda_node_support_shape"):
            found.unknown = "the native library predates onnxq_cuda_node_support_shape; rebuild it"
    except RuntimeError as err:
        found.unknown = str(err)
    if found.unknown:
        return found
    if count == 0:  # no CUDA registrations: onnxruntime runs every onnxq node on the CPU
        for node in nodes:
            why = f"{CONSTANT_WEIGHT}: {text}" if id(node) in weights else text
            found.cpu.setdefault(why, []).append(node.name or node.op_type)
        return found
    for node in nodes:
        attrs = _attrs(node)
        modes = {k: str(attrs[k]) for k in _MODE_ATTRS if k in attrs}
        try:
            dtype = str(attrs.get("dtype", attrs.get("onnxq_dtype", "")))
            table: dict[str, Any] = {}
            if node.op_type == "GatherMX":
                table = dict(shape=attrs.get("shape", []), axis=attrs.get("axis", -1))
            why = cuda_aot.node_support(node.op_type, dtype, **modes, **table)
        except ValueError as err:
            why = f"refused by the ops: {err}"
        if why and id(node) in weights:
            why = f"{CONSTANT_WEIGHT}: {why}"
        if why:
            found.cpu.setdefault(why, []).append(node.name or node.op_type)
        else:
            found.kernels += 1
    return found


def quantized_tensor(
    node: onnx.NodeProto,
    stored: Mapping[str, onnx.TensorProto],
    shapes: Mapping[str, tuple[int, ...]] | None = None,
) -> QuantizedTensor | None:
    """The tensor a node decodes, or None when the node decodes none.

    ``stored`` holds the model's stored tensors by name (`onnxq.graph.walk.stored_tensors`);
    ``shapes`` the declared dims of tensors (-1 where unknown), for the shape of an activation
    whose node does not state it (a ``Shape`` input, QuantizeDequantizeMX).

    Raises:
        MalformedNodeError: an onnxq decoding node has no ``dtype`` or a bad one.
    """
    fused = node.domain == DOMAIN and node.op_type == FUSED_ACTIVATION_OP
    if node.domain == DOMAIN and (node.op_type in DECODE_OPS or fused):
        fmt, shape, out_type, q_index = _onnxq_decoder(node)
        if not shape and node.output and shapes is not None:
            shape = list(shapes.get(node.output[0], ()))
    elif node.op_type == "DequantizeLinear" and node.domain in _STANDARD:
        if not node.input or node.input[0] not in stored:
            return None
        fmt, shape, out_type = _dequantize_linear(node, stored)
        q_index = 0  # x, the quantized input
    else:
        return None
    numel = math.prod(shape) if all(d >= 0 for d in shape) else 0
    try:
        out_bits = 8 * onnx.helper.tensor_dtype_to_np_dtype(out_type).itemsize
    except (KeyError, ValueError, TypeError):  # not a float type: the node is broken
        out_bits = 32
    if not node.output:
        return None
    common = {"name": node.output[0], "format": fmt, "shape": tuple(shape), "numel": numel}
    if q_index >= 0 and len(node.input) > q_index and node.input[q_index] in stored:
        inputs = tuple(i for i in node.input[q_index:] if i and i in stored)  # not Indices
        if q_index > 0:  # MatMulMX / GatherMX: the weight's name, from its codes' (`W__q`)
            q_name = node.input[q_index]
            common["name"] = q_name[: -len("__q")] if q_name.endswith("__q") else q_name
        nbytes = sum(tensor_bytes(stored[i]) for i in inputs)
        bits = 8 * nbytes / numel if numel else None
        return QuantizedTensor(
            **common,
            kind="weight",
            output_bits=out_bits,
            stored=inputs,
            nbytes=nbytes,
            bits_per_value=bits,
        )
    try:
        bits = datatype(fmt).bits_per_value
    except ValueError:
        bits = None
    return QuantizedTensor(
        **common,
        kind="activation",
        output_bits=out_bits,
        stored=(),
        nbytes=None,
        bits_per_value=bits,
    )


def _onnxq_decoder(node: onnx.NodeProto) -> tuple[str, list[int], int, int]:
    """(format name, shape, output element type, position of Q) of an onnxq decoding node."""
    attrs = _attrs(node)
    shape = [int(d) for d in attrs.get("shape", [])]
    label = node.name or node.op_type
    if "dtype" not in attrs:
        raise MalformedNodeError(
            f"node {label!r} ({node.op_type}) has no dtype attribute: "
            "the model is malformed; quantize the float model again"
        )
    try:  # the attribute is untrusted: a code the ops would refuse is an error, not a label
        fmt = format_name(datatype(str(attrs["dtype"])).name)
    except ValueError as err:
        raise MalformedNodeError(f"node {label!r}: bad dtype: {err}") from None
    out_type = int(attrs.get("output_type", onnx.TensorProto.FLOAT))
    if node.op_type == FUSED_ACTIVATION_OP:  # Y has X's type; it reads no stored codes
        return fmt, shape, out_type, -1
    return fmt, shape, out_type, OPS[node.op_type].inputs.index("Q")


def _dequantize_linear(
    node: onnx.NodeProto, stored: Mapping[str, onnx.TensorProto]
) -> tuple[str, list[int], int]:
    """(format, shape, output element type) of a DequantizeLinear node with a stored input."""
    attrs = _attrs(node)
    x = stored[node.input[0]]
    elem = onnx.TensorProto.DataType.Name(x.data_type).lower()
    block = attrs.get("block_size", 0)
    fmt = f"{elem} block {block}" if block else f"{elem} axis {attrs.get('axis', 1)}"
    out_type: int = onnx.TensorProto.FLOAT
    if len(node.input) > 1 and node.input[1] in stored:  # x_scale: its type is the output's
        out_type = stored[node.input[1]].data_type
        if not stored[node.input[1]].dims:
            fmt = f"{elem} tensor"
    return fmt, list(x.dims), out_type


def _attrs(node: onnx.NodeProto) -> dict[str, Any]:
    """`node_attrs`, with string attributes that are not UTF-8 read with U+FFFD replacements.

    A model's bytes need not be UTF-8; the format parser then refuses the replaced ``dtype``.
    """
    try:
        return node_attrs(node)
    except UnicodeDecodeError:
        clean = onnx.NodeProto()
        clean.CopyFrom(node)
        for attr in clean.attribute:
            if attr.type == onnx.AttributeProto.STRING:
                attr.s = attr.s.decode(errors="replace").encode()
        return node_attrs(clean)
