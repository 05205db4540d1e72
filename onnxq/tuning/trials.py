"""One trial: quantize the float model as an assignment says, run it, measure the budget metric.

A trial never writes a file: each one starts from the float model in memory. Weights-only
trials (no activation is quantized) take the fast path, which is what
``quantize_model(weight_storage="fake")`` does to a weight - `onnxq.cast` with the data type,
axis, modes and tiling that the plan gives that weight in that format (a conv weight with 16
input channels is tiled as a matrix in 32-value tiles but not in 16-value ones, so each
format is planned on its own), values put in place of the float ones - without the rest of
the pass (checks, opset conversion, function fallbacks): each weight is cast once per format
and kept, and the float model is restored after each trial. `tests/tuning` checks that both
give the same outputs bit for bit, convolutions included. Trials that quantize activations
go through `quantize_model`.

Sessions run with one onnxruntime thread, so that trials run side by side on a process pool or
a Ray cluster give the same numbers as one after another.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from onnxq.tuning.budget import Budget
from onnxq.tuning.data import Sample
from onnxq.tuning.layers import (
    FLOAT,
    Layer,
    assignment_recipe,
    find_layers,
    has_activations,
    weight_plans,
)

__all__ = ["Context", "Evaluator", "Job", "make_session", "run_job", "run_outputs"]

Outputs = list[dict[str, np.ndarray]]
# part of every cache key: bump it when a trial's numbers change for the same inputs (2: each
# format's own plan (conv tiling), Conv weights no longer swapped by the session)
TRIALS_REVISION = 2
SWAPPABLE_OPS = frozenset({"MatMul", "Gemm", "Gather"})  # see Evaluator.swappable


@dataclasses.dataclass(frozen=True)
class Job:
    """One trial: an assignment (layer name -> candidate, sorted) and the splits to measure."""

    assignment: tuple[tuple[str, str], ...]
    splits: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Context:
    """What every trial needs, shipped once to each worker (or put once in Ray's store)."""

    token: str  # names this search (workers keep one evaluator per token)
    model_bytes: bytes
    base: Mapping[str, Any]  # the starting recipe as a mapping
    layers: tuple[Layer, ...]
    weights_only: bool
    budget: Budget
    samples: Mapping[str, Sequence[Sample]]  # split name -> samples
    refs: Mapping[str, Outputs]  # split name -> float outputs


def make_session(
    model: bytes | onnx.ModelProto, initializers: Mapping[str, np.ndarray] | None = None
) -> Any:
    """An onnxruntime session with one thread (and the onnxq ops when the model has some).

    ``initializers`` (plain models only) replace main-graph initializers of the same names
    (``SessionOptions.add_initializer``), which spares serializing a changed model. Only
    for weights read by `SWAPPABLE_OPS`: onnxruntime's layout optimizations build a Conv's
    reordered weight from the model's own initializer, and the replacement is ignored.
    """
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    if initializers is not None:
        values = {k: ort.OrtValue.ortvalue_from_numpy(v) for k, v in initializers.items()}
        for name, value in values.items():
            options.add_initializer(name, value)
        sess = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
        sess.onnxq_kept = values  # the session reads them; they must outlive it
        return sess
    proto = model if isinstance(model, onnx.ModelProto) else None
    data = model if isinstance(model, bytes) else model.SerializeToString()
    if proto is None and b"onnxq" not in data:
        return ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
    if proto is None:
        proto = onnx.load_from_string(data)
    if any(n.domain == "onnxq" for n in proto.graph.node):
        from onnxq.graph.ort_session import has_custom_ops, session

        if has_custom_ops():
            return session(proto, sess_options=options)
    return ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])


def run_outputs(sess: Any, samples: Sequence[Sample]) -> Outputs:
    """Each sample's outputs, by name."""
    names = [o.name for o in sess.get_outputs()]
    return [dict(zip(names, sess.run(names, dict(s)), strict=True)) for s in samples]


class Evaluator:
    """Runs trials for one `Context` in this process (weights cast once per format, kept)."""

    def __init__(self, ctx: Context) -> None:
        """Parse the model and plan its weights once."""
        from onnxq.graph.recipe import Recipe

        self.ctx = ctx
        self.model = onnx.load_from_string(ctx.model_bytes)
        self.base = Recipe.from_mapping(ctx.base)
        probe = assignment_recipe(self.base, ctx.layers, {}, ctx.weights_only)
        self.fast = ctx.weights_only and not has_activations(probe)
        self.entries: dict[str, Any] = {}
        if self.fast:
            _, _, self.entries = find_layers(self.model, self.base)
        self.plans: dict[str, dict[str, Any]] = {}  # candidate -> tensor -> its planned entry
        self.types: Any = None
        self.casts: dict[tuple[str, str], np.ndarray] = {}
        # main-graph initializers read only by MatMul / Gemm / Gather can be swapped by the
        # session (no model serialized per trial); onnxruntime 1.32's layout optimizations
        # (ORT_ENABLE_ALL) reorder Conv weights from the model's own initializer and ignore
        # the swapped one, so a model with a tuned Conv is serialized for each trial
        ops = {n.name: n.op_type for n in self.model.graph.node if n.name}
        self.swappable = all(
            e.source.constant is None
            and e.source.scope.parent is None
            and all(ops.get(c) in SWAPPABLE_OPS for c in e.consumers)
            for e in self.entries.values()
        )

    def _cast(self, tensor: str, fmt: str) -> np.ndarray:
        from onnxq.cast import cast

        key = (tensor, fmt)
        if key not in self.casts:
            e = self._planned(fmt)[tensor]
            values = numpy_helper.to_array(self.entries[tensor].source.tensor)
            shape = values.shape
            if e.tiled_shape is not None:  # as the graph pass does: a short conv axis, flattened
                values = values.reshape(e.tiled_shape)
            fake = cast(
                values, e.dtype, axis=e.axis, round_mode=e.round_mode, scale_mode=e.scale_mode
            ).reshape(shape)
            self.casts[key] = np.ascontiguousarray(fake)
        return self.casts[key]

    def _planned(self, fmt: str) -> dict[str, Any]:
        """The weight entries planned with every layer in ``fmt`` (axis, tiling and modes)."""
        if fmt not in self.plans:
            if self.types is None:  # shapes are inferred once, not once per format
                from onnxq.graph.plan import tensor_types
                from onnxq.graph.schemas import infer_shapes

                self.types = tensor_types(infer_shapes(self.model))
            plans = weight_plans(self.model, self.base, self.ctx.layers, fmt, self.types)
            self.plans[fmt] = plans
        return self.plans[fmt]

    def _changes(self, assignment: Mapping[str, str]) -> dict[str, np.ndarray]:
        """Weight tensor -> its fake-quantized values, for the layers not left float."""
        changes = {}
        for layer in self.ctx.layers:
            fmt = assignment.get(layer.name, FLOAT)
            if fmt != FLOAT:
                changes.update({name: self._cast(name, fmt) for name in layer.tensors})
        return changes

    def session(self, assignment: Mapping[str, str]) -> Any:
        """A session of the model quantized as ``assignment`` says."""
        if self.fast and self.swappable:
            return make_session(self.ctx.model_bytes, self._changes(assignment))
        return make_session(self.model_bytes(assignment))

    def model_bytes(self, assignment: Mapping[str, str]) -> bytes:
        """The serialized model quantized as ``assignment`` says (fake weights)."""
        if not self.fast:
            return self._passed(assignment).SerializeToString()
        saved: list[tuple[onnx.TensorProto, onnx.TensorProto]] = []
        try:
            for name, values in self._changes(assignment).items():
                target = self.entries[name].source.tensor
                original = onnx.TensorProto()
                original.CopyFrom(target)
                saved.append((target, original))
                target.CopyFrom(numpy_helper.from_array(values, target.name))
            return self.model.SerializeToString()
        finally:
            for target, original in saved:
                target.CopyFrom(original)

    def _passed(self, assignment: Mapping[str, str]) -> onnx.ModelProto:
        from onnxq.graph.quantize import quantize_model

        recipe = assignment_recipe(self.base, self.ctx.layers, assignment, self.ctx.weights_only)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return quantize_model(
                self.model,
                recipe=recipe,
                weight_storage="fake",
                allow_empty=True,
                custom_ops_only=self.base.custom_ops_only,
            )

    def trial(self, job: Job) -> dict[str, float]:
        """The budget metric of ``job``'s assignment on each of its splits."""
        sess = self.session(dict(job.assignment))
        result = {}
        for split in job.splits:
            outputs = run_outputs(sess, self.ctx.samples[split])
            result[split] = self.ctx.budget.evaluate(self.ctx.refs[split], outputs)
        return result


_EVALUATORS: dict[str, Evaluator] = {}


def evaluator(ctx: Context) -> Evaluator:
    """This process's evaluator of ``ctx`` (made on first use, then kept: one per search)."""
    ev = _EVALUATORS.get(ctx.token)
    if ev is None:
        _EVALUATORS.clear()  # one search at a time per worker: drop the last one's casts
        ev = _EVALUATORS[ctx.token] = Evaluator(ctx)
    return ev


def init_worker(ctx: Context) -> None:
    """Process-pool initializer: build the evaluator once per worker."""
    evaluator(ctx)


def run_job(job: Job, ctx: Context | None = None) -> dict[str, float]:
    """Run one trial in this process (a process-pool worker when ``ctx`` is None)."""
    if ctx is None:
        (ev,) = _EVALUATORS.values()
    else:
        ev = evaluator(ctx)
    return ev.trial(job)
