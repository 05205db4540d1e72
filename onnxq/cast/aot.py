"""Ahead-of-time compilation of the Triton cast kernels for the C library's CUDA path.

The library (``ops/``) launches the *same* kernels as `onnxq.cast.triton` and
`onnxq.cast.triton_fast` through the CUDA driver API, without Python: quantize through the fast
kernel (`triton_fast._fast_kernel`, and `_amax_kernel` for NVFP4's tensor amax) when the last
axis is a multiple of the tile, through the general kernels otherwise; dequantize and the bit
packing through the general ones. This module compiles them at build time:

1. For each specialisation (`PRESETS` x input/output float types, tiles along the last axis,
   the default modes: round even, scale floor, nan element), the host functions
   `triton.quantize` / `triton.dequantize` / `triton_fast.quantize` are called on small CPU
   tensors with their kernels replaced by recorders. The recorded launch gives every
   constexpr value and the type of every pointer argument, so nothing of the kernels'
   parameter lists is copied here; a change in the host code is picked up by the next build.
   Two shapes are recorded and must agree (checks that the constexprs do not depend on the
   shape, and that the scalar arguments follow `_geometry` / `_fast_geometry`, which the C++
   launcher computes the same way).
2. Each specialisation is compiled with ``triton.compile`` for sm_80 and sm_90 (cubin) plus
   PTX for sm_80 (loaded through the driver's JIT on newer GPUs), with floating-point fusion
   off. Chosen here rather than recorded: the general kernels' ``BT`` (tile instances per
   program), which the host itself shrinks for small tensors and which changes no result
   (`ELEMS_PER_PROGRAM` keeps the cubins small); the fast kernel's ``HW_BF16`` (True: the
   recording may run in the interpreter, the images convert in hardware); the amax kernel's
   ``ROUNDS`` (the host's grows with the tensor: `AMAX_ROUNDS` are compiled). The fast
   kernel's program size is the host's tuned one (``triton_fast._BLOCK`` / ``_WARPS``).
3. ``kernels.bin`` (all images and constant tables), ``aot_index.inc`` (the C++ table the
   launcher reads: formats, kernels, the role of every kernel parameter) and ``manifest.json``
   are written to the output folder. A stamp of the inputs (this module, the Triton engine,
   the format code, the Triton version) skips the work when nothing changed.

Pointer and scalar arguments are matched to what the launcher passes by name (`_ROLES`): a
parameter added to a kernel without a role here stops the build with a message naming it.

Run: ``python -m onnxq.cast.aot OUT_DIR [--jobs N]`` (``ops/CMakeLists.txt`` does, through
``ops/gen_aot.py``, when triton and torch import).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import json
import math
import os
import re
import struct
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = [
    "ARCHS",
    "ELEMS_PER_PROGRAM",
    "PRESETS",
    "FormatInfo",
    "GenerationError",
    "KernelSpec",
    "compile_spec",
    "generate",
    "main",
    "specialisations",
]

PRESETS = ("mxfp8e4", "mxfp6e2", "mxfp4", "mxint8", "bfp16", "mx6", "nvfp4")
FLOATS = ("float32", "float16", "bfloat16")  # index = the kernels' IN_KIND / OUT_KIND
ARCHS = (80, 90)
PTX_ARCH = 80  # the PTX kept for GPUs newer than the cubins (JIT-compiled by the driver)
ELEMS_PER_PROGRAM = 1024
FORMAT_VERSION = 2  # of kernels.bin / aot_index.inc; the launcher checks it

# Kernel operations (the launcher's `op`)
OP_QUANT_VALUES, OP_QUANT_CODES, OP_DEQUANT, OP_STATS, OP_PACK, OP_UNPACK = 0, 1, 2, 3, 4, 5
OP_QUANT_BOTH = 6  # values and codes in one launch
# The fast path (onnxq.cast.triton_fast): quantize when the last axis is a multiple of the tile
OP_FAST_VALUES, OP_FAST_CODES, OP_FAST_PACKED, OP_AMAX = 7, 8, 9, 10
# (formats with 8-bit codes and no shift bits have no OP_FAST_PACKED: the layouts are the same)
FAST_OPS = ((OP_FAST_VALUES, "values"), (OP_FAST_CODES, "codes"), (OP_FAST_PACKED, "packed"))
AMAX_ROUNDS = (1, 4, 16, 64)  # the tensor-amax pass's blocks per program: the variants compiled

# Parameter roles: what the launcher passes for each kernel parameter (ops/src/cuda_launch.h).
ROLE_IDS = {
    "x": 0,  # input floats (quantize, stats)
    "y": 1,  # output floats (quantize values, dequantize)
    "codes": 2,  # element codes (quantize output / dequantize input)
    "scale": 3,  # scale codes
    "meta": 4,  # MX shift bits (unpacked, one byte per subtile)
    "null": 5,  # a pointer this specialisation never reads or writes
    "top": 6,  # float32 tensor amax (from the stats passes)
    "ts_code": 7,  # tensor-scale code output (quantize)
    "ts": 8,  # tensor scale as float32 (dequantize: the float32 code itself)
    "const": 9,  # a constant table uploaded once per device (index in `consts`)
    "amax_out": 10,  # stats: per-chunk amax bits
    "flag_out": 11,  # stats: per-chunk flags
    "src": 12,  # pack / unpack input
    "dst": 13,  # pack / unpack output
    "n_units": 20,
    "n_chunks": 21,
    "C": 22,
    "TC": 23,
    "inner": 24,
    "nC": 25,
    "sub_cols": 26,
    "value": 27,  # a 32-bit scalar passed as recorded (format parameters, the seed's key)
    "count": 28,  # pack / unpack: codes
    "nbytes": 29,  # pack / unpack: bytes of the packed stream
    "scratch": 30,  # a trailing pointer Triton adds (global / profile scratch): null
    "n_tiles": 31,  # fast path: tiles in the tensor
    "code_nbytes": 32,  # fast path: bytes of the codes (packed: the bit stream)
    "meta_nbytes": 33,  # fast path: bytes of the shift bits (packed: one bit each)
    "numel": 34,  # tensor amax: elements
}
_GEOMETRY = ("n_units", "n_chunks", "C", "TC", "inner", "nC", "sub_cols")

# Pointer roles by kernel and parameter name. Scalars need no entry: the geometry ones are
# computed by the launcher (checked against the host's values), the others are passed as
# recorded (checked to be the same for every shape).
_ROLES: dict[str, dict[str, str]] = {
    "_quant_kernel": {
        "x_ptr": "x", "y_ptr": "y", "code_ptr": "codes", "scale_ptr": "scale",
        "meta_ptr": "meta", "zero_ptr": "null", "amax_ptr": "null", "flag_ptr": "null",
        "lo_ptr": "null", "hi_ptr": "null", "top_ptr": "top", "ts_code_ptr": "ts_code",
        "idx_ptr": "null",
    },
    "_dequant_kernel": {
        "code_ptr": "codes", "y_ptr": "y", "scale_ptr": "scale", "meta_ptr": "meta",
        "zero_ptr": "null", "tab_ptr": "const", "stab_ptr": "const", "ztab_ptr": "const",
        "ts_ptr": "ts",
    },
    "_stats_kernel": {
        "x_ptr": "x", "amax_ptr": "amax_out", "flag_ptr": "flag_out", "lo_ptr": "null",
        "hi_ptr": "null",
    },
    # onnxq.cast.triton_fast (outputs a launch does not want are never touched: WANT_Y,
    # WANT_CODES, SHIFT and TS are constexprs)
    "_fast_kernel": {
        "x_ptr": "x", "y_ptr": "y", "code_ptr": "codes", "scale_ptr": "scale",
        "meta_ptr": "meta", "top_ptr": "top", "ts_code_ptr": "ts_code",
    },
    "_amax_kernel": {"x_ptr": "x", "top_ptr": "top"},
}  # fmt: skip
# Constexprs that must have these values for the roles above to hold (a "null" pointer is
# never touched only if its feature is off).
_REQUIRED = {"PRE": False, "IDX": False, "MINMAX": False, "STOCH": False}

_PTR_TYPES = {
    "torch.int32": "i32",
    "torch.int16": "i16",
    "torch.int8": "i8",
    "torch.uint8": "u8",
    "torch.float32": "fp32",
    "torch.float16": "fp16",
    "torch.bfloat16": "bf16",
}
_OPTION_DEFAULTS = {"num_warps": 4, "enable_fp_fusion": False}


class GenerationError(RuntimeError):
    """The kernels cannot be specialised or compiled as this module expects (message says why)."""


@dataclasses.dataclass(frozen=True)
class FormatInfo:
    """What the launcher needs to know about one data type (its geometry and buffers)."""

    preset: str
    code: str
    tile: int  # elements per tile along the last axis
    sub: int  # MX subtile size (0: none)
    scaled: bool
    code_bits: int
    scale_bits: int
    tenscale_bits: int  # 0: none

    def geometry(self, shape: tuple[int, ...]) -> dict[str, int]:
        """The quantize / dequantize kernels' scalar arguments for ``shape`` (last axis)."""
        return _geometry(shape, self.tile, self.sub)


def _fast_geometry(shape: tuple[int, ...], f: FormatInfo, packed: bool) -> dict[str, int]:
    """The fast kernel's scalar arguments (the launcher computes the same)."""
    numel = math.prod(shape)
    n_tiles = numel // f.tile
    meta = n_tiles * (f.tile // f.sub) if f.sub else 0
    return dict(
        n_tiles=n_tiles, code_nbytes=(numel * f.code_bits + 7) // 8 if packed else numel,
        meta_nbytes=(meta + 7) // 8 if packed else meta,
    )  # fmt: skip


@dataclasses.dataclass
class KernelSpec:
    """One kernel of the table: a compile unit plus the values of its parameters."""

    symbol: str  # unique name in the index
    kernel: str  # the JIT function's name in onnxq.cast.triton
    op: int
    fmt: int  # index in the format list (-1: format independent, the stats kernel)
    io_type: int  # input float type (quantize, stats) or output float type (dequantize)
    signature: dict[str, str]
    constexprs: dict[str, Any]
    options: dict[str, Any]  # compile options (num_warps, enable_fp_fusion)
    roles: list[tuple[str, str, int]]  # (parameter, role, const index or 32-bit value)
    chunk: int = 0  # stats / amax / pack kernels: elements per program
    module: str = "onnxq.cast.triton"
    # parameters compiled with Triton's divisibility hint (pointers 16-byte aligned, integers
    # multiples of 16; what the JIT assumes where it holds): the launcher guarantees them
    hints: tuple[str, ...] = ()

    @property
    def unit(self) -> str:
        """Key of the compiled image: specs with equal keys share one."""
        return json.dumps(
            [self.module, self.kernel, self.signature, self.constexprs, self.options,
             list(self.hints)],
            sort_keys=True,
        )  # fmt: skip


def _geometry(shape: tuple[int, ...], tile: int, sub: int) -> dict[str, int]:
    C = shape[-1]
    rows = math.prod(shape[:-1])
    nC = -(-C // tile)
    return dict(
        n_units=rows * nC, n_chunks=1, C=C, TC=tile, inner=1, nC=nC,
        sub_cols=-(-C // sub) if sub else 1,
    )  # fmt: skip


def _stats_geometry(size: int, tile: int) -> dict[str, int]:
    chunks = -(-size // max(tile, 1))
    return dict(n_units=chunks, n_chunks=chunks, C=size, TC=size, inner=1, nC=1)


# -- recording the host's launches -------------------------------------------------------------
@dataclasses.dataclass
class _Launch:
    kernel: Any
    args: tuple
    kwargs: dict


@contextlib.contextmanager
def _recording(tm: Any) -> Iterator[list[_Launch]]:
    """Replace the kernels of module ``tm`` by recorders for the duration of the block."""
    kinds = ("JITFunction", "InterpretedFunction")  # (TRITON_INTERPRET=1: the tests)
    names = [n for n, v in vars(tm).items() if type(v).__name__ in kinds]
    names = [n for n in names if n in _ROLES]
    saved = {n: getattr(tm, n) for n in names}
    launches: list[_Launch] = []

    class Recorder:
        def __init__(self, fn: Any) -> None:
            self.fn = fn

        def __getitem__(self, grid: Any) -> Any:
            def launch(*args: Any, **kwargs: Any) -> None:
                launches.append(_Launch(self.fn, args, kwargs))

            return launch

    try:
        for n in names:
            setattr(tm, n, Recorder(saved[n]))
        yield launches
    finally:
        for n, fn in saved.items():
            setattr(tm, n, fn)


def _record_quant(tm: Any, dt: Any, shape: tuple[int, ...], in_type: str, want: str):
    import torch

    from onnxq.formats.modes import NanPolicy, RoundMode, ScaleMode

    x = torch.zeros(shape, dtype=getattr(torch, in_type))
    with _recording(tm) as launches:
        tm.quantize(
            x, dt, axis=-1, round_mode=RoundMode.EVEN, scale_mode=ScaleMode.FLOOR,
            nan_policy=NanPolicy.ELEMENT, seed=0, full_int_range=False,
            want_values=want in ("values", "both"), want_codes=want in ("codes", "both"),
        )  # fmt: skip
    return launches


def _record_fast(tf: Any, dt: Any, shape: tuple[int, ...], in_type: str, want: str):
    """The fast path's launches for one cast (the tuned program size, not the environment's)."""
    import torch

    from onnxq.formats.modes import NanPolicy, RoundMode, ScaleMode

    fp = tf._fast_plan(shape, dt, -1, RoundMode.EVEN, tf._BLOCK, tf._WARPS)
    if fp is None:
        why = tf.why_not_fast(shape, dt, -1, RoundMode.EVEN)
        raise GenerationError(f"{dt.code}: the fast path refuses {shape} ({why})")
    x = torch.zeros(shape, dtype=getattr(torch, in_type))
    with _recording(tf) as launches:
        tf.quantize(
            x, dt, fp, scale_mode=ScaleMode.FLOOR, nan_policy=NanPolicy.ELEMENT,
            full_int_range=False, want_values=want == "values", want_codes=want != "values",
            packed=want == "packed",
        )  # fmt: skip
    return launches


def _record_dequant(tm: Any, dt: Any, shape: tuple[int, ...], out_type: str):
    import torch

    p = tm.plan(shape, dt, -1)
    code_t = torch.uint8 if dt.nspec.bits <= 8 else torch.uint16
    codes = torch.zeros(shape, dtype=code_t)
    s = dt.sspec
    scale = tenscale = meta = None
    if s is not None:
        scale = torch.zeros(p.grid_shape, dtype=tm._code_torch_dtype(s.scale.bits))
        if s.tenscale is not None:
            tenscale = torch.tensor([1.0], dtype=torch.float32).view(torch.uint32)
        if p.sub:
            meta = torch.zeros(p.meta_shape, dtype=torch.uint8)
    with _recording(tm) as launches:
        tm.dequantize(
            dt, shape, -1, codes, scale=scale, tenscale=tenscale, meta=meta,
            out_dtype=getattr(torch, out_type),
        )  # fmt: skip
    return launches


def _ptr_type(t: Any) -> str:
    name = str(t.dtype)
    if name not in _PTR_TYPES:
        raise GenerationError(f"no Triton pointer type for a {name} kernel argument")
    return "*" + _PTR_TYPES[name]


def _bits32(value: int | float) -> int:
    if isinstance(value, float):
        return struct.unpack("<i", struct.pack("<f", value))[0]
    return int(value)


def _constexpr_names(fn: Any) -> set[str]:
    names = list(fn.arg_names)
    if hasattr(fn, "constexprs"):
        return {names[i] for i in fn.constexprs}
    import inspect  # an interpreted function: read the annotations

    params = inspect.signature(fn.fn).parameters.values()
    return {p.name for p in params if "constexpr" in str(p.annotation)}


def _describe(
    launch: _Launch, geometry: dict[str, int], consts: list[bytes], *, tenscale: bool
) -> tuple[dict[str, str], dict[str, Any], dict[str, Any], list[tuple[str, str, int]]]:
    """Signature, constexprs, compile options and parameter roles of one recorded launch."""
    import torch

    fn = launch.kernel
    kname = fn.fn.__name__
    table = _ROLES.get(kname, {})
    names = list(fn.arg_names)
    constexpr_names = _constexpr_names(fn)
    if len(launch.args) > len(names):
        raise GenerationError(f"{kname}: {len(launch.args)} positional arguments")
    bound = dict(zip(names, launch.args, strict=False))
    options = dict(_OPTION_DEFAULTS)
    for key, value in launch.kwargs.items():
        if key in names:
            bound[key] = value
        else:
            options[key] = value  # a launch option (num_warps, enable_fp_fusion, ...)
    options["enable_fp_fusion"] = False
    missing = [n for n in names if n not in bound]
    if missing:
        raise GenerationError(f"{kname}: parameters {missing} not passed by the host")
    signature: dict[str, str] = {}
    roles: list[tuple[str, str, int]] = []
    constexprs: dict[str, Any] = {}
    for name in names:
        value = bound[name]
        if name in constexpr_names:
            constexprs[name] = value
            signature[name] = "constexpr"
        elif isinstance(value, torch.Tensor):
            signature[name] = _ptr_type(value)
            role = table.get(name)
            if role is None:
                raise GenerationError(
                    f"{kname}: pointer parameter {name!r} has no role in onnxq/cast/aot.py "
                    f"(_ROLES); say what the C launcher passes for it"
                )
            if role == "ts" and not tenscale:
                role = "const"  # the unused 1.0 of a format without a tensor scale
            extra = -1
            if role == "const":
                data = value.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes()
                if data not in consts:
                    consts.append(data)
                extra = consts.index(data)
            roles.append((name, role, extra))
        elif isinstance(value, bool):
            raise GenerationError(f"{kname}: run-time parameter {name!r} is a bool")
        elif isinstance(value, float):
            signature[name] = "fp32"
            roles.append((name, "value", _bits32(value)))
        elif isinstance(value, int):
            if not -(1 << 31) <= value < (1 << 31):
                raise GenerationError(f"{kname}: scalar {name} = {value} needs 64 bits")
            signature[name] = "i32"
            if name in geometry:
                if geometry[name] != value:
                    raise GenerationError(
                        f"{kname}: scalar {name} = {value} where the launcher computes "
                        f"{geometry[name]}"
                    )
                roles.append((name, name, -1))
            else:
                roles.append((name, "value", value))
        else:
            raise GenerationError(f"{kname}: run-time parameter {name!r} is {value!r}")
    for key, want in _REQUIRED.items():
        if key in constexprs and bool(constexprs[key]) != want:
            raise GenerationError(f"{kname}: constexpr {key} = {constexprs[key]}")
    return signature, constexprs, options, roles


def _same(a: tuple, b: tuple, what: str) -> None:
    """Two recorded launches (different shapes) must differ only in geometry and ``BT``."""
    sig_a, ce_a, opt_a, roles_a = a
    sig_b, ce_b, opt_b, roles_b = b
    diff = sorted(k for k in set(ce_a) | set(ce_b) if k != "BT" and ce_a.get(k) != ce_b.get(k))
    if sig_a != sig_b or opt_a != opt_b:
        diff.append("signature or options")
    va = [(n, r, x) for n, r, x in roles_a if r == "value"]
    vb = [(n, r, x) for n, r, x in roles_b if r == "value"]
    if va != vb:
        diff += sorted({n for n, _, _ in va} ^ {n for n, _, _ in vb} | {
            x[0] for x, y in zip(va, vb, strict=False) if x != y})  # fmt: skip
    if diff:
        raise GenerationError(f"{what}: {diff} depend on the tensor shape")


_SHAPES = ((512, 96), (3, 5, 40))  # recorded and compared; the first is the one compiled
_FAST_SHAPES = ((512, 96), (3, 5, 64))  # the last axis a multiple of every preset's tile


def specialisations(
    presets: tuple[str, ...] = PRESETS,
) -> tuple[list[FormatInfo], list[KernelSpec], list[bytes]]:
    """Record every specialisation: the formats, the kernels and the constant tables.

    Raises:
        GenerationError: the host code launches something this module cannot reproduce.
        ImportError: torch or triton is missing.
    """
    import onnxq
    from onnxq.cast import triton as tm
    from onnxq.cast import triton_fast as tf

    formats: list[FormatInfo] = []
    kernels: list[KernelSpec] = []
    consts: list[bytes] = []
    stats_done: set[int] = set()
    amax_done: set[int] = set()

    def named(launches: list[_Launch], kernel: str) -> list[_Launch]:
        return [la for la in launches if la.kernel.fn.__name__ == kernel]

    for preset in presets:
        dt = onnxq.datatype(preset)
        p = tm.plan(_SHAPES[0], dt, -1)
        s = dt.sspec
        if s is None or not p.single or p.inner != 1 or getattr(p, "rows", 0):
            raise GenerationError(f"{preset}: only scaled formats with short 1-D tiles")
        if s.zero is not None:
            raise GenerationError(f"{preset}: zero points")
        if s.tenscale is not None and (not s.tenscale.is_float or s.tenscale.bits != 32):
            raise GenerationError(f"{preset}: tensor scales other than float32")
        if dt.nspec.bits > 8 or s.scale.bits > 8:
            raise GenerationError(f"{preset}: codes or scales of more than 8 bits")
        info = FormatInfo(
            preset, dt.code, p.TC, p.sub, True, dt.nspec.bits, s.scale.bits,
            s.tenscale.bits if s.tenscale is not None else 0,
        )  # fmt: skip
        fi = len(formats)
        formats.append(info)
        has_ts = s.tenscale is not None
        for k, ftype in enumerate(FLOATS):
            quants = ((OP_QUANT_VALUES, "values"), (OP_QUANT_CODES, "codes"),
                      (OP_QUANT_BOTH, "both"))  # fmt: skip
            for op, want in quants:
                rec = [_record_quant(tm, dt, shape, ftype, want) for shape in _SHAPES]
                mains = [named(r, "_quant_kernel") for r in rec]
                if [len(m) for m in mains] != [1, 1]:
                    raise GenerationError(f"{preset}: expected one _quant_kernel launch")
                extra = [la.kernel.fn.__name__ for la in rec[0] if la not in mains[0]]
                if extra != (["_stats_kernel"] if has_ts else []):
                    raise GenerationError(f"{preset}: unexpected launches {extra}")
                d = [
                    _describe(m[0], info.geometry(shape), consts, tenscale=has_ts)
                    for m, shape in zip(mains, _SHAPES, strict=True)
                ]
                _same(d[0], d[1], f"{preset} quantize")
                sig, ce, opts, roles = d[0]
                _set_bt(ce)
                kernels.append(
                    KernelSpec(f"q{op}_{preset}_{ftype}", "_quant_kernel", op, fi, k, sig, ce,
                               opts, roles)
                )  # fmt: skip
            for op, want in FAST_OPS:
                if want == "packed" and info.code_bits == 8 and not info.sub:
                    continue  # the packed layouts are the unpacked ones: OP_FAST_CODES
                rec = [_record_fast(tf, dt, shape, ftype, want) for shape in _FAST_SHAPES]
                mains = [named(r, "_fast_kernel") for r in rec]
                if [len(m) for m in mains] != [1, 1]:
                    raise GenerationError(f"{preset}: expected one _fast_kernel launch")
                extra = [la.kernel.fn.__name__ for la in rec[0] if la not in mains[0]]
                if extra != (["_amax_kernel"] if has_ts else []):
                    raise GenerationError(f"{preset}: unexpected fast launches {extra}")
                d = [
                    _describe(m[0], _fast_geometry(shape, info, want == "packed"), consts,
                              tenscale=has_ts)
                    for m, shape in zip(mains, _FAST_SHAPES, strict=True)
                ]  # fmt: skip
                _same(d[0], d[1], f"{preset} fast {want}")
                sig, ce, opts, roles = d[0]
                if ce.get("HW_BF16") is None or ce.get("BT", 0) * ce.get("TC", 0) < 1:
                    raise GenerationError(f"{preset}: fast kernel constexprs {sorted(ce)}")
                ce["HW_BF16"] = True  # the interpreter's switch; the images convert in hardware
                kernels.append(
                    KernelSpec(f"f{op}_{preset}_{ftype}", "_fast_kernel", op, fi, k, sig, ce,
                               opts, roles, module="onnxq.cast.triton_fast", hints=_ptrs(sig))
                )  # fmt: skip
                if has_ts and k not in amax_done:
                    amax_done.add(k)
                    kernels.extend(_amax_specs(tf, rec[0], k, consts))
            if has_ts and k not in stats_done:
                stats_done.add(k)
                sizes = (1 << 16, 3 * (1 << 16) + 5)
                d = []
                for size in sizes:
                    st = named(_record_quant(tm, dt, (size,), ftype, "values"), "_stats_kernel")
                    if len(st) != 1:
                        raise GenerationError("expected one _stats_kernel launch (tensor amax)")
                    tile = st[0].kwargs.get("TILE", 0)
                    d.append(_describe(st[0], _stats_geometry(size, tile), consts,
                                       tenscale=False))  # fmt: skip
                _same(d[0], d[1], "stats")
                sig, ce, opts, roles = d[0]
                if ce.get("BT") != 1 or not ce.get("LAST"):
                    raise GenerationError(f"stats kernel constexprs {ce}: not one chunk each")
                kernels.append(KernelSpec(f"stats_{ftype}", "_stats_kernel", OP_STATS, -1, k,
                                          sig, ce, opts, roles, chunk=ce["TILE"]))  # fmt: skip
            rec = [_record_dequant(tm, dt, shape, ftype) for shape in _SHAPES]
            if [len(r) for r in rec] != [1, 1]:
                raise GenerationError(f"{preset}: expected one _dequant_kernel launch")
            d = [
                _describe(r[0], info.geometry(shape), consts, tenscale=has_ts)
                for r, shape in zip(rec, _SHAPES, strict=True)
            ]
            _same(d[0], d[1], f"{preset} dequantize")
            sig, ce, opts, roles = d[0]
            _set_bt(ce)
            kernels.append(
                KernelSpec(f"dq_{preset}_{ftype}", "_dequant_kernel", OP_DEQUANT, fi, k, sig, ce,
                           opts, roles)
            )  # fmt: skip
    kernels.extend(_pack_specs(formats))
    return formats, kernels, consts


def _amax_specs(tf: Any, launches: list[_Launch], k: int, consts: list[bytes]) -> list[KernelSpec]:
    """NVFP4's tensor amax for the fast path: one image per `AMAX_ROUNDS` value.

    The host picks ``ROUNDS`` (blocks per program, a loop count) from the tensor size so that
    about ``_AMAX_PROGRAMS`` programs run; the launcher takes the largest compiled value that
    does not exceed the host's, so it runs at most twice as many programs (atomics) as the
    host below about 5e8 elements, 8x at 2^31.
    """
    am = [la for la in launches if la.kernel.fn.__name__ == "_amax_kernel"]
    if len(am) != 1:
        raise GenerationError("expected one _amax_kernel launch (tensor amax)")
    numel = am[0].args[2] if len(am[0].args) > 2 else am[0].kwargs.get("numel")
    sig, ce, opts, roles = _describe(am[0], {"numel": int(numel)}, consts, tenscale=False)
    if set(ce) != {"IN_KIND", "BLOCK", "ROUNDS"} or ce["IN_KIND"] != k:
        raise GenerationError(f"amax kernel constexprs {ce}")
    specs = []
    for rounds in AMAX_ROUNDS:
        c = {**ce, "ROUNDS": rounds}
        specs.append(KernelSpec(f"amax{rounds}_{FLOATS[k]}", "_amax_kernel", OP_AMAX, -1, k, sig,
                                c, opts, roles, chunk=ce["BLOCK"] * rounds,
                                module="onnxq.cast.triton_fast",
                                hints=(*_ptrs(sig), "numel")))  # fmt: skip
    return specs


def _ptrs(signature: dict[str, str]) -> tuple[str, ...]:
    return tuple(n for n, t in signature.items() if t.startswith("*"))


def _pack_specs(formats: list[FormatInfo]) -> list[KernelSpec]:
    """Device bit packing (onnxq.cast.triton_pack) for the widths under 8 bits in use."""
    from onnxq.cast import triton_pack

    widths = {f.code_bits for f in formats if f.code_bits < 8} | ({1} if any(
        f.sub for f in formats) else set())  # fmt: skip
    sig = {"src_ptr": "*u8", "dst_ptr": "*u8", "count": "i32", "nbytes": "i32"}
    roles = [("src_ptr", "src", -1), ("dst_ptr", "dst", -1), ("count", "count", -1),
             ("nbytes", "nbytes", -1)]  # fmt: skip
    specs = []
    for bits in sorted(widths):
        for op, name in ((OP_PACK, "_pack_kernel"), (OP_UNPACK, "_unpack_kernel")):
            ce = {"BITS": bits, "BLOCK": triton_pack.BLOCK}
            spec = KernelSpec(
                f"{name[1:-7]}{bits}", name, op, -1, bits,
                {**sig, "BITS": "constexpr", "BLOCK": "constexpr"}, ce, dict(_OPTION_DEFAULTS),
                roles, chunk=triton_pack.BLOCK, module="onnxq.cast.triton_pack",
            )  # fmt: skip
            specs.append(spec)
    return specs


def _set_bt(ce: dict[str, Any]) -> None:
    if "BT" in ce:
        per_unit = ce.get("NSUB", 1) * ce.get("SUB", ce.get("TILE", 1))
        ce["BT"] = max(1, ELEMS_PER_PROGRAM // per_unit)


# -- compiling ---------------------------------------------------------------------------------
_PARAM_RE = re.compile(r"\.param\s+\.(\w+)")


def compile_spec(spec: KernelSpec, arch: int) -> dict[str, Any]:
    """Compile one specialisation for ``sm_<arch>``: cubin, PTX and launch metadata.

    Raises:
        GenerationError: the compiled kernel needs something the launcher does not provide.
    """
    os.environ.setdefault("TRITON_DISABLE_LINE_INFO", "1")  # smaller images
    import importlib

    import triton
    from triton.backends.compiler import GPUTarget

    fn = getattr(importlib.import_module(spec.module), spec.kernel)
    target = GPUTarget("cuda", arch, 32)
    backend = triton.compiler.make_backend(target)
    options = backend.parse_options(dict(spec.options))
    attrs = {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in spec.hints}
    src = triton.compiler.ASTSource(
        fn=fn, signature=spec.signature, constexprs=spec.constexprs, attrs=attrs
    )
    ck = triton.compile(src, target=target, options=options.__dict__)
    md = ck.metadata
    for what in ("global_scratch_size", "profile_scratch_size", "tmem_size"):
        if getattr(md, what, 0):
            raise GenerationError(f"{spec.symbol}: the kernel needs {what} = {getattr(md, what)}")
    if getattr(md, "num_ctas", 1) != 1 or getattr(md, "launch_cooperative_grid", False):
        raise GenerationError(f"{spec.symbol}: clusters / cooperative launches are not supported")
    if getattr(md, "launch_pdl", False):
        raise GenerationError(f"{spec.symbol}: programmatic dependent launch is not supported")
    ptx = ck.asm["ptx"]
    entry = ptx[ptx.index(".entry") :]
    entry = entry[: entry.index(")")]
    params = _PARAM_RE.findall(entry)
    extra = params[len(spec.roles) :]
    if len(params) < len(spec.roles) or any(p not in ("u64", "b64") for p in extra):
        raise GenerationError(
            f"{spec.symbol}: the PTX entry has parameters {params} for {len(spec.roles)} arguments"
        )
    for (name, role, _), ptype in zip(spec.roles, params, strict=False):
        want = ("u32", "b32", "s32", "f32") if ROLE_IDS[role] >= 20 else ("u64", "b64")
        if ptype not in want:
            raise GenerationError(f"{spec.symbol}: parameter {name} is .{ptype} in the PTX")
    return {
        "cubin": ck.asm["cubin"],
        "ptx": ptx.encode() + b"\0",
        "name": md.name,
        "num_warps": md.num_warps,
        "shared": md.shared,
        "extra_params": len(extra),
    }


def _compile_job(job: tuple[str, int, tuple[str, ...]]) -> tuple[str, int, dict[str, Any]]:
    unit, arch, presets = job
    _, kernels, _ = _cached_specs(presets)
    spec = next(k for k in kernels if k.unit == unit)
    return unit, arch, compile_spec(spec, arch)


_SPEC_CACHE: dict[tuple[str, ...], Any] = {}


def _cached_specs(presets: tuple[str, ...]) -> Any:
    if presets not in _SPEC_CACHE:
        _SPEC_CACHE[presets] = specialisations(presets)
    return _SPEC_CACHE[presets]


# -- output ------------------------------------------------------------------------------------
def _stamp(presets: tuple[str, ...]) -> str:
    """Hash of everything the output depends on (sources, Triton version, settings)."""
    from importlib import metadata

    here = Path(__file__).resolve().parent
    h = hashlib.sha256()
    h.update(repr((FORMAT_VERSION, presets, ARCHS, PTX_ARCH, ELEMS_PER_PROGRAM)).encode())
    h.update(metadata.version("triton").encode())
    names = ("aot", "triton", "triton_fast", "triton_pack", "elements", "layout", "reference",
             "packing")  # fmt: skip
    files = [here / f"{n}.py" for n in names] + sorted((here.parent / "formats").glob("*.py"))
    for f in files:
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def _amax_programs() -> int:
    from onnxq.cast import triton_fast

    return int(triton_fast._AMAX_PROGRAMS)


def _c_str(s: str) -> str:
    return json.dumps(s)


def generate(
    out_dir: str | os.PathLike[str], *, jobs: int = 0, presets: tuple[str, ...] = PRESETS,
    force: bool = False,
) -> dict[str, Any]:  # fmt: skip
    """Write kernels.bin, aot_index.inc and manifest.json into ``out_dir``; return the manifest.

    Specialisations that differ only in run-time values share one compiled image.

    Raises:
        GenerationError: a specialisation cannot be recorded or compiled.
        ImportError: torch or triton is missing.
    """
    if os.environ.pop("TRITON_INTERPRET", "0") == "1" and "triton" in sys.modules:
        raise GenerationError("triton was imported with TRITON_INTERPRET=1: nothing to compile")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    stamp = _stamp(presets)
    manifest_path = out / "manifest.json"
    if not force and manifest_path.is_file() and (out / "aot_index.inc").is_file():
        old = json.loads(manifest_path.read_text())
        if old.get("stamp") == stamp and (out / "kernels.bin").is_file():
            return old
    import triton

    formats, kernels, consts = _cached_specs(presets)
    units = list(dict.fromkeys(k.unit for k in kernels))
    work = [(u, arch, presets) for u in units for arch in ARCHS]
    jobs = jobs or min(len(work), os.cpu_count() or 1)
    results: dict[tuple[str, int], dict[str, Any]] = {}
    if jobs > 1:
        import concurrent.futures
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")
        with concurrent.futures.ProcessPoolExecutor(jobs, mp_context=ctx) as pool:
            for unit, arch, res in pool.map(_compile_job, work):
                results[(unit, arch)] = res
    else:
        for job in work:
            unit, arch, res = _compile_job(job)
            results[(unit, arch)] = res

    blob = bytearray()

    def put(data: bytes) -> tuple[int, int]:
        while len(blob) % 64:
            blob.append(0)
        off = len(blob)
        blob.extend(data)
        return off, len(data)

    const_pos = [put(c) for c in consts]
    placed: dict[str, tuple[dict[int, tuple[int, int]], tuple[int, int]]] = {}
    for u in units:
        images = {a: put(results[(u, a)]["cubin"]) for a in ARCHS}
        placed[u] = (images, put(results[(u, PTX_ARCH)]["ptx"]))
    extras = {results[key]["extra_params"] for key in results}
    if len(extras) != 1 or extras.pop() > 2:
        # Triton keeps every run-time argument and appends its scratch pointers; anything else
        # would shift the parameters the launcher passes
        raise GenerationError(f"kernels disagree on trailing parameters: {sorted(extras)}")
    rows, params, entries = [], [], []
    for k in kernels:
        r = {a: results[(k.unit, a)] for a in ARCHS}
        nextra = r[ARCHS[0]]["extra_params"]
        warps = {x["num_warps"] for x in r.values()}
        if any(x["extra_params"] != nextra for x in r.values()) or len(warps) != 1:
            raise GenerationError(f"{k.symbol}: the architectures disagree on the parameters")
        first = len(params)
        params.extend((ROLE_IDS[role], extra) for _, role, extra in k.roles)
        params.extend([(ROLE_IDS["scratch"], -1)] * nextra)
        images, ptx = placed[k.unit]
        bt = k.constexprs.get("ROUNDS", k.constexprs.get("BT", 1))  # amax: blocks per program
        cubins = ", ".join(f"{{{a}, {images[a][0]}u, {images[a][1]}u}}" for a in ARCHS)
        rows.append(
            f"  {{{k.fmt}, {k.op}, {k.io_type}, {_c_str(r[ARCHS[0]]['name'])}, {warps.pop()}, "
            f"{max(x['shared'] for x in r.values())}, {bt}, {k.chunk}, {int(bool(k.hints))}, "
            f"{first}, "
            f"{len(params) - first}, {{{cubins}}}, {{{PTX_ARCH}, {ptx[0]}u, {ptx[1]}u}}}},"
            f"  // {k.symbol}"
        )
        entries.append(
            {
                "symbol": k.symbol, "kernel": k.kernel, "op": k.op,
                "format": formats[k.fmt].preset if k.fmt >= 0 else None,
                "io_type": k.io_type if k.op in (OP_PACK, OP_UNPACK) else FLOATS[k.io_type],
                "constexprs": k.constexprs,
                "options": k.options, "signature": k.signature, "hints": list(k.hints),
                "roles": [[n, r_, x] for n, r_, x in k.roles], "image": units.index(k.unit),
                "cubin": {f"sm_{a}": list(images[a]) for a in ARCHS},
                "ptx": {f"sm_{PTX_ARCH}": list(ptx)},
                "num_warps": r[ARCHS[0]]["num_warps"], "extra_params": nextra,
            }
        )  # fmt: skip
    fmt_rows = [
        f"  {{{_c_str(f.preset)}, {_c_str(f.code)}, {f.tile}, {f.sub}, {int(f.scaled)}, "
        f"{f.code_bits}, {f.scale_bits}, {f.tenscale_bits}}},"
        for f in formats
    ]
    param_rows = [
        "  " + " ".join(f"{{{role}, {extra}}}," for role, extra in params[i : i + 8])
        for i in range(0, len(params), 8)
    ]
    const_rows = [f"  {{{o}u, {n}u}}," for o, n in const_pos]
    inc = "\n".join(
        [
            "// Generated by onnxq/cast/aot.py; do not edit. Included by ops/src/cuda_launch.cc.",
            f"#define ONNXQ_AOT_FORMAT_VERSION {FORMAT_VERSION}",
            f"#define ONNXQ_AOT_TRITON_VERSION {_c_str(triton.__version__)}",
            f"#define ONNXQ_AOT_BLOB_BYTES {len(blob)}u",
            f"#define ONNXQ_AOT_NARCH {len(ARCHS)}",
            f"#define ONNXQ_AOT_AMAX_PROGRAMS {_amax_programs()}",
            "static const AotFormat kAotFormats[] = {", *fmt_rows, "};",
            "static const AotParam kAotParams[] = {", *param_rows, "};",
            "static const AotSpan kAotConsts[] = {", *(const_rows or ["  {0u, 0u},"]), "};",
            "static const AotKernel kAotKernels[] = {", *rows, "};",
            "",
        ]
    )  # fmt: skip
    (out / "kernels.bin").write_bytes(bytes(blob))
    (out / "aot_index.inc").write_text(inc)
    manifest = {
        "stamp": stamp,
        "format_version": FORMAT_VERSION,
        "triton": triton.__version__,
        "archs": [f"sm_{a}" for a in ARCHS],
        "ptx_arch": f"sm_{PTX_ARCH}",
        "blob_bytes": len(blob),
        "images": len(units),
        "formats": [dataclasses.asdict(f) for f in formats],
        "kernels": entries,
    }
    manifest_path.write_text(json.dumps(manifest, indent=1, default=str))
    return manifest


def main(argv: list[str] | None = None) -> int:
    """Command line: ``python -m onnxq.cast.aot OUT_DIR [--jobs N] [--force]``."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out_dir")
    ap.add_argument("--jobs", type=int, default=0, help="compile processes (0: one per core)")
    ap.add_argument("--force", action="store_true", help="ignore the up-to-date stamp")
    args = ap.parse_args(argv)
    try:
        m = generate(args.out_dir, jobs=args.jobs, force=args.force)
    except ImportError as err:
        print(f"onnxq aot: no GPU kernels ({err})", file=sys.stderr)
        return 3
    print(
        f"onnxq aot: {len(m['kernels'])} kernels ({m['images']} images) for "
        f"{', '.join(m['archs'])} (+ PTX {m['ptx_arch']}), {m['blob_bytes']} bytes, "
        f"triton {m['triton']}, in {args.out_dir}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
