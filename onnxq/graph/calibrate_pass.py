"""The graph pass's calibration step: which activations get static scales, and observing them.

`activation_modes` checks the planned activations against ``calibration`` and the target and
picks those with one float scale per tensor; `calibrate` runs the float model on the samples
(`onnxq.graph.calibrate.observe`) with those tensors added to its outputs (`_observable`) and
returns their static scales and the ``onnxq_calibration`` metadata.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import onnx
from onnx import helper

from onnxq._files import all_tensors
from onnxq.graph import calibrate as cal
from onnxq.graph.model_io import SPILL_LOCATION, is_external
from onnxq.graph.plan import ActivationPlan, scopes
from onnxq.graph.schemas import DOMAIN

__all__ = ["activation_modes", "calibrate", "check_options"]


def check_options(calibration: Any, method: str, percentile: float) -> None:
    """Refuse a bad calibration method, percentile or sample directory."""
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
    locations (made absolute by `onnxq.graph.model_io.load`) are written relative to their
    common folder, which onnxruntime is told about; ``model`` is restored afterwards.
    """
    g = model.graph
    n_out = len(g.output)
    have = {o.name for o in g.output}
    added = [name for name in outputs if name not in have]
    g.output.extend(helper.make_tensor_value_info(name, outputs[name], None) for name in added)
    moved: list[tuple[onnx.StringStringEntryProto, str]] = []
    folder = None
    custom = any(n.domain == DOMAIN for sc in scopes(g) for n in sc.graph.node)
    opsets = list(model.opset_import)
    if not custom:  # the onnxq domain import that to_opset added: no node uses it
        del model.opset_import[:]
        model.opset_import.extend(o for o in opsets if o.domain != DOMAIN)
    try:
        external = [t for t in all_tensors(model) if is_external(t)]
        entries = [e for t in external for e in t.external_data if e.key == "location"]
        if any(e.value == SPILL_LOCATION for e in entries):
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


def calibrate(
    model: onnx.ModelProto,
    acts: list[ActivationPlan],
    calibration: Any,
    method: str,
    percentile: float,
) -> tuple[dict[str, cal.StaticScale], dict[str, Any]]:
    """Observe ``acts`` on the calibration samples; their static scales and the metadata."""
    g = model.graph
    inits = {t.name for t in g.initializer}
    inputs = {i.name: i.type.tensor_type.elem_type for i in g.input if i.name not in inits}
    samples = cal.calibration_inputs(calibration, inputs)
    wanted = {a.tensor: a.elem_type for a in acts if a.tensor not in inputs}
    count = 0

    def counted(done: int) -> None:
        nonlocal count
        count = done

    with _observable(model, wanted) as (data, folder, custom):
        observers = cal.observe(
            data,
            [a.tensor for a in acts],
            samples,
            histogram=method == "percentile",
            external_folder=folder,
            custom_ops=custom,
            progress=counted,
        )
    scales: dict[str, cal.StaticScale] = {}
    record: dict[str, Any] = {}
    for act in acts:
        obs = observers[act.tensor]
        lo, hi, amax = obs.limits(method, percentile)
        scales[act.tensor] = cal.static_scale(act.dtype, lo, hi, amax)
        record[act.tensor] = {
            "dtype": act.dtype.name,
            "min": float(lo),
            "max": float(hi),
            "amax": float(amax),
            "observed_amax": float(obs.amax),
            **scales[act.tensor].as_dict(),
        }
    meta: dict[str, Any] = {"method": method}
    if method == "percentile":
        meta["percentile"] = percentile
    meta.update(samples=count, tensors=record)
    return scales, meta


def activation_modes(
    acts: list[ActivationPlan], calibration: Any, target: str
) -> list[ActivationPlan]:
    """Check the planned activations against calibration and target; those to calibrate."""
    kinds = {a.tensor: cal.calibrated_kind(a.dtype, a.round_mode) for a in acts}
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
            unused = (
                "calibration is not used: no activation is quantized (pass an activation format)"
            )
            warnings.warn(unused, UserWarning, stacklevel=3)
        elif dynamic:
            warnings.warn(
                f"calibration is not used for activation format(s) {', '.join(dynamic)}: "
                "their exponent or block scales are computed from the data at every call "
                "(QuantizeMX); only formats with one float scale per tensor are calibrated",
                UserWarning,
                stacklevel=3,
            )
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
