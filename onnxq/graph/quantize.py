"""The graph pass: `quantize_model` makes a float ONNX model compute in onnxq formats.

It works in two steps (style.md item 10): `plan` (`onnxq.graph.plan`) walks every graph
(subgraphs of If/Loop/Scan included) and returns a `QuantPlan` - each weight and activation
tensor with its data type, tile axis and the reason - and `quantize_model` materialises it
(this module: the rewriting; `onnxq.graph.model_io` reads and writes the model,
`onnxq.graph.pass_checks` checks the options and the plan first):

- weights (initializers, ``Constant`` outputs, subgraph and outer-scope initializers, reached
  through Transpose/Cast/Identity) are quantized once, along the consuming op's reduction axis
  mapped back through any Transpose. ``packed`` storage keeps the `onnxq.cast` compress-mode
  fields as uint8/16/32 initializers of the main graph and a ``DequantizeMX`` (``CodebookLookup``
  for codebooks) node, also in the main graph, that produces the float weight under its old name
  (subgraphs read it from the outer scope); ``fake`` storage replaces the values in place.
  Conv weights whose reduction axis is shorter than a tile (depthwise) are tiled as the matrix
  ``[M, C/group*kh*kw]`` and a ``Reshape`` restores their shape (`onnxq.graph.tiling`).
- activations (every float input of a target op that is not a weight) get, per tensor and
  tile axis, one ``QuantizeDequantizeMX`` node (``fuse=True``) or a ``QuantizeMX ->
  DequantizeMX`` pair (``fuse=False``; DequantizeMX learns a shape known only at run time
  from a ``Shape(X)`` node), placed after the producer (`onnxq.graph.activation_nodes`); the
  target consumers read the dequantized tensor. Symbolic, ``-1``, unknown and zero dims all
  work: only an activation of unknown rank (its tile axis cannot be known) stays float,
  listed with its reason in the ``onnxq_skipped`` metadata.

``target="standard"`` writes no onnxq node: each packed weight becomes plain ai.onnx nodes
(``DequantizeLinear`` with ``block_size``, or ``Gather`` on a value table times the tile
scales; `onnxq.graph.lower`) with the same bits as the onnxq target's DequantizeMX, and each
block-format activation pair is replaced by its standard-ONNX function body (inlined
fallbacks of `onnxq.graph.functions`), so the whole model computes the onnxq target's bits.

Calibration (`onnxq.graph.calibrate`, `onnxq.graph.calibrate_pass`): without it ``QuantizeMX``
computes every activation scale from the data at each call. With ``calibration`` (a directory of
``.npz`` inputs or an iterable of input dicts), activations whose data type has one float scale
per tensor (int8_tensor, uint8_tensor, fp8e4_tensor, fp8e5_tensor, ...) are observed by running
the float model in onnxruntime (``minmax`` or ``percentile`` ranges) and get a static
``QuantizeLinear -> DequantizeLinear`` pair with the calibrated scale (and zero point) instead,
for both targets; the ranges go to the ``onnxq_calibration`` metadata. Channel-scaled
activations refuse calibration (NotImplementedError); exponent and block scales (MX, BFP,
NVFP4...) stay per call, with a warning. ``target="standard"`` needs calibration for
tensor-scaled activations and a QuantizeMX fallback (exponent scales) for block-format ones.

Fusions (`onnxq.graph.fuse`, onnxq target only) run after the rewrite: by default only those
that never cost speed (``gather``: GatherMX); ``fuse="all"`` or a list of names adds
``matmul_mx`` (MatMulMX: fast at few rows of A, about 1.2x float from 64 rows on).
"""

from __future__ import annotations

import dataclasses
import json
import os
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import onnx
import onnx.inliner
from onnx import TensorProto, helper, numpy_helper

from onnxq._version import __version__
from onnxq.cast.api import QTensor, cast
from onnxq.formats.codebook import Codebook
from onnxq.formats.datatype import DataType
from onnxq.graph import calibrate_pass, model_io, pass_checks
from onnxq.graph.activation_nodes import activation_nodes
from onnxq.graph.calibrate import StaticScale, qdq_nodes
from onnxq.graph.commute import hoist_over_pads
from onnxq.graph.functions import build_function, fallback_shape
from onnxq.graph.fuse import apply_fusions, chosen_fusions
from onnxq.graph.lower import lower_weight
from onnxq.graph.plan import (
    ActivationPlan,
    QuantPlan,
    Scope,
    TensorTypes,
    WeightPlan,
    lookup,
    plan,
    scopes,
    tensor_types,
)
from onnxq.graph.recipe import Recipe
from onnxq.graph.schemas import DOMAIN, OPS, infer_shapes, output_types, register_schemas
from onnxq.graph.tiling import restore_nodes
from onnxq.graph.walk import node_attrs, node_subgraphs

__all__ = ["plan", "quantize_model"]

Inserts = dict[int, tuple[Scope, dict[str, list[onnx.NodeProto]]]]


def _keys(names: tuple[str, ...]) -> tuple[str, ...]:
    """The op contract's input or output names as field keys: ``Scale?`` -> ``scale``."""
    return tuple(n.rstrip("?").lower() for n in names)


# The QTensor field of an op contract key (`onnxq.graph.schemas.OPS`) where they differ.
_QTENSOR_FIELDS = {"q": "data"}


class _Names:
    """Fresh tensor and node names: none of the model's names, none given twice."""

    def __init__(self, model: onnx.ModelProto) -> None:
        self.used: set[str] = set()
        for scope in scopes(model.graph):
            g = scope.graph
            self.used.update(t.name for t in g.initializer)
            self.used.update(v.name for v in [*g.input, *g.output, *g.value_info])
            self.used.update(o for n in g.node for o in n.output)
            self.used.update(n.name for n in g.node)

    def fresh(self, base: str) -> str:
        """``base``, or ``base_1``, ``base_2``, ... when it is taken."""
        name, k = base, 0
        while name in self.used:
            k += 1
            name = f"{base}_{k}"
        self.used.add(name)
        return name


def _declare(graph: onnx.GraphProto, node: onnx.NodeProto, in_shape: list[int] | None) -> None:
    """Write value_info for every output of an onnxq node (onnxruntime needs their types)."""
    types = output_types(node.op_type, node_attrs(node), tuple(in_shape) if in_shape else None)
    for name, (elem, shape) in zip(node.output, types, strict=False):
        if name and elem:
            graph.value_info.append(helper.make_tensor_value_info(name, elem, shape))


def _weight_nodes(
    entry: WeightPlan, array: np.ndarray, names: _Names, elem: int
) -> tuple[list[TensorProto], onnx.NodeProto]:
    """The packed fields of a weight as initializers and the node that dequantizes them."""
    q = cast(
        array,
        entry.dtype,
        axis=entry.axis,
        mode="compress",
        round_mode=entry.round_mode,
        scale_mode=entry.scale_mode,
    )
    assert isinstance(q, QTensor)
    inits: dict[str, TensorProto] = {}
    for key in _keys(OPS["DequantizeMX"].inputs):  # names are drawn in this order
        if key == "shape":  # the run-time Shape input: a weight's shape is the attribute
            continue
        value = getattr(q, _QTENSOR_FIELDS.get(key, key))
        if value is not None:
            name = names.fresh(f"{entry.tensor}__{key}")
            inits[key] = numpy_helper.from_array(np.ascontiguousarray(value), name)
    op = "CodebookLookup" if isinstance(entry.dtype.nspec, Codebook) else "DequantizeMX"
    inputs = [inits[k].name if k in inits else "" for k in _keys(OPS[op].inputs)]
    while inputs and not inputs[-1]:
        inputs.pop()
    node = helper.make_node(
        op,
        inputs,
        [entry.tensor],
        name=names.fresh(f"{entry.tensor}__dq"),
        domain=DOMAIN,
        dtype=entry.dtype.code,
        axis=entry.axis,
        shape=list(array.shape),
        output_type=elem,
    )
    return list(inits.values()), node


def _rename_inside(graph: onnx.GraphProto, old: str, new: str) -> None:
    for node in graph.node:
        node.input[:] = [new if i == old else i for i in node.input]
        for sub in node_subgraphs(node):
            _rename_inside(sub, old, new)
    for out in graph.output:
        if out.name == old:
            out.name = new


def _remove(scope: Scope, names: set[str]) -> None:
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


def _apply_inserts(graph: onnx.GraphProto, table: Mapping[str, list[onnx.NodeProto]]) -> None:
    nodes = list(table.get("", []))
    for node in graph.node:
        nodes.append(node)
        for out in node.output:
            nodes.extend(table.get(out, []) if out else [])
    del graph.node[:]
    graph.node.extend(nodes)


class _Rewrite:
    """The rewrite of one model: new names, and the structural changes that wait until the end.

    Activations are rewired first and weights after; nodes are inserted and float tensors
    removed only in `finish`, once every planned reference to a node or tensor has been used.
    """

    def __init__(
        self,
        model: onnx.ModelProto,
        storage: str,
        target: str,
        spill: model_io.Spill | None,
        fuse: bool = True,
    ) -> None:
        self.model, self.storage, self.target, self.spill = model, storage, target, spill
        self.fuse = fuse  # activations: one QuantizeDequantizeMX instead of the pair
        self.names = _Names(model)
        g = model.graph
        self.main_defined = {t.name for t in g.initializer} | {i.name for i in g.input}
        self.main_defined |= {o for n in g.node for o in n.output}
        self.activations = 0  # quantized so far
        self.inserts: Inserts = {}
        self.static_inits: list[TensorProto] = []
        self.dq_nodes: list[onnx.NodeProto] = []
        self.removals: dict[int, tuple[Scope, set[str]]] = {}

    def _queue(self, entry: ActivationPlan, nodes: list[onnx.NodeProto]) -> Scope:
        """Queue ``nodes`` after the producer of ``entry``'s tensor; the scope they go to."""
        owner, kind = lookup(entry.scope, entry.tensor)
        owner = owner or entry.scope
        table = self.inserts.setdefault(id(owner), (owner, {}))[1]
        table.setdefault(entry.tensor if kind == "node" else "", []).extend(nodes)
        return owner

    def activation(self, entry: ActivationPlan) -> None:
        """Rewire the consumers and queue the activation's nodes after its producer.

        One QuantizeDequantizeMX with ``fuse``, else QuantizeMX -> DequantizeMX (with a
        Shape(X) node when X's shape is known only at run time); `activation_nodes`.
        """
        nodes, infos, out = activation_nodes(entry, self.names.fresh, self.fuse)
        for node, index in entry.slots:
            node.input[index] = out
        owner = self._queue(entry, nodes)
        owner.graph.value_info.extend(infos)
        self.activations += 1

    def calibrated(self, entry: ActivationPlan, params: StaticScale) -> None:
        """Rewire the consumers and queue the static QuantizeLinear -> DequantizeLinear pair."""
        out = self.names.fresh(f"{entry.tensor}__dqx")
        inits, nodes = qdq_nodes(entry.tensor, out, params, entry.elem_type, self.names.fresh)
        for node, index in entry.slots:
            node.input[index] = out
        self.static_inits.extend(inits)
        self._queue(entry, nodes)
        self.activations += 1

    def weight(self, entry: WeightPlan) -> None:
        """Quantize one weight; its removal waits in ``removals`` (keeps references valid)."""
        src, spill = entry.source, self.spill
        tensor = src.tensor
        try:
            array = model_io.tensor_values(tensor, spill)
        except ValueError as err:  # payload and dims disagree, unknown element type
            raise ValueError(
                f"weight {entry.tensor!r} cannot be read ({err}): the model file is corrupt; "
                "export or copy it again"
            ) from None
        shape = array.shape
        if entry.tiled_shape is not None:  # a short reduction axis: tiles over the whole one
            array = array.reshape(entry.tiled_shape)
        if self.storage == "fake":
            fake = cast(
                array,
                entry.dtype,
                axis=entry.axis,
                round_mode=entry.round_mode,
                scale_mode=entry.scale_mode,
            ).reshape(shape)
            del array
            if spill is not None:
                spill.set_values(tensor, np.asarray(fake))
            else:
                tensor.CopyFrom(numpy_helper.from_array(np.asarray(fake), tensor.name))
            return
        target_name = entry.tensor
        if src.scope.parent is not None and target_name in self.main_defined:  # would shadow
            target_name = self.names.fresh(f"{entry.tensor}__w")
            _rename_inside(src.scope.graph, entry.tensor, target_name)
        decoded = target_name  # the decoder's output; a Reshape restores the shape from it
        if entry.tiled_shape is not None:
            decoded = self.names.fresh(f"{target_name}__tiled")
        if self.target == "standard":  # plain ai.onnx nodes (lower.py)
            inits, nodes = lower_weight(
                decoded,
                array,
                entry.dtype,
                entry.axis,
                round_mode=entry.round_mode,
                scale_mode=entry.scale_mode,
                output_type=tensor.data_type,
                fresh=self.names.fresh,
            )
        else:
            renamed = dataclasses.replace(entry, tensor=decoded)
            inits, node = _weight_nodes(renamed, array, self.names, tensor.data_type)
            nodes = [node]
        del array
        if decoded != target_name:
            target, reshape = restore_nodes(decoded, target_name, shape, self.names.fresh)
            inits.append(target)
            nodes.append(reshape)
        for field in ("raw_data", "float_data", "int32_data"):  # free the float payload now
            tensor.ClearField(field)
        self.removals.setdefault(id(src.scope), (src.scope, set()))[1].add(entry.tensor)
        if spill is not None:  # the codes wait on disk too
            for init in inits:
                spill.park(init)
        self.model.graph.initializer.extend(inits)
        self.main_defined.add(target_name)
        self.dq_nodes.extend(nodes)
        if self.target != "standard":
            _declare(self.model.graph, nodes[0], None)  # the DequantizeMX / CodebookLookup

    def finish(self) -> None:
        """Make the structural changes: deepest graphs first (rebuilding copies subgraphs)."""
        m = self.model
        removals, inserts = self.removals, self.inserts
        changed = {id(s): s for s, _ in removals.values()} | {id(s): s for s, _ in inserts.values()}
        for key, scope in sorted(changed.items(), key=lambda item: -item[1].depth):
            if key in removals:
                _remove(scope, removals[key][1])
            if key in inserts:
                _apply_inserts(scope.graph, inserts[key][1])
        if self.dq_nodes:
            rest = list(m.graph.node)
            del m.graph.node[:]
            m.graph.node.extend([*self.dq_nodes, *rest])


def _rewrite(
    rewrite: _Rewrite,
    the_plan: QuantPlan,
    statics: Mapping[str, StaticScale],
    report: Callable[[int, int, str], None] | None,
) -> None:
    """Materialise the plan: activations first, then weights one at a time."""
    total = len(the_plan.weights) + len(the_plan.activations)
    done = 0
    for act in the_plan.activations:
        assert isinstance(act, ActivationPlan)
        if act.tensor in statics:
            rewrite.calibrated(act, statics[act.tensor])
        else:
            rewrite.activation(act)
        done += 1
        if report is not None:
            report(done, total, act.tensor)
    rewrite.model.graph.initializer.extend(rewrite.static_inits)  # before the packed weights
    for entry in the_plan.weights:  # one at a time: each float payload is freed when done
        assert isinstance(entry, WeightPlan)
        rewrite.weight(entry)
        done += 1
        if report is not None:
            report(done, total, entry.tensor)
    rewrite.finish()


def _inline_fallbacks(model: onnx.ModelProto, missing: list[dict[str, str]]) -> onnx.ModelProto:
    """Replace every onnxq node (block-format activations) by its standard-ONNX function body.

    The bodies are the bit-exact fallbacks of functions.py, so the standard model computes
    what the onnxq one does; nodes on unknown dims inline bodies that read the sizes at run
    time (``Shape``, ``Reshape``...), so the standard model keeps its symbolic dims.

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
    for node in (n for scope in scopes(inlined.graph) for n in scope.graph.node):
        if node.domain == DOMAIN:  # pragma: no cover - the inliner replaced them all
            raise NotImplementedError(f"target='standard': node {node.name!r} was not inlined")
    return inlined


def _embed(model: onnx.ModelProto, shapes: Mapping[str, list[int | None]]) -> list[dict[str, str]]:
    """Add the function fallback of every onnxq node that has one; list the others.

    X's shape comes from ``shapes`` (the inferred types) or, for a DequantizeMX node, from its
    ``shape`` attribute or its run-time ``Shape`` input (`functions.fallback_shape`); unknown
    dims get bodies that read the sizes at run time.
    """
    missing: list[dict[str, str]] = []
    have = {(f.domain, f.name, f.overload) for f in model.functions}
    for scope in scopes(model.graph):
        producers = {o: n for n in scope.graph.node for o in n.output}
        for node in scope.graph.node:
            if node.domain != DOMAIN:
                continue
            attrs = node_attrs(node)
            if node.op_type == "QuantizeMX":
                attrs["num_outputs"] = len(node.output)
            try:
                shape = fallback_shape(node, shapes, producers)
                if shape is None:
                    raise ValueError("the rank of its input is unknown")
                fn = build_function(node.op_type, attrs, shape)
            except (NotImplementedError, ValueError) as err:
                missing.append({"node": node.name, "reason": str(err)})
                continue
            node.overload = fn.overload
            if (fn.domain, fn.name, fn.overload) not in have:
                model.functions.append(fn)
                have.add((fn.domain, fn.name, fn.overload))
    return missing


def _with_fallbacks(
    model: onnx.ModelProto, types: Mapping[str, tuple[int, list[int | None] | None]], target: str
) -> tuple[onnx.ModelProto, list[dict[str, str]]]:
    """Embed the function fallbacks; the standard target inlines them and drops the domain."""
    missing = _embed(model, {k: v[1] for k, v in types.items() if v[1] is not None})
    if target == "standard":  # no onnxq node: inline the fallbacks, drop the domain import
        model = _inline_fallbacks(model, missing)
        keep = [o for o in model.opset_import if o.domain != DOMAIN]
        del model.opset_import[:]
        model.opset_import.extend(keep)
    return model, missing


def _set_metadata(model: onnx.ModelProto, values: Mapping[str, str]) -> None:
    keep = [p for p in model.metadata_props if p.key not in values]
    del model.metadata_props[:]
    model.metadata_props.extend(keep)
    for key, value in values.items():
        model.metadata_props.append(onnx.StringStringEntryProto(key=key, value=value))


def _record(
    model: onnx.ModelProto,
    meta: dict[str, str],
    the_plan: QuantPlan,
    activations: int,
    missing: list[dict[str, str]],
    calibration_meta: dict[str, Any] | None,
    custom_ops_only: bool,
) -> None:
    """Write the metadata (counts, nodes that lack a fallback...) and the minimal IR version."""
    quantized = {"weights": len(the_plan.weights), "activations": activations}
    skipped = [s.as_dict() for s in the_plan.skipped]
    meta["onnxq_quantized"] = json.dumps(quantized)
    target = meta["onnxq_target"]
    if missing and target != "standard":
        if not custom_ops_only:  # the early check (no_fallback) should have caught it
            raise NotImplementedError(pass_checks.no_fallback_message(missing, target))
        meta["onnxq_no_fallback"] = json.dumps(missing)
        meta["onnxq_custom_ops_only"] = (
            f"{len(missing)} onnxq node(s) have no standard-ONNX fallback: the model runs only "
            "with the onnxq custom-op library (onnxq.runtime.session)"
        )
    if skipped:
        meta["onnxq_skipped"] = json.dumps(skipped)
    if calibration_meta is not None:
        meta["onnxq_calibration"] = json.dumps(calibration_meta)
    _set_metadata(model, meta)
    ir = helper.find_min_ir_version_for(list(model.opset_import), ignore_unknown=True)
    if any(f.overload for f in model.functions):
        ir = max(ir, 10)  # NodeProto/FunctionProto.overload
    model.ir_version = ir


def _inferred_types(model: onnx.ModelProto) -> tuple[TensorTypes, TensorTypes]:
    """Tensor types from shape inference (dims, and dims with symbolic names kept).

    Large payloads are out of the model meanwhile. When inference fails, the types the model
    declares are used: activations whose rank is then unknown are skipped, with a reason.
    """
    with model_io.stripped(model):
        try:
            inferred = infer_shapes(model)
        except onnx.shape_inference.InferenceError as err:
            warnings.warn(
                f"shape inference fails on the model ({' '.join(str(err).split())[:200]}); "
                "using the shapes it declares (activations of unknown rank stay float)",
                UserWarning,
                stacklevel=3,
            )
            inferred = model
        return tensor_types(inferred), tensor_types(inferred, symbolic=True)


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
    fuse: bool | str | Sequence[str] = True,
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
        fuse: the fusions to run (onnxq.graph.fuse): True the default ones, ``"all"``, names;
            False none, and QuantizeMX -> DequantizeMX activations. As the recipe key ``fuse``.

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
    chosen, custom_ops_only, label, report = pass_checks.choices(
        recipe,
        weights,
        activations,
        weight_storage=weight_storage,
        target=target,
        calibration=calibration,
        calibration_method=calibration_method,
        percentile=percentile,
        progress=progress,
        custom_ops_only=custom_ops_only,
        allow_empty=allow_empty,
    )
    fuse_activations, fusions = chosen_fusions(fuse, chosen.fuse)  # a bad name fails here
    out_path = pass_checks.output_path(model, output, overwrite)
    register_schemas()
    m, spill = model_io.load(model, out_path)
    m = model_io.to_opset(m)
    types, symbols = _inferred_types(m)
    the_plan = hoist_over_pads(plan(m, chosen, types, symbols), m, types, symbols)
    planned = [a for a in the_plan.activations if isinstance(a, ActivationPlan)]
    to_calibrate = calibrate_pass.activation_modes(planned, calibration, target)
    calibrated = {a.tensor for a in to_calibrate}
    if not the_plan.weights and not planned and not allow_empty:
        raise ValueError(pass_checks.nothing_selected(m, chosen, label, len(the_plan.skipped)))
    gaps = pass_checks.no_fallback(the_plan, target, calibrated)
    if gaps and not custom_ops_only:
        raise NotImplementedError(pass_checks.no_fallback_message(gaps, target))
    statics: dict[str, StaticScale] = {}
    calibration_meta: dict[str, Any] | None = None
    if to_calibrate:
        statics, calibration_meta = calibrate_pass.calibrate(
            m, to_calibrate, calibration, calibration_method, percentile
        )
    rewrite = _Rewrite(m, weight_storage, target, spill, fuse_activations)
    _rewrite(rewrite, the_plan, statics, report)
    fused = {k: v for k, v in apply_fusions(m, fusions).items() if v} if target == "onnxq" else {}
    m, missing = _with_fallbacks(m, types, target)
    meta = {
        "onnxq_version": __version__,
        "onnxq_recipe": chosen.to_json(),
        "onnxq_weight_storage": weight_storage,
        "onnxq_target": target,
        **({"onnxq_fused": json.dumps(fused)} if fused else {}),
    }
    _record(m, meta, the_plan, rewrite.activations, missing, calibration_meta, custom_ops_only)
    source = Path(model) if isinstance(model, (str, os.PathLike)) else None
    model_io.finish(m, out_path, spill, source)
    if report is not None and hasattr(report, "close"):
        report.close()
    return m
