"""Quantize an activation before the Pad that feeds its convolution, where that is exact.

Models exported from TensorFlow-style "same" padding (EfficientNet, MobileNet ports) put an
explicit ``Pad`` before many convolutions. onnxruntime folds such a Pad into the Conv's own
``pads`` (its Pad fusion) - but only while the Pad feeds the Conv directly. A quantized
activation between them (``Pad -> QuantizeDequantizeMX -> Conv``) stops the fusion, and every
Pad then runs as a node of its own, a full copy of the activation (3 ms of EfficientNet-Lite0's
9 ms float run, measured with onnxruntime's profiler).

Quantizing the Pad's input instead (``QuantizeDequantizeMX -> Pad -> Conv``) gives the same bits
when the tiles are the same before and after the Pad:

- no pad touches the tile axis (the tiles run along the channels, the pads along the spatial
  axes), so every tile of the padded tensor is either a tile of the input at some position or
  a new one;
- a new tile is all zeros (``constant`` mode with value +0) and quantizes to all +0 (checked
  by a cast of such a tile), or a copy of an input position (``edge``, ``reflect``, ``wrap``),
  whose quantized values are the copies of that position's;
- no pad is negative (cropping could drop the element that sets a tensor scale);
- the tile is one-dimensional, has no zero point, and rounding is not stochastic (stochastic
  bits depend on the element's index).

`hoist_over_pads` applies this to a plan; the Pad's output must have no reader other than the
planned consumers. Pads whose ``pads`` / ``constant_value`` / ``axes`` are initializers,
Constant nodes or small computed chains of constants (folded here with onnx's reference
evaluator) are taken; anything else stays as planned.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import onnx
from onnx import numpy_helper

from onnxq.cast.api import cast
from onnxq.formats.datatype import DataType
from onnxq.graph.plan import ActivationPlan, QuantPlan, Scope, TensorTypes, lookup
from onnxq.graph.walk import node_attrs, node_subgraphs

__all__ = ["hoist_over_pads"]

# Constant chains folded to read a Pad's inputs: these ops, at most this many nodes and elements.
_FOLDABLE = {
    "Cast", "Concat", "ConstantOfShape", "Gather", "Identity", "Reshape", "Slice", "Squeeze",
    "Transpose", "Unsqueeze", "Add", "Sub", "Mul", "Neg",
}  # fmt: skip
_MAX_FOLD_NODES = 32
_MAX_ELEMENTS = 4096


class _Folder:
    """Values of small constant tensors of one scope chain (None where not a constant)."""

    def __init__(self, opset: int) -> None:
        self.opset, self.budget = opset, _MAX_FOLD_NODES
        self.known: dict[tuple[int, str], np.ndarray] = {}

    def value(self, scope: Scope, name: str) -> np.ndarray | None:
        """The constant value of ``name`` seen from ``scope`` (None: not a small constant)."""
        key = (id(scope), name)
        if key not in self.known:
            value = self._value(scope, name)
            if value is None:
                return None  # not remembered: a spent fold budget must not outlive its Pad
            self.known[key] = value
        return self.known[key]

    def fresh(self) -> None:
        """A new fold budget (one per Pad)."""
        self.budget = _MAX_FOLD_NODES

    def _value(self, scope: Scope, name: str) -> np.ndarray | None:
        owner, kind = lookup(scope, name)
        if owner is None or kind == "input":
            return None
        if kind == "init":
            return _small(owner.inits[name])
        node = owner.producers[name]
        if node.op_type == "Constant":  # value_ints, value_float, ...: the evaluator reads them
            attrs = {a.name: a for a in node.attribute}
            return _small(attrs["value"].t) if "value" in attrs else self._run(node, {})
        if node.op_type not in _FOLDABLE or node.domain not in ("", "ai.onnx") or self.budget <= 0:
            return None
        self.budget -= 1
        feeds = {}
        for i in node.input:
            if i:
                v = self.value(owner, i)
                if v is None:
                    return None
                feeds[i] = v
        if node.op_type == "ConstantOfShape" and int(np.prod(feeds[node.input[0]])) > _MAX_ELEMENTS:
            return None
        return self._run(node, feeds)

    def _run(self, node: onnx.NodeProto, feeds: dict[str, np.ndarray]) -> np.ndarray | None:
        from onnx.reference import ReferenceEvaluator

        try:
            out = ReferenceEvaluator(node, opsets={"": self.opset}).run(None, feeds)
        except Exception:  # a malformed chain: no fold, the activation stays as planned
            return None
        value = np.asarray(out[0])
        return value if value.size <= _MAX_ELEMENTS else None


def _small(tensor: onnx.TensorProto) -> np.ndarray | None:
    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        return None
    if int(np.prod(tensor.dims, dtype=np.int64)) > _MAX_ELEMENTS:
        return None
    try:
        return numpy_helper.to_array(tensor)
    except Exception:  # a corrupt payload: not a constant this pass can use
        return None


def _per_axis_pads(
    pad: onnx.NodeProto, scope: Scope, folder: _Folder, rank: int
) -> np.ndarray | None:
    """The Pad's begin/end pads per axis, ``[2, rank]``, or None where they are not constant."""
    if len(pad.input) < 2 or not pad.input[1]:
        return None
    pads = folder.value(scope, pad.input[1])
    if pads is None or pads.dtype.kind not in "iu":
        return None
    pads = pads.astype(np.int64).reshape(-1)
    axes = list(range(rank))
    if len(pad.input) > 3 and pad.input[3]:
        given = folder.value(scope, pad.input[3])
        if given is None or given.dtype.kind not in "iu":
            return None
        axes = [int(a) % rank if -rank <= int(a) < rank else -1 for a in given.reshape(-1)]
        if -1 in axes or len(set(axes)) != len(axes):
            return None
    if pads.size != 2 * len(axes):
        return None
    full = np.zeros((2, rank), dtype=np.int64)
    full[0, axes] = pads[: len(axes)]
    full[1, axes] = pads[len(axes) :]
    return full


def _fill_is_zero(pad: onnx.NodeProto, scope: Scope, folder: _Folder) -> bool:
    """True when a constant-mode Pad fills with +0 (no value given, or a +0 scalar)."""
    if len(pad.input) < 3 or not pad.input[2]:
        return True
    value = folder.value(scope, pad.input[2])
    if value is None or value.size != 1:
        return False
    v = value.reshape(-1)[0]
    return bool(v == 0 and not np.signbit(v))


@functools.lru_cache(maxsize=64)
def _zero_tiles_stay_zero(dtype: DataType, round_mode: str, scale_mode: str) -> bool:
    """Whether an all-zero tile of the format quantizes to all +0 (next to a live one)."""
    x = np.zeros((2, 64), dtype=np.float32)
    x[1] = np.linspace(-3.0, 5.0, 64, dtype=np.float32)
    y = np.asarray(cast(x, dtype, axis=1, round_mode=round_mode, scale_mode=scale_mode))
    return bool(np.all(y[0].view(np.uint32) == 0))


def _format_commutes(dtype: DataType, round_mode: str) -> bool:
    s = dtype.sspec
    return s is not None and len(s.tiles) == 1 and s.zero is None and round_mode != "stochastic"


def _readers(scope: Scope, name: str) -> list[tuple[onnx.NodeProto, int]] | None:
    """The (node, input index) pairs reading ``name`` in ``scope``; None if anything else does."""
    g = scope.graph
    if any(o.name == name for o in g.output):
        return None
    found = []
    for node in g.node:
        found.extend((node, i) for i, inp in enumerate(node.input) if inp == name)
        if any(_mentions(sub, name) for sub in node_subgraphs(node)):
            return None
    return found


def _mentions(graph: onnx.GraphProto, name: str) -> bool:
    return any(
        name in node.input or any(_mentions(s, name) for s in node_subgraphs(node))
        for node in graph.node
    )


def _hoisted(
    entry: ActivationPlan, folder: _Folder, types: TensorTypes, symbols: TensorTypes
) -> ActivationPlan | None:
    owner, kind = lookup(entry.scope, entry.tensor)
    if owner is not entry.scope or kind != "node":
        return None
    pad = owner.producers[entry.tensor]
    if pad.op_type != "Pad" or pad.domain not in ("", "ai.onnx") or not pad.input[0]:
        return None
    readers = _readers(owner, entry.tensor)
    slots = sorted((id(n), i) for n, i in entry.slots)
    if readers is None or sorted((id(n), i) for n, i in readers) != slots:
        return None
    x = pad.input[0]
    folder.fresh()
    elem, shape = types.get(x, (0, None))
    if elem != entry.elem_type or shape is None or entry.shape is None:
        return None
    rank = len(shape)
    if rank != len(entry.shape):
        return None
    pads = _per_axis_pads(pad, owner, folder, rank)
    if pads is None or (pads < 0).any() or pads[:, entry.axis].any():
        return None
    mode = str(node_attrs(pad).get("mode", "constant"))
    if mode not in ("constant", "edge", "reflect", "wrap"):
        return None
    if mode == "constant" and not (
        _fill_is_zero(pad, owner, folder)
        and _zero_tiles_stay_zero(entry.dtype, entry.round_mode, entry.scale_mode)
    ):
        return None
    dims = symbols.get(x, (0, None))[1]
    return dataclasses.replace(
        entry,
        tensor=x,
        slots=((pad, 0),),
        shape=list(shape),
        dims=tuple(dims) if dims is not None and len(dims) == rank else tuple(shape),
        reason=f"{entry.reason}; quantized before Pad {pad.name or entry.tensor!r} "
        f"(no pad on axis {entry.axis}: the same tiles, and onnxruntime can fold the Pad)",
    )


def hoist_over_pads(
    plan: QuantPlan, model: onnx.ModelProto, types: TensorTypes, symbols: TensorTypes
) -> QuantPlan:
    """``plan`` with each activation read only through a commuting Pad moved to the Pad's input.

    Args:
        plan: the graph pass's plan (not modified).
        model: the model the plan is for (its ai.onnx opset folds the Pads' constant inputs).
        types: tensor element types and dims (`onnxq.graph.plan.tensor_types`).
        symbols: the same with symbolic dims named.

    Returns:
        The plan with those entries' ``tensor``, ``slots``, ``shape``, ``dims`` and ``reason``
        replaced; every other entry as it was.
    """
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 21)
    folder = _Folder(opset)
    moved = []
    for entry in plan.activations:
        new = None
        if isinstance(entry, ActivationPlan) and _format_commutes(entry.dtype, entry.round_mode):
            new = _hoisted(entry, folder, types, symbols)
        moved.append(new or entry)
    return dataclasses.replace(plan, activations=tuple(moved))
