"""The graph pass's checks before any tensor is rewritten, and their messages.

`choices` validates the options of `quantize_model` and merges the recipe with the format
arguments; `nothing_selected` explains an empty selection; `no_fallback` asks the function
builders (`onnxq.graph.functions`) which planned tensors would get an onnxq node without a
standard-ONNX fallback, and `no_fallback_message` says what to do about it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import onnx

from onnxq.formats.codebook import Codebook
from onnxq.graph.calibrate import calibrated_kind
from onnxq.graph.calibrate_pass import check_options
from onnxq.graph.functions import build_function
from onnxq.graph.plan import ActivationPlan, QuantPlan, WeightPlan, scopes
from onnxq.graph.recipe import Recipe, load_recipe
from onnxq.graph.schemas import output_types

__all__ = [
    "choices",
    "no_fallback",
    "no_fallback_message",
    "nothing_selected",
    "output_path",
    "progress_callback",
    "static_shape",
]


def choices(
    recipe: Any,
    weights: Any,
    activations: Any,
    *,
    weight_storage: str,
    target: str,
    calibration: Any,
    calibration_method: str,
    percentile: float,
    progress: Any,
    custom_ops_only: bool,
    allow_empty: bool,
) -> tuple[Recipe, bool, str, Callable[[int, int, str], None] | None]:
    """Check the options; the recipe to apply, custom_ops_only, its label and the progress.

    Raises:
        ValueError: a bad storage, target, calibration option, recipe, or nothing to quantize.
        TypeError: ``progress`` is neither a bool nor a callable.
    """
    if weight_storage not in ("packed", "fake"):
        raise ValueError(f"weight_storage {weight_storage!r}: expected 'packed' or 'fake'")
    if target not in ("onnxq", "standard"):
        raise ValueError(f"target {target!r}: expected 'onnxq' or 'standard'")
    check_options(calibration, calibration_method, percentile)
    report = progress_callback(progress)
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
    return chosen, custom_ops_only, label, report


def output_path(model: Any, output: Any, overwrite: bool) -> Path | None:
    """The output path; refuses the input path itself without ``overwrite``."""
    out_path = Path(output) if output is not None else None
    if out_path is not None and isinstance(model, (str, os.PathLike)):
        src = Path(model)
        if src.exists() and out_path.resolve() == src.resolve() and not overwrite:
            raise ValueError(
                f"output {str(out_path)!r} is the input model; pass --overwrite "
                "(overwrite=True) to replace it"
            )
    return out_path


def progress_callback(progress: Any) -> Callable[[int, int, str], None] | None:
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


def static_shape(shape: list[int | None] | None) -> bool:
    """True when every dim is known before run time."""
    return shape is not None and all(d is not None for d in shape)


def _choice_label(recipe: Any, weights: Any, activations: Any) -> str:
    """How the user named their choices, for messages: the recipe file and/or the formats."""
    parts = []
    if isinstance(recipe, (str, os.PathLike)):
        parts.append(f"recipe {Path(recipe).name!r}")
    elif recipe is not None:
        parts.append("the recipe")
    parts += [
        f"{what} {str(v)!r}"
        for what, v in (("weights", weights), ("activations", activations))
        if v
    ]
    return " with ".join(parts)


def nothing_selected(model: onnx.ModelProto, recipe: Recipe, label: str, skipped: int) -> str:
    """The message for choices that select no tensor of ``model``, with the likely reason."""
    nodes = [n for s in scopes(model.graph) for n in s.graph.node if n.domain in ("", "ai.onnx")]
    targets = [n for n in nodes if n.op_type in recipe.op_types]
    if skipped:
        why = (
            f"its {skipped} activation(s) have an unknown rank, so their tile axis cannot be "
            "known (declare the input shapes, or fix what stops shape inference)"
        )
    elif not targets:
        why = f"the model has no {'/'.join(recipe.op_types)} node"
    else:
        why = (
            f"none of its {len(targets)} {'/'.join(sorted({n.op_type for n in targets}))} "
            "node(s) has a float weight or an activation that the recipe gives a format "
            "(excluded, or weights computed by other nodes)"
        )
    return (
        f"nothing to quantize: {label} selects no tensor of the model: {why}; check the "
        "recipe, or pass --allow-empty (allow_empty=True) to write it unchanged"
    )


def no_fallback(the_plan: QuantPlan, target: str, calibrated: set[str]) -> list[dict[str, str]]:
    """Planned tensors whose onnxq node would have no standard-ONNX function fallback.

    Asks the builders (`onnxq.graph.functions.build_function`) with the attributes the
    materialisers give each node, before any weight is quantized: one entry per tensor
    (``tensor``, ``kind``, ``format``, ``modes``, ``reason``).
    """
    cache: dict[tuple[str, str, tuple[int | None, ...]], str | None] = {}

    def refusal(op: str, attrs: dict[str, Any], shape: list[int | None]) -> str | None:
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
            assert isinstance(w, WeightPlan)
            op = "CodebookLookup" if isinstance(w.dtype.nspec, Codebook) else "DequantizeMX"
            attrs = {
                "dtype": w.dtype.code,
                "axis": w.axis,
                "output_type": w.source.tensor.data_type,
            }
            dims = w.tiled_shape or tuple(w.source.tensor.dims)  # the decoder's shape
            why = refusal(op, attrs, [int(d) for d in dims])
            if why:
                gaps.append(
                    {
                        "tensor": w.tensor,
                        "kind": "weight",
                        "format": w.dtype.name,
                        "modes": "",
                        "reason": why,
                    }
                )
    for a in the_plan.activations:
        assert isinstance(a, ActivationPlan)
        if a.tensor in calibrated or a.shape is None:
            continue  # calibrated pairs are plain ops; an unknown rank is skipped, not quantized
        if isinstance(a.dtype.nspec, Codebook):
            continue  # refused by the activation rewrite (onnxq.graph.quantize)
        # Unknown dims stay None: the builders then make the bodies that read the sizes at
        # run time, as `_embed` will (QuantizeMX from Shape(X), DequantizeMX from its Shape
        # input; QuantizeDequantizeMX refuses nothing that this pair does not).
        dims: list[int | None] = [None if d is None else int(d) for d in a.shape]
        attrs = {
            "dtype": a.dtype.code,
            "axis": a.axis,
            "round_mode": a.round_mode,
            "scale_mode": a.scale_mode,
        }
        known = tuple(int(d) for d in dims if d is not None) if static_shape(dims) else None
        try:
            kinds = [elem for elem, _ in output_types("QuantizeMX", attrs, known)]
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
            kind = calibrated_kind(a.dtype, a.round_mode)
            gaps.append(
                {
                    "tensor": a.tensor,
                    "kind": "activation",
                    "format": a.dtype.name,
                    "modes": f"round_mode {a.round_mode}, scale_mode {a.scale_mode}",
                    "reason": why,
                    "calibrate": kind,
                }
            )
    return gaps


def no_fallback_message(gaps: list[dict[str, str]], target: str) -> str:
    """The message for tensors or nodes without a standard-ONNX fallback (`no_fallback`)."""
    g = gaps[0]
    if "tensor" in g:
        modes = f", {g['modes']}" if g["modes"] else ""
        what = f"{g['kind']} {g['tensor']!r} ({g['format']}{modes})"
    else:  # an entry of onnxq.graph.quantize._embed: the node
        what = f"node {g['node']!r}"
    more = f" (and {len(gaps) - 1} more tensor(s))" if len(gaps) > 1 else ""
    calibrate_it = ""
    if g.get("calibrate") == "tensor":  # a static QuantizeLinear pair would do
        calibrate_it = (
            "calibrate it (--calibration DIR, calibration=...) for a static "
            "QuantizeLinear/DequantizeLinear pair, "
        )
    if target == "standard":
        return (
            f"target='standard' cannot quantize {what}{more}: it has no standard-ONNX form "
            f"({g['reason']}); use another format or mode, or target='onnxq'"
        )
    return (
        f"{what}{more} has no standard-ONNX fallback ({g['reason']}), so the model would run "
        "only where the onnxq custom-op library is registered, not in a plain onnxruntime; "
        "choose another format or mode (floor or ceil scales, even/away/zero rounding), "
        f"{calibrate_it}or pass --custom-ops-only (custom_ops_only=True, recipe key "
        "custom_ops_only: true) to write a custom-op-only model"
    )
