"""ctypes binding to the C++ kernels of ``ops/`` (libonnxq_ops.so): the ``native`` backend.

The library exports a plain C ABI (``ops/include/onnxq_ops.h``). A data type is passed as
numbers derived here from the `DataType` (`_Format`), never as a string; codebook tables come
from the `Codebook`. Results have the layouts of `reference.Encoded`, so `api.cast` treats both
backends alike, and they are bit-identical to the reference (tests/cast/native/test_cast.py).
"""

from __future__ import annotations

import ctypes
import functools
import math
import os
import sys
import warnings
from pathlib import Path

import ml_dtypes
import numpy as np

from onnxq.cast.layout import Tiling
from onnxq.cast.packing import code_dtype
from onnxq.cast.request import Encoded
from onnxq.formats.datatype import DataType
from onnxq.formats.modes import NanPolicy, RoundMode, ScaleMode
from onnxq.formats.number import InfNaN, Kind, NumberSpec

__all__ = [
    "LIBRARY_NAME",
    "available",
    "dequantize",
    "library_path",
    "missing_reason",
    "quantize",
    "unsupported",
    "warn_unavailable_once",
]

LIBRARY_NAME = "libonnxq_ops.so" if sys.platform != "darwin" else "libonnxq_ops.dylib"
_ABI_VERSION = 2
_FLOAT_CODES = {
    np.dtype(np.float32): 0,
    np.dtype(np.float16): 1,
    np.dtype(ml_dtypes.bfloat16): 2,
}
_KINDS = {Kind.FLOAT: 0, Kind.INT: 1, Kind.UINT: 2, Kind.EXPONENT: 3}
_INFNAN = {None: 0, InfNaN.IEEE: 1, InfNaN.FN: 2, InfNaN.FNUZ: 3, InfNaN.INUZ: 4}
_ROUND = {RoundMode.EVEN: 0, RoundMode.AWAY: 1, RoundMode.ZERO: 2, RoundMode.STOCHASTIC: 3}
_SCALE = {
    ScaleMode.FLOOR: 0,
    ScaleMode.CEIL: 1,
    ScaleMode.MIDMAX: 2,
    ScaleMode.OPTION3: 3,
    ScaleMode.TOPBINADE: 4,
    ScaleMode.RCEIL: 5,
    ScaleMode.EVEN: 6,
    ScaleMode.SEARCH: 7,
}
_POLICY = {NanPolicy.ELEMENT: 0, NanPolicy.BLOCK: 1}


class _Number(ctypes.Structure):
    _fields_ = [
        ("kind", ctypes.c_int32),
        ("ebits", ctypes.c_int32),
        ("mbits", ctypes.c_int32),
        ("bias", ctypes.c_int32),
        ("infnan", ctypes.c_int32),
    ]


class _Format(ctypes.Structure):
    _fields_ = [
        ("elem", _Number),
        ("scaled", ctypes.c_int32),
        ("scale", _Number),
        ("has_zero", ctypes.c_int32),
        ("zero", _Number),
        ("has_tenscale", ctypes.c_int32),
        ("tenscale", _Number),
        ("ntiles", ctypes.c_int32),
        ("tile", ctypes.c_int32 * 2),
        ("sub", ctypes.c_int32 * 2),
        ("sparse_n", ctypes.c_int32),
        ("sparse_m", ctypes.c_int32),
        ("sparse_dim", ctypes.c_int32),
        ("cb_index_bits", ctypes.c_int32),
        ("cb_meta_bits", ctypes.c_int32),
        ("cb_mags", ctypes.POINTER(ctypes.c_double)),
        ("cb_even", ctypes.POINTER(ctypes.c_uint8)),
        ("cb_table", ctypes.POINTER(ctypes.c_double)),
    ]


class _Modes(ctypes.Structure):
    _fields_ = [
        ("round_mode", ctypes.c_int32),
        ("scale_mode", ctypes.c_int32),
        ("nan_policy", ctypes.c_int32),
        ("full_int_range", ctypes.c_int32),
        ("seed", ctypes.c_uint64),
    ]


def c_modes(
    round_mode: RoundMode | str,
    scale_mode: ScaleMode | str,
    nan_policy: NanPolicy | str,
    full_int_range: bool,
    seed: int = 0,
) -> _Modes:
    """The C ABI's ``onnxq_modes`` for `onnxq.cast`'s modes (members or their names)."""
    return _Modes(
        _ROUND[RoundMode.parse(round_mode)],
        _SCALE[ScaleMode.parse(scale_mode)],
        _POLICY[NanPolicy.parse(nan_policy)],
        int(full_int_range),
        int(seed) & 0xFFFFFFFFFFFFFFFF,
    )


def _candidates() -> list[Path]:
    here = Path(__file__).resolve().parent.parent  # the onnxq package
    found = []
    env = os.environ.get("ONNXQ_OPS_LIBRARY")
    if env:
        found.append(Path(env))
    found.append(here / LIBRARY_NAME)
    found.append(here.parent / "ops" / "build" / LIBRARY_NAME)  # a source checkout's build
    return found


def library_path() -> Path | None:
    """Return the path of the built custom-op / kernel library, or None when it is not built.

    Looked for in ``$ONNXQ_OPS_LIBRARY``, the installed package, then ``ops/build/``.
    """
    for path in _candidates():
        if path.is_file():
            return path
    return None


@functools.lru_cache(maxsize=1)
def _load() -> tuple[ctypes.CDLL | None, str]:
    path = library_path()
    if path is None:
        where = ", ".join(str(p) for p in _candidates())
        return None, (
            f"the native library {LIBRARY_NAME} is not built (looked in {where}); "
            f"build it with `python -m pip install -e .` (needs cmake and a C++17 compiler)"
        )
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as err:
        return None, f"the native library {path} cannot be loaded: {err}"
    if lib.onnxq_abi_version() != _ABI_VERSION:
        found = lib.onnxq_abi_version()
        return None, f"the native library {path} has ABI {found}, not {_ABI_VERSION}"
    p, i32, i64, sz = ctypes.c_void_p, ctypes.c_int32, ctypes.c_int64, ctypes.c_size_t
    lib.onnxq_quantize.restype = i32
    lib.onnxq_quantize.argtypes = [
        ctypes.POINTER(_Format), ctypes.POINTER(_Modes), p, i32, i32, ctypes.POINTER(i64), i32,
        p, i32, p, p, p, p, p, p, i32, ctypes.c_char_p, sz,
    ]  # fmt: skip
    lib.onnxq_dequantize.restype = i32
    lib.onnxq_dequantize.argtypes = [
        ctypes.POINTER(_Format), i32, ctypes.POINTER(i64), i32, p, p, p, p, p, p, p, i32, i32,
        ctypes.c_char_p, sz,
    ]  # fmt: skip
    lib.onnxq_number_info.restype = i32
    lib.onnxq_number_info.argtypes = [
        ctypes.POINTER(_Number), ctypes.POINTER(ctypes.c_double), ctypes.c_char_p, sz,
    ]  # fmt: skip
    lib.onnxq_pack_bits.restype = i32
    lib.onnxq_pack_bits.argtypes = [
        p, i32, i64, i32, p, p, ctypes.POINTER(i64), ctypes.c_char_p, sz,
    ]  # fmt: skip
    lib.onnxq_unpack_bits.restype = i32
    lib.onnxq_unpack_bits.argtypes = [p, i64, i32, i64, p, p, i32, ctypes.c_char_p, sz]
    if hasattr(lib, "onnxq_parse_dtype"):  # absent from libraries built before it existed
        lib.onnxq_parse_dtype.restype = i32
        lib.onnxq_parse_dtype.argtypes = [p, sz, ctypes.POINTER(_Format), ctypes.c_char_p, sz]
    return lib, ""


def available() -> bool:
    """True when the native library is built and loads."""
    return _load()[0] is not None


def missing_reason() -> str:
    """Why the native backend is unavailable ("" when it is available)."""
    return _load()[1]


_warned = False


def warn_unavailable_once() -> None:
    """Warn, once per process, that ``backend='auto'`` falls back to the numpy reference."""
    global _warned
    if _warned:
        return
    _warned = True
    warnings.warn(
        f"onnxq: using the numpy reference engine because {missing_reason()}",
        RuntimeWarning,
        stacklevel=4,
    )


def _lib() -> ctypes.CDLL:
    lib, reason = _load()
    if lib is None:
        raise NotImplementedError(f"backend 'native' is not available: {reason}")
    return lib


def _number(spec: NumberSpec) -> _Number:
    spec = spec.compute_spec
    return _Number(_KINDS[spec.kind], spec.ebits, spec.mbits, spec.bias, _INFNAN[spec.infnan])


class _Packed:
    """A `_Format` plus the arrays its pointers refer to (kept alive together)."""

    def __init__(self, dt: DataType, *, tables: bool = True) -> None:
        n, s = dt.nspec, dt.sspec
        f = _Format()
        f.elem = _number(n)
        self.arrays: list[np.ndarray] = []
        if s is not None:
            f.scaled = 1
            f.scale = _number(s.scale)
            if s.zero is not None:
                f.has_zero, f.zero = 1, _number(s.zero)
            if s.tenscale is not None:
                f.has_tenscale, f.tenscale = 1, _number(s.tenscale)
            f.ntiles = len(s.tiles)
            for i, tile in enumerate(s.tiles):
                f.tile[i] = tile.size
            f.sub[0], f.sub[1] = s.subtile
            f.sparse_n, f.sparse_m, f.sparse_dim = s.sparsity
        if n.is_codebook and not tables:
            f.cb_index_bits, f.cb_meta_bits = n.index_bits, n.meta_bits
        elif n.is_codebook:
            mags = np.ascontiguousarray(n.magnitudes(), dtype=np.float64)
            even = np.ascontiguousarray(np.asarray(n.magnitude_codes()) % 2 == 0, dtype=np.uint8)
            table = np.ascontiguousarray(n.table(), dtype=np.float64)
            self.arrays += [mags, even, table]
            f.cb_index_bits, f.cb_meta_bits = n.index_bits, n.meta_bits
            f.cb_mags = mags.ctypes.data_as(ctypes.POINTER(ctypes.c_double))
            f.cb_even = even.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8))
            f.cb_table = table.ctypes.data_as(ctypes.POINTER(ctypes.c_double))
        self.struct = f


def unsupported(dt: DataType, *, metric: object = None) -> str:
    """Why the native kernels cannot do this cast ("" when they can)."""
    if metric is not None:
        return "a custom codebook metric (the native kernels use the L2 default)"
    n = dt.nspec
    spec = n.compute_spec
    if spec.is_float and spec.ebits > 11:
        return f"element format {spec} (more than 11 exponent bits)"
    return ""


def _ptr(a: np.ndarray | None) -> int | None:
    return None if a is None else a.ctypes.data


def _check(status: int, err: ctypes.Array[ctypes.c_char]) -> None:
    if status:
        message = err.value.decode(errors="replace")
        raise ValueError(message)


def _grids(tiling: Tiling, dt: DataType) -> tuple[tuple[int, ...], tuple[int, ...] | None]:
    """Shapes of the tile grid and the meta grid (None when the format has no meta)."""
    tile_shape = tiling.tile_grid(np.empty((tiling.B, tiling.nR, tiling.nC), np.uint8)).shape
    n = dt.nspec
    if not (n.is_codebook or tiling.Sc):
        return tile_shape, None
    if tiling.Sc:
        per_sub = np.empty((tiling.B, tiling.nR, tiling.nC, tiling.n_sub), np.uint8)
        return tile_shape, tiling.sub_grid(per_sub).shape
    return tile_shape, tile_shape


def quantize(
    x: np.ndarray,
    dt: DataType,
    *,
    axis: int = -1,
    round_mode: RoundMode = RoundMode.EVEN,
    scale_mode: ScaleMode = ScaleMode.FLOOR,
    nan_policy: NanPolicy = NanPolicy.ELEMENT,
    seed: int = 0,
    full_int_range: bool = False,
    want_codes: bool = True,
    values_dtype: np.dtype | None = None,
    nthreads: int = 0,
    values_out: np.ndarray | None = None,
) -> Encoded:
    """`reference.quantize` in C++: the same `Encoded` fields, bit for bit.

    Args:
        x: float32, float16 or bfloat16 array (converted to float32 exactly, as the reference).
        dt: the data type.
        axis: the tile axis.
        round_mode: element rounding.
        scale_mode: exponent scale selection.
        nan_policy: element or block.
        seed: stochastic rounding seed.
        full_int_range: allow -2^(N-1) for int elements.
        want_codes: also return codes, scales, meta and mask.
        values_dtype: dtype of ``values`` (default float32; float16/bfloat16 are rounded from
            the float32 result exactly as ``astype`` does).
        nthreads: worker threads (0: every core).
        values_out: a C-contiguous array of x's shape and ``values_dtype`` to write the values
            into (may be ``x`` itself: tiles are read whole before they are written).

    Returns:
        An `Encoded` with the reference's layouts.

    Raises:
        NotImplementedError: the library is missing or cannot do this cast.
        ValueError: the kernels refused the arguments (the message says why).
    """
    lib = _lib()
    x = np.ascontiguousarray(x)
    if x.dtype not in _FLOAT_CODES:
        x = x.astype(np.float32)
    out_dtype = np.dtype(values_dtype) if values_dtype is not None else np.dtype(np.float32)
    if round_mode is RoundMode.STOCHASTIC and dt.nspec.is_codebook:
        raise NotImplementedError(
            "codebooks round to the nearest table entry; stochastic is not supported"
        )
    packed = _Packed(dt)
    n, s = dt.nspec, dt.sspec
    tiling = Tiling.build(x.shape, axis, s)
    if values_out is not None:
        if (
            values_out.shape != x.shape
            or values_out.dtype != out_dtype
            or not values_out.flags.c_contiguous
            or not values_out.flags.writeable
        ):
            raise ValueError(
                f"values_out must be a writeable C-contiguous {out_dtype} array of shape {x.shape}"
            )
        values = values_out
    else:
        values = np.empty(x.shape, dtype=out_dtype)
    codes = scale = zero = tenscale = meta = mask = None
    if want_codes:
        codes = np.empty(x.shape, dtype=code_dtype(n.bits))
        if s is not None:
            tile_shape, meta_shape = _grids(tiling, dt)
            scale = np.empty(tile_shape, dtype=code_dtype(s.scale.bits))
            if s.zero is not None:
                zero = np.empty(tile_shape, dtype=code_dtype(s.zero.bits))
            if s.tenscale is not None:
                tenscale = np.empty((1,), dtype=code_dtype(s.tenscale.bits))
            if meta_shape is not None:
                meta = np.zeros(meta_shape, dtype=np.uint8)
    if s is not None and s.sparsity[1]:
        mask = np.empty(x.shape, dtype=np.uint8)
    modes = c_modes(round_mode, scale_mode, nan_policy, full_int_range, seed)
    shape = (ctypes.c_int64 * x.ndim)(*x.shape)
    err = ctypes.create_string_buffer(1024)
    status = lib.onnxq_quantize(
        ctypes.byref(packed.struct),
        ctypes.byref(modes),
        _ptr(x),
        _FLOAT_CODES[x.dtype],
        x.ndim,
        shape,
        axis,
        _ptr(values),
        _FLOAT_CODES[out_dtype],
        _ptr(codes),
        _ptr(scale),
        _ptr(zero),
        _ptr(tenscale),
        _ptr(meta),
        _ptr(mask),
        nthreads,
        err,
        len(err),
    )
    _check(status, err)
    return Encoded(
        values=values,
        codes=codes,
        scale=scale,
        zero=zero,
        tenscale=tenscale,
        meta=meta,
        mask=None if mask is None else mask.astype(bool),
    )


def dequantize(
    dt: DataType,
    shape: tuple[int, ...],
    axis: int,
    codes: np.ndarray,
    scale: np.ndarray | None = None,
    zero: np.ndarray | None = None,
    tenscale: np.ndarray | None = None,
    meta: np.ndarray | None = None,
    mask: np.ndarray | None = None,
    *,
    values_dtype: np.dtype | None = None,
    nthreads: int = 0,
) -> np.ndarray:
    """`reference.dequantize` in C++ (plus the mask: pruned positions read as 0).

    Raises:
        NotImplementedError: the library is missing.
        ValueError: a missing or mis-sized field (the message says which).
    """
    lib = _lib()
    out_dtype = np.dtype(values_dtype) if values_dtype is not None else np.dtype(np.float32)
    packed = _Packed(dt)
    count = math.prod(shape)
    tiling = Tiling.build(shape, axis, dt.sspec)

    def field(a: np.ndarray | None, size: int, bits: int, what: str) -> np.ndarray | None:
        if a is None:
            return None
        arr = np.ascontiguousarray(a, dtype=code_dtype(bits)).reshape(-1)
        if arr.size != size:
            raise ValueError(
                f"{dt.name}: {what} has {arr.size} entries; shape {shape} needs {size}"
            )
        return arr

    c = field(codes, count, dt.nspec.bits, "codes")
    s = dt.sspec
    sc = zp = ts = mt = None
    if s is not None:
        ntile = 1 if tiling.kind == "tensor" else tiling.B * tiling.nR * tiling.nC
        sc = field(scale, ntile, s.scale.bits, "scale")
        if s.zero is not None:
            zp = field(zero, ntile, s.zero.bits, "zero point")
        if s.tenscale is not None:
            ts = field(tenscale, 1, s.tenscale.bits, "tensor scale")
        if meta is not None:
            rows, cols = tiling.sub_counts if tiling.Sc else (0, 0)
            nmeta = tiling.B * rows * cols if tiling.Sc else ntile
            mt = field(meta, nmeta, 8, "meta")
    mk = None if mask is None else np.ascontiguousarray(mask, dtype=np.uint8).reshape(-1)
    values = np.empty(shape, dtype=out_dtype)
    dims = (ctypes.c_int64 * len(shape))(*shape)
    err = ctypes.create_string_buffer(1024)
    status = lib.onnxq_dequantize(
        ctypes.byref(packed.struct),
        len(shape),
        dims,
        axis,
        _ptr(c),
        _ptr(sc),
        _ptr(zp),
        _ptr(ts),
        _ptr(mt),
        _ptr(mk),
        _ptr(values),
        _FLOAT_CODES[out_dtype],
        nthreads,
        err,
        len(err),
    )
    _check(status, err)
    return values


def _fields(f: _Format) -> dict[str, int]:
    """The number fields of an onnxq_format, flattened (codebook pointers left out)."""
    out: dict[str, int] = {}
    for name, _ in _Format._fields_:
        value = getattr(f, name)
        if isinstance(value, _Number):
            for sub, _ in _Number._fields_:
                out[f"{name}.{sub}"] = getattr(value, sub)
        elif isinstance(value, ctypes.Array):
            for i, item in enumerate(value):
                out[f"{name}[{i}]"] = item
        elif isinstance(value, int):
            out[name] = value
    return out


def format_fields(dt: DataType) -> dict[str, int]:
    """What Python passes the kernels for ``dt``, as the fields `parse_dtype` returns."""
    return _fields(_Packed(dt, tables=False).struct)


def parse_dtype(code: str) -> dict[str, int]:
    """The C++ parser's reading of a data type code (the ops' `dtype` attribute), for tests.

    The code travels as UTF-8 bytes with its length, so NUL and non-ASCII characters reach the
    parser as they are.

    Raises:
        NotImplementedError: the library is missing or predates onnxq_parse_dtype.
        ValueError: the C++ parser refuses the code (its message).
    """
    lib = _lib()
    if not hasattr(lib, "onnxq_parse_dtype"):
        raise NotImplementedError("the native library predates onnxq_parse_dtype; rebuild it")
    raw = code.encode("utf-8", "surrogatepass")
    out = _Format()
    err = ctypes.create_string_buffer(1024)
    _check(lib.onnxq_parse_dtype(raw, len(raw), ctypes.byref(out), err, len(err)), err)
    return _fields(out)


def number_info(spec: NumberSpec) -> tuple[int, float, int, int, float, float]:
    """(bits, maxfloat, emax, emin, midmax, float32_max) as the C++ side derives them (tests).

    Raises:
        NotImplementedError: the library is missing.
        ValueError: the C++ side rejects the spec.
    """
    lib = _lib()
    out = (ctypes.c_double * 6)()
    err = ctypes.create_string_buffer(512)
    num = _number(spec)
    _check(lib.onnxq_number_info(ctypes.byref(num), out, err, len(err)), err)
    return int(out[0]), out[1], int(out[2]), int(out[3]), out[4], out[5]
