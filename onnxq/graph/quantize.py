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
scales; `onnxq.graph.lower`) with the same bits as the onnxq target's DequantizeMX.

Calibration: ``QuantizeMX`` computes every scale (tensor and channel float scales included)
from the data at each call, so ``target="onnxq"`` has nothing to calibrate; a static,
calibrated scale belongs to ``target="standard"`` (DequantizeLinear with constant scales),
whose activation path is not implemented yet (it raises NotImplementedError).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import tempfile
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, Literal

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import onnxq
from onnxq.formats.codebook import Codebook
from onnxq.formats.datatype import DataType
from onnxq.graph.functions import build_function
from onnxq.graph.lower import lower_weight
from onnxq.graph.recipe import ActivationEntry, QuantPlan, Recipe, WeightEntry, load_recipe
from onnxq.graph.schemas import DOMAIN, output_types, register_schemas

__all__ = ["plan", "quantize_model"]

_FLOAT_TYPES = (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16)
_PASS_THROUGH = ("Transpose", "Cast", "Identity")
_OPSET = 21  # the function fallbacks are written in ai.onnx opset 21
_TWO_GB = 2**31 - 1
_STRIP_BYTES = 1 << 20  # initializers above this leave the model during shape inference
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
        types = _tensor_types(onnx.shape_inference.infer_shapes(model))
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


def _load(model: str | os.PathLike[str] | onnx.ModelProto) -> tuple[onnx.ModelProto, Path | None]:
    if isinstance(model, onnx.ModelProto):
        copy = onnx.ModelProto()
        copy.CopyFrom(model)
        return copy, None
    if not isinstance(model, (str, os.PathLike)):
        raise TypeError(f"model must be a path or an onnx.ModelProto, not {type(model).__name__}")
    path = Path(model)
    if not path.is_file():
        raise ValueError(f"model {str(path)!r} does not exist or is not a file")
    try:
        return onnx.load(path, load_external_data=True), path
    except Exception as err:
        raise ValueError(f"model {str(path)!r} is not a readable ONNX model: {err}") from None


def _payload(model: onnx.ModelProto) -> int:
    """Bytes of tensor payload held in the main graph (decides external-data saving)."""
    return sum(len(t.raw_data) for t in model.graph.initializer)


def _save(model: onnx.ModelProto, output: Path) -> None:
    """Write to a temporary file beside ``output`` and rename it (never half-written)."""
    folder = output.parent if str(output.parent) else Path(".")
    if not folder.is_dir():
        raise ValueError(f"output folder {str(folder)!r} does not exist")
    big = _payload(model) >= _TWO_GB // 2
    fd, tmp = tempfile.mkstemp(prefix=f".{output.name}.", suffix=".tmp", dir=folder)
    os.close(fd)
    data_tmp = None
    try:
        if big:
            location = f"{output.name}.data"
            data_tmp = f".{location}.tmp"
            with contextlib.suppress(FileNotFoundError):
                (folder / data_tmp).unlink()
            onnx.save_model(
                model, tmp, save_as_external_data=True, all_tensors_to_one_file=True,
                location=data_tmp, size_threshold=1024,
            )  # fmt: skip
            for t in (*model.graph.initializer,):  # point the references at the final name
                for entry in t.external_data:
                    if entry.key == "location":
                        entry.value = location
            onnx.save_model(model, tmp)
            os.replace(folder / data_tmp, folder / location)
        else:
            onnx.save_model(model, tmp)
        os.replace(tmp, output)
    except BaseException:
        for leftover in (tmp, None if data_tmp is None else folder / data_tmp):
            if leftover is not None:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(leftover)
        raise


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
) -> None:  # fmt: skip
    """Quantize one weight; structural removals wait in ``removals`` (keeps references valid)."""
    src = entry.source
    tensor = src.tensor
    array = numpy_helper.to_array(tensor)
    if storage == "fake":
        fake = onnxq.cast(array, entry.dtype, axis=entry.axis, round_mode=entry.round_mode,
                          scale_mode=entry.scale_mode)  # fmt: skip
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


def _calibration_check(calibration: Any, method: str, percentile: float, target: str) -> None:
    if method not in ("minmax", "percentile"):
        raise ValueError(f"calibration_method {method!r}: expected 'minmax' or 'percentile'")
    if not 0.0 < percentile <= 100.0:
        raise ValueError(f"percentile {percentile}: expected a value in (0, 100]")
    if calibration is None:
        return
    if isinstance(calibration, (str, os.PathLike)) and not Path(calibration).is_dir():
        raise ValueError(f"calibration {str(calibration)!r} is not a directory of .npz files")
    if target == "onnxq":
        warnings.warn(
            "calibration is not used with target='onnxq': QuantizeMX computes its scales from "
            "the data at every call", UserWarning, stacklevel=3,
        )  # fmt: skip


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
    progress: Callable[[int, int, str], None] | None = None,
    overwrite: bool = False,
) -> onnx.ModelProto:
    """Quantize a float ONNX model to onnxq formats (see the module doc).

    Args:
        model: a model path (external data is loaded) or an ``onnx.ModelProto`` (not modified).
        output: where to write the result (temporary file + rename); None writes nothing.
        weights: default weight format (overrides the recipe's).
        activations: default activation format (overrides the recipe's).
        recipe: a YAML/JSON path, a mapping or a `Recipe` (onnxq.graph.recipe).
        weight_storage: ``packed`` (compressed codes + DequantizeMX) or ``fake`` (dequantized
            float values in place).
        target: ``onnxq`` (custom ops with function fallbacks) or ``standard`` (weights as
            plain DequantizeLinear / Gather nodes, no custom op; weights only).
        calibration: a directory of ``.npz`` inputs or an iterable of input dicts; unused by
            ``target="onnxq"`` (QuantizeMX computes scales per call), so it only warns.
        calibration_method: ``minmax`` or ``percentile``.
        percentile: the percentile of ``percentile`` calibration, in (0, 100].
        progress: called as ``progress(done, total, tensor_name)`` after each tensor.
        overwrite: allow ``output`` to be the input path.

    Returns:
        The quantized model. When it is written with external data (over 2 GB), its tensors
        refer to the data file beside ``output``.

    Raises:
        ValueError: nothing to quantize, a bad recipe, format, storage, path or percentile,
            output equal to the input without ``overwrite``, or a model the pass cannot read.
        NotImplementedError: ``target="standard"`` with activations, or with a weight format
            it cannot store exactly.
    """
    if weight_storage not in ("packed", "fake"):
        raise ValueError(f"weight_storage {weight_storage!r}: expected 'packed' or 'fake'")
    if target not in ("onnxq", "standard"):
        raise ValueError(f"target {target!r}: expected 'onnxq' or 'standard'")
    _calibration_check(calibration, calibration_method, percentile, target)
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
    out_path = Path(output) if output is not None else None
    if out_path is not None and isinstance(model, (str, os.PathLike)):
        src = Path(model)
        if src.exists() and out_path.resolve() == src.resolve() and not overwrite:
            raise ValueError(
                f"output {str(out_path)!r} is the input model; pass --overwrite "
                "(overwrite=True) to replace it"
            )
    register_schemas()
    m, _ = _load(model)
    m = _opset(m)
    with _stripped(m):
        types = _tensor_types(onnx.shape_inference.infer_shapes(m))
    the_plan = plan(m, chosen, types)
    if target == "standard" and the_plan.activations:
        raise NotImplementedError(
            f"target='standard' lowers weights only: {len(the_plan.activations)} activation "
            "tensor(s) are planned, and their scales are computed per call, which standard "
            "QuantizeLinear/DequantizeLinear cannot do; drop activations or use target='onnxq'"
        )
    names = _Names(m)
    main_defined = {*(t.name for t in m.graph.initializer), *(i.name for i in m.graph.input),
                    *(o for n in m.graph.node for o in n.output)}  # fmt: skip
    total = len(the_plan.weights) + len(the_plan.activations)
    # Rewire activations first: no structural change happens until every planned reference
    # to a node or tensor has been used.
    skipped: list[dict[str, str]] = []
    inserts: dict[int, tuple[_Scope, dict[str, list[onnx.NodeProto]]]] = {}
    done = 0
    for act in the_plan.activations:
        assert isinstance(act, _ActivationPlan)
        _materialise_activation(act, act.shape, names, inserts, skipped)
        done += 1
        if progress is not None:
            progress(done, total, act.tensor)
    dq_nodes: list[onnx.NodeProto] = []
    removals: dict[int, tuple[_Scope, set[str]]] = {}
    for entry in the_plan.weights:  # one at a time: each float payload is freed when done
        assert isinstance(entry, _WeightPlan)
        _materialise_weight(m, entry, weight_storage, names, main_defined, dq_nodes, removals,
                            target)  # fmt: skip
        done += 1
        if progress is not None:
            progress(done, total, entry.tensor)
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
    if target == "standard":  # no onnxq node: drop the domain import
        keep = [o for o in m.opset_import if o.domain != DOMAIN]
        del m.opset_import[:]
        m.opset_import.extend(keep)
    meta = {
        "onnxq_version": onnxq.__version__,
        "onnxq_recipe": chosen.to_json(),
        "onnxq_weight_storage": weight_storage,
        "onnxq_quantized": json.dumps({"weights": len(the_plan.weights),
                                       "activations": len(the_plan.activations) - len(skipped)}),
    }  # fmt: skip
    if missing:
        meta["onnxq_no_fallback"] = json.dumps(missing)
    if skipped:
        meta["onnxq_skipped"] = json.dumps(skipped)
    _set_metadata(m, meta)
    ir = helper.find_min_ir_version_for(list(m.opset_import), ignore_unknown=True)
    if any(f.overload for f in m.functions):
        ir = max(ir, 10)  # NodeProto/FunctionProto.overload
    m.ir_version = ir
    if _payload(m) < _TWO_GB // 2:
        onnx.checker.check_model(m, full_check=True)
    if out_path is not None:
        _save(m, out_path)
        if _payload(m) >= _TWO_GB // 2:
            onnx.checker.check_model(str(out_path), full_check=True)
    return m
