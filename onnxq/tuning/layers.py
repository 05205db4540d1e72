"""What a search tunes: layers (named nodes and the weights they read), candidates, recipes.

A *layer* is a group of named target nodes and the weight tensors they read, closed under
sharing (two nodes reading one weight are one layer, since the pass quantizes a weight once).
The layers are those the starting recipe's op types select and does not exclude or keep in
float. Nodes without a name cannot be named by a recipe: a layer holding one is not tuned and
stays float (the report lists it). An *assignment* maps each layer to a candidate format (or
``float``); `assignment_recipe` turns it into the recipe the graph pass reads: the starting
recipe with no default weight format and one node override per tuned node.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import onnx

from onnxq.formats.datatype import datatype
from onnxq.graph.plan import WeightPlan, plan
from onnxq.graph.recipe import KEEP_FLOAT, Recipe

__all__ = [
    "DEFAULT_CANDIDATES",
    "FLOAT",
    "Layer",
    "assignment_recipe",
    "bits_of",
    "find_layers",
    "glob_escape",
    "parse_candidates",
    "weight_plans",
]

DEFAULT_CANDIDATES = ("mxfp4", "mx6", "mxfp6", "mxfp8", "bfp16")
FLOAT = "float"  # a candidate that keeps the layer's weights in float32
Assignment = Mapping[str, str]  # layer name -> candidate name


@dataclasses.dataclass(frozen=True)
class Layer:
    """One tunable group: its name (the first node's), its nodes, weights and weight count."""

    name: str
    nodes: tuple[str, ...]
    tensors: tuple[str, ...]
    size: int


def bits_of(candidate: str) -> float:
    """Bits per weight value of a candidate (scales included; ``float``: 32)."""
    return 32.0 if candidate == FLOAT else float(datatype(candidate).bits_per_value)


def parse_candidates(names: Sequence[str] | str | None) -> tuple[str, ...]:
    """Candidate formats, checked and ordered by bits per value (fewest first).

    Raises:
        ValueError: an unknown format, or no candidate.
    """
    if names is None:
        names = DEFAULT_CANDIDATES
    if isinstance(names, str):
        names = [n.strip() for n in names.split(",")]
    names = [n for n in dict.fromkeys(names) if n]
    if not names:
        raise ValueError("no candidate format; give e.g. mxfp4,mx6,mxfp8")
    for n in names:
        if n == FLOAT:
            continue
        try:
            datatype(n)
        except (ValueError, TypeError) as err:
            raise ValueError(
                f"unknown candidate format {n!r} ({err}); run `onnxq formats` for the presets"
            ) from None
    return tuple(sorted(names, key=bits_of))


def glob_escape(name: str) -> str:
    """``name`` as a recipe pattern that matches exactly that name (fnmatch escapes)."""
    return "".join(f"[{c}]" if c in "*?[" else c for c in name)


def _probe(base: Recipe, candidate: str) -> Recipe:
    """The starting recipe with every target's weights in ``candidate`` (to find layers)."""
    fmt = datatype(candidate if candidate != FLOAT else "mxfp8")
    return dataclasses.replace(base, weights=fmt, activations=None)


def find_layers(
    model: onnx.ModelProto, base: Recipe
) -> tuple[list[Layer], list[str], dict[str, WeightPlan]]:
    """The layers of ``model`` the starting recipe lets a search tune.

    Returns:
        (layers in graph order, labels of nodes left untuned because they have no name,
        the planned weight entries by tensor name).

    Raises:
        ValueError: a recipe pattern that matches no node (from the plan).
    """
    entries = plan(model, _probe(base, "mxfp8")).weights
    named = {n.name for n in _all_nodes(model.graph) if n.name}
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        while parent.setdefault(x, x) != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for e in entries:  # union each weight with the nodes that read it
        for c in e.consumers:
            parent[find("n:" + c)] = find("w:" + e.tensor)
    groups: dict[str, dict[str, list[Any]]] = {}
    for e in entries:
        g = groups.setdefault(find("w:" + e.tensor), {"nodes": [], "entries": []})
        g["entries"].append(e)
        g["nodes"].extend(c for c in e.consumers if c not in g["nodes"])
    layers, untuned = [], []
    for g in groups.values():
        nodes = g["nodes"]
        if any(n not in named for n in nodes):
            untuned.extend(nodes)
            continue
        size = sum(math.prod(e.source.tensor.dims) for e in g["entries"])
        tensors = tuple(e.tensor for e in g["entries"])
        layers.append(Layer(nodes[0], tuple(nodes), tensors, int(size)))
    return layers, untuned, {e.tensor: e for e in entries}


def _all_nodes(graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    out = []
    for node in graph.node:
        out.append(node)
        for attr in node.attribute:
            for g in [attr.g] if attr.HasField("g") else list(attr.graphs):
                out.extend(_all_nodes(g))
    return out


def assignment_recipe(
    base: Recipe, layers: Sequence[Layer], assignment: Assignment, weights_only: bool
) -> dict[str, Any]:
    """The recipe mapping (YAML/JSON-ready) that quantizes ``assignment``.

    The starting recipe's modes, op types, exclusions and activation choices are kept (in
    weights+activations mode each tuned node's activations take its layer's format); its
    default weight format and op-type weight formats are dropped, so only tuned nodes get
    weight formats, one node override each (later overrides win over the recipe's own).
    """
    data = base.to_dict()
    data["weights"] = None
    op_types = {}
    for op, override in data["op_type_overrides"].items():
        kept = {k: v for k, v in override.items() if k != "weights" or v is None}
        if kept:
            op_types[op] = kept
    data["op_type_overrides"] = op_types
    nodes = dict(data["node_overrides"])
    for layer in layers:
        fmt = assignment.get(layer.name, FLOAT)
        value = None if fmt == FLOAT else fmt
        for node in layer.nodes:
            override: dict[str, Any] = {"weights": value}
            if not weights_only:
                override["activations"] = value
            key = glob_escape(node)
            nodes.pop(key, None)  # re-insert last: a later pattern wins
            nodes[key] = override
    data["node_overrides"] = nodes
    return data


def weight_plans(
    model: onnx.ModelProto,
    base: Recipe,
    layers: Sequence[Layer],
    candidate: str,
    types: Mapping[str, Any] | None = None,
) -> dict[str, WeightPlan]:
    """Tensor -> its planned entry with every layer in ``candidate``, as the graph pass plans it.

    The data type decides more than the element grid: a conv weight's tiling (a short
    reduction axis is tiled as a matrix only when shorter than the type's tile,
    `onnxq.graph.tiling`), so a trial must read the entry planned for its own format.
    """
    uniform = {layer.name: candidate for layer in layers}
    recipe = Recipe.from_mapping(assignment_recipe(base, layers, uniform, True))
    return {e.tensor: e for e in plan(model, recipe, types).weights}  # type: ignore[arg-type]


def has_activations(recipe: Mapping[str, Any]) -> bool:
    """True when a recipe mapping quantizes some activation."""
    overrides = [*recipe.get("op_type_overrides", {}).values()]
    overrides += [*recipe.get("node_overrides", {}).values()]
    return recipe.get("activations") not in (None, KEEP_FLOAT) or any(
        o.get("activations") not in (None, KEEP_FLOAT) for o in overrides
    )
