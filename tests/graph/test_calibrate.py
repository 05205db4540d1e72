"""Activation calibration (onnxq.graph.calibrate): static QuantizeLinear/DequantizeLinear pairs.

The calibrated pair must give, bit for bit, the reference's formula with the calibrated scale:
``scale = cast(amax / maxfloat)``, elements ``round_even(x / scale)`` saturated to the format,
times the scale (uint8: with the zero point of ``reference._zero_point_scaled``).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper

import onnxq
from onnxq.cast.elements import quantize_values
from onnxq.formats.datatype import datatype
from onnxq.formats.modes import RoundMode
from onnxq.graph.calibrate import RangeObserver
from onnxq.graph.quantize import quantize_model
from tests.models import builders


def _samples(n: int = 4, scale: float = 1.0, seed: int = 0) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"x": (rng.standard_normal((4, 64)) * scale).astype(np.float32)} for _ in range(n)]


def _meta(model: onnx.ModelProto) -> dict[str, str]:
    return {p.key: p.value for p in model.metadata_props}


def _calibration(model: onnx.ModelProto) -> dict:
    return json.loads(_meta(model)["onnxq_calibration"])


def _run_x(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    """The calibrated pair's output for the graph input ``x`` (the first MatMul's input A)."""
    matmul = next(n for n in model.graph.node if n.op_type == "MatMul")
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    probe.graph.output.append(helper.make_tensor_value_info(matmul.input[0], 1, None))
    sess = ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run([matmul.input[0]], {"x": x})[0]


def _expected(x: np.ndarray, name: str, scale: float, zero: int = 0) -> np.ndarray:
    """numpy: the reference's element rounding of x / scale (float32) times the scale."""
    dt = datatype(name)
    s = np.float32(scale)
    v = (x.astype(np.float32) / s).astype(np.float32)
    if zero or dt.sspec.zero is not None:
        q = np.clip(np.rint(v.astype(np.float64)) + zero, 0, dt.nspec.maxfloat)
        return ((q - zero).astype(np.float32) * s).astype(np.float32)
    q = quantize_values(v.astype(np.float64), dt.nspec, RoundMode.EVEN)
    return (q.astype(np.float32) * s).astype(np.float32)


def _save_npz(folder: Path, samples: list[dict[str, np.ndarray]]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for i, sample in enumerate(samples):
        np.savez(folder / f"s{i}.npz", **sample)
    return folder


@pytest.mark.parametrize("fmt", ["int8_tensor", "fp8e4_tensor", "fp8e5_tensor", "uint8_tensor"])
def test_minmax_scale_and_bits(fmt: str, tmp_path: Path) -> None:
    model, _ = builders.mlp()
    samples = _samples()
    q = quantize_model(model, activations=fmt, calibration=samples, target="standard")
    cal = _calibration(q)
    assert cal["method"] == "minmax" and cal["samples"] == len(samples)
    rec = cal["tensors"]["x"]
    xs = np.concatenate([s["x"] for s in samples])
    assert rec["amax"] == float(np.abs(xs).max())
    dt = datatype(fmt)
    if dt.sspec.zero is None:
        assert rec["scale"] == float(np.float32(np.abs(xs).max()) / np.float32(dt.nspec.maxfloat))
    # New data, twice as wide: the pair saturates like the format (int8: -127..127).
    x = _samples(1, scale=2.0, seed=9)[0]["x"]
    got = _run_x(q, x)
    want = _expected(x, fmt, rec["scale"], rec.get("zero_point", 0))
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    # Calibrated on the same single sample, it equals the dynamic onnxq cast bit for bit.
    one = quantize_model(model, activations=fmt, calibration=[{"x": x}], target="standard")
    ref = np.asarray(onnxq.cast(x, fmt))
    np.testing.assert_array_equal(_run_x(one, x).view(np.uint32), ref.view(np.uint32))
    # A directory of .npz files gives the same model as the iterable.
    from_dir = quantize_model(
        model, activations=fmt, calibration=_save_npz(tmp_path, samples), target="standard"
    )
    assert _calibration(from_dir) == cal
    assert from_dir.graph == q.graph


def test_uint8_zero_point() -> None:
    model, _ = builders.mlp()
    samples = [{"x": s["x"] + np.float32(1.5)} for s in _samples()]  # asymmetric range
    q = quantize_model(model, activations="uint8_tensor", calibration=samples, target="standard")
    rec = _calibration(q)["tensors"]["x"]
    xs = np.concatenate([s["x"] for s in samples])
    lo, hi = np.minimum(xs.min(), np.float32(0)), np.maximum(xs.max(), np.float32(0))
    scale = np.float32((hi - lo) / np.float32(255))
    zero = int(np.clip(np.rint(np.float32(-lo / scale)), 0, 255))
    assert (rec["min"], rec["max"]) == (float(xs.min()), float(xs.max()))
    assert rec["scale"] == float(scale) and rec["zero_point"] == zero and 0 < zero < 255
    zp = next(t for t in q.graph.initializer if t.name.endswith("zero_point") and "x__" in t.name)
    assert onnx.numpy_helper.to_array(zp).dtype == np.uint8
    x = samples[0]["x"]
    want = _expected(x, "uint8_tensor", rec["scale"], zero)
    np.testing.assert_array_equal(_run_x(q, x).view(np.uint32), want.view(np.uint32))


def test_percentile_is_below_minmax_with_outliers() -> None:
    model, _ = builders.mlp()
    samples = _samples(8)
    samples[3]["x"][1, 7] = 60.0  # one outlier
    kw = {"activations": "int8_tensor", "calibration": samples, "target": "standard"}
    minmax = _calibration(quantize_model(model, **kw))["tensors"]["x"]
    pct = _calibration(
        quantize_model(model, calibration_method="percentile", percentile=99.0, **kw)
    )
    assert pct["method"] == "percentile" and pct["percentile"] == 99.0
    rec = pct["tensors"]["x"]
    assert minmax["amax"] == 60.0 and rec["observed_amax"] == 60.0
    assert rec["amax"] < 10.0 and rec["scale"] < minmax["scale"]
    exact = np.percentile(np.abs(np.concatenate([s["x"] for s in samples])), 99.0)
    assert abs(rec["amax"] - exact) <= 0.01 * exact
    assert rec["scale"] == float(np.float32(np.float32(rec["amax"]) / np.float32(127)))


def test_range_observer_percentile_is_bounded_and_close() -> None:
    rng = np.random.default_rng(1)
    obs = RangeObserver(histogram=True)
    chunks = [rng.standard_normal(10_000).astype(np.float32) for _ in range(5)]
    for c in chunks:
        obs.update(np.append(c, [np.nan, np.inf]))  # non-finite values are not counted
    assert obs.count == 50_000
    allv = np.abs(np.concatenate(chunks))
    for p in (50.0, 99.0, 99.9):
        assert abs(obs.percentile_of(p) - np.percentile(allv, p)) <= 0.01 * np.percentile(allv, p)
    assert obs.percentile_of(100.0) == allv.max() == obs.amax
    assert obs._hist is not None and obs._hist.size == 1 << 15  # bounded, not the data


def test_standard_target_runs_and_tracks_the_float_model() -> None:
    model, inputs = builders.mlp()
    q = quantize_model(
        model,
        weights="mxint8",
        activations="int8_tensor",
        target="standard",
        calibration=_samples(),
    )
    assert not any(n.domain == "onnxq" for n in q.graph.node)
    assert sum(n.op_type == "QuantizeLinear" for n in q.graph.node) == 3  # x, h0, h1
    onnx.checker.check_model(q, full_check=True)
    ref, got = _run(model, inputs), _run(q, inputs)
    cos = float((ref * got).sum() / np.linalg.norm(ref) / np.linalg.norm(got))
    assert cos > 0.99


def _run(model: onnx.ModelProto, inputs: dict[str, np.ndarray]) -> np.ndarray:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, inputs)[0]


def test_external_data_model_and_zero_range(tmp_path: Path) -> None:
    model, inputs = builders.mlp()
    src = tmp_path / "in" / "m.onnx"
    src.parent.mkdir()
    onnx.save(model, src, save_as_external_data=True, location="m.data", size_threshold=0)
    out = tmp_path / "q.onnx"
    zeros = [{"x": np.zeros((4, 64), np.float32)}]
    q = quantize_model(src, out, activations="int8_tensor", calibration=zeros, target="standard")
    rec = _calibration(q)["tensors"]
    assert rec["x"]["scale"] == 0.0 and rec["h0"]["amax"] > 0  # h0 = relu(b0) is not zero
    sess = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    probe = _run_x(onnx.load(out), inputs["x"])
    assert np.array_equal(probe.view(np.uint32), np.zeros_like(probe).view(np.uint32))
    assert sess.run(None, inputs)[0].shape == (4, 16)


def test_onnxq_target_uses_the_same_static_pair() -> None:
    model, _ = builders.mlp()
    kw = {"activations": "fp8e4_tensor", "calibration": _samples()}
    a = quantize_model(model, **kw)
    b = quantize_model(model, target="standard", **kw)
    assert _calibration(a) == _calibration(b)
    ops = [n.op_type for n in a.graph.node]
    assert "QuantizeDequantizeMX" not in ops and ops.count("QuantizeLinear") == 3
    # Without calibration the onnxq target stays dynamic (a float-scale QuantizeDequantizeMX,
    # which has no standard-ONNX fallback: only when asked for) and standard refuses.
    with pytest.raises(NotImplementedError, match="--calibration DIR"):
        quantize_model(model, activations="fp8e4_tensor")
    assert "QuantizeDequantizeMX" in [
        n.op_type
        for n in quantize_model(model, activations="fp8e4_tensor", custom_ops_only=True).graph.node
    ]
    with pytest.raises(NotImplementedError, match="--calibration"):
        quantize_model(model, activations="fp8e4_tensor", target="standard")


def test_block_formats_ignore_calibration_with_a_precise_warning() -> None:
    model, _ = builders.mlp()
    with pytest.warns(UserWarning, match="not used for activation format.*mxfp8e4"):
        q = quantize_model(model, activations="mxfp8e4", calibration=_samples())
    assert "onnxq_calibration" not in _meta(q)
    with pytest.warns(UserWarning, match="no activation is quantized"):
        quantize_model(model, weights="mxfp4", calibration=_samples())


def test_channel_scaled_activations_refuse_calibration() -> None:
    model, _ = builders.mlp()
    with pytest.raises(NotImplementedError, match=r"int8_channel.*cannot be calibrated"):
        quantize_model(model, activations="int8_channel", calibration=_samples())


def test_bad_calibration_inputs(tmp_path: Path) -> None:
    model, _ = builders.mlp()
    kw = {"activations": "int8_tensor"}
    with pytest.raises(ValueError, match="not a directory"):
        quantize_model(model, calibration=tmp_path / "missing", **kw)
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "notes.txt").write_text("no samples here")
    with pytest.raises(ValueError, match=r"holds no \.npz file"):
        quantize_model(model, calibration=empty, **kw)
    wrong = _save_npz(tmp_path / "wrong", [{"y": np.zeros((4, 64), np.float32)}])
    with pytest.raises(ValueError, match="'y' is not an input of the model"):
        quantize_model(model, calibration=wrong, **kw)
    with pytest.raises(ValueError, match="input 'x' is missing"):
        quantize_model(model, calibration=[{}], **kw)
    with pytest.raises(ValueError, match="no sample"):
        quantize_model(model, calibration=[], **kw)
    with pytest.raises(ValueError, match="iterable of input dicts"):
        quantize_model(model, calibration=_samples()[0], **kw)  # type: ignore[arg-type]
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "s.npz").write_bytes(b"not a zip")
    with pytest.raises(ValueError, match=r"not a readable \.npz"):
        quantize_model(model, calibration=bad, **kw)
