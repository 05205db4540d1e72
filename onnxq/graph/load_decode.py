"""Decoding constant weights when a session is created (``session(decode_weights="load")``).

A ``DequantizeMX`` or ``CodebookLookup`` node of the main graph whose inputs are all constant
initializers decodes the same weight on every run. onnxruntime cannot see through it: the
consumer (MatMul, Gemm, Conv, LSTM, ...) reads a computed input, so onnxruntime neither
pre-packs the weight nor folds what follows it. Here those nodes run once, before the session
is created, in the op's own kernel (a small onnxruntime session of just those nodes with the
custom-op library, so the bits and the error messages are the op's), and the model handed to
onnxruntime carries each decoded weight as a plain initializer in the node's ``output_type``:
onnxruntime then treats it as the float model's weight and runs the float graph's kernels.

Memory (the float model's, not more): the decoded weights reach onnxruntime as an external
data file in a private temporary folder, written chunk by chunk (at most `CHUNK_BYTES` of
decoded values in memory at a time) and removed once the session exists. onnxruntime reads or
maps that file as it does a float model's external data, so the tensors it keeps are its own:
a weight it pre-packs is released after packing, as the float model's are, and no decoded copy
stays in this process. The packed initializers that only the decoded nodes read are left out
of the model onnxruntime receives; shape inference (which copies the whole model several
times) runs only when onnxq nodes remain, on a copy without the large payloads, and the heap
the packed model's parse leaves behind is handed back before onnxruntime loads
(`release_freed_memory`). Where no temporary file can be written (and off POSIX systems,
where a mapped file cannot be removed), the decoded weights go through an in-memory
external-data file instead (``add_external_initializers_from_files_in_memory``, under a name
unique to the session): onnxruntime copies it while the session is created, so creation
briefly holds the decoded weights twice.

Left to decode at run time (as with ``decode_weights="run"``): nodes inside subgraphs (If,
Loop, Scan bodies; a main-graph weight that a subgraph reads is folded, as an outer-scope
initializer), nodes whose output is a graph output, nodes with an input that is not a
constant initializer (a graph input, a computed tensor, a Constant node), nodes whose Y shape
is not given by the ``shape`` attribute or a small constant ``Shape`` input, and an output
larger than its packed inputs can describe (every element costs at least one bit of them: a
hostile ``shape`` then meets the op's own checks at run time instead of a huge allocation
here). Fused ops (MatMulMX, GatherMX) keep their packed inputs: they read the codes directly.
"""

from __future__ import annotations

import ctypes
import dataclasses
import math
import os
import re
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import onnx
from google.protobuf.message import Message
from onnx import TensorProto, numpy_helper

from onnxq._files import external_ref, load_external, read_array
from onnxq.graph.schemas import DOMAIN, infer_shapes, input_index
from onnxq.graph.walk import (
    node_attrs,
    node_subgraphs,
    trim_value_info,
    value_info_names,
    walk_graphs,
)

__all__ = [
    "CHUNK_BYTES",
    "DECODE_MODES",
    "SESSION_DTYPE",
    "Fold",
    "SessionModel",
    "foldable",
    "light_copy",
    "release_freed_memory",
    "rename_dtype",
    "session_model",
]

DECODE_MODES = ("load", "run")
# The name of the onnxq ops' `dtype` attribute in the model a session hands onnxruntime (the
# kernels read either): see `rename_dtype`.
SESSION_DTYPE = "onnxq_dtype"
CHUNK_BYTES = 64 << 20  # decoded bytes held in memory at a time when writing the file
_DECODERS = ("DequantizeMX", "CodebookLookup")
_STANDARD = ("", "ai.onnx")
_OUTPUT_BYTES = {TensorProto.FLOAT: 4, TensorProto.FLOAT16: 2, TensorProto.BFLOAT16: 2}
_ALIGN = 4096  # each decoded tensor starts on a page of the file: onnxruntime may map it
# Payloads at least this large stay out of shape inference; smaller ones (shape tensors)
# carry values that onnx's data propagation reads.
_LIGHT_BYTES = 1 << 12
# onnxruntime's text around a kernel's own message: keep the op's one line.
_OP_MESSAGE = re.compile(r"\[(?:DequantizeMX|CodebookLookup)\][^\n]*")
_DATA_FILE = "onnxq-decoded-weights.bin"
_MAX_RANK = 64  # the op's limit on X's rank
_MODEL_FILE = "model.onnx"


@dataclasses.dataclass(frozen=True)
class Fold:
    """One decoder run at load: the node, the initializer it becomes, what it replaces."""

    node: onnx.NodeProto
    name: str  # the initializer's name: the decoder's Y, or the output of a Reshape after it
    dims: tuple[int, ...]  # the initializer's dims
    y_dims: tuple[int, ...]  # the decoder's own output dims (the same element count)
    elem: int  # TensorProto element type (the node's output_type)
    reshape: onnx.NodeProto | None  # a constant Reshape that alone reads Y, folded with it

    @property
    def nbytes(self) -> int:
        """Bytes the decoded tensor takes."""
        return math.prod(self.dims) * _OUTPUT_BYTES[self.elem]


# ---------------------------------------------------------------- shape inference, lightly


def _copy_fields(source: Message, target: Message, skip: str) -> None:
    """Copy every set field of ``source`` but ``skip`` into ``target`` (the same type)."""
    for field, value in source.ListFields():
        if field.name == skip:
            continue
        if isinstance(value, Message):
            getattr(target, field.name).CopyFrom(value)
        elif isinstance(value, (str, bytes, int, float)):
            setattr(target, field.name, value)
        else:  # a repeated field
            getattr(target, field.name).extend(value)


def light_copy(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` whose big main-graph payloads are left out (headers remain).

    Initializers of `_LIGHT_BYTES` or more keep their name, type and dims but no data;
    `_restore` puts the payloads back. Shape inference on it does not copy them.
    """
    light = onnx.ModelProto()
    _copy_fields(model, light, "graph")
    _copy_fields(model.graph, light.graph, "initializer")
    for t in model.graph.initializer:
        light.graph.initializer.append(_header(t) if _is_big(t) else t)
    return light


def _is_big(t: TensorProto) -> bool:
    # From the declared dims: reading the payload (or ByteSize, which serializes) would copy it.
    return t.data_location != TensorProto.EXTERNAL and _declared_bytes(t) >= _LIGHT_BYTES


def _header(t: TensorProto) -> TensorProto:
    return TensorProto(name=t.name, data_type=t.data_type, dims=list(t.dims))


def _restore(model: onnx.ModelProto, source: onnx.ModelProto, folder: Path) -> None:
    """Give ``model``'s header initializers their payloads from ``source``; read external data.

    External references (a ModelProto's, relative to the working directory) are read here:
    the model onnxruntime receives lives in another folder.
    """
    full = {t.name: t for t in source.graph.initializer if _is_big(t)}
    for t in model.graph.initializer:
        if t.name in full and not t.HasField("raw_data") and t.data_location != t.EXTERNAL:
            t.CopyFrom(full[t.name])
    load_external(model, folder)


# ---------------------------------------------------------------- which nodes


def _sub_reads(graph: onnx.GraphProto) -> set[str]:
    """Names read by nodes inside the graph's subgraphs (outer-scope reads included)."""
    names: set[str] = set()
    for node in graph.node:
        for sub in node_subgraphs(node):
            for g in walk_graphs(sub):
                for n in g.node:
                    names.update(n.input)
    return names


def _declared_bytes(t: TensorProto) -> int:
    """Bytes a stored tensor's dims and type declare (0 when the type has no fixed size)."""
    try:
        size = onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
    except (KeyError, ValueError, TypeError):
        return 0
    return math.prod(t.dims) * size if all(d >= 0 for d in t.dims) else 0


def _small_ints(t: TensorProto | None) -> list[int] | None:
    """A stored int64 1-D tensor of at most `_MAX_RANK` values (a shape), else None."""
    if t is None or t.data_type != TensorProto.INT64 or len(t.dims) != 1:
        return None
    if t.data_location == TensorProto.EXTERNAL or not 0 <= t.dims[0] <= _MAX_RANK:
        return None
    try:
        return [int(v) for v in numpy_helper.to_array(t).reshape(-1)]
    except (ValueError, TypeError):  # a payload that does not match its dims
        return None


def _decoded_dims(node: onnx.NodeProto, constants: dict[str, TensorProto]) -> list[int] | None:
    """Y's dims as the op takes them: the ``Shape`` input's value, else the ``shape`` attribute.

    None when neither is usable here (the op decides at run time, and reports).
    """
    attrs = node_attrs(node)
    slot = input_index("DequantizeMX", "Shape")
    if node.op_type == "DequantizeMX" and len(node.input) > slot and node.input[slot]:
        dims = _small_ints(constants.get(node.input[slot]))
        given = attrs.get("shape")
        if dims is None or (given is not None and list(given) != dims):
            return None  # the op reports the disagreement
    else:
        given = attrs.get("shape")
        dims = [int(d) for d in given] if isinstance(given, list) else None
    if dims is None or not 1 <= len(dims) <= _MAX_RANK or any(d < 0 for d in dims):
        return None
    return dims


def _reshaped(dims: list[int], shape: list[int], allowzero: bool) -> list[int] | None:
    """ONNX Reshape's output dims for input ``dims`` and a constant ``shape``, None if invalid."""
    out: list[int] = []
    for i, d in enumerate(shape):
        if d == 0 and not allowzero:  # 0 copies the input's dim
            if i >= len(dims):
                return None
            d = dims[i]
        out.append(d)
    if out.count(-1) > 1 or any(d < -1 for d in out):
        return None
    total = math.prod(dims)
    if -1 in out:
        known = math.prod(d for d in out if d != -1)
        if known == 0 or total % known:
            return None
        out[out.index(-1)] = total // known
    return out if math.prod(out) == total else None


def _reshape_after(
    y: str,
    dims: list[int],
    readers: dict[str, list[onnx.NodeProto]],
    constants: dict[str, TensorProto],
    outputs: set[str],
    sub_reads: set[str],
) -> tuple[onnx.NodeProto, list[int]] | None:
    """The constant Reshape that alone reads ``y`` (a tiled conv weight), with its dims.

    A ``y`` that a subgraph also reads keeps its own initializer (no Reshape is folded).
    """
    users = readers.get(y, [])
    if len(users) != 1 or y in sub_reads:
        return None
    node = users[0]
    if node.op_type != "Reshape" or node.domain not in _STANDARD or len(node.input) != 2:
        return None
    if node.input[0] != y or len(node.output) != 1 or node.output[0] in outputs:
        return None
    shape = _small_ints(constants.get(node.input[1]))
    if not node.output[0] or shape is None:
        return None
    out = _reshaped(dims, shape, bool(node_attrs(node).get("allowzero", 0)))
    return None if out is None else (node, out)


def foldable(model: onnx.ModelProto) -> list[Fold]:
    """The main graph's decoder nodes that decode a constant weight, with what they become.

    Read from the nodes' attributes and constant inputs (no shape inference is needed).
    """
    graph = model.graph
    inputs = {v.name for v in graph.input}
    constants = {t.name: t for t in graph.initializer if t.name not in inputs}
    outputs = {v.name for v in graph.output}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in dict.fromkeys(node.input):
            readers.setdefault(name, []).append(node)
    sub_reads = _sub_reads(graph)
    folds: list[Fold] = []
    for node in graph.node:
        if node.domain != DOMAIN or node.op_type not in _DECODERS or len(node.output) != 1:
            continue
        y = node.output[0]
        named = {n for n in node.input if n}
        if not y or y in outputs or not named or not named <= constants.keys():
            continue
        dims = _decoded_dims(node, constants)
        elem = node_attrs(node).get("output_type", TensorProto.FLOAT)
        if dims is None or elem not in _OUTPUT_BYTES:
            continue
        count = math.prod(dims)
        if count == 0 or count > 8 * sum(_declared_bytes(constants[n]) for n in named):
            # empty (nothing to load), or more elements than bits: a hostile shape that the
            # op refuses at run time
            continue
        after = _reshape_after(y, dims, readers, constants, outputs, sub_reads)
        # Copies: a node of ``model`` would keep the whole model's memory alive.
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        if after is None:
            folds.append(Fold(copy, y, tuple(dims), tuple(dims), elem, None))
        else:
            reshape = onnx.NodeProto()
            reshape.CopyFrom(after[0])
            folds.append(Fold(copy, reshape.output[0], tuple(after[1]), tuple(dims), elem, reshape))
    return folds


# ---------------------------------------------------------------- decoding


def _array(tensor: TensorProto, folder: Path) -> np.ndarray:
    """A stored tensor's value; external data read from ``folder`` (checked)."""
    if tensor.data_location != TensorProto.EXTERNAL:
        return numpy_helper.to_array(tensor)
    ref = external_ref(tensor, folder)
    loaded = _header(tensor)
    raw = read_array(ref.path, ref.offset, ref.length, f"external data of {tensor.name!r}")
    loaded.raw_data = raw.tobytes()
    return numpy_helper.to_array(loaded)


def _decoder_model(model: onnx.ModelProto, folds: list[Fold]) -> onnx.ModelProto:
    """A model of just the decoder nodes, their packed inputs as graph inputs.

    Graph inputs rather than initializers: the kernel then decodes in Run, into the bound
    buffer, instead of decoding at creation and copying what it kept.
    """
    stored = {t.name: t for t in model.graph.initializer}
    inputs: dict[str, onnx.ValueInfoProto] = {}
    for f in folds:
        for name in f.node.input:
            if name and name not in inputs:
                t = stored[name]
                inputs[name] = onnx.helper.make_tensor_value_info(name, t.data_type, list(t.dims))
    outputs = [
        onnx.helper.make_tensor_value_info(f.node.output[0], f.elem, list(f.y_dims)) for f in folds
    ]
    graph = onnx.helper.make_graph(
        [f.node for f in folds], "onnxq_decode_weights", list(inputs.values()), outputs
    )
    out = onnx.helper.make_model(graph, opset_imports=list(model.opset_import))
    out.ir_version = model.ir_version
    return out


def _decode(
    source: onnx.ModelProto,
    folds: list[Fold],
    target: np.ndarray,
    offsets: list[int],
    library: str,
    folder: Path,
    threads: int,
) -> None:
    """Decode ``folds`` into ``target`` at ``offsets`` with the op's kernel (one Run).

    Raises:
        ValueError: the op refuses a node's inputs (its one-line message) or a stored tensor
            is malformed.
    """
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.register_custom_ops_library(library)
    options.enable_cpu_mem_arena = False
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    stored = {t.name: t for t in source.graph.initializer}
    try:
        sess = ort.InferenceSession(
            _decoder_model(source, folds).SerializeToString(),
            sess_options=options,
            providers=["CPUExecutionProvider"],
        )
        binding = sess.io_binding()
        for value in sess.get_inputs():
            binding.bind_cpu_input(value.name, _array(stored[value.name], folder))
        for f, offset in zip(folds, offsets, strict=True):
            binding.bind_output(
                f.node.output[0],
                "cpu",
                element_type=f.elem,
                shape=list(f.y_dims),
                buffer_ptr=target.ctypes.data + offset,
            )
        sess.run_with_iobinding(binding)
    except Exception as err:  # the op's one-line message, when it has one
        text = " ".join(str(err).split())
        found = _OP_MESSAGE.search(str(err))
        raise ValueError(
            (found.group(0) if found else text)
            + " (decoding constant weights when the session is created; decode_weights='run'"
            " defers the check to the first run)"
        ) from None


def _layout(folds: list[Fold]) -> tuple[list[int], int]:
    """Each decoded tensor's offset in the data file, and the file's size."""
    offsets: list[int] = []
    end = 0
    for f in folds:
        offsets.append(end)
        end += -(-f.nbytes // _ALIGN) * _ALIGN
    return offsets, end


def _chunks(folds: list[Fold]) -> Iterator[list[int]]:
    """Indices of ``folds`` in runs of at most `CHUNK_BYTES` decoded (one bigger alone)."""
    run: list[int] = []
    size = 0
    for i, f in enumerate(folds):
        if run and size + f.nbytes > CHUNK_BYTES:
            yield run
            run, size = [], 0
        run.append(i)
        size += -(-f.nbytes // _ALIGN) * _ALIGN
    if run:
        yield run


# ---------------------------------------------------------------- the model onnxruntime gets


def _strip(model: onnx.ModelProto, folds: list[Fold]) -> None:
    """Drop the folded nodes and the initializers only they read from ``model`` (in place)."""
    graph = model.graph
    # Nodes are matched by their outputs (SSA names): ``model`` may be a copy of the model
    # the folds were found in.
    gone = {(f.node.op_type, tuple(f.node.output)) for f in folds}
    gone |= {("Reshape", tuple(f.reshape.output)) for f in folds if f.reshape is not None}
    kept = [n for n in graph.node if (n.op_type, tuple(n.output)) not in gone]
    del graph.node[:]
    graph.node.extend(kept)
    read = {v.name for v in (*graph.output, *graph.input)} | _sub_reads(graph)
    for node in graph.node:
        read.update(node.input)
    candidates = {n for f in folds for n in f.node.input}
    candidates |= {f.reshape.input[1] for f in folds if f.reshape is not None}
    keep = [t for t in graph.initializer if t.name not in candidates or t.name in read]
    del graph.initializer[:]
    graph.initializer.extend(keep)


def _add_placeholders(
    model: onnx.ModelProto, folds: list[Fold], offsets: list[int], location: str
) -> None:
    for f, offset in zip(folds, offsets, strict=True):
        t = TensorProto(name=f.name, data_type=f.elem, dims=list(f.dims))
        t.data_location = TensorProto.EXTERNAL
        for key, value in (("location", location), ("offset", offset), ("length", f.nbytes)):
            entry = t.external_data.add()
            entry.key, entry.value = key, str(value)
        model.graph.initializer.append(t)


def release_freed_memory() -> None:
    """Hand the heap that freed protobuf messages leave behind back to the system (glibc).

    The packed model's parse lands in blocks that glibc keeps after they are freed (below its
    mmap threshold); onnxruntime then allocates the float weights beside them. Elsewhere (no
    ``malloc_trim``) nothing happens.
    """
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return
    trim.argtypes = [ctypes.c_size_t]
    trim(0)


@dataclasses.dataclass
class SessionModel:
    """What onnxruntime is given: a model file path or serialized bytes, and extra options.

    ``memory_file`` (name, buffer) is an in-memory external-data file to register with
    ``SessionOptions.add_external_initializers_from_files_in_memory``; ``folds`` the nodes
    that were decoded. `close` removes the temporary folder once the session exists.
    """

    model: str | bytes
    folds: list[Fold]
    memory_file: tuple[str, np.ndarray] | None = None
    workdir: Path | None = None
    custom_ops: bool = True  # onnxq nodes remain: the session needs the custom-op library

    def close(self) -> None:
        """Drop the decoded buffer and remove the temporary files (a mapped file stays valid)."""
        self.memory_file = None
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None


def _decode_to_file(
    model: onnx.ModelProto,
    folds: list[Fold],
    decode: Callable[[list[Fold], np.ndarray, list[int]], None],
    workdir: Path,
) -> str:
    """Decode into ``workdir``'s data file chunk by chunk; save the model beside it."""
    offsets, size = _layout(folds)
    with open(workdir / _DATA_FILE, "wb") as out:
        for run in _chunks(folds):
            chunk = [folds[i] for i in run]
            local, used = _layout(chunk)
            buffer = np.empty(max(used, 1), np.uint8)
            decode(chunk, buffer, local)
            for i, at in zip(run, local, strict=True):
                out.seek(offsets[i])
                out.write(memoryview(buffer)[at : at + folds[i].nbytes])
            del buffer
        out.truncate(size)
    _add_placeholders(model, folds, offsets, _DATA_FILE)
    path = workdir / _MODEL_FILE
    onnx.save_model(model, str(path))
    return str(path)


def _decode_to_memory(
    model: onnx.ModelProto,
    folds: list[Fold],
    decode: Callable[[list[Fold], np.ndarray, list[int]], None],
) -> SessionModel:
    """Decode into one buffer that onnxruntime reads as an in-memory external-data file."""
    offsets, size = _layout(folds)
    buffer = np.empty(max(size, 1), np.uint8)
    for run in _chunks(folds):
        decode([folds[i] for i in run], buffer, [offsets[i] for i in run])
    name = f"onnxq-decoded-{uuid.uuid4().hex}.bin"  # reused options never read it again
    _add_placeholders(model, folds, offsets, name)
    return SessionModel(model.SerializeToString(), folds, (name, buffer))


def session_model(
    source: onnx.ModelProto,
    library: str,
    folder: Path,
    threads: int = 0,
    *,
    use_file: bool | None = None,
) -> SessionModel:
    """The model for onnxruntime with its constant weights decoded (see the module docstring).

    Args:
        source: the model (not modified); external data is read from ``folder``.
        library: the custom-op library (`onnxq.graph.ort_session.library_path`).
        folder: where ``source``'s external data lives (checked: ``onnxq._files``).
        threads: the decoding session's intra-op threads (0: onnxruntime's default).
        use_file: decoded weights through a temporary file (True), in memory (False), or the
            file where the system can remove a mapped file and one can be written (None).

    Returns:
        The model to create the session from; call its ``close`` once the session exists.

    Raises:
        ValueError: a decoder node's inputs fail the op's checks (the op's one-line message),
            a malformed stored tensor, or a bad external-data reference.
    """
    folds = foldable(source)
    model = light_copy(source)
    _strip(model, folds)
    custom = any(n.domain == DOMAIN for g in walk_graphs(model.graph) for n in g.node)
    if custom:
        # onnxruntime needs the remaining onnxq outputs' types (see infer_shapes); the model
        # is light now (no packed payloads), so inference copies little
        declared = value_info_names(model)
        model = infer_shapes(model)
        trim_value_info(model, declared, DOMAIN)  # the rest would change onnxruntime's fusions
        rename_dtype(model)
    _restore(model, source, folder)
    if not folds:
        return SessionModel(model.SerializeToString(), folds, custom_ops=custom)

    def decode(chunk: list[Fold], target: np.ndarray, offsets: list[int]) -> None:
        _decode(source, chunk, target, offsets, library, folder, threads)

    if use_file is None:
        use_file = os.name == "posix"  # elsewhere a mapped file cannot be removed
    if use_file:
        workdir = None
        try:
            workdir = Path(tempfile.mkdtemp(prefix="onnxq-decoded-"))
            path = _decode_to_file(model, folds, decode, workdir)
            return SessionModel(path, folds, workdir=workdir, custom_ops=custom)
        except OSError:  # no writable temporary folder, or it is full: decode in memory
            _strip_placeholders(model, folds)
            if workdir is not None:
                shutil.rmtree(workdir, ignore_errors=True)
        except BaseException:
            if workdir is not None:
                shutil.rmtree(workdir, ignore_errors=True)
            raise
    result = _decode_to_memory(model, folds, decode)
    result.custom_ops = custom
    return result


def rename_dtype(model: onnx.ModelProto) -> None:
    """Rename the onnxq nodes' ``dtype`` attribute to `SESSION_DTYPE`, in place.

    onnxruntime's CPU provider runs a float16 node that sits between two nodes it must cast
    to float32 (a float16 Conv has no CPU kernel) in float32 as well, and then requires any
    ``dtype`` attribute of that node to be an integer (its InsertCastTransformer, up to at
    least 1.32): an activation cast between two float16 convolutions, whose ``dtype`` is a
    string, stopped the session ("InsertCastTransformer works on the assumption that `dtype`
    attribute holds an integer"). Under another name onnxruntime leaves the attribute alone
    and runs the cast in float32 between its Casts. Run after anything that reads ``dtype``.
    """
    for graph in walk_graphs(model.graph):
        for node in graph.node:
            if node.domain == DOMAIN:
                for attr in node.attribute:
                    if attr.name == "dtype":
                        attr.name = SESSION_DTYPE


def _strip_placeholders(model: onnx.ModelProto, folds: list[Fold]) -> None:
    """Remove the placeholders a failed file attempt may have added."""
    names = {f.name for f in folds}
    keep = [
        t
        for t in model.graph.initializer
        if not (t.name in names and t.data_location == TensorProto.EXTERNAL)
    ]
    del model.graph.initializer[:]
    model.graph.initializer.extend(keep)
