"""The graph pass: `quantize_model` makes a float ONNX model compute in onnxq formats.

It works in two steps (style.md item 10): `plan` walks every graph (subgraphs of If/Loop/Scan
included) and returns a `QuantPlan` - each weight and activation tensor with its data type,
tile axis and the reason - and `quantize_model` materialises it:

- weights (initializers, ``Constant`` outputs, subgraph and outer-scope initializers, reached
  through Transpose/Cast/Identity) are quantized once, along the consuming op's reduction axis
  mapped back through any Transpose. ``packed`` storage keeps the `onnxq.cast` compress-mode
  fields as uint8/16/32 initializers of the main graph and a ``DequantizeMX`` (``CodebookLookup``
  for codebooks) node, also in the main graph, that produces the float weight under its old name
  (subgraphs read it from the outer scope); ``fake`` storage replaces the values in place.
- activations get one ``QuantizeMX -> DequantizeMX`` pair per tensor, placed after its
  producer; the target consumers read the dequantized tensor. The onnxq ops need static
  shapes (DequantizeMX's ``shape`` attribute), so an activation with a symbolic dim is left in
  float and listed in the ``onnxq_skipped`` metadata.

``target="standard"`` writes no onnxq node: each packed weight becomes plain ai.onnx nodes
(``DequantizeLinear`` with ``block_size``, or ``Gather`` on a value table times the tile
scales; `onnxq.graph.lower`) with the same bits as the onnxq target's DequantizeMX, and each
block-format activation pair is replaced by its standard-ONNX function body (inlined
fallbacks of `onnxq.graph.functions`), so the whole model computes the onnxq target's bits.

Calibration (`onnxq.graph.calibrate`): without it ``QuantizeMX`` computes every activation
scale from the data at each call. With ``calibration`` (a directory of ``.npz`` inputs or an
iterable of input dicts), activations whose data type has one float scale per tensor
(int8_tensor, uint8_tensor, fp8e4_tensor, fp8e5_tensor, ...) are observed by running the float
model in onnxruntime (``minmax`` or ``percentile`` ranges) and get a static ``QuantizeLinear ->
DequantizeLinear`` pair with the calibrated scale (and zero point) instead, for both targets;
the ranges go to the ``onnxq_calibration`` metadata. Channel-scaled activations refuse
calibration (NotImplementedError); exponent and block scales (MX, BFP, NVFP4...) stay per call,
with a warning. ``target="standard"`` needs calibration for tensor-scaled activations and a
QuantizeMX fallback (exponent scales) for block-format ones.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import secrets
import tempfile
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, Literal

import numpy as np
import onnx
import onnx.inliner
from onnx import TensorProto, helper, numpy_helper

import onnxq
from onnxq import _output
from onnxq._files import (
    all_tensors,
    external_ref,
    load_external,
    open_regular,
    read_array,
    read_range,
)
from onnxq.formats.codebook import Codebook
from onnxq.formats.datatype import DataType
from onnxq.graph import calibrate
from onnxq.graph.functions import build_function
from onnxq.graph.lower import lower_weight
from onnxq.graph.recipe import ActivationEntry, QuantPlan, Recipe, WeightEntry, load_recipe
from onnxq.graph.schemas import DOMAIN, infer_shapes, output_types, register_schemas

__all__ = ["plan", "quantize_model"]

_FLOAT_TYPES = (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16)
_PASS_THROUGH = ("Transpose", "Cast", "Identity")
_OPSET = 21  # the function fallbacks are written in ai.onnx opset 21
_TWO_GB = 2**31 - 1
_STRIP_BYTES = 1 << 20  # initializers above this leave the model during shape inference
_EXTERNAL_BYTES = _TWO_GB // 2  # payloads from this size are saved with external data
_EXTERNAL_MIN = 1024  # with external data, tensors from this size go to the data file
_INLINE_BYTES = 1 << 16  # external tensors up to this size are loaded with the graph
_PARK_BYTES = 1 << 16  # while rewriting, new payloads above this wait on disk (_Spill)
_CHUNK = 64 << 20  # copy external payloads this much at a time
_SPILL = "<onnxq spill>"  # the location of a payload parked in the _Spill
_Q_OUT = ("q", "scale", "zero", "tenscale", "meta", "mask")

AxisFn = Callable[[int], int]


def _roles(node: onnx.NodeProto) -> list[tuple[int, bool, AxisFn]]:
    """(input index, weight only, reduction axis as a function of the input's rank)."""
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    last: AxisFn = lambda rank: rank - 1  # noqa: E731
    match node.op_type:
        case "MatMul":
            return [(0, False, last), (1, False, lambda rank: rank - 2 if rank >= 2 else 0)]
        case "Gemm":
            a = 0 if attrs.get("transA", 0) else 1
            b = 1 if attrs.get("transB", 0) else 0
            return [(0, False, lambda _r: a), (1, False, lambda _r: b)]
        case "Conv":
            return [(0, False, lambda _r: 1), (1, False, lambda _r: 1)]
        case "ConvTranspose":
            return [(0, False, lambda _r: 1), (1, False, lambda _r: 0)]
        case "LSTM" | "GRU" | "RNN":
            return [(0, False, last), (1, True, last), (2, True, last)]
        case "Gather":
            return [(0, True, last)] if attrs.get("axis", 0) == 0 else []
        case _:
            raise ValueError(f"op type {node.op_type!r} has no known reduction axes")


# -- graph index ------------------------------------------------------------------------------
@dataclasses.dataclass(eq=False)
class _Scope:
    graph: onnx.GraphProto
    parent: _Scope | None
    inits: dict[str, TensorProto]
    producers: dict[str, onnx.NodeProto]
    inputs: set[str]
    depth: int


def _scopes(graph: onnx.GraphProto, parent: _Scope | None = None) -> Iterator[_Scope]:
    scope = _Scope(
        graph,
        parent,
        {t.name: t for t in graph.initializer},
        {o: n for n in graph.node for o in n.output if o},
        {i.name for i in graph.input},
        0 if parent is None else parent.depth + 1,
    )
    yield scope
    for node in graph.node:
        for attr in node.attribute:
            for sub in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else attr.graphs:
                yield from _scopes(sub, scope)


def _lookup(scope: _Scope | None, name: str) -> tuple[_Scope | None, str]:
    """The scope that defines ``name`` and how: ``init``, ``node``, ``input`` or ``none``."""
    while scope is not None:
        if name in scope.producers:
            return scope, "node"
        if name in scope.inits:
            return scope, "init"
        if name in scope.inputs:
            return scope, "input"
        scope = scope.parent
    return None, "none"


@dataclasses.dataclass(frozen=True)
class _Source:
    scope: _Scope
    name: str
    tensor: TensorProto
    constant: onnx.NodeProto | None  # the Constant node that holds the tensor


def _trace(scope: _Scope, name: str) -> tuple[_Source, list[list[int] | None]] | None:
    """Follow Transpose/Cast/Identity back to a float initializer or Constant."""
    perms: list[list[int] | None] = []
    for _ in range(64):
        owner, kind = _lookup(scope, name)
        if owner is None or kind == "input":
            return None
        if kind == "init":
            tensor = owner.inits[name]
            return (_Source(owner, name, tensor, None), perms) if _is_weight(tensor) else None
        node = owner.producers[name]
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            attr = next((a for a in node.attribute if a.name == "value"), None)
            if attr is None or not _is_weight(attr.t):
                return None
            return _Source(owner, name, attr.t, node), perms
        if node.op_type not in _PASS_THROUGH or node.domain not in ("", "ai.onnx"):
            return None
        if node.op_type == "Transpose":
            perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), None)
            perms.append(perm)
        name, scope = node.input[0], owner
    return None


def _is_weight(tensor: TensorProto) -> bool:
    return tensor.data_type in _FLOAT_TYPES and len(tensor.dims) >= 1 and all(tensor.dims)


def _map_axis(axis: int, rank: int, perms: list[list[int] | None]) -> int:
    for perm in perms:  # consumer side first: output axis a reads input axis perm[a]
        axis = (perm or list(range(rank))[::-1])[axis]
    return axis


# -- planning ---------------------------------------------------------------------------------
def _tensor_types(model: onnx.ModelProto) -> dict[str, tuple[int, list[int | None] | None]]:
    """Tensor name -> (element type, dims with None for symbolic ones) across every graph."""
    found: dict[str, tuple[int, list[int | None] | None]] = {}
    for scope in _scopes(model.graph):
        g = scope.graph
        for info in [*g.input, *g.value_info, *g.output]:
            t = info.type.tensor_type
            dims = None
            if t.HasField("shape"):
                dims = [d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim]
            found[info.name] = (t.elem_type, dims)
        for init in g.initializer:
            found[init.name] = (init.data_type, list(init.dims))
    return found


def _node_label(node: onnx.NodeProto) -> str:
    return node.name or f"{node.op_type}({', '.join(node.output)})"


def plan(
    model: onnx.ModelProto,
    recipe: Recipe,
    types: Mapping[str, tuple[int, list[int | None] | None]] | None = None,
) -> QuantPlan:
    """What `quantize_model` would quantize in ``model`` (not modified), and why.

    Args:
        model: the float model.
        recipe: the choices (validated against the model's node names here).
        types: tensor element types and dims from shape inference; inferred when None.

    Returns:
        The plan: one entry per weight (shared weights once) and per activation tensor.

    Raises:
        ValueError: a recipe pattern matches no node.
    """
    scopes = list(_scopes(model.graph))
    recipe.check_nodes(n.name for s in scopes for n in s.graph.node)
    if types is None:
        types = _tensor_types(infer_shapes(model))
    weights: dict[tuple[int, str], dict[str, Any]] = {}
    acts: dict[str, dict[str, Any]] = {}
    for scope in scopes:
        for node in scope.graph.node:
            if node.domain not in ("", "ai.onnx"):
                continue
            choice = recipe.resolve(node.op_type, node.name)
            if choice is None:
                continue
            label = _node_label(node)
            for index, weight_only, axis_of in _roles(node):
                if index >= len(node.input) or not node.input[index]:
                    continue
                name = node.input[index]
                traced = _trace(scope, name)
                if traced is not None:
                    if choice.weights is None:
                        continue
                    source, perms = traced
                    rank = len(source.tensor.dims)
                    axis = choice.weight_axis if choice.weight_axis is not None else axis_of(rank)
                    if not -rank <= axis < rank:
                        raise ValueError(f"node {label!r}: weight axis {axis} is out of range")
                    axis = _map_axis(axis % rank, rank, perms)
                    key = (id(source.scope), source.name)
                    entry = weights.get(key)
                    if entry is None:
                        weights[key] = {
                            "source": source, "tensor": source.name, "dtype": choice.weights,
                            "axis": axis, "round_mode": choice.round_mode,
                            "scale_mode": choice.scale_mode, "consumers": [label],
                            "reason": f"{node.op_type} input {index}: reduction axis {axis}",
                        }  # fmt: skip
                    else:
                        entry["consumers"].append(label)
                        if entry["axis"] != axis or entry["dtype"] != choice.weights:
                            entry["reason"] += (
                                f"; also read by {label!r} wanting {choice.weights} axis {axis} "
                                "(quantized once, as first planned)"
                            )
                    continue
                if weight_only or choice.activations is None:
                    continue
                elem, shape = types.get(name, (TensorProto.FLOAT, None))
                rank = len(shape) if shape is not None else 2
                axis = (
                    choice.activation_axis if choice.activation_axis is not None else axis_of(rank)
                )
                if shape is not None:
                    axis %= max(rank, 1)
                entry = acts.get(name)
                if entry is None:
                    acts[name] = {
                        "tensor": name, "dtype": choice.activations, "axis": axis,
                        "round_mode": choice.round_mode, "scale_mode": choice.scale_mode,
                        "consumers": [label], "slots": [(node, index)], "scope": scope,
                        "elem_type": elem or TensorProto.FLOAT, "shape": shape,
                        "reason": f"{node.op_type} input {index}: reduction axis {axis}",
                    }  # fmt: skip
                else:
                    entry["consumers"].append(label)
                    entry["slots"].append((node, index))
    return QuantPlan(
        weights=tuple(_WeightPlan.make(e) for e in weights.values()),
        activations=tuple(_ActivationPlan.make(e) for e in acts.values()),
    )


@dataclasses.dataclass(frozen=True, kw_only=True)
class _WeightPlan(WeightEntry):
    source: _Source

    @classmethod
    def make(cls, e: dict[str, Any]) -> _WeightPlan:
        return cls(**{**e, "consumers": tuple(e["consumers"])})


@dataclasses.dataclass(frozen=True, kw_only=True)
class _ActivationPlan(ActivationEntry):
    slots: tuple[tuple[onnx.NodeProto, int], ...]
    scope: _Scope
    elem_type: int
    shape: list[int | None] | None

    @classmethod
    def make(cls, e: dict[str, Any]) -> _ActivationPlan:
        return cls(**{**e, "consumers": tuple(e["consumers"]), "slots": tuple(e["slots"])})


# -- model I/O --------------------------------------------------------------------------------
@contextlib.contextmanager
def _stripped(model: onnx.ModelProto) -> Iterator[dict[str, bytes]]:
    """Move large initializer payloads out while the model is serialized (2 GB protobuf limit)."""
    stash: dict[str, bytes] = {}
    for t in model.graph.initializer:
        if len(t.raw_data) > _STRIP_BYTES:
            stash[t.name] = t.raw_data
            t.ClearField("raw_data")
    try:
        yield stash
    finally:
        _restore(model, stash)


def _restore(model: onnx.ModelProto, stash: Mapping[str, bytes]) -> None:
    for t in model.graph.initializer:
        if t.name in stash and not t.raw_data:
            t.raw_data = stash[t.name]


def _load(
    model: str | os.PathLike[str] | onnx.ModelProto, output: Path | None = None
) -> tuple[onnx.ModelProto, _Spill | None]:
    """The model to rewrite, and the spill that keeps its payloads on disk (None: in memory).

    With an ``output`` the external data of a model path is not loaded: tensors over
    ``_INLINE_BYTES`` keep their references (made absolute) and are read one at a time when
    quantized or copied into the output, so memory stays bounded. Without one the returned
    model must hold everything, so external data is loaded as before.
    """
    if isinstance(model, onnx.ModelProto):
        copy = onnx.ModelProto()
        copy.CopyFrom(model)
        # A ModelProto has no folder: its external locations are relative to the working
        # directory (as onnxruntime reads them), and must stay inside it.
        base, loaded = Path.cwd(), copy
    elif isinstance(model, (str, os.PathLike)):
        path = Path(model)
        if not path.is_file():
            raise ValueError(f"model {str(path)!r} does not exist or is not a file")
        try:
            loaded = onnx.load(path, load_external_data=False)
        except Exception as err:
            raise ValueError(f"model {str(path)!r} is not a readable ONNX model: {err}") from None
        base = path.parent
    else:
        raise TypeError(f"model must be a path or an onnx.ModelProto, not {type(model).__name__}")
    if output is None:
        load_external(loaded, base)
        return loaded, None
    spill = _Spill(output.parent)
    _resolve_external(loaded, base, spill)
    return loaded, spill


class _Spill:
    """Payloads parked on disk while the model is rewritten (one weight in memory at a time).

    An anonymous temporary file (no name left behind, even if the process dies) in the output
    folder; tensors parked there refer to it by the location ``_SPILL``.
    """

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.file: Any = None
        self.had_external = False  # the input had external data: the output keeps it

    def _handle(self) -> Any:
        if self.file is None:
            where = self.folder if str(self.folder) and self.folder.is_dir() else None
            self.file = tempfile.TemporaryFile(dir=where)
        return self.file

    def put(self, tensor: TensorProto, data: np.ndarray | bytes) -> None:
        """Write ``data`` (the tensor's little-endian raw bytes) and point ``tensor`` at it."""
        f = self._handle()
        f.seek(0, os.SEEK_END)
        view = memoryview(data).cast("B") if isinstance(data, np.ndarray) else memoryview(data)
        offset = _aligned(f.tell(), view.nbytes)
        f.seek(offset)
        f.write(view)
        _point(tensor, _SPILL, offset, view.nbytes)

    def park(self, tensor: TensorProto) -> None:
        """Move a large raw_data payload out of ``tensor`` into the spill."""
        if tensor.data_location != TensorProto.EXTERNAL and tensor.HasField("raw_data"):
            data = tensor.raw_data
            if len(data) > _PARK_BYTES:
                self.put(tensor, data)

    def set_values(self, tensor: TensorProto, values: np.ndarray) -> None:
        """Replace ``tensor``'s values (same name) by ``values``, parked on disk."""
        values = np.ascontiguousarray(values)
        if values.dtype.byteorder == ">" or values.dtype not in _RAW_DTYPES:
            tensor.CopyFrom(numpy_helper.from_array(values, tensor.name))
            self.park(tensor)
            return
        tensor.data_type = helper.np_dtype_to_tensor_dtype(values.dtype)
        del tensor.dims[:]
        tensor.dims.extend(values.shape)
        self.put(tensor, values)

    def read(self, offset: int, length: int) -> np.ndarray:
        f = self._handle()
        f.flush()
        out = np.empty(length, np.uint8)
        f.seek(offset)
        if f.readinto(memoryview(out)) != length:
            raise ValueError("the spill file is shorter than expected")
        return out

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None


_RAW_DTYPES = tuple(
    np.dtype(d)
    for d in ("float32", "float16", "float64", "uint8", "int8", "uint16", "int16", "uint32",
              "int32", "int64")
)  # fmt: skip


def _aligned(position: int, size: int | None) -> int:
    """Large payloads start on a page (onnxruntime can map them), small ones on 64 bytes."""
    step = 4096 if size is None or size >= _STRIP_BYTES else 64
    return position + (-position % step)


def _is_external(tensor: TensorProto) -> bool:
    return tensor.data_location == TensorProto.EXTERNAL


def _external_info(tensor: TensorProto) -> tuple[str, int, int | None]:
    info = {e.key: e.value for e in tensor.external_data}
    if "location" not in info:
        raise ValueError(f"tensor {tensor.name!r} has external data without a location")
    length = int(info["length"]) if info.get("length") else None
    return info["location"], int(info.get("offset") or 0), length


def _point(tensor: TensorProto, location: str, offset: int, length: int) -> None:
    for field in ("raw_data", "float_data", "int32_data", "int64_data", "double_data",
                  "uint64_data", "external_data"):  # fmt: skip
        tensor.ClearField(field)
    tensor.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", str(offset)), ("length", str(length))):
        tensor.external_data.add(key=key, value=value)


def _resolve_external(model: onnx.ModelProto, base: Path, spill: _Spill) -> None:
    """Check every external reference against its file and make its location absolute.

    Locations must name regular files inside ``base`` and ranges inside them (`external_ref`).
    Tensors are read later, one at a time; small ones are loaded now (shape inference may
    read them).
    """
    for tensor in all_tensors(model):
        if not _is_external(tensor):
            continue
        spill.had_external = True
        ref = external_ref(tensor, base)
        if ref.length <= _INLINE_BYTES:
            data = read_range(ref.path, ref.offset, ref.length, f"external data of {tensor.name!r}")
            tensor.ClearField("external_data")
            tensor.data_location = TensorProto.DEFAULT
            tensor.raw_data = data
        else:
            _point(tensor, str(ref.path), ref.offset, ref.length)


def _external_bytes(tensor: TensorProto, spill: _Spill | None) -> np.ndarray:
    """One external tensor's bytes (uint8), read from the spill or its data file."""
    location, offset, length = _external_info(tensor)
    if location == _SPILL:
        if spill is None or length is None:
            raise ValueError(f"tensor {tensor.name!r} refers to a spill that is gone")
        return spill.read(offset, length)
    if length is None or not Path(location).is_absolute():  # `_resolve_external` sets both
        raise ValueError(f"external data of {tensor.name!r} was not checked before reading")
    return read_array(Path(location), offset, length, f"external data of {tensor.name!r}")


def _array(tensor: TensorProto, spill: _Spill | None) -> np.ndarray:
    """A tensor's values; an external payload is read now, this tensor only."""
    if not _is_external(tensor):
        return numpy_helper.to_array(tensor)
    data = _external_bytes(tensor, spill)
    dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.data_type))
    if dtype in _RAW_DTYPES:
        return data.view(dtype.newbyteorder("<")).astype(dtype, copy=False).reshape(tensor.dims)
    inline = TensorProto(name=tensor.name, dims=tensor.dims, data_type=tensor.data_type)
    inline.raw_data = data.tobytes()
    del data
    return numpy_helper.to_array(inline)


def _payload(model: onnx.ModelProto) -> int:
    """Bytes of tensor payload, held or external (decides external-data saving)."""
    total = 0
    for t in all_tensors(model):
        if _is_external(t):
            length = _external_info(t)[2]
            total += length if length is not None else 0
        else:
            total += len(t.raw_data)
    return total


def _copy_payload(tensor: TensorProto, spill: _Spill | None, out: Any) -> None:
    """Append ``tensor``'s external payload to ``out`` in chunks (never all in memory)."""
    location, offset, length = _external_info(tensor)
    if location == _SPILL:
        assert spill is not None and spill.file is not None and length is not None
        spill.file.flush()
        src, close = spill.file, False
    else:
        if length is None or not Path(location).is_absolute():  # `_resolve_external` sets both
            raise ValueError(f"external data of {tensor.name!r} was not checked before copying")
        src, size = open_regular(Path(location), f"external data of {tensor.name!r}")
        close = True
        if offset + length > size:
            src.close()
            raise ValueError(f"external data of {tensor.name!r} ends early (truncated?)")
    try:
        src.seek(offset)
        left = length
        while left:
            chunk = src.read(min(left, _CHUNK))
            if not chunk:
                raise ValueError(f"external data of {tensor.name!r} ends early")
            out.write(chunk)
            left -= len(chunk)
    finally:
        if close:
            src.close()
    return None


_DATA_MAGIC = b"onnxq external data v1\n".ljust(64, b"\0")  # marks data files onnxq wrote


def _save(
    model: onnx.ModelProto, output: Path, spill: _Spill | None = None, source: Path | None = None
) -> None:
    """Check the model and write it beside ``output`` so that a kill at any point is harmless.

    External data (when the input had it or the payload reaches ``_EXTERNAL_BYTES``) goes to
    a data file under a name that does not exist yet - ``{output.name}.data``, else
    ``{output.name}.{8 hex}.data`` - written tensor by tensor (parked and input payloads
    copied in chunks). Order: data file complete under its new name, then the model renamed
    onto ``output`` (the commit), then the data files no model refers to any more are removed
    (`_remove_stale_data`). A kill before the commit leaves the old model with its old data; a
    kill after it, the new model with its new data; temporary files and orphaned data are
    removed by the next run (`onnxq._output`). Otherwise one file, parked payloads read back.
    """
    folder = output.parent if str(output.parent) else Path(".")
    if not folder.is_dir():
        raise ValueError(f"output folder {str(folder)!r} does not exist")
    external = (spill is not None and spill.had_external) or _payload(model) >= _EXTERNAL_BYTES
    if not external:
        for t in all_tensors(model):  # bring parked payloads back: one self-contained file
            if _is_external(t):
                data = _external_bytes(t, spill).tobytes()
                t.ClearField("external_data")
                t.data_location = TensorProto.DEFAULT
                t.raw_data = data
        onnx.checker.check_model(model, full_check=True)
    _output.sweep(folder)
    # The data files of the model about to be replaced may be removed after the commit.
    replaced = _referenced(output) if output.exists() and _data_files(output) else set()
    data_path: Path | None = None
    try:
        with contextlib.ExitStack() as stack:
            if external:
                data_target = folder / f"{output.name}.data"
                out, data_tmp = stack.enter_context(_output.new_file(data_target))
                out.write(_DATA_MAGIC)
                refs: list[TensorProto] = []
                for t in all_tensors(model):
                    data = b"" if _is_external(t) else t.raw_data
                    if not _is_external(t) and len(data) < _EXTERNAL_MIN:
                        continue
                    size = _external_info(t)[2] if _is_external(t) else len(data)
                    start = _aligned(out.tell(), size)
                    out.seek(start)
                    if _is_external(t):
                        _copy_payload(t, spill, out)
                    else:
                        out.write(data)
                    del data
                    refs.append(t)
                    _point(t, "", start, out.tell() - start)
                out.flush()
                data_path = _publish_new(data_tmp, output)
                for t in refs:  # point the references at the data file's final name
                    for entry in t.external_data:
                        if entry.key == "location":
                            entry.value = data_path.name
            f, tmp = stack.enter_context(_output.new_file(output))
            f.write(model.SerializeToString())
            f.flush()
            if external:
                onnx.checker.check_model(str(tmp), full_check=True)
            _output.replace(tmp, output)  # the commit
            data_path = None
    except BaseException:
        if data_path is not None:  # published but never referenced by a committed model
            with contextlib.suppress(OSError):
                os.unlink(data_path)
        raise
    finally:
        if spill is not None:
            spill.close()
    _remove_stale_data(output, source, replaced)


def _publish_new(temp: Path, output: Path) -> Path:
    """Give a finished data file a name beside ``output`` that no file has; return it.

    ``os.link`` fails rather than replace, so an existing data file (the old model's, or the
    input's) is never overwritten.
    """
    for k in range(100):
        name = f"{output.name}.data" if k == 0 else f"{output.name}.{secrets.token_hex(4)}.data"
        final = temp.parent / name
        try:
            os.link(temp, final)
        except FileExistsError:
            continue
        except OSError:  # no hard links on this filesystem
            if final.exists():
                continue
            os.replace(temp, final)
            return final
        os.unlink(temp)
        return final
    raise ValueError(f"no free data file name beside {str(output)!r}")


def _referenced(model_path: Path) -> set[str]:
    """The external data locations a model file refers to (empty when unreadable)."""
    try:
        model = onnx.load(str(model_path), load_external_data=False)
    except Exception:
        return set()
    return {e.value for t in all_tensors(model) if _is_external(t)
            for e in t.external_data if e.key == "location"}  # fmt: skip


def _data_files(output: Path) -> list[Path]:
    """Files beside ``output`` named like its data files: ``{name}.data``, ``{name}.{hex}.data``."""
    folder = output.parent if str(output.parent) else Path(".")
    names = re.compile(re.escape(output.name) + r"(\.[0-9a-f]{8})?\.data")
    with contextlib.suppress(OSError):
        return [p for p in folder.iterdir()
                if names.fullmatch(p.name) and p.is_file() and not p.is_symlink()]  # fmt: skip
    return []


def _remove_stale_data(output: Path, source: Path | None, replaced: set[str]) -> None:
    """Remove the data files of ``output`` that no model uses any more.

    Candidates (`_data_files`) are those the replaced model referred to (``replaced``) and
    those onnxq wrote (they start with ``_DATA_MAGIC``: orphans of a run killed after its
    commit); other files are never touched. They stay when the model at ``output`` or the
    input model refers to them, or while another run holds them (`onnxq._output.locked`).
    """
    candidates = []
    for path in _data_files(output):
        with contextlib.suppress(OSError), open(path, "rb") as f:
            if path.name in replaced or f.read(len(_DATA_MAGIC)) == _DATA_MAGIC:
                candidates.append(path)
    if not candidates:
        return
    keep = _referenced(output)
    if source is not None and source.exists() and not _same_path(source, output):
        keep |= {str((source.parent / v).resolve()) for v in _referenced(source)}
    for path in candidates:
        if path.name in keep or str(path.resolve()) in keep or _output.locked(path):
            continue
        with contextlib.suppress(OSError):
            os.unlink(path)


def _same_path(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return a.resolve() == b.resolve()


# -- materialisation --------------------------------------------------------------------------
class _Names:
    def __init__(self, model: onnx.ModelProto) -> None:
        self.used: set[str] = set()
        for scope in _scopes(model.graph):
            g = scope.graph
            self.used.update(t.name for t in g.initializer)
            self.used.update(v.name for v in [*g.input, *g.output, *g.value_info])
            self.used.update(o for n in g.node for o in n.output)
            self.used.update(n.name for n in g.node)

    def fresh(self, base: str) -> str:
        name, k = base, 0
        while name in self.used:
            k += 1
            name = f"{base}_{k}"
        self.used.add(name)
        return name


def _declare(graph: onnx.GraphProto, node: onnx.NodeProto, in_shape: list[int] | None) -> None:
    """Write value_info for every output of an onnxq node (onnxruntime needs their types)."""
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    attrs = {k: v.decode() if isinstance(v, bytes) else v for k, v in attrs.items()}
    types = output_types(node.op_type, attrs, tuple(in_shape) if in_shape else None)
    for name, (elem, shape) in zip(node.output, types, strict=False):
        if name and elem:
            graph.value_info.append(helper.make_tensor_value_info(name, elem, shape))


def _weight_nodes(
    entry: _WeightPlan, array: np.ndarray, names: _Names, elem: int
) -> tuple[list[TensorProto], onnx.NodeProto]:
    q = onnxq.cast(
        array, entry.dtype, axis=entry.axis, mode="compress",
        round_mode=entry.round_mode, scale_mode=entry.scale_mode,
    )  # fmt: skip
    assert isinstance(q, onnxq.QTensor)
    fields = {"q": q.data, "scale": q.scale, "zero": q.zero, "tenscale": q.tenscale,
              "meta": q.meta, "mask": q.mask}  # fmt: skip
    inits: dict[str, TensorProto] = {}
    for key, value in fields.items():
        if value is not None:
            name = names.fresh(f"{entry.tensor}__{key}")
            inits[key] = numpy_helper.from_array(np.ascontiguousarray(value), name)
    attrs = {"dtype": entry.dtype.code, "axis": entry.axis, "shape": list(array.shape),
             "output_type": elem}  # fmt: skip
    if isinstance(entry.dtype.nspec, Codebook):
        order = ["q", "meta", "scale"]
        op = "CodebookLookup"
    else:
        order = ["q", "scale", "zero", "tenscale", "meta", "mask"]
        op = "DequantizeMX"
    inputs = [inits[k].name if k in inits else "" for k in order]
    while inputs and not inputs[-1]:
        inputs.pop()
    node = helper.make_node(op, inputs, [entry.tensor], name=names.fresh(f"{entry.tensor}__dq"),
                            domain=DOMAIN, **attrs)  # fmt: skip
    return list(inits.values()), node


def _rename_inside(graph: onnx.GraphProto, old: str, new: str) -> None:
    for node in graph.node:
        node.input[:] = [new if i == old else i for i in node.input]
        for attr in node.attribute:
            for sub in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else attr.graphs:
                _rename_inside(sub, old, new)
    for out in graph.output:
        if out.name == old:
            out.name = new


def _materialise_weight(
    model: onnx.ModelProto, entry: _WeightPlan, storage: str, names: _Names,
    main_defined: set[str], dq_nodes: list[onnx.NodeProto],
    removals: dict[int, tuple[_Scope, set[str]]], target: str = "onnxq",
    spill: _Spill | None = None,
) -> None:  # fmt: skip
    """Quantize one weight; structural removals wait in ``removals`` (keeps references valid)."""
    src = entry.source
    tensor = src.tensor
    try:
        array = _array(tensor, spill)
    except ValueError as err:  # payload and dims disagree, unknown element type
        raise ValueError(
            f"weight {entry.tensor!r} cannot be read ({err}): the model file is corrupt; "
            "export or copy it again"
        ) from None
    if storage == "fake":
        fake = onnxq.cast(array, entry.dtype, axis=entry.axis, round_mode=entry.round_mode,
                          scale_mode=entry.scale_mode)  # fmt: skip
        del array
        if spill is not None:
            spill.set_values(tensor, np.asarray(fake))
        else:
            tensor.CopyFrom(numpy_helper.from_array(np.asarray(fake), tensor.name))
        return
    target_name = entry.tensor
    if src.scope.parent is not None and target_name in main_defined:  # would shadow: rename
        target_name = names.fresh(f"{entry.tensor}__w")
        _rename_inside(src.scope.graph, entry.tensor, target_name)
    renamed = dataclasses.replace(entry, tensor=target_name)
    if target == "standard":  # plain ai.onnx nodes (lower.py)
        inits, nodes = lower_weight(
            target_name, array, entry.dtype, entry.axis, round_mode=entry.round_mode,
            scale_mode=entry.scale_mode, output_type=tensor.data_type, fresh=names.fresh,
        )  # fmt: skip
    else:
        inits, node = _weight_nodes(renamed, array, names, tensor.data_type)
        nodes = [node]
    del array
    for field in ("raw_data", "float_data", "int32_data"):  # free the float payload now
        tensor.ClearField(field)
    removals.setdefault(id(src.scope), (src.scope, set()))[1].add(entry.tensor)
    if spill is not None:  # the codes wait on disk too
        for init in inits:
            spill.park(init)
    model.graph.initializer.extend(inits)
    main_defined.add(target_name)
    dq_nodes.extend(nodes)
    if target != "standard":
        _declare(model.graph, nodes[0], None)


def _remove(scope: _Scope, names: set[str]) -> None:
    """Drop the float initializers, their graph inputs and the Constant nodes of ``names``."""
    g = scope.graph
    for field, key in ((g.initializer, "name"), (g.input, "name")):
        keep = [item for item in field if getattr(item, key) not in names]
        if len(keep) != len(field):
            del field[:]
            field.extend(keep)
    keep_nodes = [n for n in g.node if not (n.op_type == "Constant" and n.output[0] in names)]
    if len(keep_nodes) != len(g.node):
        del g.node[:]
        g.node.extend(keep_nodes)


def _materialise_activation(
    entry: _ActivationPlan, shape: list[int | None] | None, names: _Names,
    inserts: dict[int, tuple[_Scope, dict[str, list[onnx.NodeProto]]]],
    skipped: list[dict[str, str]],
) -> None:  # fmt: skip
    """Rewire the consumers and queue the QuantizeMX -> DequantizeMX pair after the producer."""
    if shape is None or any(d is None for d in shape):
        skipped.append(
            {"tensor": entry.tensor, "reason": "no static shape (DequantizeMX needs one)"}
        )
        return
    if isinstance(entry.dtype.nspec, Codebook):
        raise ValueError(
            f"activation {entry.tensor!r}: codebook formats ({entry.dtype.name}) are for weights; "
            "choose a non-codebook activation format"
        )
    owner, kind = _lookup(entry.scope, entry.tensor)
    owner = owner or entry.scope
    dims = [int(d) for d in shape if d is not None]
    attrs = {"dtype": entry.dtype.code, "axis": entry.axis, "round_mode": entry.round_mode,
             "scale_mode": entry.scale_mode}  # fmt: skip
    types = output_types("QuantizeMX", attrs, tuple(dims))
    base = entry.tensor
    outs = [names.fresh(f"{base}__{k}") if elem else ""
            for k, (elem, _) in zip(_Q_OUT, types, strict=True)]  # fmt: skip
    while not outs[-1]:
        outs.pop()
    qx = helper.make_node("QuantizeMX", [base], outs, name=names.fresh(f"{base}__qx"),
                          domain=DOMAIN, **attrs)  # fmt: skip
    dq_name = names.fresh(f"{base}__dqx")
    dq = helper.make_node("DequantizeMX", outs, [dq_name], name=names.fresh(f"{base}__dqa"),
                          domain=DOMAIN, dtype=entry.dtype.code, axis=entry.axis, shape=dims,
                          output_type=entry.elem_type)  # fmt: skip
    for node, index in entry.slots:
        node.input[index] = dq_name
    table = inserts.setdefault(id(owner), (owner, {}))[1]
    graph = owner.graph
    table.setdefault(base if kind == "node" else "", []).extend([qx, dq])
    _declare(graph, qx, dims)
    _declare(graph, dq, None)


def _apply_inserts(graph: onnx.GraphProto, table: Mapping[str, list[onnx.NodeProto]]) -> None:
    nodes = list(table.get("", []))
    for node in graph.node:
        nodes.append(node)
        for out in node.output:
            nodes.extend(table.get(out, []) if out else [])
    del graph.node[:]
    graph.node.extend(nodes)


def _inline_fallbacks(model: onnx.ModelProto, missing: list[dict[str, str]]) -> onnx.ModelProto:
    """Replace every onnxq node (block-format activations) by its standard-ONNX function body.

    The bodies are the bit-exact fallbacks of functions.py, so the standard model computes
    what the onnxq one does.

    Raises:
        NotImplementedError: a node has no fallback (its format or mode is not expressible).
    """
    if missing:
        first = missing[0]
        raise NotImplementedError(
            f"target='standard': node {first['node']!r} has no standard-ONNX form "
            f"({first['reason']}); use target='onnxq' or another activation format"
        )
    if not model.functions:
        return model
    inlined = onnx.inliner.inline_local_functions(model)
    del inlined.functions[:]
    for node in (n for scope in _scopes(inlined.graph) for n in scope.graph.node):
        if node.domain == DOMAIN:  # pragma: no cover - the inliner replaced them all
            raise NotImplementedError(f"target='standard': node {node.name!r} was not inlined")
    return inlined


def _embed(model: onnx.ModelProto, shapes: Mapping[str, list[int | None]]) -> list[dict[str, str]]:
    """Add the function fallback of every onnxq node that has one; list the others."""
    missing: list[dict[str, str]] = []
    have = {(f.domain, f.name, f.overload) for f in model.functions}
    for scope in _scopes(model.graph):
        for node in scope.graph.node:
            if node.domain != DOMAIN:
                continue
            attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
            attrs = {k: v.decode() if isinstance(v, bytes) else v for k, v in attrs.items()}
            if node.op_type == "QuantizeMX":
                shape = shapes.get(node.input[0])
                attrs["num_outputs"] = len(node.output)
            else:
                shape = list(attrs.get("shape", []))
            try:
                if not shape or any(d is None for d in shape):
                    raise ValueError("no static input shape")
                fn = build_function(node.op_type, attrs, [int(d) for d in shape if d is not None])
            except (NotImplementedError, ValueError) as err:
                missing.append({"node": node.name, "reason": str(err)})
                continue
            node.overload = fn.overload
            if (fn.domain, fn.name, fn.overload) not in have:
                model.functions.append(fn)
                have.add((fn.domain, fn.name, fn.overload))
    return missing


def _set_metadata(model: onnx.ModelProto, values: Mapping[str, str]) -> None:
    keep = [p for p in model.metadata_props if p.key not in values]
    del model.metadata_props[:]
    model.metadata_props.extend(keep)
    for key, value in values.items():
        model.metadata_props.append(onnx.StringStringEntryProto(key=key, value=value))


def _opset(model: onnx.ModelProto) -> onnx.ModelProto:
    """Bring ai.onnx to opset 21 (the function fallbacks' opset) and import the onnxq domain."""
    version = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    if version is not None and version < _OPSET:
        from onnx import version_converter

        with _stripped(model) as stash:
            try:
                converted = version_converter.convert_version(model, _OPSET)
            except Exception as err:
                raise ValueError(
                    f"the model's ai.onnx opset {version} could not be converted to opset "
                    f"{_OPSET}, which the onnxq function fallbacks use: {err}"
                ) from None
            _restore(converted, stash)
        model = converted
    if not any(o.domain == DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(DOMAIN, 1))
    return model


def _calibration_check(calibration: Any, method: str, percentile: float) -> None:
    if method not in ("minmax", "percentile"):
        raise ValueError(f"calibration_method {method!r}: expected 'minmax' or 'percentile'")
    if not 0.0 < percentile <= 100.0:
        raise ValueError(f"percentile {percentile}: expected a value in (0, 100]")
    if calibration is None:
        return
    if isinstance(calibration, (str, os.PathLike)) and not Path(calibration).is_dir():
        raise ValueError(f"calibration {str(calibration)!r} is not a directory of .npz files")


@contextlib.contextmanager
def _observable(
    model: onnx.ModelProto, outputs: Mapping[str, int]
) -> Iterator[tuple[bytes, str | None, bool]]:
    """The model serialized with ``outputs`` (name -> element type) added to its graph outputs.

    Yields ``(bytes, folder of its external data or None, has onnxq nodes)``. External
    locations (made absolute by `_load`) are written relative to their common folder, which
    onnxruntime is told about; ``model`` is restored afterwards.
    """
    g = model.graph
    n_out = len(g.output)
    have = {o.name for o in g.output}
    g.output.extend(helper.make_tensor_value_info(name, elem, None)
                    for name, elem in outputs.items() if name not in have)  # fmt: skip
    moved: list[tuple[onnx.StringStringEntryProto, str]] = []
    folder = None
    custom = any(n.domain == DOMAIN for sc in _scopes(g) for n in sc.graph.node)
    opsets = list(model.opset_import)
    if not custom:  # the onnxq domain import that _opset added: no node uses it
        del model.opset_import[:]
        model.opset_import.extend(o for o in opsets if o.domain != DOMAIN)
    try:
        entries = [e for t in all_tensors(model) if _is_external(t)
                   for e in t.external_data if e.key == "location"]  # fmt: skip
        if any(e.value == _SPILL for e in entries):
            raise ValueError("calibration runs before any tensor is spilled")
        absolute = [e for e in entries if os.path.isabs(e.value)]
        if absolute:
            folder = os.path.commonpath([os.path.dirname(e.value) for e in absolute])
            for e in absolute:
                moved.append((e, e.value))
                e.value = os.path.relpath(e.value, folder)
        try:
            data = model.SerializeToString()
        except Exception as err:  # the 2 GB protobuf limit
            raise ValueError(
                f"calibration: the float model cannot be serialized for onnxruntime ({err}); "
                "save it with external data and pass its path with an output path"
            ) from None
        yield data, folder, custom
    finally:
        for entry, value in moved:
            entry.value = value
        del g.output[n_out:]
        del model.opset_import[:]
        model.opset_import.extend(opsets)


def _calibrate(
    model: onnx.ModelProto, acts: list[_ActivationPlan], calibration: Any, method: str,
    percentile: float,
) -> tuple[dict[str, calibrate.StaticScale], dict[str, Any]]:  # fmt: skip
    """Observe ``acts`` on the calibration samples; their static scales and the metadata."""
    g = model.graph
    inits = {t.name for t in g.initializer}
    inputs = {i.name: i.type.tensor_type.elem_type for i in g.input if i.name not in inits}
    samples = calibrate.calibration_inputs(calibration, inputs)
    wanted = {a.tensor: a.elem_type for a in acts if a.tensor not in inputs}
    count = 0

    def counted(done: int) -> None:
        nonlocal count
        count = done

    with _observable(model, wanted) as (data, folder, custom):
        observers = calibrate.observe(
            data, [a.tensor for a in acts], samples, histogram=method == "percentile",
            external_folder=folder, custom_ops=custom, progress=counted,
        )  # fmt: skip
    scales: dict[str, calibrate.StaticScale] = {}
    record: dict[str, Any] = {}
    for act in acts:
        obs = observers[act.tensor]
        lo, hi, amax = obs.limits(method, percentile)
        scales[act.tensor] = calibrate.static_scale(act.dtype, lo, hi, amax)
        record[act.tensor] = {
            "dtype": act.dtype.name, "min": float(lo), "max": float(hi), "amax": float(amax),
            "observed_amax": float(obs.amax), **scales[act.tensor].as_dict(),
        }  # fmt: skip
    meta: dict[str, Any] = {"method": method}
    if method == "percentile":
        meta["percentile"] = percentile
    meta.update(samples=count, tensors=record)
    return scales, meta


def _materialise_calibrated(
    entry: _ActivationPlan, params: calibrate.StaticScale, names: _Names,
    inserts: dict[int, tuple[_Scope, dict[str, list[onnx.NodeProto]]]],
    new_inits: list[TensorProto],
) -> None:  # fmt: skip
    """Rewire the consumers and queue the static QuantizeLinear -> DequantizeLinear pair."""
    owner, kind = _lookup(entry.scope, entry.tensor)
    owner = owner or entry.scope
    base = entry.tensor
    out = names.fresh(f"{base}__dqx")
    inits, nodes = calibrate.qdq_nodes(base, out, params, entry.elem_type, names.fresh)
    for node, index in entry.slots:
        node.input[index] = out
    new_inits.extend(inits)
    table = inserts.setdefault(id(owner), (owner, {}))[1]
    table.setdefault(base if kind == "node" else "", []).extend(nodes)


def _activation_modes(
    acts: list[_ActivationPlan], calibration: Any, target: str
) -> list[_ActivationPlan]:
    """Check the planned activations against calibration and target; those to calibrate."""
    kinds = {a.tensor: calibrate.calibrated_kind(a.dtype, a.round_mode) for a in acts}
    chosen = [a for a in acts if kinds[a.tensor] == "tensor"]
    if calibration is not None:
        for a in acts:
            kind = kinds[a.tensor]
            if kind == "channel":
                raise NotImplementedError(
                    f"activation {a.tensor!r}: {a.dtype.name} has a float scale per row along "
                    f"axis {a.axis}, which changes with every input and cannot be calibrated; "
                    "use a tensor-scaled format (int8_tensor, fp8e4_tensor, ...) or drop "
                    "calibration"
                )
            if kind.startswith("unsupported"):
                raise NotImplementedError(
                    f"activation {a.tensor!r}: {a.dtype.name} cannot be calibrated into a "
                    f"static QuantizeLinear/DequantizeLinear pair ({kind.split(': ', 1)[1]})"
                )
            if kind == "tensor" and a.scope.parent is not None:
                raise NotImplementedError(
                    f"activation {a.tensor!r} is inside an If/Loop/Scan subgraph, which "
                    "calibration cannot observe; exclude its node or drop calibration"
                )
        dynamic = sorted({a.dtype.name for a in acts if kinds[a.tensor] == "dynamic"})
        if not acts:
            warnings.warn("calibration is not used: no activation is quantized (pass an "
                          "activation format)", UserWarning, stacklevel=3)  # fmt: skip
        elif dynamic:
            warnings.warn(
                f"calibration is not used for activation format(s) {', '.join(dynamic)}: "
                "their exponent or block scales are computed from the data at every call "
                "(QuantizeMX); only formats with one float scale per tensor are calibrated",
                UserWarning, stacklevel=3,
            )  # fmt: skip
    if target == "standard":
        for a in acts:
            if kinds[a.tensor] == "tensor" and calibration is None:
                raise NotImplementedError(
                    f"target='standard' needs calibration for activation {a.tensor!r} "
                    f"({a.dtype.name}): pass calibration (--calibration DIR of .npz inputs) "
                    "so its scale becomes a constant of QuantizeLinear/DequantizeLinear"
                )
            if kinds[a.tensor] not in ("tensor", "dynamic"):
                raise NotImplementedError(
                    f"target='standard' cannot quantize activation {a.tensor!r} "
                    f"({a.dtype.name}): use a tensor-scaled format with calibration, a block "
                    "format, drop activations or use target='onnxq'"
                )
            # "dynamic" (block) formats: their QuantizeMX/DequantizeMX pair is replaced by its
            # standard-ONNX function body (inlined after embedding, see quantize_model).
    return chosen if calibration is not None else []


def quantize_model(
    model: str | os.PathLike[str] | onnx.ModelProto,
    output: str | os.PathLike[str] | None = None,
    *,
    weights: str | DataType | None = None,
    activations: str | DataType | None = None,
    recipe: str | os.PathLike[str] | Mapping[str, Any] | Recipe | None = None,
    weight_storage: Literal["packed", "fake"] = "packed",
    target: Literal["onnxq", "standard"] = "onnxq",
    calibration: str | os.PathLike[str] | Iterable[Mapping[str, np.ndarray]] | None = None,
    calibration_method: Literal["minmax", "percentile"] = "minmax",
    percentile: float = 99.99,
    progress: bool | Callable[[int, int, str], None] | None = None,
    overwrite: bool = False,
    custom_ops_only: bool = False,
    allow_empty: bool = False,
) -> onnx.ModelProto:
    """Quantize a float ONNX model to onnxq formats (see the module doc).

    Args:
        model: a model path or an ``onnx.ModelProto`` (not modified). With an ``output``,
            external data is read one tensor at a time (memory stays near the largest
            tensor's size); without one it is all loaded, since the result holds it.
        output: where to write the result (temporary file + rename); None writes nothing.
        weights: default weight format (overrides the recipe's).
        activations: default activation format (overrides the recipe's).
        recipe: a YAML/JSON path, a mapping or a `Recipe` (onnxq.graph.recipe).
        weight_storage: ``packed`` (compressed codes + DequantizeMX) or ``fake`` (dequantized
            float values in place).
        target: ``onnxq`` (custom ops with function fallbacks) or ``standard`` (weights as
            plain DequantizeLinear / Gather nodes, no custom op; activations only through
            calibration).
        calibration: a directory of ``.npz`` inputs (keys: input names) or an iterable of
            input dicts. Activations with one float scale per tensor get a static
            QuantizeLinear/DequantizeLinear pair with the calibrated scale (both targets);
            exponent and block scales stay per call (a warning says so).
        calibration_method: ``minmax`` (max |x|, and min/max for zero points) or
            ``percentile`` (that percentile of |x|).
        percentile: the percentile of ``percentile`` calibration, in (0, 100].
        progress: ``True`` draws a progress bar on stderr; a callable is called as
            ``progress(done, total, tensor_name)`` after each tensor; None or False: silent.
        overwrite: allow ``output`` to be the input path.
        custom_ops_only: write the model even when some of its onnxq nodes have no
            standard-ONNX fallback (scale modes other than floor/ceil, stochastic rounding,
            NVFP4 activations, ...), so that it runs only where the onnxq custom-op library is
            registered; the ``onnxq_custom_ops_only`` metadata lists those nodes. Without it
            (and without the recipe key ``custom_ops_only: true``) such a model is refused.
        allow_empty: return (and write) the model even when the choices select no tensor;
            without it that is an error.

    Returns:
        The quantized model. When it is written with external data (the input had external
        data, or the payload reaches 1 GB), its tensors refer to the data file
        ``{output name}.data`` beside ``output``.

    Raises:
        ValueError: nothing to quantize (no format, or no tensor selected without
            ``allow_empty``), a bad recipe, format, storage, path or percentile, output equal
            to the input without ``overwrite``, a model the pass cannot read or that is not
            valid ONNX, or bad calibration samples (no .npz file, wrong input names).
        NotImplementedError: a tensor whose onnxq node has no standard-ONNX fallback without
            ``custom_ops_only``; ``target="standard"`` with activations that are not calibrated
            tensor-scaled formats or have no fallback, or with a weight format it cannot store
            exactly; calibration of channel-scaled or subgraph activations.
        TypeError: ``progress`` is neither a bool nor a callable.
    """
    if weight_storage not in ("packed", "fake"):
        raise ValueError(f"weight_storage {weight_storage!r}: expected 'packed' or 'fake'")
    if target not in ("onnxq", "standard"):
        raise ValueError(f"target {target!r}: expected 'onnxq' or 'standard'")
    _calibration_check(calibration, calibration_method, percentile)
    report = _progress(progress)
    if recipe is None and weights is None and activations is None:
        raise ValueError(
            "nothing to quantize: pass a weight format (--weights mxfp4) or a recipe (--recipe)"
        )
    chosen = load_recipe(recipe) if recipe is not None else Recipe()
    overrides = {
        k: v for k, v in (("weights", weights), ("activations", activations)) if v is not None
    }
    if overrides:
        chosen = Recipe.from_mapping(
            {**chosen.to_dict(), **{k: str(v) for k, v in overrides.items()}}
        )
    custom_ops_only = bool(custom_ops_only or chosen.custom_ops_only)
    if custom_ops_only and target == "standard":
        raise ValueError(
            "custom_ops_only (--custom-ops-only) contradicts target='standard' (--target "
            "standard), which writes no custom op; drop one of them"
        )
    label = _choice_label(recipe, weights, activations)
    if not allow_empty and not chosen.sets_a_format():
        raise ValueError(
            f"nothing to quantize: {label} sets no weight or activation format; give one "
            "(weights: mxfp4) or pass --allow-empty (allow_empty=True)"
        )
    out_path = Path(output) if output is not None else None
    if out_path is not None and isinstance(model, (str, os.PathLike)):
        src = Path(model)
        if src.exists() and out_path.resolve() == src.resolve() and not overwrite:
            raise ValueError(
                f"output {str(out_path)!r} is the input model; pass --overwrite "
                "(overwrite=True) to replace it"
            )
    register_schemas()
    m, spill = _load(model, out_path)
    m = _opset(m)
    with _stripped(m):
        try:
            types = _tensor_types(infer_shapes(m))
        except onnx.shape_inference.InferenceError as err:
            raise ValueError(
                f"shape inference fails on the model ({' '.join(str(err).split())[:300]}): it "
                "is not valid ONNX; check it with onnx.checker.check_model(full_check=True)"
            ) from None
    the_plan = plan(m, chosen, types)
    planned = [a for a in the_plan.activations if isinstance(a, _ActivationPlan)]
    to_calibrate = _activation_modes(planned, calibration, target)
    calibrated = {a.tensor for a in to_calibrate}
    kept = [a for a in planned if a.tensor in calibrated or _static_shape(a.shape)]
    if not the_plan.weights and not kept and not allow_empty:
        raise ValueError(_nothing_selected(m, chosen, label, len(planned)))
    gaps = _no_fallback(the_plan, target, calibrated)
    if gaps and not custom_ops_only:
        raise NotImplementedError(_no_fallback_message(gaps, target))
    statics: dict[str, calibrate.StaticScale] = {}
    calibration_meta: dict[str, Any] | None = None
    if to_calibrate:
        statics, calibration_meta = _calibrate(m, to_calibrate, calibration,
                                               calibration_method, percentile)  # fmt: skip
    names = _Names(m)
    main_defined = {*(t.name for t in m.graph.initializer), *(i.name for i in m.graph.input),
                    *(o for n in m.graph.node for o in n.output)}  # fmt: skip
    total = len(the_plan.weights) + len(the_plan.activations)
    # Rewire activations first: no structural change happens until every planned reference
    # to a node or tensor has been used.
    skipped: list[dict[str, str]] = []
    inserts: dict[int, tuple[_Scope, dict[str, list[onnx.NodeProto]]]] = {}
    static_inits: list[TensorProto] = []
    done = 0
    for act in the_plan.activations:
        assert isinstance(act, _ActivationPlan)
        if act.tensor in statics:
            _materialise_calibrated(act, statics[act.tensor], names, inserts, static_inits)
        else:
            _materialise_activation(act, act.shape, names, inserts, skipped)
        done += 1
        if report is not None:
            report(done, total, act.tensor)
    m.graph.initializer.extend(static_inits)
    dq_nodes: list[onnx.NodeProto] = []
    removals: dict[int, tuple[_Scope, set[str]]] = {}
    for entry in the_plan.weights:  # one at a time: each float payload is freed when done
        assert isinstance(entry, _WeightPlan)
        _materialise_weight(m, entry, weight_storage, names, main_defined, dq_nodes, removals,
                            target, spill)  # fmt: skip
        done += 1
        if report is not None:
            report(done, total, entry.tensor)
    # Rebuilding a node list copies its subgraphs: change the deepest graphs first.
    changed = {id(s): s for s, _ in removals.values()} | {id(s): s for s, _ in inserts.values()}
    for key, scope in sorted(changed.items(), key=lambda item: -item[1].depth):
        if key in removals:
            _remove(scope, removals[key][1])
        if key in inserts:
            _apply_inserts(scope.graph, inserts[key][1])
    if dq_nodes:
        rest = list(m.graph.node)
        del m.graph.node[:]
        m.graph.node.extend([*dq_nodes, *rest])
    static = {k: v[1] for k, v in types.items() if v[1] is not None}
    missing = _embed(m, static)
    if target == "standard":  # no onnxq node: inline the fallbacks, drop the domain import
        m = _inline_fallbacks(m, missing)
        keep = [o for o in m.opset_import if o.domain != DOMAIN]
        del m.opset_import[:]
        m.opset_import.extend(keep)
    meta = {
        "onnxq_version": onnxq.__version__,
        "onnxq_recipe": chosen.to_json(),
        "onnxq_weight_storage": weight_storage,
        "onnxq_target": target,
        "onnxq_quantized": json.dumps({"weights": len(the_plan.weights),
                                       "activations": len(the_plan.activations) - len(skipped)}),
    }  # fmt: skip
    if missing and target != "standard":
        if not custom_ops_only:  # the early check (_no_fallback) should have caught it
            raise NotImplementedError(_no_fallback_message(missing, target))
        meta["onnxq_no_fallback"] = json.dumps(missing)
        meta["onnxq_custom_ops_only"] = (
            f"{len(missing)} onnxq node(s) have no standard-ONNX fallback: the model runs only "
            "with the onnxq custom-op library (onnxq.runtime.session)"
        )
    if skipped:
        meta["onnxq_skipped"] = json.dumps(skipped)
    if calibration_meta is not None:
        meta["onnxq_calibration"] = json.dumps(calibration_meta)
    _set_metadata(m, meta)
    ir = helper.find_min_ir_version_for(list(m.opset_import), ignore_unknown=True)
    if any(f.overload for f in m.functions):
        ir = max(ir, 10)  # NodeProto/FunctionProto.overload
    m.ir_version = ir
    if out_path is not None:
        source = Path(model) if isinstance(model, (str, os.PathLike)) else None
        try:  # checks the model before anything is renamed into place
            _save(m, out_path, spill, source)
        except _CHECK_ERRORS as err:
            raise ValueError(_invalid(err)) from None
    elif _payload(m) < _EXTERNAL_BYTES:
        try:
            onnx.checker.check_model(m, full_check=True)
        except _CHECK_ERRORS as err:
            raise ValueError(_invalid(err)) from None
    if report is not None and hasattr(report, "close"):
        report.close()
    return m


_CHECK_ERRORS = (onnx.checker.ValidationError, onnx.shape_inference.InferenceError)


def _invalid(err: Exception) -> str:
    return (
        f"the quantized model fails onnx.checker ({' '.join(str(err).split())[:300]}); the "
        "input model is probably not valid ONNX: check it with onnx.checker.check_model"
    )


def _progress(progress: Any) -> Callable[[int, int, str], None] | None:
    """The progress callback: True draws a bar on stderr (`onnxq.progress.ProgressBar`)."""
    if progress is None or progress is False:
        return None
    if progress is True:
        from onnxq.progress import ProgressBar

        return ProgressBar(always=True)
    if not callable(progress):
        raise TypeError(
            f"progress must be True, False, None or a callable(done, total, name), not "
            f"{type(progress).__name__}"
        )
    return progress


def _static_shape(shape: list[int | None] | None) -> bool:
    return shape is not None and all(d is not None for d in shape)


def _choice_label(recipe: Any, weights: Any, activations: Any) -> str:
    """How the user named their choices, for messages: the recipe file and/or the formats."""
    parts = []
    if isinstance(recipe, (str, os.PathLike)):
        parts.append(f"recipe {Path(recipe).name!r}")
    elif recipe is not None:
        parts.append("the recipe")
    parts += [f"{what} {str(v)!r}" for what, v in (("weights", weights),
                                                   ("activations", activations)) if v]  # fmt: skip
    return " with ".join(parts)


def _nothing_selected(model: onnx.ModelProto, recipe: Recipe, label: str, skipped: int) -> str:
    nodes = [n for s in _scopes(model.graph) for n in s.graph.node
             if n.domain in ("", "ai.onnx")]  # fmt: skip
    targets = [n for n in nodes if n.op_type in recipe.op_types]
    if skipped:
        why = (f"its {skipped} activation(s) have no static shape (DequantizeMX needs one: fix "
               "the input shapes)")  # fmt: skip
    elif not targets:
        why = f"the model has no {'/'.join(recipe.op_types)} node"
    else:
        why = (f"none of its {len(targets)} {'/'.join(sorted({n.op_type for n in targets}))} "
               "node(s) has a float weight or an activation that the recipe gives a format "
               "(excluded, or weights computed by other nodes)")  # fmt: skip
    return (f"nothing to quantize: {label} selects no tensor of the model: {why}; check the "
            "recipe, or pass --allow-empty (allow_empty=True) to write it unchanged")  # fmt: skip


def _no_fallback(the_plan: QuantPlan, target: str, calibrated: set[str]) -> list[dict[str, str]]:
    """Planned tensors whose onnxq node would have no standard-ONNX function fallback.

    Asks the builders (`onnxq.graph.functions.build_function`) with the attributes the
    materialisers give each node, before any weight is quantized: one entry per tensor
    (``tensor``, ``kind``, ``format``, ``modes``, ``reason``).
    """
    cache: dict[tuple[str, str, tuple[int, ...]], str | None] = {}

    def refusal(op: str, attrs: dict[str, Any], shape: list[int]) -> str | None:
        key = (op, json.dumps(attrs, sort_keys=True), tuple(shape))
        if key not in cache:
            try:
                build_function(op, attrs, shape)
                cache[key] = None
            except NotImplementedError as err:
                cache[key] = str(err)
            except ValueError:  # bad attributes: the materialisers report those
                cache[key] = None
        return cache[key]

    gaps = []
    if target != "standard":  # standard weights are lowered to plain ops (lower.py) instead
        for w in the_plan.weights:
            assert isinstance(w, _WeightPlan)
            op = "CodebookLookup" if isinstance(w.dtype.nspec, Codebook) else "DequantizeMX"
            attrs = {"dtype": w.dtype.code, "axis": w.axis,
                     "output_type": w.source.tensor.data_type}  # fmt: skip
            why = refusal(op, attrs, [int(d) for d in w.source.tensor.dims])
            if why:
                gaps.append({"tensor": w.tensor, "kind": "weight", "format": w.dtype.name,
                             "modes": "", "reason": why})  # fmt: skip
    for a in the_plan.activations:
        assert isinstance(a, _ActivationPlan)
        if a.tensor in calibrated or not _static_shape(a.shape):
            continue
        if isinstance(a.dtype.nspec, Codebook):
            continue  # refused by _materialise_activation
        dims = [int(d) for d in a.shape or () if d is not None]
        attrs = {"dtype": a.dtype.code, "axis": a.axis, "round_mode": a.round_mode,
                 "scale_mode": a.scale_mode}  # fmt: skip
        try:
            kinds = [elem for elem, _ in output_types("QuantizeMX", attrs, tuple(dims))]
        except ValueError:
            continue
        while kinds and not kinds[-1]:
            kinds.pop()
        why = refusal("QuantizeMX", {**attrs, "num_outputs": len(kinds)}, dims) or refusal(
            "DequantizeMX",
            {"dtype": a.dtype.code, "axis": a.axis, "output_type": a.elem_type},
            dims,
        )
        if why:
            kind = calibrate.calibrated_kind(a.dtype, a.round_mode)
            gaps.append({"tensor": a.tensor, "kind": "activation", "format": a.dtype.name,
                         "modes": f"round_mode {a.round_mode}, scale_mode {a.scale_mode}",
                         "reason": why, "calibrate": kind})  # fmt: skip
    return gaps


def _no_fallback_message(gaps: list[dict[str, str]], target: str) -> str:
    g = gaps[0]
    if "tensor" in g:
        modes = f", {g['modes']}" if g["modes"] else ""
        what = f"{g['kind']} {g['tensor']!r} ({g['format']}{modes})"
    else:  # an entry of _embed: the node
        what = f"node {g['node']!r}"
    more = f" (and {len(gaps) - 1} more tensor(s))" if len(gaps) > 1 else ""
    calibrate_it = ""
    if g.get("calibrate") == "tensor":  # a static QuantizeLinear pair would do
        calibrate_it = ("calibrate it (--calibration DIR, calibration=...) for a static "
                        "QuantizeLinear/DequantizeLinear pair, ")  # fmt: skip
    if target == "standard":
        return (f"target='standard' cannot quantize {what}{more}: it has no standard-ONNX form "
                f"({g['reason']}); use another format or mode, or target='onnxq'")  # fmt: skip
    return (
        f"{what}{more} has no standard-ONNX fallback ({g['reason']}), so the model would run "
        "only where the onnxq custom-op library is registered, not in a plain onnxruntime; "
        "choose another format or mode (floor or ceil scales, even/away/zero rounding), "
        f"{calibrate_it}or pass --custom-ops-only (custom_ops_only=True, recipe key "
        "custom_ops_only: true) to write a custom-op-only model"
    )
