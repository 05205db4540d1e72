"""The C library's CUDA path from Python: torch CUDA tensors through ``onnxq_cuda_*``.

The library (``ops/src/cuda_launch.cc``) launches the Triton kernels of
`onnxq.cast.triton_fast` (quantize where the last axis is a multiple of the tile) and
`onnxq.cast.triton` (the rest), compiled ahead of time at build time (`onnxq.cast.aot`), through
the CUDA driver API, without Python or Triton at run time. This module is how tests and Python
users reach that launch path (the same one the onnxruntime CUDA ops and C/C++ hosts use):
`quantize` and `dequantize` take and return torch CUDA tensors and queue the work on the
current torch stream (or ``stream``).

Covered: the presets the library embeds (`formats`), float32/float16/bfloat16, tiles along any
axis (``axis=``; the fast kernel where it is the last), every mode but stochastic rounding and
scale search (the fast kernel takes the defaults, the general ones the rest); and `lookup_packed`
decodes codebooks (CodebookLookup: implicit and generic, exponent scales up to 8 bits, 1-D
tiles along any axis). Anything else raises; `onnxq.cast` with ``backend="triton"`` or
the CPU engines do the rest. docs/gpu.md has the design.
"""

from __future__ import annotations

import ctypes
import functools
import math
import operator
from collections.abc import Sequence
from typing import Any

from onnxq.formats.datatype import DataType

__all__ = [
    "available",
    "dequantize",
    "dequantize_packed",
    "formats",
    "info",
    "lookup_packed",
    "node_support",
    "quantize",
    "quantize_packed",
]

_ERRLEN = 1024
_FLOAT_KINDS = ("float32", "float16", "bfloat16")


@functools.lru_cache(maxsize=1)
def _lib() -> ctypes.CDLL:
    from onnxq.cast import native

    lib, why = native._load()
    if lib is None:
        raise RuntimeError(why)
    if not hasattr(lib, "onnxq_cuda_quantize"):
        raise RuntimeError("the native library predates the CUDA path; rebuild it")
    p, i32, i64, sz, s = (
        ctypes.c_void_p,
        ctypes.c_int32,
        ctypes.c_int64,
        ctypes.c_size_t,
        (ctypes.c_char_p),
    )
    lib.onnxq_cuda_available.restype = i32
    lib.onnxq_cuda_available.argtypes = [s, sz]
    lib.onnxq_cuda_info.restype = i32
    lib.onnxq_cuda_info.argtypes = [s, sz]
    if hasattr(lib, "onnxq_cuda_node_support"):
        lib.onnxq_cuda_node_support.restype = i32
        lib.onnxq_cuda_node_support.argtypes = [s, s, p, s, sz]
    if hasattr(lib, "onnxq_cuda_node_support_shape"):
        lib.onnxq_cuda_node_support_shape.restype = i32
        lib.onnxq_cuda_node_support_shape.argtypes = [s, s, p, i32, p, i32, s, sz]
    lib.onnxq_cuda_quantize.restype = i32
    lib.onnxq_cuda_quantize.argtypes = [
        s,
        p,
        p,
        i32,
        i32,
        ctypes.POINTER(i64),
        i32,
        p,
        p,
        p,
        p,
        p,
        p,
        s,
        sz,
    ]
    lib.onnxq_cuda_dequantize.restype = i32
    lib.onnxq_cuda_dequantize.argtypes = [
        s,
        i32,
        ctypes.POINTER(i64),
        i32,
        p,
        p,
        p,
        p,
        p,
        i32,
        p,
        s,
        sz,
    ]
    lib.onnxq_cuda_quantize_packed.restype = i32
    lib.onnxq_cuda_quantize_packed.argtypes = [
        s,
        p,
        p,
        i32,
        i32,
        ctypes.POINTER(i64),
        i32,
        p,
        p,
        p,
        p,
        p,
        s,
        sz,
    ]
    lib.onnxq_cuda_dequantize_packed.restype = i32
    lib.onnxq_cuda_dequantize_packed.argtypes = lib.onnxq_cuda_dequantize.argtypes
    lib.onnxq_cuda_lookup_packed.restype = i32
    lib.onnxq_cuda_lookup_packed.argtypes = [s, p, i32, ctypes.POINTER(i64), i32]
    lib.onnxq_cuda_lookup_packed.argtypes += [p, p, p, p, i32, p, s, sz]
    if hasattr(lib, "onnxq_cuda_gather_packed"):
        lib.onnxq_cuda_gather_packed.restype = i32
        lib.onnxq_cuda_gather_packed.argtypes = [s, p, i32, ctypes.POINTER(i64), i32, p, i64]
        lib.onnxq_cuda_gather_packed.argtypes += [p, p, p, p, p, i32, p, s, sz]
    return lib


def node_support(
    op_type: str,
    dtype: str,
    *,
    round_mode: str = "even",
    scale_mode: str = "floor",
    nan_policy: str = "element",
    int_range: str = "symmetric",
    shape: Sequence[int] | None = None,
    axis: int = -1,
) -> str:
    """Why onnxruntime's CUDA provider would run this onnxq node on the CPU ("" when not).

    Decided as the library decides at session creation (no driver or GPU needed): ``""`` for a
    node on the embedded GPU kernels, else the reason (a format, mode or table layout without
    kernels: the node's CPU kernel on host copies, one warning per node; MatMulMX: no CUDA
    kernel at all). The arguments are the node's op type and attributes; GatherMX needs its
    ``shape`` and ``axis`` (its table's), which the other ops ignore.

    Raises:
        ValueError: an unknown op type or mode, a ``dtype`` that does not parse, a
            CodebookLookup of a format that is no codebook, or a GatherMX without a shape or
            with a shape and axis it refuses (the op's other checks at session creation, of
            its attributes and inputs, are not made here).
        RuntimeError: the native library is missing or predates this function.
    """
    from onnxq.cast.native import c_modes

    lib = _lib()
    if not hasattr(lib, "onnxq_cuda_node_support_shape"):
        raise RuntimeError("the native library predates onnxq_cuda_node_support_shape; rebuild it")
    if int_range not in ("symmetric", "full"):
        raise ValueError(f"int_range {int_range!r}: expected 'symmetric' or 'full'")
    modes = c_modes(round_mode, scale_mode, nan_policy, int_range == "full")
    # the C strings end at a NUL, which the ops refuse inside a dtype; text that is not UTF-8
    # (lone surrogates) keeps its escapes, which no op type or dtype has
    texts = [t.encode(errors="backslashreplace") for t in (op_type, dtype)]
    if any(b"\0" in t for t in texts):
        raise ValueError(f"{(op_type + ' ' + dtype)!r}: a NUL byte in the op type or dtype")
    if shape is not None:
        try:  # a model's attributes: integers only, and none past int64 / int32
            shape, axis = [operator.index(d) for d in shape], operator.index(axis)
        except TypeError:
            raise ValueError(f"shape {shape!r} and axis {axis!r} must be integers") from None
        if any(not -(2**63) <= d < 2**63 for d in shape) or not -(2**31) <= axis < 2**31:
            raise ValueError(f"axis {axis} or a dim of the shape {shape} is out of range")
    dims = (ctypes.c_int64 * max(1, len(shape or ())))(*(shape or ()))
    err = ctypes.create_string_buffer(_ERRLEN)
    rc = lib.onnxq_cuda_node_support_shape(
        *texts,
        ctypes.addressof(modes),
        -1 if shape is None else len(shape),
        ctypes.addressof(dims),
        axis if shape is not None else 0,
        err,
        _ERRLEN,
    )
    why = err.value.decode(errors="replace").removeprefix("[onnxq_cuda_node_support] ")
    if rc == 2:
        raise ValueError(why)
    return why if rc else ""


def info() -> tuple[int, str]:
    """(number of embedded kernels, a description - or why there are none).

    Raises:
        RuntimeError: the native library is not built.
    """
    buf = ctypes.create_string_buffer(_ERRLEN)
    n = _lib().onnxq_cuda_info(buf, _ERRLEN)
    return int(n), buf.value.decode()


def formats() -> list[str]:
    """The presets the library has CUDA kernels for (empty when built without them)."""
    n, text = info()
    if not n:
        return []
    return [f.strip() for f in text.split(" for ", 1)[1].split(",")]


def available() -> tuple[bool, str]:
    """(True, "") when the CUDA path can run here, else (False, the reason)."""
    try:
        lib = _lib()
    except RuntimeError as err:
        return False, str(err)
    buf = ctypes.create_string_buffer(_ERRLEN)
    ok = lib.onnxq_cuda_available(buf, _ERRLEN)
    return bool(ok), buf.value.decode()


def _as_datatype(dtype: DataType | str) -> DataType:
    from onnxq.formats.datatype import datatype

    return dtype if isinstance(dtype, DataType) else datatype(dtype)


def _grid(
    dt: DataType, shape: tuple[int, ...], axis: int = -1
) -> tuple[tuple[int, ...], tuple[int, ...] | None]:
    """Scale grid and MX shift-bit grid of tiles along ``axis``."""
    s = dt.sspec
    if s is None or len(s.tiles) != 1:
        raise NotImplementedError(f"{dt.code}: the CUDA path has 1-D tile formats only")
    if not -len(shape) <= axis < len(shape):
        raise ValueError(f"axis {axis} is out of range for a tensor of shape {shape}")
    a = axis % len(shape)
    tile = s.tiles[0]
    C = shape[a]
    size = tile.size or C
    grid = (*shape[:a], -(-C // size), *shape[a + 1 :])
    meta = (*shape[:a], -(-C // tile.subtile), *shape[a + 1 :]) if tile.subtile else None
    return grid, meta


def _check(t: Any, name: str) -> None:
    import torch

    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch tensor, not {type(t).__name__}")
    if not t.is_cuda:
        raise ValueError(f"{name} is a {t.device} tensor; the CUDA path takes CUDA tensors")


def _stream(device: Any, stream: Any) -> int:
    import torch

    if stream is None:
        stream = torch.cuda.current_stream(device)
    return int(getattr(stream, "cuda_stream", stream))


def _modes(round_mode: Any, scale_mode: Any, nan_policy: Any, int_range: str) -> Any:
    """The C ABI's ``onnxq_modes`` (by reference) for `onnxq.cast`'s mode arguments."""
    from onnxq.cast import native
    from onnxq.cast.request import INT_RANGES

    if int_range not in INT_RANGES:
        raise ValueError(f"unknown int_range {int_range!r}: expected 'symmetric' or 'full'")
    return ctypes.byref(native.c_modes(round_mode, scale_mode, nan_policy, int_range == "full"))


def _call(fn: Any, *args: Any) -> None:
    err = ctypes.create_string_buffer(_ERRLEN)
    if fn(*args, err, _ERRLEN) != 0:
        raise RuntimeError(err.value.decode())


def quantize(
    x: Any,
    dtype: DataType | str,
    *,
    axis: int = -1,
    want_values: bool = True,
    want_codes: bool = True,
    round_mode: Any = "even",
    scale_mode: Any = "floor",
    nan_policy: Any = "element",
    int_range: str = "symmetric",
    stream: Any = None,
) -> dict[str, Any]:
    """Quantize a CUDA tensor, tiles along ``axis``, with the library's kernels.

    The modes are `onnxq.cast`'s (names or enums); stochastic rounding and scale search are
    refused (RuntimeError).

    Returns:
        ``values`` (x's dtype and shape, when asked) and, when asked, ``codes`` (uint8, x's
        shape), ``scale`` (uint8 tile grid), ``meta`` (MX shift bits, uint8 subtile grid) and
        ``tenscale`` (uint32, shape (1,)) where the format has them: the layouts of
        ``onnxq.cast(..., mode="actual")``.

    Raises:
        TypeError: x is not a float32/float16/bfloat16 torch tensor.
        ValueError: x is not on a CUDA device.
        NotImplementedError: the format has no 1-D tiles.
        RuntimeError: the library refuses (no kernel for the format, no driver, ...).
    """
    import torch

    _check(x, "x")
    kinds = {getattr(torch, k): i for i, k in enumerate(_FLOAT_KINDS)}
    if x.dtype not in kinds:
        raise TypeError(f"the CUDA path casts float32, float16 or bfloat16, not {x.dtype}")
    if not (want_values or want_codes):
        raise ValueError("nothing to compute: want_values and want_codes are both false")
    dt = _as_datatype(dtype)
    x = x.contiguous()
    shape = tuple(x.shape)
    if not shape:
        raise ValueError("0-D tensors have no axis to tile")
    grid, meta_shape = _grid(dt, shape, axis)
    dev = x.device
    out: dict[str, Any] = {}
    values = torch.empty_like(x) if want_values else None
    codes = scale = meta = tenscale = None
    if want_codes:
        codes = torch.empty(shape, dtype=torch.uint8, device=dev)
        scale = torch.empty(grid, dtype=torch.uint8, device=dev)
        if meta_shape is not None:
            meta = torch.empty(meta_shape, dtype=torch.uint8, device=dev)
        if dt.sspec.tenscale is not None:
            tenscale = torch.zeros(1, dtype=torch.uint32, device=dev)
    arr = (ctypes.c_int64 * len(shape))(*shape)

    def ptr(t: Any) -> int | None:
        return None if t is None else t.data_ptr()

    _call(
        _lib().onnxq_cuda_quantize,
        dt.code.encode(),
        _modes(round_mode, scale_mode, nan_policy, int_range),
        x.data_ptr(),
        kinds[x.dtype],
        len(shape),
        arr,
        axis,
        ptr(values),
        ptr(codes),
        ptr(scale),
        ptr(tenscale),
        ptr(meta),
        _stream(dev, stream),
    )
    if values is not None:
        out["values"] = values
    if want_codes:
        out.update(codes=codes, scale=scale)
        if meta is not None:
            out["meta"] = meta
        if tenscale is not None:
            out["tenscale"] = tenscale
    return out


def dequantize(
    dtype: DataType | str,
    codes: Any,
    scale: Any,
    *,
    tenscale: Any = None,
    meta: Any = None,
    out_dtype: Any = None,
    axis: int = -1,
    stream: Any = None,
) -> Any:
    """Values of unpacked codes (the layouts `quantize` returns) as a CUDA tensor.

    Raises:
        TypeError: an argument is not a torch tensor of the expected dtype, or ``out_dtype``
            is not float32/float16/bfloat16.
        ValueError: an argument is not on a CUDA device or has the wrong size.
        RuntimeError: the library refuses (no kernel for the format, no driver, ...).
    """
    import torch

    out_dtype, out_kind = _out_kind(out_dtype)
    dt = _as_datatype(dtype)
    _check(codes, "codes")
    shape = tuple(codes.shape)
    grid, meta_shape = _grid(dt, shape, axis)
    fields = {"codes": (codes, shape), "scale": (scale, grid)}
    if meta_shape is not None:
        fields["meta"] = (meta, meta_shape)
    if dt.sspec.tenscale is not None:
        fields["tenscale"] = (tenscale, (1,))
    flat: dict[str, Any] = {}
    for name, (t, want) in fields.items():
        if t is None:
            raise ValueError(f"{dt.code}: dequantizing needs {name}")
        _check(t, name)
        width = 4 if name == "tenscale" else 1
        if t.element_size() != width or t.dtype.is_floating_point:
            raise TypeError(f"{name} must be {'uint32' if width == 4 else 'uint8'}, not {t.dtype}")
        if t.numel() != math.prod(want):
            raise ValueError(f"{name} has {t.numel()} elements, not {math.prod(want)}")
        flat[name] = t.contiguous()
    y = torch.empty(shape, dtype=out_dtype, device=codes.device)
    arr = (ctypes.c_int64 * len(shape))(*shape)
    _call(
        _lib().onnxq_cuda_dequantize,
        dt.code.encode(),
        len(shape),
        arr,
        axis,
        flat["codes"].data_ptr(),
        flat["scale"].data_ptr(),
        flat["tenscale"].data_ptr() if "tenscale" in flat else None,
        flat["meta"].data_ptr() if "meta" in flat else None,
        y.data_ptr(),
        out_kind,
        _stream(codes.device, stream),
    )
    return y


def quantize_packed(
    x: Any,
    dtype: DataType | str,
    *,
    axis: int = -1,
    round_mode: Any = "even",
    scale_mode: Any = "floor",
    nan_policy: Any = "element",
    int_range: str = "symmetric",
    stream: Any = None,
) -> dict[str, Any]:
    """Quantize to the custom ops' layouts (``onnxq.cast(..., mode="compress")``'s fields).

    ``q``: codes bit-packed (uint8 1-D); ``scale``: uint8 tile grid; ``meta``: shift bits
    packed one bit each; ``tenscale``: uint32 (1,); the last two where the format has them.
    Modes as in `quantize`.

    Raises:
        TypeError, ValueError, NotImplementedError, RuntimeError: as `quantize`.
    """
    import torch

    _check(x, "x")
    kinds = {getattr(torch, k): i for i, k in enumerate(_FLOAT_KINDS)}
    if x.dtype not in kinds:
        raise TypeError(f"the CUDA path casts float32, float16 or bfloat16, not {x.dtype}")
    dt = _as_datatype(dtype)
    x = x.contiguous()
    shape = tuple(x.shape)
    grid, meta_shape = _grid(dt, shape, axis)
    dev = x.device
    out = {
        "q": torch.empty((x.numel() * dt.nspec.bits + 7) // 8, dtype=torch.uint8, device=dev),
        "scale": torch.empty(grid, dtype=torch.uint8, device=dev),
    }
    if meta_shape is not None:
        out["meta"] = torch.empty((math.prod(meta_shape) + 7) // 8, dtype=torch.uint8, device=dev)
    if dt.sspec.tenscale is not None:
        out["tenscale"] = torch.zeros(1, dtype=torch.uint32, device=dev)
    arr = (ctypes.c_int64 * len(shape))(*shape)
    _call(
        _lib().onnxq_cuda_quantize_packed,
        dt.code.encode(),
        _modes(round_mode, scale_mode, nan_policy, int_range),
        x.data_ptr(),
        kinds[x.dtype],
        len(shape),
        arr,
        axis,
        out["q"].data_ptr(),
        out["scale"].data_ptr(),
        out["tenscale"].data_ptr() if "tenscale" in out else None,
        out["meta"].data_ptr() if "meta" in out else None,
        _stream(dev, stream),
    )
    return out


def _packed_inputs(code: str, fields: dict[str, tuple[Any, int, int]]) -> dict[str, Any]:
    """Check the packed inputs (name -> tensor, elements, 1 for uint8 or 4 for uint32).

    Returns them contiguous.

    Raises:
        ValueError: a missing input, one not on CUDA or of the wrong size.
        TypeError: an input of the wrong type.
    """
    flat: dict[str, Any] = {}
    for name, (t, size, width) in fields.items():
        if t is None:
            raise ValueError(f"{code}: decoding needs {name}")
        _check(t, name)
        if t.element_size() != width or t.dtype.is_floating_point:
            raise TypeError(f"{name} must be {'uint32' if width == 4 else 'uint8'}, not {t.dtype}")
        if t.numel() != size:
            raise ValueError(f"{name} has {t.numel()} elements, not {size}")
        flat[name] = t.contiguous()
    return flat


def _out_kind(out_dtype: Any) -> tuple[Any, int]:
    """(the output's torch dtype, float32 by default; its float type number for the C ABI).

    Raises:
        TypeError: a type the CUDA path does not write.
    """
    import torch

    out_dtype = torch.float32 if out_dtype is None else out_dtype
    kinds = {getattr(torch, k): i for i, k in enumerate(_FLOAT_KINDS)}
    if out_dtype not in kinds:
        raise TypeError(f"the CUDA path writes float32, float16 or bfloat16, not {out_dtype}")
    return out_dtype, kinds[out_dtype]


def _packed_fields(
    dt: DataType, shape: tuple[int, ...], axis: int, q: Any, scale: Any, tenscale: Any, meta: Any
) -> dict[str, tuple[Any, int, int]]:
    """The packed inputs a table of ``shape`` needs (`_packed_inputs`' argument).

    Codes, scale grid, MX shift bits or a codebook's meta bits, tensor scale.
    """
    grid, sub_grid = _grid(dt, shape, axis)
    book = getattr(dt.nspec, "is_codebook", False)
    bits = dt.nspec.index_bits if book else dt.nspec.bits
    fields = {"q": (q, (math.prod(shape) * bits + 7) // 8, 1), "scale": (scale, math.prod(grid), 1)}
    meta_bits = dt.nspec.meta_bits if book else int(sub_grid is not None)
    if meta_bits:
        fields["meta"] = (meta, (math.prod(sub_grid or grid) * meta_bits + 7) // 8, 1)
    if dt.sspec.tenscale is not None:
        fields["tenscale"] = (tenscale, 1, 4)
    return fields


def dequantize_packed(
    dtype: DataType | str,
    shape: tuple[int, ...],
    q: Any,
    scale: Any,
    *,
    tenscale: Any = None,
    meta: Any = None,
    out_dtype: Any = None,
    axis: int = -1,
    stream: Any = None,
) -> Any:
    """Values of the custom ops' layouts (`quantize_packed`) as a CUDA tensor of ``shape``.

    Raises:
        TypeError, ValueError, RuntimeError: as `dequantize`.
    """
    import torch

    out_dtype, out_kind = _out_kind(out_dtype)
    dt = _as_datatype(dtype)
    shape = tuple(shape)
    flat = _packed_inputs(dt.code, _packed_fields(dt, shape, axis, q, scale, tenscale, meta))
    y = torch.empty(shape, dtype=out_dtype, device=flat["q"].device)
    arr = (ctypes.c_int64 * len(shape))(*shape)
    _call(
        _lib().onnxq_cuda_dequantize_packed,
        dt.code.encode(),
        len(shape),
        arr,
        axis,
        flat["q"].data_ptr(),
        flat["scale"].data_ptr(),
        flat["tenscale"].data_ptr() if "tenscale" in flat else None,
        flat["meta"].data_ptr() if "meta" in flat else None,
        y.data_ptr(),
        out_kind,
        _stream(y.device, stream),
    )
    return y


def lookup_packed(
    dtype: DataType | str,
    shape: tuple[int, ...],
    q: Any,
    scale: Any,
    meta: Any = None,
    *,
    out_dtype: Any = None,
    axis: int = -1,
    stream: Any = None,
) -> Any:
    """CodebookLookup on CUDA tensors: values of a codebook's packed layouts, of ``shape``.

    Tiles run along ``axis``. ``q`` the packed indices, ``scale`` the uint8 scale grid,
    ``meta`` the packed mapping indices (None when the codebook has no meta bits): the layouts
    of ``onnxq.cast(..., mode="compress")`` and of CodebookLookup's inputs. A generic
    codebook's mappings (a data type from ``add_mappings``) go to the device as its table; an
    implicit one's are the library's own.

    Raises:
        TypeError: a data type that is not a codebook, or inputs of the wrong type.
        ValueError: a missing input, inputs of the wrong size or not on CUDA.
        RuntimeError: what the library refuses (tiles it has no kernel for, no driver...).
    """
    import numpy as np
    import torch

    out_dtype, out_kind = _out_kind(out_dtype)
    dt = _as_datatype(dtype)
    book = dt.nspec
    if not getattr(book, "is_codebook", False):
        raise TypeError(f"{dt.code} is not a codebook; use dequantize_packed")
    shape = tuple(shape)
    flat = _packed_inputs(dt.code, _packed_fields(dt, shape, axis, q, scale, None, meta))
    table = None if book.is_implicit else np.ascontiguousarray(book.table(), dtype=np.float64)
    y = torch.empty(shape, dtype=out_dtype, device=flat["q"].device)
    _call(
        _lib().onnxq_cuda_lookup_packed,
        dt.code.encode(),
        None if table is None else table.ctypes.data,
        len(shape),
        (ctypes.c_int64 * len(shape))(*shape),
        axis,
        flat["q"].data_ptr(),
        flat["scale"].data_ptr(),
        flat["meta"].data_ptr() if "meta" in flat else None,
        y.data_ptr(),
        out_kind,
        _stream(y.device, stream),
    )
    return y


def gather_packed(
    dtype: DataType | str,
    shape: tuple[int, ...],
    rows: Any,
    q: Any,
    scale: Any,
    *,
    tenscale: Any = None,
    meta: Any = None,
    out_dtype: Any = None,
    axis: int = -1,
    stream: Any = None,
) -> Any:
    """GatherMX on CUDA tensors: rows ``rows`` of the packed table of ``shape``, decoded.

    ``rows``: row indices in ``[0, shape[0])`` (a sequence or CPU tensor: the library reads
    them on the host). The table's inputs are `dequantize_packed`'s (a codebook's:
    `lookup_packed`'s); tiles along ``axis``, not 0. Returns ``(len(rows), *shape[1:])``.

    Raises:
        TypeError, ValueError, RuntimeError: as `dequantize_packed`; an index out of range
            or tiles along the rows (RuntimeError).
    """
    import numpy as np
    import torch

    out_dtype, out_kind = _out_kind(out_dtype)
    dt, shape = _as_datatype(dtype), tuple(shape)
    flat = _packed_inputs(dt.code, _packed_fields(dt, shape, axis, q, scale, tenscale, meta))
    idx = np.ascontiguousarray(torch.as_tensor(rows).cpu().numpy(), dtype=np.int64).reshape(-1)
    book = dt.nspec
    generic = getattr(book, "is_codebook", False) and not book.is_implicit
    table = np.ascontiguousarray(book.table(), dtype=np.float64) if generic else None
    y = torch.empty((len(idx), *shape[1:]), dtype=out_dtype, device=flat["q"].device)
    _call(
        _lib().onnxq_cuda_gather_packed,
        dt.code.encode(),
        None if table is None else table.ctypes.data,
        len(shape),
        (ctypes.c_int64 * len(shape))(*shape),
        axis,
        idx.ctypes.data,
        len(idx),
        *(flat[n].data_ptr() if n in flat else None for n in ("q", "scale", "tenscale", "meta")),
        y.data_ptr(),
        out_kind,
        _stream(y.device, stream),
    )
    return y
