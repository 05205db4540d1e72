"""What the graph pass quantizes, and along which axis: `plan` and the op-role table.

`plan` walks every graph (subgraphs of If/Loop/Scan included) and returns a `QuantPlan`: each
weight and activation tensor with its data type, tile axis and the reason. The op-role table
(`ROLES`) says which inputs of each supported op type are weights or activations and along which
axis they are reduced; `SUPPORTED_OP_TYPES` (the op types a recipe may name) is its keys.

Weights are initializers or ``Constant`` outputs (subgraph and outer-scope ones included),
reached through Transpose/Cast/Identity; their axis is the consumer's reduction axis mapped back
through any Transpose. Everything else a target node reads is an activation.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Protocol

import onnx
from onnx import TensorProto

from onnxq.formats.datatype import DataType, datatype
from onnxq.graph.schemas import infer_shapes
from onnxq.graph.tiling import flat_shape
from onnxq.graph.walk import node_attrs, node_subgraphs

__all__ = [
    "ROLES",
    "SUPPORTED_OP_TYPES",
    "ActivationEntry",
    "ActivationPlan",
    "PlanEntry",
    "QuantPlan",
    "Scope",
    "SkippedEntry",
    "WeightEntry",
    "WeightPlan",
    "lookup",
    "plan",
    "scopes",
    "tensor_types",
]

FLOAT_TYPES = (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16)
_PASS_THROUGH = ("Transpose", "Cast", "Identity")

AxisFn = Callable[[int], int]
# (input index, weight only, reduction axis as a function of the input's rank)
Role = tuple[int, bool, AxisFn]
TensorTypes = Mapping[str, tuple[int, list[int | None] | None]]


class NodeChoice(Protocol):
    """What the choices say for one node (`onnxq.graph.recipe.Override`, fully resolved)."""

    @property
    def weights(self) -> DataType | str | None: ...
    @property
    def activations(self) -> DataType | str | None: ...
    @property
    def round_mode(self) -> str | None: ...
    @property
    def scale_mode(self) -> str | None: ...
    @property
    def weight_scale_mode(self) -> str | None: ...
    @property
    def weight_axis(self) -> int | None: ...
    @property
    def activation_axis(self) -> int | None: ...


class Choices(Protocol):
    """What `plan` asks of the choices (`onnxq.graph.recipe.Recipe`, which imports this module)."""

    def check_nodes(self, names: Iterable[str]) -> None:
        """Refuse patterns that match no node."""

    def resolve(self, op_type: str, node_name: str) -> NodeChoice | None:
        """The choices for one node, or None when it is not a target."""


def _last(rank: int) -> int:
    return rank - 1


def _matmul(_attrs: Mapping[str, Any]) -> list[Role]:
    return [(0, False, _last), (1, False, lambda rank: rank - 2 if rank >= 2 else 0)]


def _gemm(attrs: Mapping[str, Any]) -> list[Role]:
    a = 0 if attrs.get("transA", 0) else 1
    b = 1 if attrs.get("transB", 0) else 0
    return [(0, False, lambda _r: a), (1, False, lambda _r: b)]


def _conv(_attrs: Mapping[str, Any]) -> list[Role]:
    return [(0, False, lambda _r: 1), (1, False, lambda _r: 1)]


def _conv_transpose(_attrs: Mapping[str, Any]) -> list[Role]:
    return [(0, False, lambda _r: 1), (1, False, lambda _r: 0)]


def _recurrent(_attrs: Mapping[str, Any]) -> list[Role]:
    # W and R computed by other nodes are quantized as activations (reduced along input/hidden).
    return [(0, False, _last), (1, False, _last), (2, False, _last)]


def _gather(attrs: Mapping[str, Any]) -> list[Role]:
    return [(0, True, _last)] if attrs.get("axis", 0) == 0 else []


# The op-role table: op type -> its roles from the node's attributes. Its keys, in this order,
# are the op types a recipe may name.
ROLES: dict[str, Callable[[Mapping[str, Any]], list[Role]]] = {
    "MatMul": _matmul,
    "Gemm": _gemm,
    "Conv": _conv,
    "ConvTranspose": _conv_transpose,
    "LSTM": _recurrent,
    "GRU": _recurrent,
    "RNN": _recurrent,
    "Gather": _gather,
}
SUPPORTED_OP_TYPES = tuple(ROLES)


def roles(node: onnx.NodeProto) -> list[Role]:
    """(input index, weight only, reduction axis as a function of the input's rank)."""
    if node.op_type not in ROLES:
        raise ValueError(f"op type {node.op_type!r} has no known reduction axes")
    return ROLES[node.op_type](node_attrs(node))


# -- the plan's entries -----------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, kw_only=True)
class PlanEntry:
    """One tensor the graph pass quantizes.

    Attributes:
        tensor: the tensor name (initializer, Constant output or activation).
        dtype: its data type.
        axis: the axis tiles run along (the consumers' reduction axis, mapped back through
            Transpose for weights).
        round_mode: element rounding.
        scale_mode: scale selection.
        consumers: names (or op types) of the target nodes that read it.
        reason: why this format and axis (for reports and metadata).
    """

    tensor: str
    dtype: DataType
    axis: int
    round_mode: str
    scale_mode: str
    consumers: tuple[str, ...]
    reason: str


@dataclasses.dataclass(frozen=True, kw_only=True)
class WeightEntry(PlanEntry):
    """A weight quantized once, however many nodes use it.

    ``tiled_shape`` is the 2-D shape a conv weight with a short reduction axis is tiled in
    (``[M, C/group*kh*kw]``, `onnxq.graph.tiling`), with ``axis`` then an axis of it; None when
    the weight is tiled in its own shape.
    """

    tiled_shape: tuple[int, ...] | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class ActivationEntry(PlanEntry):
    """An activation tensor that gets one QuantizeMX -> DequantizeMX pair for all consumers."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class SkippedEntry:
    """A float input of a target op that stays float, and why (its tile axis is unknown)."""

    tensor: str
    consumers: tuple[str, ...]
    reason: str

    def as_dict(self) -> dict[str, str]:
        """The ``onnxq_skipped`` metadata entry."""
        return {
            "tensor": self.tensor,
            "consumers": ", ".join(self.consumers),
            "reason": self.reason,
        }


@dataclasses.dataclass(frozen=True, kw_only=True)
class QuantPlan:
    """Everything the graph pass will change: weights first, then activations.

    ``skipped`` lists the float inputs of target ops that stay float: an activation is skipped
    only when its tile axis cannot be known (unknown rank, or a scalar).
    """

    weights: tuple[WeightEntry, ...] = ()
    activations: tuple[ActivationEntry, ...] = ()
    skipped: tuple[SkippedEntry, ...] = ()


# -- graph index ------------------------------------------------------------------------------
@dataclasses.dataclass(eq=False)
class Scope:
    """One graph of the model with its parent scope and what it defines."""

    graph: onnx.GraphProto
    parent: Scope | None
    inits: dict[str, TensorProto]
    producers: dict[str, onnx.NodeProto]
    inputs: set[str]
    depth: int


def scopes(graph: onnx.GraphProto, parent: Scope | None = None) -> Iterator[Scope]:
    """The scope of ``graph`` and of every subgraph inside it, parents first."""
    scope = Scope(
        graph,
        parent,
        {t.name: t for t in graph.initializer},
        {o: n for n in graph.node for o in n.output if o},
        {i.name for i in graph.input},
        0 if parent is None else parent.depth + 1,
    )
    yield scope
    for node in graph.node:
        for sub in node_subgraphs(node):
            yield from scopes(sub, scope)


def lookup(scope: Scope | None, name: str) -> tuple[Scope | None, str]:
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
class Source:
    """Where a weight's values are stored."""

    scope: Scope
    name: str
    tensor: TensorProto
    constant: onnx.NodeProto | None  # the Constant node that holds the tensor


def _trace(scope: Scope, name: str) -> tuple[Source, list[list[int] | None]] | None:
    """Follow Transpose/Cast/Identity back to a float initializer or Constant."""
    perms: list[list[int] | None] = []
    for _ in range(64):
        owner, kind = lookup(scope, name)
        if owner is None or kind == "input":
            return None
        if kind == "init":
            tensor = owner.inits[name]
            return (Source(owner, name, tensor, None), perms) if _is_weight(tensor) else None
        node = owner.producers[name]
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            attr = next((a for a in node.attribute if a.name == "value"), None)
            if attr is None or not _is_weight(attr.t):
                return None
            return Source(owner, name, attr.t, node), perms
        if node.op_type not in _PASS_THROUGH or node.domain not in ("", "ai.onnx"):
            return None
        if node.op_type == "Transpose":
            perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), None)
            perms.append(perm)
        name, scope = node.input[0], owner
    return None


def _is_weight(tensor: TensorProto) -> bool:
    return tensor.data_type in FLOAT_TYPES and len(tensor.dims) >= 1 and all(tensor.dims)


def _map_axis(axis: int, rank: int, perms: list[list[int] | None]) -> int:
    for perm in perms:  # consumer side first: output axis a reads input axis perm[a]
        axis = (perm or list(range(rank))[::-1])[axis]
    return axis


# -- planning ---------------------------------------------------------------------------------
def _dim(d: onnx.TensorShapeProto.Dimension, symbolic: bool) -> int | str | None:
    """A dim's size (a negative size, as some exporters write for "any", is unknown)."""
    if d.HasField("dim_value"):
        return d.dim_value if d.dim_value >= 0 else None
    if symbolic and d.HasField("dim_param") and d.dim_param:
        return d.dim_param
    return None


def tensor_types(
    model: onnx.ModelProto, *, symbolic: bool = False
) -> dict[str, tuple[int, list[Any] | None]]:
    """Tensor name -> (element type, dims or None when the rank is unknown), every graph.

    A dim is its size, or None when it is not known before run time (symbolic, negative such
    as ``-1``, or unset); with ``symbolic`` a named dim is its name (``"batch"``) instead.
    """
    found: dict[str, tuple[int, list[Any] | None]] = {}
    for scope in scopes(model.graph):
        g = scope.graph
        for info in [*g.input, *g.value_info, *g.output]:
            if not info.type.HasField("tensor_type"):
                continue  # sequences, maps, optionals: not tensors
            t = info.type.tensor_type
            dims = None
            if t.HasField("shape"):
                dims = [_dim(d, symbolic) for d in t.shape.dim]
            found[info.name] = (t.elem_type, dims)
        for init in g.initializer:
            found[init.name] = (init.data_type, list(init.dims))
    return found


def node_label(node: onnx.NodeProto) -> str:
    """The node's name, or its op type and outputs when it has none (for messages)."""
    return node.name or f"{node.op_type}({', '.join(node.output)})"


@dataclasses.dataclass(frozen=True, kw_only=True)
class WeightPlan(WeightEntry):
    """A planned weight with where its values are stored."""

    source: Source

    @classmethod
    def make(cls, e: dict[str, Any]) -> WeightPlan:
        """The entry from the mapping `plan` collects."""
        return cls(**{**e, "consumers": tuple(e["consumers"])})


@dataclasses.dataclass(frozen=True, kw_only=True)
class ActivationPlan(ActivationEntry):
    """A planned activation with the node inputs that read it and its type.

    ``shape`` holds X's dims (None where unknown before run time), ``dims`` the same with the
    names of symbolic dims (for the value_info of the outputs); the rank is always known.
    """

    slots: tuple[tuple[onnx.NodeProto, int], ...]
    scope: Scope
    elem_type: int
    shape: list[int | None] | None
    dims: tuple[int | str | None, ...] | None = None

    @classmethod
    def make(cls, e: dict[str, Any]) -> ActivationPlan:
        """The entry from the mapping `plan` collects."""
        return cls(**{**e, "consumers": tuple(e["consumers"]), "slots": tuple(e["slots"])})

    @property
    def static(self) -> bool:
        """True when every dim is known before run time and positive."""
        return self.shape is not None and all(d is not None and d > 0 for d in self.shape)


class _Collector:
    """The weights and activations found so far, one entry per tensor."""

    def __init__(self, types: TensorTypes, symbols: TensorTypes) -> None:
        self.types, self.symbols = types, symbols
        self.weights: dict[tuple[int, str], dict[str, Any]] = {}
        self.acts: dict[tuple[str, int], dict[str, Any]] = {}
        self.skipped: dict[str, dict[str, Any]] = {}

    def weight(
        self,
        traced: tuple[Source, list[list[int] | None]],
        choice: NodeChoice,
        role: Role,
        node: onnx.NodeProto,
    ) -> None:
        source, perms = traced
        index, _, axis_of = role
        label = node_label(node)
        rank = len(source.tensor.dims)
        axis = choice.weight_axis if choice.weight_axis is not None else axis_of(rank)
        if not -rank <= axis < rank:
            raise ValueError(f"node {label!r}: weight axis {axis} is out of range")
        axis = _map_axis(axis % rank, rank, perms)
        key = (id(source.scope), source.name)
        entry = self.weights.get(key)
        if entry is None:
            tiled = None
            if choice.weight_axis is None and not perms and choice.weights is not None:
                dt = datatype(choice.weights) if isinstance(choice.weights, str) else choice.weights
                tiled = flat_shape(node.op_type, dt, source.tensor.dims, axis)
            reason = f"{node.op_type} input {index}: reduction axis {axis}"
            if tiled is not None:
                reason += (
                    f" holds {source.tensor.dims[axis]} value(s), shorter than a tile: tiled as "
                    f"{list(tiled)} along axis 1 (the whole reduction)"
                )
                axis = 1
            self.weights[key] = {
                "source": source,
                "tensor": source.name,
                "dtype": choice.weights,
                "axis": axis,
                "round_mode": choice.round_mode,
                "scale_mode": choice.weight_scale_mode or choice.scale_mode,
                "consumers": [label],
                "reason": reason,
                "tiled_shape": tiled,
            }
            return
        entry["consumers"].append(label)
        if entry["axis"] != axis or entry["dtype"] != choice.weights:
            entry["reason"] += (
                f"; also read by {label!r} wanting {choice.weights} axis {axis} "
                "(quantized once, as first planned)"
            )

    def activation(
        self, scope: Scope, name: str, choice: NodeChoice, role: Role, node: onnx.NodeProto
    ) -> None:
        index, _, axis_of = role
        label = node_label(node)
        elem, shape = self.types.get(name, (0, None))
        if elem and elem not in FLOAT_TYPES:
            return  # not a float input (an int MatMul, a bad model): nothing to quantize
        if shape is None or not shape:
            self._skip(name, label, _UNKNOWN_RANK if shape is None else _SCALAR)
            return
        rank = len(shape)
        axis = choice.activation_axis if choice.activation_axis is not None else axis_of(rank)
        if not -rank <= axis < rank:
            raise ValueError(
                f"node {label!r}: activation axis {axis} is out of range for input {index} "
                f"{name!r} of rank {rank}"
            )
        axis %= rank
        key = (name, axis)
        entry = self.acts.get(key)
        if entry is not None:
            entry["consumers"].append(label)
            entry["slots"].append((node, index))
            return
        dims = self.symbols.get(name, (0, None))[1]
        self.acts[key] = {
            "tensor": name,
            "dtype": choice.activations,
            "axis": axis,
            "round_mode": choice.round_mode,
            "scale_mode": choice.scale_mode,
            "consumers": [label],
            "slots": [(node, index)],
            "scope": scope,
            "elem_type": elem or TensorProto.FLOAT,
            "shape": shape,
            "dims": tuple(dims) if dims is not None and len(dims) == rank else tuple(shape),
            "reason": f"{node.op_type} input {index}: reduction axis {axis}",
        }

    def _skip(self, name: str, label: str, reason: str) -> None:
        entry = self.skipped.setdefault(name, {"reason": reason, "consumers": []})
        entry["consumers"].append(label)


_UNKNOWN_RANK = (
    "unknown rank (shape inference gives no shape), so its tile axis cannot be known; declare "
    "the model inputs' shapes (or fix what stops shape inference) to quantize it"
)
_SCALAR = "a scalar has no axis to tile along"


def plan(
    model: onnx.ModelProto,
    recipe: Choices,
    types: TensorTypes | None = None,
    symbols: TensorTypes | None = None,
) -> QuantPlan:
    """What `quantize_model` would quantize in ``model`` (not modified), and why.

    Every float input of a target op that is not a weight is an activation, whatever its
    dims (symbolic, ``-1``, unknown or zero); it is skipped only when its rank is unknown.

    Args:
        model: the float model.
        recipe: the choices (validated against the model's node names here).
        types: tensor element types and dims from shape inference (`tensor_types`); inferred
            when None.
        symbols: the same with symbolic dims named (``tensor_types(..., symbolic=True)``), for
            the outputs' value_info; ``types`` when None.

    Returns:
        The plan: one entry per weight (shared weights once), per activation tensor and tile
        axis, and per skipped activation.

    Raises:
        ValueError: a recipe pattern matches no node, or an axis override is out of range.
    """
    all_scopes = list(scopes(model.graph))
    recipe.check_nodes(n.name for s in all_scopes for n in s.graph.node)
    if types is None:
        inferred = infer_shapes(model)
        types, symbols = tensor_types(inferred), tensor_types(inferred, symbolic=True)
    found = _Collector(types, symbols if symbols is not None else types)
    for scope in all_scopes:
        for node in scope.graph.node:
            if node.domain not in ("", "ai.onnx"):
                continue
            choice = recipe.resolve(node.op_type, node.name)
            if choice is None:
                continue
            for role in roles(node):
                index, weight_only, _ = role
                if index >= len(node.input) or not node.input[index]:
                    continue
                name = node.input[index]
                traced = _trace(scope, name)
                if traced is not None:
                    if choice.weights is not None:
                        found.weight(traced, choice, role, node)
                elif not weight_only and choice.activations is not None:
                    found.activation(scope, name, choice, role, node)
    return QuantPlan(
        weights=tuple(WeightPlan.make(e) for e in found.weights.values()),
        activations=tuple(ActivationPlan.make(e) for e in found.acts.values()),
        skipped=tuple(
            SkippedEntry(tensor=k, consumers=tuple(v["consumers"]), reason=v["reason"])
            for k, v in found.skipped.items()
        ),
    )
