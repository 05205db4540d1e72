"""DequantizeMX / CodebookLookup of constant initializers: decoded once, the same bits.

When every input of the node is a constant initializer the kernel may decode Y when the session
is created and each Run copy it. ONNXQ_CONST_DECODE (read when the session is created): 1
always, 0 never, unset when the copy is faster than the decoding. Every way, and with the packed
weight fed as graph inputs, Y has the same bits in every output type; one session run from 8
threads gives each the serial run's bits; a bad constant input gives the same error either way.
"""

from __future__ import annotations

import concurrent.futures

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxq
from onnxq import runtime

pytestmark = pytest.mark.needs_custom_ops
pytest.importorskip("onnxruntime")

SHAPE = (64, 96)
SLOTS = {
    "DequantizeMX": ("Q", "Scale", "Zero", "TenScale", "Meta", "Mask"),
    "CodebookLookup": ("Q", "Meta", "Scale", "Table"),
}
CASES = [
    ("DequantizeMX", "mxfp4"),
    ("DequantizeMX", "mx6"),  # Meta (shift bits)
    ("DequantizeMX", "nvfp4"),  # TenScale
    ("DequantizeMX", "uint4_block32"),  # Zero
    ("DequantizeMX", "e2m1fnuz_e8m0_t32n2m4"),  # Mask (N:M sparse)
    ("CodebookLookup", "cb41fi_e2m2fnuz_e8m0_t32"),
]
OUT_TYPES = {
    TensorProto.FLOAT: np.float32,
    TensorProto.FLOAT16: np.float16,
    TensorProto.BFLOAT16: np.float32,  # through the Cast
}


def _fields(dt: str, seed: int = 3) -> dict[str, np.ndarray]:
    """The packed inputs QuantizeMX makes for a seeded weight (onnxq.cast compress mode)."""
    x = np.random.default_rng(seed).standard_normal(SHAPE).astype(np.float32)
    q = onnxq.cast(x, dt, axis=-1, mode="compress", backend="reference")
    got = {"Q": q.data, "Scale": q.scale, "Zero": q.zero, "TenScale": q.tenscale}
    got.update({"Meta": q.meta, "Mask": q.mask})
    return {k: np.ascontiguousarray(v) for k, v in got.items() if v is not None}


def _model(
    op: str, dt: str, out_type: int, constant: bool, **fields: np.ndarray
) -> onnx.ModelProto:
    """Y = op(fields) as initializers (constant) or graph inputs; x -> Identity keeps an input."""
    names = [k if k in fields else "" for k in SLOTS[op]]
    while not names[-1]:
        names.pop()
    tensors = [numpy_helper.from_array(v, k) for k, v in fields.items()]
    node = helper.make_node(
        op, names, ["Y"], domain="onnxq", dtype=dt, shape=list(SHAPE), output_type=out_type
    )
    ident = helper.make_node("Identity", ["x"], ["xo"])
    # numpy has no bfloat16: a bfloat16 Y is read through an exact Cast to float.
    y_name = "Y"
    nodes = [node, ident]
    if out_type == TensorProto.BFLOAT16:
        y_name, out_type = "Yf", TensorProto.FLOAT
        nodes.append(helper.make_node("Cast", ["Y"], ["Yf"], to=TensorProto.FLOAT))
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    fed = [helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in tensors]
    inputs = [x] if constant else [x, *fed]
    graph = helper.make_graph(
        nodes,
        "const_decode",
        inputs,
        [
            helper.make_tensor_value_info(y_name, out_type, list(SHAPE)),
            helper.make_tensor_value_info("xo", TensorProto.FLOAT, [1]),
        ],
        initializer=tensors if constant else [],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("onnxq", 1)]
    return helper.make_model(graph, opset_imports=opsets)


def _bits(y: np.ndarray) -> bytes:
    return np.ascontiguousarray(y).tobytes()


def _run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    sess = runtime.session(model, decode_weights="run")
    return sess.run(None, {"x": np.ones(1, np.float32), **feeds})


@pytest.mark.parametrize(("op", "dt"), CASES)
@pytest.mark.parametrize("out_type", list(OUT_TYPES))
def test_same_bits_on_off_and_fed(
    op: str, dt: str, out_type: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    fields = _fields(dt)
    if op == "CodebookLookup":
        fields.pop("Zero", None)
    const = _model(op, dt, out_type, True, **fields)
    monkeypatch.setenv("ONNXQ_CONST_DECODE", "1")
    on = [_run(const, {})[0] for _ in range(2)]  # the second Run copies the cache again
    monkeypatch.setenv("ONNXQ_CONST_DECODE", "0")
    off = _run(const, {})[0]
    monkeypatch.delenv("ONNXQ_CONST_DECODE")
    auto = _run(const, {})[0]  # cached or not, as the kernel's timing decides
    fed = _run(_model(op, dt, out_type, False, **fields), fields)[0]
    assert on[0].shape == SHAPE and on[0].dtype == off.dtype
    assert _bits(on[0]) == _bits(on[1]) == _bits(off) == _bits(auto) == _bits(fed)
    assert on[0].dtype == OUT_TYPES[out_type]
    assert np.isfinite(off.astype(np.float32)).all()


def test_threads_share_the_decoded_weight(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ONNXQ_CONST_DECODE", "1")
    fields = _fields("mxfp4")
    sess = runtime.session(
        _model("DequantizeMX", "mxfp4", TensorProto.FLOAT, True, **fields), decode_weights="run"
    )
    feed = {"x": np.ones(1, np.float32)}
    serial = _bits(sess.run(["Y"], feed)[0])

    def runs(_: int) -> list[bytes]:
        return [_bits(sess.run(["Y"], feed)[0]) for _ in range(12)]

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = [b for rs in pool.map(runs, range(8)) for b in rs]
    assert len(results) == 96 and all(b == serial for b in results)


@pytest.mark.parametrize("switch", ["1", "0"])
def test_bad_constant_same_error(switch: str, monkeypatch: pytest.MonkeyPatch) -> None:
    fields = _fields("mxfp4")
    fields["Scale"] = fields["Scale"][:, :1].copy()  # the wrong tile grid
    monkeypatch.setenv("ONNXQ_CONST_DECODE", switch)
    sess = runtime.session(
        _model("DequantizeMX", "mxfp4", TensorProto.FLOAT, True, **fields), decode_weights="run"
    )
    with pytest.raises(
        Exception, match=r"\[DequantizeMX\] input Scale is uint8 of shape \(64, 1\)"
    ):
        sess.run(None, {"x": np.ones(1, np.float32)})
