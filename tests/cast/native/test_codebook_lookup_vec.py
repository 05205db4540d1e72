"""The vector codebook lookup (ops/src/fast_dequant.inc `dqk_cb_rows`, AVX-512;
fast_rows_driver.inc `fk_cb_dequant_rows` elsewhere) against the numpy reference
(`onnxq.upcast`), bit for bit.

Random codes and mappings straight into the packed streams (every code, every mapping), random
scale codes with and without NaN tiles, on every instruction set, streaming stores on and off:
index bits 2..8 and meta bits 0..4 (combined tables of one to eight permute chunks and the
gathered ones over 256 entries), units of 8 (two to a vector, rows of an odd number of them),
16, 32 and 64 elements, subtiles, packed codes and meta (sessions) and one byte each (C ABI),
outputs at every 4-byte offset from a cache line, tables holding NaN.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from onnx import TensorProto, helper

import onnxq
from onnxq import runtime
from onnxq.cast import native
from onnxq.cast.api import _expand
from onnxq.formats.codebook import Codebook
from onnxq.formats.datatype import DataType
from onnxq.formats.scale import scale as scale_spec

pytestmark = [
    pytest.mark.needs_native,
    pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning"),
]

SIMD = ["avx512", "avx2", "base", "none"]
NAMED = [
    "cb41fi_e2m2fnuz_e8m0_t32",  # the common case: 2 x 16 entries, one permute
    "cb41fi_e2m2fnuz_e8m0_t8",  # units of 8
    "cb41fi_e2m2fnuz_e8m0_t8s4",  # units of 4: the general path
    "cb41fi_e2m2fnuz_e5m0_t32",  # a 5-bit scale (NaN code 31)
    "cb20s1_e2m2fnuz_e8m0_t16",  # no meta bits
    "cb23s101234567_e2m2fnuz_e8m0_t16",
    "cb42i0123_e2m2fnuz_e8m0_t64s16",  # 64 entries, subtiles of 16
    "cb43f1234e_e4m3fnuz_e8m0_t32s8",  # 128 entries, subtiles of 8 (four to a tile)
    "cb34i0123e0123_e3m2_e8m0_t32",  # 4 meta bits, 128 entries
    "cb44i0123e0123_e3m2_e8m0_t64",  # 256 entries
    "cb53s101234567_e3m2_e8m0_t32",  # 5-bit codes: 10 bytes a vector
    "cb52s10123_e3m2_e8m0_t8",
    "cb61s112_e4m3_e8m0_t32",
    "cb64s112345678s212345678_e4m3_e8m0_t16",  # 1024 entries: gathered
    "cb71s112_e4m3_e8m0_t8",
    "cb73s112345678_e4m3_e8m0_t32s16",
    "cb80s11_e4m4_e8m0_t32",
    "cb83s112345678_e4m4_e8m0_t16s8",
]
# Odd numbers of 8-element units per row, several rows to a vector run, rows longer than one
# cache line's worth of codes, one row, and 3 x 37 (no whole units: the general path).
SHAPES = [(3, 256), (7, 40), (2, 4136), (5, 4160), (1, 64), (3, 37)]


def _random_q(name: str | DataType, shape: tuple[int, ...], seed: int, nan: bool) -> onnxq.QTensor:
    """A compress-mode QTensor: random packed codes and meta bits, scale codes whose powers are
    float32 numbers, with NaN tiles (the all-ones code) when `nan`."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(np.float32)
    q = onnxq.cast(x, name, mode="compress", backend="reference")
    data = rng.integers(0, 256, q.data.shape, dtype=np.uint8)
    meta = None if q.meta is None else rng.integers(0, 256, q.meta.shape, dtype=np.uint8)
    scale = q.scale.copy()
    flat = scale.reshape(-1)
    top = (1 << q.dtype.sspec.scale.ebits) - 1  # the NaN code
    flat[:] = rng.integers(max(0, top // 2 - 20), min(top, top // 2 + 20), flat.size)
    flat[rng.integers(0, flat.size)] = top - 1
    if nan:
        flat[rng.integers(0, flat.size, 1 + flat.size // 16)] = top
    return dataclasses.replace(q, data=data, scale=scale, meta=meta)


def _bits(a: np.ndarray) -> np.ndarray:
    return np.asarray(a).view(np.uint32)


def _session(q: onnxq.QTensor):
    """A float32 DequantizeMX session of q's packed streams, and its feeds."""
    names, feeds, inputs = [], {}, []
    for name, v in (("q", q.data), ("scale", q.scale), ("", None), ("", None), ("meta", q.meta)):
        names.append(name if v is not None else "")
        if v is not None:
            feeds[name] = v
            inputs.append(helper.make_tensor_value_info(name, TensorProto.UINT8, list(v.shape)))
    while not names[-1]:
        names.pop()
    node = helper.make_node(
        "DequantizeMX",
        names,
        ["y"],
        domain="onnxq",
        dtype=q.dtype.name,
        axis=q.axis,
        shape=list(q.shape),
        output_type=TensorProto.FLOAT,
    )
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, list(q.shape))
    graph = helper.make_graph([node], "dq", inputs, [y])
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("onnxq", 1)]
    )
    return runtime.session(model), feeds


def _run_into(sess, feeds: dict[str, np.ndarray], shape, buf: np.ndarray, at: int) -> np.ndarray:
    """Runs sess with Y bound to buf[at : at + size] (uint32 view)."""
    n = math.prod(shape)
    binding = sess.io_binding()
    for k, v in feeds.items():
        binding.bind_cpu_input(k, v)
    view = buf[at : at + n]
    binding.bind_output("y", "cpu", 0, np.float32, list(shape), view.ctypes.data)
    sess.run_with_iobinding(binding)
    return view


@pytest.mark.needs_custom_ops
@pytest.mark.parametrize("nan", [False, True], ids=["finite", "nan-tiles"])
@pytest.mark.parametrize("name", NAMED)
def test_packed_session_equals_reference(name: str, nan: bool, monkeypatch) -> None:
    for i, shape in enumerate(SHAPES):
        q = _random_q(name, shape, 100 * i + len(name), nan)
        want = _bits(onnxq.upcast(q))
        sess, feeds = _session(q)
        for simd in SIMD:
            monkeypatch.setenv("ONNXQ_SIMD", simd)
            for stream in ("0", "1"):
                monkeypatch.setenv("ONNXQ_DQ_STREAM", stream)
                buf = np.zeros(want.size + 16, np.uint32)
                got = _run_into(sess, feeds, shape, buf, 0)
                assert np.array_equal(got, want.reshape(-1)), (name, shape, simd, stream)


@pytest.mark.parametrize("nan", [False, True], ids=["finite", "nan-tiles"])
@pytest.mark.parametrize("name", NAMED)
def test_byte_codes_equal_reference(name: str, nan: bool, monkeypatch) -> None:
    """The C ABI: one byte a code and a meta; two threads over row blocks (1000 x 40: blocks
    of 409 rows, their outputs 32 bytes past a cache line)."""
    for i, shape in enumerate([*SHAPES, (1000, 40)]):
        q = _random_q(name, shape, 7 * i + len(name), nan)
        want = _bits(onnxq.upcast(q))
        codes, meta = _expand(q)
        for simd in SIMD:
            monkeypatch.setenv("ONNXQ_SIMD", simd)
            for stream in ("0", "1"):
                monkeypatch.setenv("ONNXQ_DQ_STREAM", stream)
                got = native.dequantize(
                    q.dtype, q.shape, q.axis, codes, q.scale, meta=meta, nthreads=2
                )
                assert np.array_equal(_bits(got), want), (name, shape, simd, stream)


@pytest.mark.needs_custom_ops
@pytest.mark.parametrize(
    "name", ["cb41fi_e2m2fnuz_e8m0_t32", "cb41fi_e2m2fnuz_e8m0_t8", "cb53s101234567_e3m2_e8m0_t32"]
)
def test_streaming_stores_any_alignment(name: str, monkeypatch) -> None:
    """Y bound at every 4-byte offset from a cache line: the same bits, nothing written
    outside Y."""
    monkeypatch.setenv("ONNXQ_DQ_STREAM", "1")
    for shape in ((3, 4160), (2, 8), (5, 24), (1, 64), (9, 40)):
        q = _random_q(name, shape, 5, nan=True)
        want = _bits(onnxq.upcast(q)).reshape(-1)
        sess, feeds = _session(q)
        for simd in ("avx512", "avx2", "base"):
            monkeypatch.setenv("ONNXQ_SIMD", simd)
            for off in range(16):
                buf = np.full(want.size + 64, 0xDEADBEEF, np.uint32)
                at = (-buf.ctypes.data % 64) // 4 + off
                got = _run_into(sess, feeds, shape, buf, at)
                assert np.array_equal(got, want), (name, shape, simd, off)
                assert np.all(buf[:at] == 0xDEADBEEF), (name, shape, simd, off)
                assert np.all(buf[at + want.size :] == 0xDEADBEEF), (name, shape, simd, off)


def _generic(ib: int, mb: int, seed: int, label: str = "r") -> DataType:
    """A generic codebook of random e5m3 magnitudes (k * 2^j, k in 8..15)."""
    rng = np.random.default_rng(seed)
    book = Codebook.parse(f"cb{ib}{mb}_e5m3_{label}{seed}")
    pool = np.array([k * 2.0**j for k in range(8, 16) for j in range(-10, 11)])
    half = 1 << (ib - 1)
    book = book.add_mappings(
        [[0.0, *np.sort(rng.choice(pool, half - 1, replace=False))] for _ in range(1 << mb)]
    )
    return DataType(nspec=book, sspec=scale_spec("e8m0_t16"))


def _check_abi(dt: DataType, shape, seed: int, monkeypatch, nan_at: int | None = None) -> None:
    """nan_at: mapping 0's entry at that index (and its negative) made NaN in the table the
    reference and the native library read (the Python API refuses NaN entries; the native
    library takes any table)."""
    q = _random_q(dt, shape, seed, nan=False)
    if nan_at is not None:
        rows = [list(r) for r in dt.nspec.table()]
        rows[0][nan_at] = math.nan
        rows[0][nan_at + len(rows[0]) // 2] = -math.nan
        object.__setattr__(dt.nspec, "table", lambda: tuple(tuple(r) for r in rows))
    want = _bits(onnxq.upcast(q))
    codes, meta = _expand(q)
    for simd in SIMD:
        monkeypatch.setenv("ONNXQ_SIMD", simd)
        got = native.dequantize(dt, q.shape, q.axis, codes, q.scale, meta=meta)
        assert np.array_equal(_bits(got), want), (dt.name, shape, simd)


@pytest.mark.parametrize("mb", range(5))
@pytest.mark.parametrize("ib", range(2, 9))
def test_every_index_and_meta_width(ib: int, mb: int, monkeypatch) -> None:
    """Generic tables of every shape: combined tables of 4 to 4096 entries."""
    dt = _generic(ib, mb, 10 * ib + mb)
    for i, shape in enumerate([(4, 64), (3, 48), (2, 16)]):
        _check_abi(dt, shape, i, monkeypatch)


@pytest.mark.parametrize(("ib", "mb"), [(4, 1), (2, 0), (5, 3), (8, 1)])
def test_tables_holding_nan(ib: int, mb: int, monkeypatch) -> None:
    """A NaN entry (and its negative) in mapping 0 and no NaN tile: canonical NaN outputs."""
    _check_abi(_generic(ib, mb, 10 * ib + mb, label="nan"), (4, 256), 1, monkeypatch, nan_at=1)
