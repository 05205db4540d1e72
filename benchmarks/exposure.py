"""Per-layer exposure for `accuracy.py`: which layers a format breaks, and a rescue recipe.

`layer_exposure` runs the float model and a quantized one on a few inputs with every
intermediate tensor exposed (`onnxq.compare.layer_candidates` / `expose_outputs`), and scores
each target node (Conv, ConvTranspose, MatMul, Gemm, the RNNs) by the error it *adds*: the
SQNR of its float input activation (the error that reached it, capped at ``CAP`` dB; a graph
input counts as ``CAP``) minus the SQNR of its output, in the quantized model against the
float one. A layer that turns a 40 dB input into a 10 dB output adds 30 dB of damage whatever
happened before it. Each layer is labelled by its kind (depthwise conv, grouped conv, first
layer, ...) so that a reader can turn the worst ones into a recipe.

`rescued_layers` picks layers by a rule (the K most damaging, every depthwise conv, the first
or last layer) and `rescue_recipe` keeps them in a safer format (``mxfp8`` by default) with
recipe ``node_overrides``; `accuracy.py --rescue RULE` measures that recipe too, so each rescue
the README states is a measured row, not a guess.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import onnx

from onnxq.compare import error_metrics, expose_outputs, layer_candidates

TARGETS = ("Conv", "ConvTranspose", "MatMul", "Gemm", "LSTM", "GRU", "RNN")
CAP = 60.0  # dB: an input that is (almost) exact counts as this clean

Session = Callable[[onnx.ModelProto], Callable[[dict[str, np.ndarray]], list[np.ndarray]]]


def _kind(node: onnx.NodeProto, inits: Mapping[str, onnx.TensorProto], inputs: set[str]) -> str:
    """depthwise conv, grouped conv, first layer, or the op type."""
    first = any(i in inputs for i in node.input[:1])
    label = node.op_type
    if node.op_type in ("Conv", "ConvTranspose") and len(node.input) > 1:
        group = next((a.i for a in node.attribute if a.name == "group"), 1)
        w = inits.get(node.input[1])
        if group > 1 and w is not None:
            per_group = w.dims[1] if node.op_type == "Conv" else w.dims[0] // group
            label = "depthwise conv" if per_group == 1 else f"grouped conv ({per_group}/group)"
        elif w is not None and len(w.dims) > 2 and math.prod(w.dims[2:]) == 1:
            label = "pointwise conv"
    return f"{label}, first layer" if first else label


_FLOAT_VALUES: dict[tuple[int, tuple[str, ...]], dict[str, np.ndarray]] = {}


def _values(
    model: onnx.ModelProto,
    names: Sequence[str],
    feeds: Sequence[dict[str, np.ndarray]],
    session: Session,
    cache: bool = True,
) -> dict[str, np.ndarray]:
    """The tensors ``names`` over all ``feeds``, flattened and concatenated."""
    key = (id(model), tuple(names))
    if cache and key in _FLOAT_VALUES:
        return _FLOAT_VALUES[key]
    exposed = onnx.ModelProto()
    exposed.CopyFrom(model)
    added = expose_outputs(exposed, names)
    run = session(exposed)
    out_names = [o.name for o in exposed.graph.output]
    parts: dict[str, list[np.ndarray]] = {n: [] for n in added}
    for feed in feeds:
        got = dict(zip(out_names, run(feed), strict=True))
        for n in added:
            parts[n].append(np.asarray(got[n]).ravel())
    values = {n: np.concatenate(v) for n, v in parts.items()}
    if cache:
        _FLOAT_VALUES[key] = values
    return values


def _sqnr(ref: np.ndarray, got: np.ndarray) -> float:
    s = error_metrics(ref, got)["sqnr"]
    return CAP if s > CAP else s


def layer_exposure(
    float_model: onnx.ModelProto,
    q_model: onnx.ModelProto,
    feeds: Sequence[dict[str, np.ndarray]],
    session: Session,
) -> list[dict[str, Any]]:
    """Per target node: its kind, input and output SQNR (dB) and the dB it adds, worst first."""
    g = float_model.graph
    ends = {t for n in g.node if n.op_type in TARGETS for t in (n.input[0], n.output[0])}
    names = [n for n in layer_candidates(float_model, q_model) if n in ends]
    f_vals = _values(float_model, names, feeds, session)  # cached: the same for every format
    q_vals = _values(q_model, names, feeds, session, cache=False)
    shared = [n for n in names if n in f_vals and n in q_vals]
    sqnr = {n: _sqnr(f_vals[n], q_vals[n]) for n in shared}
    inits = {t.name: t for t in g.initializer}
    inputs = {i.name for i in g.input} - set(inits)
    rows = []
    for index, node in enumerate(g.node):
        if node.op_type not in TARGETS or not node.output or node.output[0] not in sqnr:
            continue
        src = node.input[0]
        s_in = CAP if src in inputs else sqnr.get(src)
        if s_in is None:
            continue
        s_out = sqnr[node.output[0]]
        rows.append(
            {
                "node": node.name or node.output[0],
                "index": index,
                "kind": _kind(node, inits, inputs),
                "sqnr_in": s_in,
                "sqnr_out": s_out,
                "added_db": s_in - s_out,
            }
        )
    rows.sort(key=lambda r: -r["added_db"])
    return rows


def _glob_literal(name: str) -> str:
    """A node name as an fnmatch pattern that matches only itself."""
    return "".join(f"[{c}]" if c in "*?[]" else c for c in name)


def rescued_layers(layers: Sequence[Mapping[str, Any]], rule: str) -> list[str]:
    """The node names a rescue rule picks from ``layers`` (worst first, as `layer_exposure`).

    A rule is ``+``-joined parts: an integer K (the K layers that add the most error),
    ``depthwise`` (every depthwise conv), ``first`` / ``last`` (the first / last target layer
    in graph order), ``scale:MODE`` (no layer: the recipe's scale mode, `rescue_recipe`).
    """
    by_order = sorted(layers, key=lambda r: r["index"])
    picked: list[str] = []
    for part in rule.split("+"):
        if part.isdigit():
            chosen = [r["node"] for r in layers[: int(part)]]
        elif part == "depthwise":
            chosen = [r["node"] for r in by_order if r["kind"].startswith("depthwise")]
        elif part in ("first", "last"):
            chosen = [by_order[0 if part == "first" else -1]["node"]] if by_order else []
        elif part.startswith("scale:") and part[6:]:
            chosen = []
        else:
            raise ValueError(f"rescue rule {rule!r}: unknown part {part!r}")
        picked += [n for n in chosen if n not in picked]
    return picked


def rescue_recipe(
    fmt: str, with_activations: bool, nodes: Sequence[str], safe: str, rule: str = ""
) -> dict:
    """``fmt`` everywhere but ``nodes``, which get ``safe`` (a recipe mapping).

    A ``scale:MODE`` part of ``rule`` sets the recipe's ``scale_mode``.
    """
    keep = {"weights": safe, "activations": safe if with_activations else None}
    recipe: dict[str, Any] = {"weights": fmt, "activations": fmt if with_activations else None}
    if nodes:
        recipe["node_overrides"] = {_glob_literal(n): keep for n in nodes}
    for part in rule.split("+"):
        if part.startswith("scale:"):
            recipe["scale_mode"] = part[6:]
    return recipe


def markdown(results: Sequence[Mapping[str, Any]], top: int) -> str:
    """One table per model: for each format and mode, the ``top`` layers that add most error."""
    out = []
    for model in dict.fromkeys(r["model"] for r in results):
        out.append(f"**{model}: layers that add the most error (dB of SQNR lost in the layer)**\n")
        out.append("| format | mode | worst layers (kind: dB added, output SQNR) |")
        out.append("|---|---|---|")
        for r in results:
            if r["model"] != model:
                continue
            cells = [
                f"`{w['node']}` ({w['kind']}: {w['added_db']:.1f} dB, {w['sqnr_out']:.1f} dB)"
                for w in r["layers"][:top]
            ]
            out.append(f"| {r['format']} | {r['mode']} | {'; '.join(cells) or '-'} |")
        out.append("")
    return "\n".join(out)
