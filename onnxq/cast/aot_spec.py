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

# Every MX / BFP / NVFP4 preset with 1-D tiles (`onnxq formats`; aliases such as mxfp8 and
# mxint4 share their code with one of these): the deployment recipes' formats among them, and
# BFP16 with 8 values per exponent (`--preset bfp16-deploy --block-size 8`, a code: no preset
# name). Its general kernels are bfp16's (tiles up to 16 share one compile): the fast ones cost.
PRESETS = (
    "mxfp8e4",
    "mxfp8e5",
    "mxfp6e2",
    "mxfp6e3",
    "mxfp4",
    "mxint8",
    "bfp16",
    "bfp8",
    "int8_e8m0_t8",
    "mx9",
    "mx6",
    "mx4",
    "nvfp4",
)
FLOATS = ("float32", "float16", "bfloat16")  # index = the kernels' IN_KIND / OUT_KIND
ARCHS = (80, 90)
PTX_ARCH = 80  # the PTX kept for GPUs newer than the cubins (JIT-compiled by the driver)
ELEMS_PER_PROGRAM = 1024
FORMAT_VERSION = 4  # of kernels.bin / aot_index.inc; the launcher checks it

# Kernel operations (the launcher's `op`)
OP_QUANT_VALUES, OP_QUANT_CODES, OP_DEQUANT, OP_STATS, OP_PACK, OP_UNPACK = 0, 1, 2, 3, 4, 5
OP_QUANT_BOTH = 6  # values and codes in one launch
# The fast path (onnxq.cast.triton_fast): quantize when the last axis is a multiple of the tile
OP_FAST_VALUES, OP_FAST_CODES, OP_FAST_PACKED, OP_AMAX = 7, 8, 9, 10
# (formats with 8-bit codes and no shift bits have no OP_FAST_PACKED: the layouts are the same)
FAST_OPS = ((OP_FAST_VALUES, "values"), (OP_FAST_CODES, "codes"), (OP_FAST_PACKED, "packed"))
# ... and its values and codes kernels for whole tiles along an axis with elements after it
# (INNER: a program's tiles side by side; the activations' QuantizeDequantizeMX of NCHW
# tensors, and QuantizeMX's codes, which the pack kernels then pack)
OP_FAST_VALUES_INNER, OP_FAST_CODES_INNER = 21, 22
# GatherMX: the rows its indices name copied out of a packed stream (onnxq.cast.triton_gather;
# `count` rows of `row_bits` bits), one image for every stream and format; the decode kernels
# then read the compact table
OP_GATHER_ROWS = 23
AMAX_ROUNDS = (1, 4, 16, 64)  # the tensor-amax pass's blocks per program: the variants compiled
# Codebook decoding (CodebookLookup; onnxq.cast.triton_codebook's `_cb_dequant_kernel`): images
# that serve every codebook data type, the format's numbers passed at run time. By block:
OP_CB_PLAIN = 11  # tiles without subtiles (one meta per tile), block SUB >= the tile
OP_CB_SUB = 12  # tiles with subtiles (a meta per subtile), block NSUB x SUB >= nsub x sub
OP_CB_LONG = 13  # tiles over 1024 elements without subtiles, one 512-element chunk a program
CB_OPS = (OP_CB_PLAIN, OP_CB_SUB, OP_CB_LONG)
# The compiled blocks (op, NSUB, SUB): the launcher takes the one of fewest lanes that holds
# the tile (lanes past the tile are masked off); a tile no block holds is refused by name.
CB_BLOCKS = (
    *((OP_CB_PLAIN, 1, s) for s in (8, 16, 32, 64, 128, 1024)),
    *((OP_CB_SUB, n, s) for n, s in ((4, 8), (16, 8), (8, 32), (32, 32))),
    (OP_CB_LONG, 1, 512),
)
CB_MAX_TILE = 1024  # tiles up to this many elements are whole in a program (not OP_CB_LONG)
# ... and each block compiled for tiles along an axis with elements after it (LAST=False)
CB_INNER_OPS = {OP_CB_PLAIN: 18, OP_CB_SUB: 19, OP_CB_LONG: 20}
# The general kernels for tiles along an axis with elements after it (inner > 1: LAST=False),
# such as NCHW activations tiled along the channels: the same kernels, another compile
OP_QUANT_VALUES_INNER, OP_QUANT_CODES_INNER, OP_QUANT_BOTH_INNER, OP_DEQUANT_INNER = 14, 15, 16, 17
INNER_OPS = {
    OP_QUANT_VALUES: OP_QUANT_VALUES_INNER,
    OP_QUANT_CODES: OP_QUANT_CODES_INNER,
    OP_QUANT_BOTH: OP_QUANT_BOTH_INNER,
    OP_DEQUANT: OP_DEQUANT_INNER,
}
PACK_WIDTHS = tuple(range(1, 8))  # bit packing kernels: codebook indices (2..7), meta (1..4)

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
    "table": 14,  # a codebook's float64 table, [2^meta_bits][2^index_bits], uploaded per call
    "rows": 15,  # GatherMX: the table rows to copy, int32, uploaded per call
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
    # codebook decoding: the geometry (n_inst is n_units) and the format's numbers
    "n_inst": 20,
    "nsub": 35,
    "sub": 36,
    "s_bias": 37,  # scale exponent bias
    "s_nan": 38,  # the scale's NaN code (2^ebits - 1)
    "s_mask": 39,  # 2^scale_bits - 1
    "ib": 40,  # index bits
    "nmap": 41,  # mappings (2^meta_bits)
    # the general quantize kernel's mode numbers: the format's value for the call's mode
    # (`FormatInfo.modes`, by the C ABI's mode numbers)
    "rmode": 42,
    "nan_nf": 43,
    "full_int": 44,
    "bump_t": 45,
    "row_bits": 46,  # GatherMX: bits of one row of the packed stream
}
# The modes the general quantize kernel takes at run time, in the C ABI's numbering
# (onnxq_ops.h `onnxq_modes`): stochastic rounding (a constexpr) and scale search (a loop of
# casts) have no embedded kernels.
MODES = {
    "round_mode": ("even", "away", "zero"),
    "scale_mode": ("floor", "ceil", "midmax", "option3", "topbinade", "rceil", "even"),
    "nan_policy": ("element", "block"),
    "full_int_range": (False, True),
}
# Its parameter that each mode sets (the only one: the generator checks)
MODE_PARAMS = {
    "round_mode": "rmode",
    "scale_mode": "bump_t",
    "nan_policy": "nan_nf",
    "full_int_range": "full_int",
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
    "_cb_dequant_kernel": {
        "code_ptr": "codes", "y_ptr": "y", "scale_ptr": "scale", "meta_ptr": "meta",
        "tab_ptr": "table",
    },
}  # fmt: skip
# Constexprs that must have these values for the roles above to hold (a "null" pointer is
# never touched only if its feature is off).
_REQUIRED = {"PRE": False, "IDX": False, "MINMAX": False, "STOCH": False}

_PTR_TYPES = {
    "torch.int32": "i32",
    "torch.int16": "i16",
    "torch.int8": "i8",
    "torch.uint8": "u8",
    "torch.float64": "fp64",
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
    # MODE_PARAMS' parameter values by mode number: {"rmode": (0, 1, 2), "bump_t": (...), ...}
    modes: dict[str, tuple[int, ...]] = dataclasses.field(default_factory=dict)

    def geometry(self, shape: tuple[int, ...], axis: int = -1) -> dict[str, int]:
        """The quantize / dequantize kernels' scalar arguments (tiles along ``axis``)."""
        return _geometry(shape, self.tile, self.sub, axis)

    def mode_numbers(self, **modes: int) -> dict[str, int]:
        """The general quantize kernel's mode parameters for C ABI mode numbers (0: default).

        ``mode_numbers(scale_mode=1)`` -> {"rmode": 0, "bump_t": ..., "nan_nf": 0, ...}; the
        launcher reads the same table (``AotFormat``).
        """
        return {p: self.modes[p][modes.get(m, 0)] for m, p in MODE_PARAMS.items()}


def _fast_geometry(
    shape: tuple[int, ...], f: FormatInfo, packed: bool, axis: int = -1
) -> dict[str, int]:
    """The fast kernel's scalar arguments for tiles along ``axis`` (the launcher's too)."""
    numel = math.prod(shape)
    n_tiles = numel // f.tile
    meta = n_tiles * (f.tile // f.sub) if f.sub else 0
    return dict(
        n_tiles=n_tiles,
        code_nbytes=(numel * f.code_bits + 7) // 8 if packed else numel,
        meta_nbytes=(meta + 7) // 8 if packed else meta,
        inner=math.prod(shape[axis % len(shape) + 1 :]),
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


def _geometry(shape: tuple[int, ...], tile: int, sub: int, axis: int = -1) -> dict[str, int]:
    a = axis % len(shape)
    C = shape[a]
    outer, inner = math.prod(shape[:a]), math.prod(shape[a + 1 :])
    nC = -(-C // tile)
    return dict(
        n_units=outer * nC * inner,
        n_chunks=1,
        C=C,
        TC=tile,
        inner=inner,
        nC=nC,
        sub_cols=-(-C // sub) if sub else 1,
    )


def cb_block(tile: int, sub: int) -> tuple[int, int, int, int] | None:
    """The codebook block for tiles of ``tile`` elements (subtiles of ``sub``, 0: none).

    Returns (op, NSUB, SUB, n_chunks), or None when no compiled block holds such tiles. The
    launcher (``ops/src/cuda_lookup.cc``, `find_block`) chooses the same.
    """
    nsub = tile // sub if sub else 1
    if tile > CB_MAX_TILE:
        if sub:
            return None
        op, n, s = next(b for b in CB_BLOCKS if b[0] == OP_CB_LONG)
        return op, n, s, -(-tile // (n * s))
    op = OP_CB_SUB if sub else OP_CB_PLAIN
    fits = [(n * s, n, s) for o, n, s in CB_BLOCKS if o == op and n >= nsub and s >= (sub or tile)]
    if not fits:
        return None
    _, n, s = min(fits)
    return op, n, s, 1


def cb_geometry(
    shape: tuple[int, ...],
    tile: int,
    sub: int,
    scale_bits: int,
    scale_bias: int,
    ib: int,
    mb: int,
    axis: int = -1,
) -> dict[str, int]:
    """`_cb_dequant_kernel`'s run-time arguments for codebook tiles along ``axis``.

    ``tile`` the data type's tile (0: the whole axis), ``sub`` its subtile (0: none); the
    launcher (``ops/src/cuda_lookup.cc``, `plan`) computes the same. Raises KeyError where
    no compiled block holds the tile (`aot_spec.cb_block`).
    """
    a = axis % len(shape)
    C = shape[a]
    rows = math.prod(shape[:a]) * math.prod(shape[a + 1 :])
    TC = tile or C
    if TC > CB_MAX_TILE and C < TC:
        # one long tile, mostly padding (`triton_codebook._geom_of`): as long as the axis
        step = sub or 1
        TC = -(-C // step) * step
    block = cb_block(TC, sub)
    if block is None:
        raise KeyError((TC, sub))
    nC = -(-C // TC)
    return dict(
        n_inst=rows * nC,
        C=C,
        TC=TC,
        inner=math.prod(shape[a + 1 :]),
        nC=nC,
        nsub=TC // sub if sub else 1,
        sub=sub or TC,
        sub_cols=-(-C // sub) if sub else 1,
        n_chunks=block[3],
        s_bias=scale_bias,
        s_nan=(1 << scale_bits) - 1,  # an exponent scale: all its bits are exponent bits
        s_mask=(1 << scale_bits) - 1,
        ib=ib,
        nmap=1 << mb,
    )


def _stats_geometry(size: int, tile: int) -> dict[str, int]:
    chunks = -(-size // max(tile, 1))
    return dict(n_units=chunks, n_chunks=chunks, C=size, TC=size, inner=1, nC=1)
