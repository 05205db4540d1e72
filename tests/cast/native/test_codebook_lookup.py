"""Native codebook lookups (DequantizeMX / CodebookLookup of codebook data types) against the
numpy reference, bit for bit: through the C ABI (one byte per code and per meta) and through an
onnxruntime CodebookLookup node (packed codes and meta), on every instruction set the CPU has.

The fast path (ops/src/fast_rows_driver.inc, fk_cb_dequant_rows) takes float32 tensors tiled
along the last axis whose units are multiples of 8 elements; tiles whose 2^s is no float32
(scales below 2^-149) send the cast to the general path, as do other shapes and axes (3 x 37
here).
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import onnxq
from onnxq import runtime
from onnxq.cast import native, reference
from onnxq.formats.datatype import datatype

pytestmark = pytest.mark.needs_native

SIMD = ["", "avx2", "base", "none"]
TYPES = [
    "cb41fi_e2m2fnuz_e8m0_t32", "cb41fi_e2m2fnuz_e8m0_t8", "cb41fi_e2m2fnuz_e8m0_t8s4",
    "cb42fi012_e2m2fnuz_e8m0_t16s4", "cb42f1346_e2m3fnuz_e8m0_t32", "cb51ie_e2m3_mx6_e8m0_t16s2",
    "cb40f_e2m3fnuz_e8m0_t64", "cb43f1234e_e4m3fnuz_e8m0_t32s8", "cb31f0e_e3m2_e8m0_t16",
    "cb20s1_e2m1_e8m0_t8", "cb41fi_e2m2fnuz_e5m0_t32", "cb41fi_e2m2fnuz_e8m0_t64s32",
]  # fmt: skip
SHAPES = [(3, 256), (2, 1100), (4, 64), (3, 37)]


def _data(shape: tuple[int, ...], seed: int) -> np.ndarray:
    """Random magnitudes over many binades, a zero row, a NaN, an Inf, huge and tiny tiles."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape) * np.exp2(rng.integers(-30, 30, shape))
    x[0] = 0.0
    x[-1, :16] *= 2.0**-140  # scales near the bottom of E8M0 (2^s a float32 subnormal)
    x[-1, 16:32] = 1e38
    if x.shape[-1] > 40:
        x[1, 40] = np.nan
        x[1, 3] = -np.inf
    return x.astype(np.float32)


@pytest.mark.parametrize("name", TYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_c_abi_lookup_equals_reference(name: str, shape, monkeypatch) -> None:
    dt = datatype(name)
    x = _data(shape, len(name) + shape[1])
    with np.errstate(all="ignore"):
        ref = reference.quantize(x, dt)
    for simd in SIMD:
        monkeypatch.setenv("ONNXQ_SIMD", simd)
        got = native.dequantize(dt, x.shape, -1, ref.codes, ref.scale, meta=ref.meta)
        assert np.array_equal(got.view(np.uint32), ref.values.view(np.uint32)), (name, simd)


def test_scales_whose_power_is_a_float32_subnormal(monkeypatch) -> None:
    # Tiles near 2^-147: E8M0 code 0 (2^-127, a float32 subnormal factor, exact in a float32
    # multiply while the FPU keeps subnormals) and the values it makes, 0 or subnormal.
    dt = datatype("cb41fi_e2m2fnuz_e8m0_t32")
    x = (np.random.default_rng(3).standard_normal((4, 256)) * 2.0**-125).astype(np.float32)
    x[0] *= 2.0**-3
    ref = reference.quantize(x, dt)
    assert (ref.scale == 0).any() and (ref.scale > 0).any()
    assert (ref.values[0] != 0).any()
    for simd in SIMD:
        monkeypatch.setenv("ONNXQ_SIMD", simd)
        got = native.dequantize(dt, x.shape, -1, ref.codes, ref.scale, meta=ref.meta)
        assert np.array_equal(got.view(np.uint32), ref.values.view(np.uint32)), simd


def _one_node_session(node, inputs, outputs):
    graph = helper.make_graph([node], "one", inputs, outputs)
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("onnxq", 1)]
    )
    return runtime.session(model)


def _lookup_session(name: str, shape: tuple[int, ...]):
    inputs = [
        helper.make_tensor_value_info(n, TensorProto.UINT8, None) for n in ("q", "meta", "scale")
    ]
    node = helper.make_node(
        "CodebookLookup",
        ["q", "meta", "scale"],
        ["y"],
        domain="onnxq",
        dtype=name,
        axis=-1,
        shape=list(shape),
    )
    return _one_node_session(
        node, inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)]
    )


@pytest.mark.needs_custom_ops
@pytest.mark.parametrize("name", TYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_session_lookup_equals_reference(name: str, shape, monkeypatch) -> None:
    x = _data(shape, 7 + shape[0])
    with np.errstate(all="ignore"):
        want = onnxq.cast(x, name, backend="reference")
        c = onnxq.cast(x, name, mode="compress", backend="reference")
    for simd in ("", "base"):
        monkeypatch.setenv("ONNXQ_SIMD", simd)
        sess = _lookup_session(name, shape)
        y = sess.run(None, {"q": c.data, "meta": c.meta, "scale": c.scale})[0]
        assert np.array_equal(y.view(np.uint32), want.view(np.uint32)), (name, simd)


def _quantize_session(name: str, shape: tuple[int, ...]):
    node = helper.make_node(
        "QuantizeMX", ["x"], ["q", "scale", "", "", "meta"], domain="onnxq", dtype=name, axis=-1
    )
    outs = [helper.make_tensor_value_info(n, TensorProto.UINT8, None) for n in ("q", "scale")]
    outs.append(helper.make_tensor_value_info("meta", TensorProto.UINT8, None))
    return _one_node_session(
        node, [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)], outs
    )


@pytest.mark.needs_custom_ops
@pytest.mark.parametrize("name", TYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_session_quantize_packs_like_the_reference(name: str, shape, monkeypatch) -> None:
    # Codes packed in place by the codebook kernels where tiles start on bytes (NaN and Inf
    # tiles through the general path into the same stream), afterwards elsewhere.
    x = _data(shape, 11 + shape[1])
    with np.errstate(all="ignore"):
        c = onnxq.cast(x, name, mode="compress", backend="reference")
    for simd in ("", "base", "none"):
        monkeypatch.setenv("ONNXQ_SIMD", simd)
        q, scale, meta = _quantize_session(name, shape).run(None, {"x": x})
        assert np.array_equal(q.reshape(-1), c.data.reshape(-1)), (name, simd, "q")
        assert np.array_equal(scale.reshape(-1), c.scale.reshape(-1)), (name, simd, "scale")
        assert np.array_equal(meta.reshape(-1), c.meta.reshape(-1)), (name, simd, "meta")
