"""An activation read through a Pad is quantized before the Pad where that gives the same bits.

`onnxq.graph.commute.hoist_over_pads` moves the QuantizeDequantizeMX above a Pad that leaves the
tile axis alone (so onnxruntime can fold the Pad into the Conv again). Two oracles check that
nothing changes but the place:

- the padded, quantized tensor equals the numpy reference cast (`onnxq.cast`, backend="reference")
  of ``np.pad(x)`` bit for bit;
- the whole model's output equals the model quantized with the hoist turned off.

Every condition that makes the move inexact (a pad on the channel axis, a negative pad, a fill
value other than +0, another reader of the Pad's output, stochastic rounding, a zero point, a
two-axis tile, pads known only at run time) keeps the activation where it was.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxq import cast
from onnxq.graph import quantize as quantize_module
from onnxq.graph.ort_session import session
from onnxq.graph.quantize import quantize_model
from tests.onnxq_cli import run_onnxq

pytestmark = pytest.mark.needs_custom_ops

C, H, W = 64, 6, 7
SPATIAL = [0, 0, 1, 2, 0, 0, 2, 1]  # begin N C H W, end N C H W: H and W only


def _model(
    pads: list[int] | None = SPATIAL,
    *,
    mode: str = "constant",
    value: float | None = None,
    axes: list[int] | None = None,
    pads_from: str = "init",
    extra_reader: bool = False,
) -> onnx.ModelProto:
    """x [1, C, H, W] -> Pad -> Conv (3x3, 8 filters) -> y; the Pad's inputs as asked.

    pads_from: ``init`` (an initializer), ``ints`` (a Constant with value_ints), ``chain``
    (ConstantOfShape + Concat + Slice, folded by the pass), ``input`` (a graph input: known
    only at run time).
    """
    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array(rng.standard_normal((8, C, 3, 3)).astype(np.float32), "w")]
    nodes, inputs = [], [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, C, H, W])]
    n_axes = 4 if axes is None else len(axes)
    if pads_from == "init":
        inits.append(numpy_helper.from_array(np.array(pads, np.int64), "pads"))
    elif pads_from == "chain":  # zeros(4) ++ pads, then the last 2 * n_axes: the given pads
        nodes += [
            helper.make_node(
                "ConstantOfShape",
                ["four"],
                ["zeros"],
                value=numpy_helper.from_array(np.zeros(1, np.int64)),
            ),
            helper.make_node("Concat", ["zeros", "given"], ["joined"], axis=0),
            helper.make_node("Slice", ["joined", "start", "stop"], ["pads"]),
        ]
        inits += [
            numpy_helper.from_array(np.array([4], np.int64), "four"),
            numpy_helper.from_array(np.array(pads, np.int64), "given"),
            numpy_helper.from_array(np.array([4], np.int64), "start"),
            numpy_helper.from_array(np.array([4 + 2 * n_axes], np.int64), "stop"),
        ]
    elif pads_from == "ints":  # a Constant node with value_ints
        nodes.append(helper.make_node("Constant", [], ["pads"], value_ints=list(pads or [])))
    else:
        inputs.append(helper.make_tensor_value_info("pads", TensorProto.INT64, [2 * n_axes]))
    pad_inputs = ["x", "pads", "", ""]
    if value is not None:
        inits.append(numpy_helper.from_array(np.array(value, np.float32), "fill"))
        pad_inputs[2] = "fill"
    if axes is not None:
        inits.append(numpy_helper.from_array(np.array(axes, np.int64), "axes"))
        pad_inputs[3] = "axes"
    while not pad_inputs[-1]:
        pad_inputs.pop()
    nodes.append(helper.make_node("Pad", pad_inputs, ["padded"], name="pad", mode=mode))
    nodes.append(helper.make_node("Conv", ["padded", "w"], ["y"], name="conv"))
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None] * 4)]
    if extra_reader:
        nodes.append(helper.make_node("Relu", ["padded"], ["r"], name="relu"))
        outputs.append(helper.make_tensor_value_info("r", TensorProto.FLOAT, [None] * 4))
    graph = helper.make_graph(nodes, "pad_conv", inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def _quantize(model: onnx.ModelProto, **kwargs: Any) -> onnx.ModelProto:
    kwargs.setdefault("activations", "mxfp8")
    return quantize_model(model, **kwargs)


def _hoisted(q: onnx.ModelProto) -> bool:
    """True when the Pad reads the activation quantizer's output (the move happened)."""
    pad = next(n for n in q.graph.node if n.op_type == "Pad")
    producer = {o: n for n in q.graph.node for o in n.output}
    src = producer.get(pad.input[0])
    return src is not None and src.domain == "onnxq"


def _x(seed: int = 0) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((1, C, H, W)).astype(np.float32)
    x[0, :32, 0, 0] = 0.0  # a zero tile inside the input
    x[0, 5, 1, 1] = 1e-40  # a subnormal
    x[0, 40:, 2, 3] *= 1e4  # a tile of large values
    return x


def _run(q: onnx.ModelProto, feeds: dict[str, np.ndarray], outputs: list[str]) -> list[Any]:
    q = onnx.ModelProto.FromString(q.SerializeToString())
    for name in outputs:
        if name not in {o.name for o in q.graph.output}:
            q.graph.output.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, None))
    return session(q).run(outputs, feeds)


def _without_hoist(monkeypatch: pytest.MonkeyPatch, model: onnx.ModelProto) -> onnx.ModelProto:
    with monkeypatch.context() as m:
        m.setattr(quantize_module, "hoist_over_pads", lambda p, *_: p)
        return _quantize(model)


def _same_bits(a: np.ndarray, b: np.ndarray) -> None:
    assert a.shape == b.shape
    np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))


@pytest.mark.parametrize(
    ("mode", "np_mode"), [("constant", "constant"), ("edge", "edge"), ("reflect", "reflect")]
)
def test_spatial_pad_is_hoisted_with_the_same_bits(
    monkeypatch: pytest.MonkeyPatch, mode: str, np_mode: str
) -> None:
    model = _model(mode=mode)
    q = _quantize(model)
    assert _hoisted(q)
    x = _x()
    padded, y = _run(q, {"x": x}, ["padded", "y"])
    width = [(SPATIAL[i], SPATIAL[i + 4]) for i in range(4)]
    expect = np.asarray(cast(np.pad(x, width, mode=np_mode), "mxfp8", axis=1, backend="reference"))
    _same_bits(padded, expect)
    (y_plain,) = _run(_without_hoist(monkeypatch, model), {"x": x}, ["y"])
    _same_bits(y, y_plain)


def test_computed_pads_and_axes_are_folded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pads from a ConstantOfShape/Concat/Slice chain or value_ints, and the ``axes`` input."""
    chain = _model(pads_from="chain")
    assert _hoisted(_quantize(chain))
    assert _hoisted(_quantize(_model(pads_from="ints")))
    by_axes = _model([1, 2, 2, 1], axes=[2, -1])  # H: 1 before, 2 after; W: 2, 1
    q = _quantize(by_axes)
    assert _hoisted(q)
    x = _x(1)
    (y,) = _run(q, {"x": x}, ["y"])
    (y_plain,) = _run(_without_hoist(monkeypatch, by_axes), {"x": x}, ["y"])
    _same_bits(y, y_plain)


@pytest.mark.parametrize(
    ("why", "model", "kwargs"),
    [
        ("a pad on the channel (tile) axis", _model([0, 1, 0, 0, 0, 0, 0, 0]), {}),
        ("channel pad through axes", _model([1, 0], axes=[1]), {}),
        ("a negative pad (a crop)", _model([0, 0, -1, 0, 0, 0, 0, 1]), {}),
        ("fill value 1", _model(value=1.0), {}),
        ("fill value -0", _model(value=-0.0), {}),
        ("pads known at run time", _model(pads_from="input"), {}),
        ("another reader of the padded tensor", _model(extra_reader=True), {}),
        ("stochastic rounding", _model(), {"recipe": {"round_mode": "stochastic"}}),
        ("a zero point", _model(), {"activations": "uint8_float32_uint8_t32"}),
        ("a two-axis tile", _model(), {"activations": "e4m3_e8m0_t8_t4"}),
    ],
)
def test_inexact_cases_stay_after_the_pad(
    why: str, model: onnx.ModelProto, kwargs: dict[str, Any]
) -> None:
    q = _quantize(model, custom_ops_only=True, **kwargs)
    assert not _hoisted(q), why
    conv = next(n for n in q.graph.node if n.op_type == "Conv")
    producer = {o: n for n in q.graph.node for o in n.output}
    assert producer[conv.input[0]].domain == "onnxq", why  # quantized where it was


def test_fill_zero_given_explicitly_is_hoisted() -> None:
    assert _hoisted(_quantize(_model(value=0.0)))


def test_efficientnet_pads_fold_again(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """EfficientNet-Lite0's 17 computed "same" Pads: every one now reads a quantized tensor,
    and the logits keep the bits of the unmoved model (batch 2, dynamic batch dim)."""
    from tests.models import exports, real

    try:
        path, feeds = exports.efficientnet_lite0(tmp_path)
    except real.MissingModelError as err:
        pytest.skip(str(err))
    model = onnx.load(str(path))
    q = _quantize(model)
    producer = {o: n for n in q.graph.node for o in n.output}
    pads = [n for n in q.graph.node if n.op_type == "Pad"]
    assert len(pads) == 17
    assert all(producer[p.input[0]].op_type == "QuantizeDequantizeMX" for p in pads)
    (y,) = session(q).run(None, feeds)
    (y_plain,) = session(_without_hoist(monkeypatch, model)).run(None, feeds)
    _same_bits(y, y_plain)


def test_cli_quantize_moves_the_cast_and_leaves_the_input(tmp_path: Path) -> None:
    """``python -m onnxq quantize`` as a subprocess: exit 0, the move made, the input intact."""
    src, out = tmp_path / "pad_conv.onnx", tmp_path / "pad_conv.q.onnx"
    onnx.save(_model(), str(src))
    before = src.read_bytes()
    done = run_onnxq("quantize", str(src), "-o", str(out), "--activations", "mxfp8")
    assert done.returncode == 0, done.stderr
    assert src.read_bytes() == before
    assert _hoisted(onnx.load(str(out)))
