"""What the ahead-of-time build produces: formats, kernel operations, parameter roles, specs.

The data `onnxq.cast.aot` and its parts share (and the C++ launcher mirrors in
``ops/src/cuda_launch.h``): the presets compiled, the kernel operations, the role of every
kernel parameter, `FormatInfo` (a data type's geometry) and `KernelSpec` (one compile unit with
the values of its parameters), and the launch geometry the launcher computes.
"""

# Kernel geometry keeps layout.py's names (C, TC, nC).

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

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
        n_tiles=n_tiles,
        code_nbytes=(numel * f.code_bits + 7) // 8 if packed else numel,
        meta_nbytes=(meta + 7) // 8 if packed else meta,
    )


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
            [
                self.module,
                self.kernel,
                self.signature,
                self.constexprs,
                self.options,
                list(self.hints),
            ],
            sort_keys=True,
        )


def _geometry(shape: tuple[int, ...], tile: int, sub: int) -> dict[str, int]:
    C = shape[-1]
    rows = math.prod(shape[:-1])
    nC = -(-C // tile)
    return dict(
        n_units=rows * nC,
        n_chunks=1,
        C=C,
        TC=tile,
        inner=1,
        nC=nC,
        sub_cols=-(-C // sub) if sub else 1,
    )


def _stats_geometry(size: int, tile: int) -> dict[str, int]:
    chunks = -(-size // max(tile, 1))
    return dict(n_units=chunks, n_chunks=chunks, C=size, TC=size, inner=1, nC=1)
