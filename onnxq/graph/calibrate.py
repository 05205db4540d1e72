"""Activation calibration: static tensor scales for activation formats with a float scale.

`quantize_model` (onnxq.graph.quantize) calls this module when ``calibration`` is given:

1. `calibration_inputs` reads the samples: a directory of ``.npz`` files (keys are the
   model's input names) or an iterable of ``{input name: array}`` dicts, checked against the
   model's inputs.
2. `observe` runs the float model in onnxruntime with the planned activation tensors added to
   its outputs and keeps, per tensor, a `RangeObserver`: the running min, max and max |x| of
   the finite values (``minmax``), and for ``percentile`` a fixed-size histogram of |x| keyed
   by the top 16 bits of the float32 pattern (32768 bins, relative bin width 2^-7), so memory
   stays bounded whatever the number of samples.
3. `static_scale` turns a range into the scale (and zero point) exactly as the reference
   engine computes them from data (`onnxq.cast.reference`): ``scale = cast(amax / maxfloat)``
   to the scale type, or for unsigned ints with an int zero point ``scale = cast((hi - lo) /
   qmax)``, ``zero = clip(rint(-lo / scale), 0, qmax)`` with ``lo <= 0 <= hi``.
4. `qdq_nodes` writes the standard ``QuantizeLinear -> DequantizeLinear`` pair (opset 21)
   with that constant scale, whose output equals the reference's element rounding of
   ``x / scale`` (round half to even, saturating) times the scale, bit for bit, for finite
   inputs: signed ints are clipped to ``+-qmax * scale`` first, because the onnxq int formats
   are symmetric (int8: -127..127) while QuantizeLinear saturates to -128.

Only data types with one float scale per tensor (``s.is_tensor``, no tensor scale, sparsity
or codebook) whose elements are an ONNX QuantizeLinear type (int8, uint8, float8e4m3fn,
float8e5m2) and the ``even`` round mode are calibrated (`calibrated_kind`). Non-finite inputs
differ from the dynamic cast: QuantizeLinear has no NaN tile poisoning.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from onnxq.cast.elements import quantize_values
from onnxq.formats.codebook import Codebook
from onnxq.formats.datatype import DataType
from onnxq.formats.modes import RoundMode
from onnxq.formats.number import Kind, NumberSpec

__all__ = [
    "RangeObserver",
    "StaticScale",
    "calibrated_kind",
    "calibration_inputs",
    "observe",
    "qdq_nodes",
    "static_scale",
]

_BINS = 1 << 15  # |x| float32 patterns >> 16: sign bit clear, so 15 bits
_SHIFT = 16
# ONNX QuantizeLinear-21 element types: (onnx type, numpy type of the zero point, signed).
_Q_TYPES: tuple[tuple[int, np.dtype, bool], ...] = (
    (TensorProto.INT8, np.dtype(np.int8), True),
    (TensorProto.UINT8, np.dtype(np.uint8), False),
    (TensorProto.FLOAT8E4M3FN, np.dtype(ml_dtypes.float8_e4m3fn), False),
    (TensorProto.FLOAT8E5M2, np.dtype(ml_dtypes.float8_e5m2), False),
)
_FLOATS = (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16)


# -- which formats ----------------------------------------------------------------------------
def _q_type(spec: NumberSpec) -> tuple[int, np.dtype, bool] | None:
    """The QuantizeLinear type whose values are exactly those of ``spec`` (None: none)."""
    if isinstance(spec, Codebook) or spec.bits != 8:
        return None
    from onnxq.cast.elements import decode_codes

    codes = np.arange(256, dtype=np.int64)
    want = decode_codes(codes, spec)
    for onnx_type, typ, signed in _Q_TYPES:
        if typ.kind in "iu":
            got = (codes - 256 * (codes >= 128)) if signed else codes
            got = got.astype(np.float64)
        else:
            got = codes.astype(np.uint8).view(typ).astype(np.float64)
        same = (np.isnan(want) & np.isnan(got)) | (want == got)
        if typ.kind in "iu" and spec.kind is not (Kind.INT if signed else Kind.UINT):
            continue
        if typ.kind in "iu" and signed:  # the onnxq int8 grid is -127..127 (symmetric)
            same[128] = True
        if bool(same.all()):
            return onnx_type, typ, signed
    return None


def calibrated_kind(dt: DataType, round_mode: str | None = None) -> str:
    """How an activation data type relates to calibration.

    Args:
        dt: the activation data type.
        round_mode: the round mode chosen for it (None: even).

    Returns:
        ``"tensor"``: one float scale per tensor that `qdq_nodes` can write; ``"channel"``:
        float scales per row or channel (a whole-axis tile); ``"unsupported: <why>"``: a
        tensor float scale this module cannot write statically; ``"dynamic"``: anything else
        (exponent or block scales, unscaled casts), whose scales QuantizeMX computes per call.
    """
    n, s = dt.nspec, dt.sspec
    if s is None or s.scale.is_exponent:
        return "dynamic"
    if not s.is_tensor:
        whole_axis = len(s.tiles) == 1 and s.tiles[0].size == 0
        return "channel" if whole_axis else "dynamic"
    if s.tenscale is not None or s.sparsity[1] or isinstance(n, Codebook):
        return "unsupported: a tensor scale over float scales, sparsity or a codebook"
    found = _q_type(n)
    if found is None:
        return f"unsupported: {n.bits}-bit {n.kind.value} elements have no QuantizeLinear type"
    if s.zero is not None and (s.zero.is_float or found[2] or found[1].kind != "u"):
        return "unsupported: zero points other than an int zero point on unsigned ints"
    if s.zero is None and found[1].kind == "u":
        return "unsupported: unsigned ints without a zero point"
    if round_mode not in (None, RoundMode.EVEN.value):
        return f"unsupported: round mode {round_mode!r} (QuantizeLinear rounds half to even)"
    return "tensor"


# -- samples ----------------------------------------------------------------------------------
def _np_type(elem: int) -> np.dtype:
    return np.dtype(helper.tensor_dtype_to_np_dtype(elem))


def calibration_inputs(
    calibration: str | os.PathLike[str] | Iterable[Mapping[str, Any]],
    inputs: Mapping[str, int],
) -> Iterator[dict[str, np.ndarray]]:
    """Yield the calibration samples as feeds, checked against the model's inputs.

    Args:
        calibration: a directory of ``.npz`` files (each holds one sample: its keys are input
            names) or an iterable of ``{input name: array}`` dicts.
        inputs: the model's required inputs: name -> ONNX element type (arrays are cast to
            it).

    Yields:
        One feed per sample.

    Raises:
        ValueError: a missing directory, one with no ``.npz`` file, an unreadable file, a
            sample that is not a mapping, lacks an input or names one the model does not
            have, or no sample at all.
    """
    if isinstance(calibration, (str, os.PathLike)):
        folder = Path(calibration)
        if not folder.is_dir():
            raise ValueError(f"calibration {str(folder)!r} is not a directory of .npz files")
        files = sorted(p for p in folder.iterdir() if p.suffix == ".npz" and p.is_file())
        if not files:
            raise ValueError(f"calibration directory {str(folder)!r} holds no .npz file")

        def from_files() -> Iterator[tuple[str, Mapping[str, Any]]]:
            for path in files:
                try:
                    with np.load(path, allow_pickle=False) as data:
                        sample = {k: data[k] for k in data.files}
                except Exception as err:
                    raise ValueError(
                        f"calibration file {str(path)!r} is not a readable .npz file: {err}"
                    ) from None
                yield f"calibration file {str(path)!r}", sample

        samples: Iterator[tuple[str, Any]] = from_files()
    elif isinstance(calibration, Mapping):
        raise ValueError(
            "calibration is one mapping; pass an iterable of input dicts (a list of samples) "
            "or a directory of .npz files"
        )
    elif isinstance(calibration, Iterable):
        samples = ((f"calibration sample {i}", s) for i, s in enumerate(calibration))
    else:
        raise ValueError(
            f"calibration: expected a directory of .npz files or an iterable of input dicts, "
            f"got {type(calibration).__name__}"
        )
    count = 0
    for where, sample in samples:
        if not isinstance(sample, Mapping):
            raise ValueError(
                f"{where}: expected a dict of input arrays, got {type(sample).__name__}"
            )
        missing = [k for k in inputs if k not in sample]
        unknown = sorted(str(k) for k in sample if k not in inputs)
        if unknown:
            raise ValueError(
                f"{where}: {unknown[0]!r} is not an input of the model; its "
                f"inputs are {', '.join(inputs)}"
            )
        if missing:
            raise ValueError(
                f"{where}: input {missing[0]!r} is missing; the model's inputs "
                f"are {', '.join(inputs)}"
            )
        feed = {}
        for name, elem in inputs.items():
            try:
                feed[name] = np.asarray(sample[name], dtype=_np_type(elem))
            except (TypeError, ValueError) as err:
                raise ValueError(f"{where}: input {name!r}: {err}") from None
        count += 1
        yield feed
    if not count:
        raise ValueError("calibration holds no sample")


# -- ranges -----------------------------------------------------------------------------------
@dataclasses.dataclass
class RangeObserver:
    """The range of one tensor over the calibration samples (finite values only).

    Attributes:
        histogram: keep the |x| histogram for `percentile_of` (32768 int64 counts).
        count: finite values seen.
        lo: the smallest finite value (float32).
        hi: the largest finite value (float32).
        amax: the largest finite |x| (float32).
    """

    histogram: bool = False
    count: int = 0
    lo: np.float32 = dataclasses.field(default_factory=lambda: np.float32(np.inf))
    hi: np.float32 = dataclasses.field(default_factory=lambda: np.float32(-np.inf))
    amax: np.float32 = dataclasses.field(default_factory=lambda: np.float32(0))
    _hist: np.ndarray | None = None

    def update(self, x: np.ndarray) -> None:
        """Add the values of ``x`` (any float type, read as float32)."""
        a = np.asarray(x, dtype=np.float32).reshape(-1)
        a = a[np.isfinite(a)]
        if not a.size:
            return
        self.count += int(a.size)
        self.lo = np.float32(min(self.lo, a.min()))
        self.hi = np.float32(max(self.hi, a.max()))
        mag = np.abs(a)
        self.amax = np.float32(max(self.amax, mag.max()))
        if self.histogram:
            if self._hist is None:
                self._hist = np.zeros(_BINS, dtype=np.int64)
            self._hist += np.bincount(mag.view(np.uint32) >> _SHIFT, minlength=_BINS)

    def percentile_of(self, percentile: float) -> np.float32:
        """The ``percentile`` (0, 100] of |x|: the histogram bin, interpolated linearly.

        At most `amax`; within one bin (2^-7 relative) of the exact percentile.
        """
        if self._hist is None or not self.count:
            return self.amax
        rank = percentile / 100.0 * self.count
        cum = np.cumsum(self._hist)
        b = int(np.searchsorted(cum, rank, side="left"))
        b = min(b, _BINS - 1)
        before = int(cum[b - 1]) if b else 0
        inside = int(self._hist[b])
        frac = (rank - before) / inside if inside else 1.0
        edges = (np.array([b, b + 1], dtype=np.uint32) << _SHIFT).view(np.float32)
        low, high = float(edges[0]), float(edges[1])
        return np.float32(min(low + min(max(frac, 0.0), 1.0) * (high - low), float(self.amax)))

    def limits(self, method: str, percentile: float) -> tuple[np.float32, np.float32, np.float32]:
        """(lo, hi, amax) for ``method``: ``minmax`` or ``percentile`` (each side at most P).

        With no finite value the range is all zero.
        """
        if not self.count:
            zero = np.float32(0)
            return zero, zero, zero
        if method == "minmax":
            return self.lo, self.hi, self.amax
        p = self.percentile_of(percentile)
        return np.float32(max(self.lo, -p)), np.float32(min(self.hi, p)), p


def observe(
    session_model: bytes,
    tensors: Sequence[str],
    samples: Iterable[Mapping[str, np.ndarray]],
    *,
    histogram: bool,
    external_folder: str | None = None,
    custom_ops: bool = False,
    progress: Callable[[int], None] | None = None,
) -> dict[str, RangeObserver]:
    """Run the float model on every sample and observe ``tensors``.

    Args:
        session_model: the serialized float model (external data relative to
            ``external_folder``); graph inputs among ``tensors`` are read from the feeds, the
            others must be graph outputs of this model.
        tensors: the tensors to observe.
        samples: feeds (see `calibration_inputs`).
        histogram: keep |x| histograms (percentile calibration).
        external_folder: where the model's external data files are.
        custom_ops: the model has onnxq nodes (a session with the custom-op library).
        progress: called with the number of samples done after each.

    Returns:
        Tensor name -> its observer.

    Raises:
        ValueError: onnxruntime refused the model or a sample.
    """
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    if external_folder is not None:
        options.add_session_config_entry(
            "session.model_external_initializers_file_folder_path", external_folder
        )
    try:
        if custom_ops:
            from onnxq.graph.ort_session import session

            sess = session(session_model, sess_options=options)
        else:
            sess = ort.InferenceSession(session_model, options, providers=["CPUExecutionProvider"])
    except Exception as err:
        raise ValueError(f"calibration: onnxruntime cannot run the float model: {err}") from None
    outputs = {o.name for o in sess.get_outputs()}
    fetched = [t for t in tensors if t in outputs]
    observers = {t: RangeObserver(histogram=histogram) for t in tensors}
    for i, feed in enumerate(samples):
        try:
            values = sess.run(fetched, dict(feed)) if fetched else []
        except Exception as err:
            raise ValueError(f"calibration sample {i}: onnxruntime failed: {err}") from None
        for name, value in zip(fetched, values, strict=True):
            observers[name].update(value)
        for name in tensors:
            if name not in outputs and name in feed:
                observers[name].update(feed[name])
        del values
        if progress is not None:
            progress(i + 1)
    return observers


# -- the static scale and its nodes -----------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class StaticScale:
    """A calibrated tensor scale (and zero point) for `qdq_nodes`.

    Attributes:
        scale: the float32 scale (0: the tensor becomes zero).
        zero: the zero point (0 without one).
        qtype: the QuantizeLinear output type (TensorProto enum).
        zero_dtype: the numpy type of the zero point initializer.
        clip: the signed-int element limit (``qmax``), None for other types.
    """

    scale: np.float32
    zero: int
    qtype: int
    zero_dtype: np.dtype
    clip: float | None

    def as_dict(self) -> dict[str, Any]:
        """The values recorded in metadata (JSON-friendly)."""
        out: dict[str, Any] = {"scale": float(self.scale)}
        if self.zero_dtype == np.dtype(np.uint8):
            out["zero_point"] = self.zero
        return out


def static_scale(dt: DataType, lo: np.float32, hi: np.float32, amax: np.float32) -> StaticScale:
    """The scale the reference engine would compute from data with this range.

    Args:
        dt: a data type for which `calibrated_kind` is ``"tensor"``.
        lo: the calibrated minimum (used with a zero point).
        hi: the calibrated maximum (used with a zero point).
        amax: the calibrated max |x|.

    Returns:
        The static scale.
    """
    n, s = dt.nspec, dt.sspec
    assert s is not None
    found = _q_type(n)
    assert found is not None
    qtype, typ, signed = found

    def cast_scale(raw: np.ndarray) -> np.float32:
        q = quantize_values(
            raw.astype(np.float64).reshape(1), s.scale, RoundMode.EVEN, limit=s.scale.float32_max
        )
        return np.float32(np.asarray(q).reshape(-1)[0])

    qmax = np.float32(n.maxfloat)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        if s.zero is not None:
            lo32, hi32 = np.minimum(np.float32(lo), np.float32(0)), np.maximum(hi, np.float32(0))
            sc = cast_scale(np.asarray((hi32 - lo32) / qmax, dtype=np.float32))
            zp = np.float32(-lo32 / sc) if sc > 0 else np.float32(0)
            zero = int(np.clip(np.rint(zp), 0, qmax))
            return StaticScale(sc, zero, qtype, typ, None)
        sc = cast_scale(np.asarray(np.float32(amax) / qmax, dtype=np.float32))
    return StaticScale(sc, 0, qtype, typ, float(qmax) if signed else None)


def qdq_nodes(
    x: str,
    y: str,
    params: StaticScale,
    elem_type: int,
    fresh: Callable[[str], str],
) -> tuple[list[TensorProto], list[onnx.NodeProto]]:
    """Standard nodes that compute ``y`` = the calibrated fake quantization of ``x``.

    Args:
        x: the float activation.
        y: the output name.
        params: the scale (`static_scale`).
        elem_type: the activation's element type (float, float16 or bfloat16; other types
            go through float32 all the same).
        fresh: makes a unique name from a hint.

    Returns:
        (initializers, nodes in topological order).
    """
    inits: list[TensorProto] = []
    nodes: list[onnx.NodeProto] = []

    def const(value: np.ndarray, hint: str) -> str:
        inits.append(numpy_helper.from_array(value, fresh(f"{x}__{hint}")))
        return inits[-1].name

    def node(op: str, inputs: list[str], hint: str, out: str | None = None, **attrs: Any) -> str:
        name = out or fresh(f"{x}__{hint}")
        nodes.append(helper.make_node(op, inputs, [name], name=fresh(f"{x}__{hint}_n"), **attrs))
        return name

    wide = elem_type != TensorProto.FLOAT and elem_type in _FLOATS
    src = node("Cast", [x], "f32", to=TensorProto.FLOAT) if wide else x
    last = None if wide else y
    if not params.scale > 0:  # the reference's zero scale: every finite value becomes +0
        out = node(
            "Mul", [node("Abs", [src], "abs"), const(np.array(0, np.float32), "zero")], "dqx", last
        )
    else:
        scale = const(np.array(params.scale, dtype=np.float32), "scale")
        zero = const(np.array(params.zero).astype(params.zero_dtype), "zero_point")
        if params.clip is not None:  # symmetric ints: QuantizeLinear would reach -qmax - 1
            limit = np.float32(np.float32(params.clip) * params.scale)
            src = node(
                "Clip",
                [
                    src,
                    const(np.array(-limit, np.float32), "lo"),
                    const(np.array(limit, np.float32), "hi"),
                ],
                "clip",
            )
        q = node("QuantizeLinear", [src, scale, zero], "qx")
        out = node("DequantizeLinear", [q, scale, zero], "dqx", last)
    if wide:
        node("Cast", [out], "cast", y, to=elem_type)
    return inits, nodes
