"""The fast DequantizeMX / onnxq_dequantize path (ops/src/dequantize_fast.cc `fast_dequantize`).

Exponent-scaled (E8M0, MX9/MX6/MX4 shift bits) and float-scaled (NVFP4) data types with float or
int elements of at most 8 bits and 1-D tiles are decoded by a table kernel that reads the codes
straight from the packed stream. Every test feeds random codes (all element codes, NaN and Inf
ones included), random scale codes (E8M0 255 = NaN tile, 0 and 254 at the range ends) and
random shift bits, and compares bit for bit with the numpy reference (`onnxq.upcast`) and with
the general C++ path (`ONNXQ_SIMD=none`), for every axis, ragged tails (odd start nibbles) and
float32 / float16 / bfloat16 outputs (canonical NaN: 0x7FC00000 / 0x7E00 / 0x7FC0).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto, helper

import onnxq
from onnxq import runtime
from onnxq.cast import native

FAST = [
    "mxfp4",
    "mxfp4e2",
    "mxfp6",
    "mxfp6e3",
    "mxfp8e4",
    "mxfp8e5",
    "mxint8",
    "mxint4",
    "mx9",
    "mx6",
    "mx4",
    "bfp16",
    "bfp8",
    "nvfp4",
]
SHAPES = [
    ((3, 70), -1),
    ((3, 70), 0),
    ((37, 5), 0),
    ((2, 33, 3), 1),
    ((2, 33, 3), 0),
    ((2, 3, 33), 2),
    ((1, 1), 0),
    ((4, 64), -1),
]
OUT = {
    np.dtype(np.float32): TensorProto.FLOAT,
    np.dtype(np.float16): TensorProto.FLOAT16,
    np.dtype(ml_dtypes.bfloat16): TensorProto.BFLOAT16,
}
_U = {1: TensorProto.UINT8, 2: TensorProto.UINT16, 4: TensorProto.UINT32}

pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")


def _random_q(dt: str, shape: tuple[int, ...], axis: int, seed: int) -> onnxq.QTensor:
    """A compress-mode QTensor with random codes, scales (NaN tiles included) and shift bits."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(np.float32)
    q = onnxq.cast(x, dt, axis=axis, mode="compress")
    data = rng.integers(0, 256, q.data.shape, dtype=np.uint8)
    scale = q.scale.copy()
    flat = scale.reshape(-1)
    if scale.dtype == np.uint8 and onnxq.datatype(dt).sspec.scale.name.startswith("e8m0"):
        # E8M0 around the middle (finite results), plus the ends and NaN tiles.
        flat[:] = rng.integers(110, 145, flat.size)
        for code in (255, 0, 254, 1):
            flat[rng.integers(0, flat.size)] = code
        if flat.size > 2:
            flat[0] = 255
    else:
        flat[:] = rng.integers(0, 256, flat.size)
    meta = q.meta
    if meta is not None:
        meta = rng.integers(0, 256, meta.shape, dtype=np.uint8)
    return dataclasses.replace(q, data=data, scale=scale, meta=meta)


def _bits(a: np.ndarray) -> np.ndarray:
    a = np.asarray(a)
    return a.view(np.uint16 if a.dtype.itemsize == 2 else np.uint32)


def _session_dequant(q: onnxq.QTensor, out: np.dtype) -> np.ndarray:
    import onnxruntime as ort

    names, feeds, inputs = [], {}, []
    for name, v in (
        ("q", q.data),
        ("scale", q.scale),
        ("zero", q.zero),
        ("tenscale", q.tenscale),
        ("meta", q.meta),
    ):
        if v is None:
            names.append("")
            continue
        names.append(name)
        feeds[name] = v
        inputs.append(helper.make_tensor_value_info(name, _U[v.dtype.itemsize], list(v.shape)))
    while names and not names[-1]:
        names.pop()
    node = helper.make_node(
        "DequantizeMX",
        names,
        ["y"],
        domain="onnxq",
        dtype=q.dtype.name,
        axis=q.axis,
        shape=list(q.shape),
        output_type=OUT[out],
    )
    graph = helper.make_graph(
        [node], "dq", inputs, [helper.make_tensor_value_info("y", OUT[out], list(q.shape))]
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("onnxq", 1)]
    )
    sess = runtime.session(model)
    if out != np.dtype(ml_dtypes.bfloat16):
        return sess.run(None, feeds)[0]
    binding = sess.io_binding()
    for k, v in feeds.items():
        binding.bind_cpu_input(k, v)
    y = np.empty(q.shape, np.uint16)
    binding.bind_ortvalue_output(
        "y", ort.OrtValue.ortvalue_from_numpy_with_onnx_type(y, TensorProto.BFLOAT16)
    )
    sess.run_with_iobinding(binding)
    return y.view(ml_dtypes.bfloat16)


def _want(q: onnxq.QTensor, out: Any) -> np.ndarray:
    return onnxq.upcast(q, out)


@pytest.mark.needs_custom_ops
@pytest.mark.parametrize("out", [np.float32, np.float16, ml_dtypes.bfloat16])
@pytest.mark.parametrize(("shape", "axis"), SHAPES)
@pytest.mark.parametrize("dt", FAST)
def test_session_matches_reference(
    dt: str, shape: tuple[int, ...], axis: int, out: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    q = _random_q(dt, shape, axis, hash((dt, shape, axis)) % 1000)
    want = _bits(_want(q, out))
    got = _bits(_session_dequant(q, np.dtype(out)))
    assert np.array_equal(got, want), dt
    monkeypatch.setenv("ONNXQ_SIMD", "none")  # the general path agrees
    assert np.array_equal(_bits(_session_dequant(q, np.dtype(out))), want), dt


@pytest.mark.needs_custom_ops
@pytest.mark.parametrize("dt", ["mxfp4", "mxfp8e4", "mx6", "mx9", "nvfp4", "mxfp6"])
def test_session_roundtrip_large(dt: str) -> None:
    """QuantizeMX's own outputs, many tiles per thread, rows with odd lengths."""
    rng = np.random.default_rng(1)
    for shape, axis in (((129, 517), -1), ((33, 17, 65), 1)):
        x = (rng.standard_normal(shape) * np.exp2(rng.integers(-20, 20, shape))).astype(np.float32)
        x.reshape(-1)[::97] = np.nan
        x.reshape(-1)[5::101] = np.inf
        q = onnxq.cast(x, dt, axis=axis, mode="compress")
        want = _bits(onnxq.cast(x, dt, axis=axis))
        assert np.array_equal(_bits(_session_dequant(q, np.dtype(np.float32))), want), dt


@pytest.mark.needs_custom_ops
def test_all_nan_and_extreme_scales() -> None:
    """Every tile NaN, then every tile at the smallest / largest E8M0 scale."""
    for dt in ("mxfp8e4", "mxint8", "mx9"):
        q = _random_q(dt, (5, 96), -1, 3)
        for code in (255, 0, 254):
            qq = dataclasses.replace(q, scale=np.full_like(q.scale, code))
            for out in (np.float32, np.float16, ml_dtypes.bfloat16):
                want = _bits(_want(qq, out))
                got = _bits(_session_dequant(qq, np.dtype(out)))
                assert np.array_equal(got, want), (dt, code, out)
                if code == 255:
                    canon = {np.float32: 0x7FC00000, np.float16: 0x7E00}.get(out, 0x7FC0)
                    assert np.all(got == canon)


@pytest.mark.parametrize("out", [np.float32, np.float16, ml_dtypes.bfloat16])
@pytest.mark.parametrize(("shape", "axis"), SHAPES)
@pytest.mark.parametrize("dt", FAST)
def test_capi_matches_reference(
    dt: str, shape: tuple[int, ...], axis: int, out: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """onnxq_dequantize (unpacked codes, one byte each) takes the same fast path."""
    from onnxq.cast.api import _expand

    q = _random_q(dt, shape, axis, hash((dt, shape, axis, "capi")) % 1000)
    codes, meta = _expand(q)
    want = _bits(_want(q, out))
    kw = dict(values_dtype=np.dtype(out), nthreads=2)
    args = (q.dtype, q.shape, q.axis, codes, q.scale, q.zero, q.tenscale, meta)
    assert np.array_equal(_bits(native.dequantize(*args, **kw)), want), dt
    monkeypatch.setenv("ONNXQ_SIMD", "none")
    assert np.array_equal(_bits(native.dequantize(*args, **kw)), want), dt


# -- onnxq_pack_bits / onnxq_unpack_bits (chunked, parallel, byte fast paths) -----------------


@pytest.mark.parametrize("bits", [1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 13, 16, 17, 31, 32, 33, 63, 64])
@pytest.mark.parametrize("count", [0, 1, 7, 8, 9, 65535, 65536, 65537, 200003])
def test_pack_unpack_bits_capi(bits: int, count: int) -> None:
    import ctypes

    from onnxq.cast import packing

    try:
        lib = native._lib()
    except NotImplementedError:
        pytest.skip("the native library is missing")
    width = 1 if bits <= 8 else 2 if bits <= 16 else 4 if bits <= 32 else 8
    dtype = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[width]
    rng = np.random.default_rng(bits * 1000 + count)
    hi = np.uint64(2**bits - 1) if bits < 64 else np.uint64(2**64 - 1)
    codes = rng.integers(0, hi, count, dtype=np.uint64, endpoint=True).astype(dtype)
    nbytes = packing.packed_nbytes(count, bits)
    out = np.full(max(nbytes, 1), 0xAB, np.uint8)
    err = ctypes.create_string_buffer(256)
    p = ctypes.c_void_p
    lib.onnxq_pack_bits.argtypes = [
        p,
        ctypes.c_int32,
        ctypes.c_int64,
        ctypes.c_int32,
        p,
        p,
        ctypes.POINTER(ctypes.c_int64),
        ctypes.c_char_p,
        ctypes.c_size_t,
    ]
    lib.onnxq_unpack_bits.argtypes = [
        p,
        ctypes.c_int64,
        ctypes.c_int32,
        ctypes.c_int64,
        p,
        p,
        ctypes.c_int32,
        ctypes.c_char_p,
        ctypes.c_size_t,
    ]
    k = ctypes.c_int64(0)
    assert (
        lib.onnxq_pack_bits(
            codes.ctypes.data, width, count, bits, None, out.ctypes.data, ctypes.byref(k), err, 256
        )
        == 0
    )
    assert k.value == count
    if bits <= 32:
        assert np.array_equal(out[:nbytes], packing.pack_bits(codes, bits))
    back = np.zeros(count, dtype)
    assert (
        lib.onnxq_unpack_bits(
            out.ctypes.data, nbytes, bits, count, None, back.ctypes.data, width, err, 256
        )
        == 0
    )
    assert np.array_equal(back, codes)


# -- the vector kernels (float32 outputs, tiles along the last axis: ops/src/fast_dequant.inc) ----

# Whole tiles, row tails, rows whose codes start inside a byte (70 * 5 bits...), rows longer than
# one 4096-column segment, an odd number of 8-element tiles, one short row.
VEC_SHAPES = [(2, 4136), (3, 8232), (5, 83), (7, 40), (1, 24), (6, 70), (4, 4097), (2, 1)]
VEC = [*FAST, "int8_e8m0_t8", "mxfp6e2"]


def _all_scales(q: onnxq.QTensor, seed: int) -> onnxq.QTensor:
    """Every scale code (E8M0 0..255: NaN tiles, results that underflow to subnormals and zero
    or overflow to inf, factors outside float32's normal range) over the tiles, shuffled."""
    rng = np.random.default_rng(seed)
    flat = q.scale.copy().reshape(-1)
    flat[:] = rng.permutation(np.arange(flat.size) % 256)
    return dataclasses.replace(q, scale=flat.reshape(q.scale.shape))


@pytest.mark.parametrize("simd", ["avx512", "avx2", "base"])
@pytest.mark.parametrize("dt", VEC)
def test_vector_kernels_match_reference(
    dt: str, simd: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every instruction set, streaming stores on and off, session (packed codes) and C ABI
    (one byte a code), bit for bit with the reference, all scale codes."""
    from onnxq.cast.api import _expand

    monkeypatch.setenv("ONNXQ_SIMD", simd)
    for i, shape in enumerate(VEC_SHAPES):
        q = _random_q(dt, shape, -1, i)
        if q.scale.dtype == np.uint8:
            q = _all_scales(q, i)
        want = _bits(_want(q, np.float32))
        for stream in ("0", "1"):
            monkeypatch.setenv("ONNXQ_DQ_STREAM", stream)
            if runtime.has_custom_ops():
                got = _bits(_session_dequant(q, np.dtype(np.float32)))
                assert np.array_equal(got, want), (dt, shape, stream)
            codes, meta = _expand(q)
            args = (q.dtype, q.shape, q.axis, codes, q.scale, q.zero, q.tenscale, meta)
            got = _bits(native.dequantize(*args, values_dtype=np.dtype(np.float32), nthreads=2))
            assert np.array_equal(got, want), (dt, shape, stream, "capi")


@pytest.mark.needs_custom_ops
@pytest.mark.parametrize("dt", ["mxfp4", "mx6", "mxint8", "int8_e8m0_t8"])
def test_vector_kernels_roundtrip(dt: str) -> None:
    """QuantizeMX's own codes of data with NaN, Inf, zeros and subnormals, 4096-wide rows."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((3, 4096)) * np.exp2(rng.integers(-140, 120, (3, 4096)))
    x = x.astype(np.float32)
    x[0, ::97] = np.nan
    x[1, 5::101] = -np.inf
    x[2, :64] = 0.0
    x[2, 64:128] = np.float32(1e-40)
    q = onnxq.cast(x, dt, mode="compress")
    want = _bits(onnxq.cast(x, dt))
    assert np.array_equal(_bits(_session_dequant(q, np.dtype(np.float32))), want), dt


@pytest.mark.needs_custom_ops
@pytest.mark.parametrize("dt", ["mxfp4", "int8_e8m0_t8", "mx6", "mxfp8e4"])
def test_streaming_stores_any_alignment(dt: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Y bound at every 4-byte offset from a cache line (streaming stores on): the same bits, and
    not one element written outside Y."""
    monkeypatch.setenv("ONNXQ_DQ_STREAM", "1")
    for shape in ((3, 4136), (2, 8), (5, 24), (1, 4096 + 40)):
        q = _random_q(dt, shape, -1, 11)
        want = _bits(_want(q, np.float32)).reshape(-1)
        (node,) = _dq_nodes(q)
        sess, feeds = node
        n = want.size
        for off in range(16):
            buf = np.full(n + 64, 0xDEADBEEF, np.uint32)
            base = (-buf.ctypes.data % 64) // 4 + off
            binding = sess.io_binding()
            for k, v in feeds.items():
                binding.bind_cpu_input(k, v)
            view = buf[base : base + n]
            binding.bind_output("y", "cpu", 0, np.float32, list(shape), view.ctypes.data)
            sess.run_with_iobinding(binding)
            assert np.array_equal(view, want), (dt, shape, off)
            assert np.all(buf[:base] == 0xDEADBEEF) and np.all(buf[base + n :] == 0xDEADBEEF)


def _dq_nodes(q: onnxq.QTensor) -> list[tuple[Any, dict[str, np.ndarray]]]:
    """A float32 DequantizeMX session of q and its feeds."""
    names, feeds, inputs = [], {}, []
    for name, v in (("q", q.data), ("scale", q.scale), ("tenscale", q.tenscale), ("meta", q.meta)):
        if v is None:
            continue
        names.append(name)
        feeds[name] = v
        inputs.append(helper.make_tensor_value_info(name, _U[v.dtype.itemsize], list(v.shape)))
    slots = {"q": 0, "scale": 1, "zero": 2, "tenscale": 3, "meta": 4}
    ordered = [""] * (max(slots[k] for k in names) + 1)
    for k in names:
        ordered[slots[k]] = k
    node = helper.make_node(
        "DequantizeMX",
        ordered,
        ["y"],
        domain="onnxq",
        dtype=q.dtype.name,
        axis=q.axis,
        shape=list(q.shape),
        output_type=TensorProto.FLOAT,
    )
    graph = helper.make_graph(
        [node], "dq", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(q.shape))]
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("onnxq", 1)]
    )
    return [(runtime.session(model), feeds)]
