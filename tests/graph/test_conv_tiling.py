"""Conv weights with a short reduction axis are tiled over their whole reduction.

A depthwise Conv weight ``[M, 1, kh, kw]`` tiled along its input channels would hold one value
per tile (MXFP4: 4 + 8 = 12 bits a value). The pass tiles it as ``[M, C/group*kh*kw]`` and
restores the shape with a Reshape (docs/ops.md). The expected weights here are computed
independently: the numpy reference cast (``backend="reference"``) of the weight reshaped the
same way, never read back from the quantized model.
"""

from __future__ import annotations

import copy
import math

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxq
from onnxq.deploy.export import export, load
from onnxq.graph.inspect import inspect_model
from onnxq.graph.plan import plan
from onnxq.graph.recipe import Recipe
from onnxq.runtime import session

RNG = np.random.default_rng(12)
# name -> (shape, its tile axis, the 2-D shape it is tiled in with 32-value tiles)
WEIGHTS = {
    "dw_w": ((32, 1, 3, 3), 1, (32, 9)),  # depthwise, group 32
    "gc_w": ((32, 16, 2, 2), 1, (32, 64)),  # grouped, group 2: 16 input channels a group
    "pw_w": ((8, 32, 1, 1), 1, None),  # pointwise: 32 input channels fill a tile already
    "ct_w": ((8, 4, 4, 4), 0, (8, 64)),  # ConvTranspose, 8 input channels
}
# The tile size of each format tested (its code's tNN).
BLOCK = {"mxfp4": 32, "mxfp8": 32, "cb41fi_e2m2fnuz_e8m0_t32": 32, "mx6": 16, "mx9": 16}
BLOCK |= {"bfp16": 16, "nvfp4": 16, "int8_e8m0_t8": 8}


def _tiled(name: str, fmt: str) -> tuple[int, int] | None:
    """The 2-D shape ``name`` is tiled in under ``fmt``: its tile axis shorter than a tile."""
    shape, axis, _ = WEIGHTS[name]
    short = shape[axis] < BLOCK[fmt] and math.prod(shape[1:]) > shape[axis]
    return (shape[0], math.prod(shape[1:])) if short else None


def _model() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """Depthwise 3x3 -> grouped 2x2 -> pointwise 1x1 -> ConvTranspose 4x4 stride 2."""
    values = {
        name: (RNG.standard_normal(shape) * (1 + np.arange(shape[0]).reshape(-1, 1, 1, 1))).astype(
            np.float32
        )
        for name, (shape, _, _) in WEIGHTS.items()
    }
    nodes = [
        helper.make_node("Conv", ["x", "dw_w"], ["a"], name="dw", group=32, pads=[1] * 4),
        helper.make_node("Conv", ["a", "gc_w"], ["b"], name="gc", group=2),
        helper.make_node("Conv", ["b", "pw_w"], ["c"], name="pw"),
        helper.make_node("ConvTranspose", ["c", "ct_w"], ["y"], name="ct", strides=[2, 2]),
    ]
    graph = helper.make_graph(
        nodes,
        "convs",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 32, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 16, 16])],
        [numpy_helper.from_array(v, n) for n, v in values.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    onnx.checker.check_model(model, full_check=True)
    return model, values


def _expected(values: dict[str, np.ndarray], fmt: str) -> dict[str, np.ndarray]:
    """Each weight cast by the numpy reference in the layout of WEIGHTS.

    Scale mode search: the pass's default for weights (docs/formats.md, "Scale modes").
    """
    out = {}
    mode = "search"
    for name, (shape, axis, _) in WEIGHTS.items():
        w, tiled = values[name], _tiled(name, fmt)
        if tiled is None:  # the input channels
            out[name] = onnxq.cast(w, fmt, axis=axis, backend="reference", scale_mode=mode)
        else:
            flat = onnxq.cast(w.reshape(tiled), fmt, axis=1, backend="reference", scale_mode=mode)
            out[name] = flat.reshape(shape)
    return out


def _with_outputs(model: onnx.ModelProto, names: list[str]) -> onnx.ModelProto:
    out = copy.deepcopy(model)
    out.graph.output.extend(
        helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in names
    )
    return out


def _plain(model: onnx.ModelProto) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def test_the_plan_tiles_short_reduction_axes_only() -> None:
    model, _ = _model()
    entries = {e.tensor: e for e in plan(model, Recipe(weights=onnxq.datatype("mxfp4"))).weights}
    for name, (_, axis, tiled) in WEIGHTS.items():
        assert entries[name].tiled_shape == tiled, name
        assert entries[name].axis == (axis if tiled is None else 1), name
    # Rules that keep the weight's own layout: a recipe axis, a channel scale, a tile that
    # the 16 input channels of gc fill (bfp16: 16).
    recipe = {"weights": "mxfp4", "node_overrides": {"dw": {"weight_axis": 1}}}
    kept = plan(model, Recipe.from_mapping(recipe))
    assert {e.tensor: e.tiled_shape for e in kept.weights}["dw_w"] is None
    channel = plan(model, Recipe(weights=onnxq.datatype("int8_channel"))).weights
    assert all(e.tiled_shape is None for e in channel)
    bfp = plan(model, Recipe(weights=onnxq.datatype("bfp16"))).weights
    tiled = {e.tensor: e.tiled_shape for e in bfp}
    assert tiled == {"dw_w": (32, 9), "gc_w": None, "pw_w": None, "ct_w": (8, 64)}


def test_mxfp4_bits_per_weight() -> None:
    model, _ = _model()
    q = onnxq.quantize_model(model, weights="mxfp4")
    found = {t.name: t for t in inspect_model(q).tensors}
    # 4-bit codes plus one 8-bit E8M0 scale per tile of 32: 4 + 8/32 = 4.25 where the tiled
    # row is a multiple of 32 (64 values); a 3x3 depthwise row is 9 values, one tile: 4 + 8/9.
    # Tiled along their input channel, dw_w would cost 4 + 8 = 12 and ct_w 4 + 8/8 = 5.
    want = {"dw_w": 4 + 8 / 9, "gc_w": 4.25, "pw_w": 4.25, "ct_w": 4.25}
    for name, bits in want.items():
        assert found[name].bits_per_value == pytest.approx(bits), name
        assert found[name].shape == WEIGHTS[name][0]
        assert found[name].tiled_shape == WEIGHTS[name][2]
    assert found["dw_w"].nbytes == 32 * 9 // 2 + 32  # codes, then one scale a row


def test_inspect_reads_the_standard_target_through_its_reshape() -> None:
    model, _ = _model()
    q = onnxq.quantize_model(model, weights="mxfp8", target="standard")  # DequantizeLinear
    found = {t.name: t for t in inspect_model(q).tensors}
    assert found["dw_w"].shape == (32, 1, 3, 3) and found["dw_w"].tiled_shape == (32, 9)
    # float8 codes (8 bits) and one float32 scale per tile of 9 values: 8 + 32/9
    assert found["dw_w"].bits_per_value == pytest.approx(8 + 32 / 9)


@pytest.mark.parametrize(
    "fmt", ["mxfp4", "mxfp8", "mx6", "bfp16", "int8_e8m0_t8", "nvfp4", "cb41fi_e2m2fnuz_e8m0_t32"]
)
def test_decoded_weights_and_outputs(fmt: str) -> None:
    model, values = _model()
    want = _expected(values, fmt)
    x = RNG.standard_normal((1, 32, 8, 8)).astype(np.float32)
    names = list(WEIGHTS)
    # The float model with the reference weights: what every quantized model must compute.
    ref_model = copy.deepcopy(model)
    for init in ref_model.graph.initializer:
        init.CopyFrom(numpy_helper.from_array(want[init.name], init.name))
    y_ref = _plain(ref_model).run(["y"], {"x": x})[0]
    custom_only = fmt == "nvfp4" or fmt.startswith("cb")
    runs = []
    packed = onnxq.quantize_model(model, weights=fmt)
    # The options of `_plain` (no graph optimizations): the weights decoded when the session is
    # created are then computed with as the reference's are, bit for bit.
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    runs.append(("packed, custom ops", session(_with_outputs(packed, names), sess_options=opts)))
    runs.append(("packed, plain onnxruntime", _plain(_with_outputs(packed, names))))
    if not custom_only:  # the standard target stores every other format exactly
        std = onnxq.quantize_model(model, weights=fmt, target="standard")
        runs.append(("standard", _plain(_with_outputs(std, names))))
    fake = onnxq.quantize_model(model, weights=fmt, weight_storage="fake")
    stored = {t.name: numpy_helper.to_array(t) for t in fake.graph.initializer}
    for name in names:
        assert np.array_equal(stored[name].view(np.uint32), want[name].view(np.uint32)), name
    runs.append(("fake", _plain(_with_outputs(fake, names))))
    for label, sess in runs:
        got = dict(zip(["y", *names], sess.run(["y", *names], {"x": x}), strict=True))
        for name in names:
            assert np.array_equal(got[name].view(np.uint32), want[name].view(np.uint32)), (
                label,
                name,
            )
        np.testing.assert_allclose(got["y"], y_ref, rtol=1e-5, atol=1e-5, err_msg=label)


@pytest.mark.parametrize("fmt", ["bfp16", "int8_e8m0_t8", "mx6", "mx9", "mxfp4", "mxfp8"])
def test_export_round_trip(fmt: str, tmp_path) -> None:
    model, values = _model()
    want = _expected(values, fmt)
    manifest = export(onnxq.quantize_model(model, weights=fmt), tmp_path / "hw")
    entries = {e["name"]: e for e in manifest["tensors"]}
    loaded = load(tmp_path / "hw")
    for name, (shape, _, _) in WEIGHTS.items():
        entry, tiled = entries[name], _tiled(name, fmt)
        if tiled is None:
            assert "weight_shape" not in entry, name
        else:
            assert entry["shape"] == list(tiled) and entry["tile_axis"] == 1
            assert entry["weight_shape"] == list(shape)
        values_hw = loaded[name]["values"].reshape(shape)  # decoded from the layout alone
        assert np.array_equal(values_hw.view(np.uint32), want[name].view(np.uint32)), name
        decoded = onnxq.upcast(loaded[name]["qtensor"]).reshape(shape)
        assert np.array_equal(decoded.view(np.uint32), want[name].view(np.uint32)), name
        assert math.prod(entry["shape"]) == math.prod(shape)


def test_a_manifest_weight_shape_must_hold_the_values(tmp_path) -> None:
    import json

    from onnxq.deploy.load import LoadError

    model, _ = _model()
    export(onnxq.quantize_model(model, weights="mxfp4"), tmp_path / "hw")
    path = tmp_path / "hw" / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["tensors"][0]["weight_shape"] = [32, 1, 3, 4]
    path.write_text(json.dumps(manifest))
    with pytest.raises(LoadError, match="weight_shape"):
        load(tmp_path / "hw")
