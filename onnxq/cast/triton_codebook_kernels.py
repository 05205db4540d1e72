"""The codebook Triton kernels: `_cb_quant_kernel` and `_cb_dequant_kernel`.

The host side is `onnxq.cast.triton_codebook`; the helpers the quantize kernel runs in phases
are in `onnxq.cast.triton_codebook_device`.
"""

# Layout, mode and codebook-shape parameters are tl.constexpr and upper case (Triton's
# convention); the format's numbers are runtime arguments (fewer compiles).
# ruff: noqa: N803

import triton
import triton.language as tl

from onnxq.cast.triton_codebook_device import (
    _cb_bound,
    _cb_chunk,
    _cb_exact_choice,
    _cb_first_choice,
    _cb_long_errors,
    _cb_long_stats,
    _cb_long_write,
    _cb_meta_offsets,
    _cb_offsets,
    _cb_ordered_errors,
    _cb_tile_flags,
    _cb_units,
    _scaled_f32_bits,
)
from onnxq.cast.triton_device import _load_bits, _scale_exp_t, _store_values

# Format numbers are runtime arguments (not specialised): one compile per layout and mode.
_FMT_ARGS = (
    "rmode",
    "nan_block",
    "bump_t",
    "e_emax",
    "s_low",
    "s_high",
    "s_bias",
    "s_nan",
    "negzero",
    "c_emin",
    "c_mbits",
    "c_maxf_bits",
)


# Not specialised either (Triton would compile again for values equal to 1 or divisible by
# 16): instance counts and the strides off the tile's contiguous run. C, TC, nsub and sub are,
# as they decide whether a tile's loads can be vectorized.
_GEOMETRY_RUNTIME = ("n_inst", "inner", "nC", "sub_cols", "n_chunks")


@triton.jit(do_not_specialize=(*_FMT_ARGS, *_GEOMETRY_RUNTIME, "delta"))
def _cb_quant_kernel(
    x_ptr,
    y_ptr,
    code_ptr,
    scale_ptr,
    meta_ptr,
    mag_ptr,
    even_ptr,
    stat_ptr,
    n_inst,
    C,
    TC,
    inner,
    nC,
    nsub,
    sub,
    sub_cols,
    n_chunks,
    delta,
    rmode,
    nan_block,
    bump_t,
    e_emax,
    s_low,
    s_high,
    s_bias,
    s_nan,
    negzero,
    c_emin,
    c_mbits,
    c_maxf_bits,
    IN_KIND: tl.constexpr,
    WANT_Y: tl.constexpr,
    WANT_CODES: tl.constexpr,
    LAST: tl.constexpr,
    TENSOR: tl.constexpr,
    SUBT: tl.constexpr,
    NSUB: tl.constexpr,
    SUB: tl.constexpr,
    BT: tl.constexpr,
    IB: tl.constexpr,
    K: tl.constexpr,
    LOG2K: tl.constexpr,
    NMAP: tl.constexpr,
    NMAP_P: tl.constexpr,
    FORCE: tl.constexpr,
    LONG: tl.constexpr,
    PRE: tl.constexpr,  # LONG: the tiles' statistics from stat_ptr (subtiles over 1024)
):
    # Not LONG: BT whole tiles per program, loaded once. LONG: one tile over 1024 elements
    # per program (BT = 1), in n_chunks chunks of NSUB * SUB: statistics first, then
    # (subtiles) the chunk's units chosen and written, or (the tile is the unit) the
    # mappings' errors added over the chunks, the choice, and the chunks written.
    pid = tl.program_id(0)
    # fmt: off
    if LONG:
        amax_b, any_nf, any_nan = _cb_long_stats(
            x_ptr, stat_ptr, pid, n_chunks, n_inst, C, TC, inner, nC, IN_KIND, LAST, TENSOR,
            NSUB, SUB, PRE,
        )
        u_ok, inst, j, o, i, off, ok, xb = _cb_chunk(
            x_ptr, pid, 0, n_inst, C, TC, inner, nC, IN_KIND, LAST, TENSOR, NSUB, SUB
        )
    else:
        u_ok, inst, j, o, i, off, ok = _cb_offsets(
            pid, n_inst, C, TC, inner, nC, nsub, sub, 0, LAST, TENSOR, NSUB, SUB, BT
        )
        xb, _raw = _load_bits(x_ptr, off, ok, IN_KIND)
        amax_b, any_nf, any_nan = _cb_tile_flags(xb)
    # codebooks have no NaN code: a NaN (nan_block 1: any NaN/Inf) makes its tile NaN;
    # nan_block 2 marks none (scale search's trial casts: the caller marks them)
    tnan = (tl.where(nan_block == 1, any_nf, any_nan) > 0) & (nan_block < 2)
    sexp, _maxexp = _scale_exp_t(amax_b, bump_t, e_emax, s_low, s_high)
    sexp3 = sexp[:, None, None]
    bound = _cb_bound(sexp3, c_emin, c_mbits, c_maxf_bits, IN_KIND)
    if WANT_CODES:
        scode = tl.where(tnan, s_nan, sexp + s_bias)
        tl.store(scale_ptr + inst, scode.to(scale_ptr.dtype.element_ty), mask=u_ok)
    if not LONG:
        _cb_units(
            y_ptr, code_ptr, meta_ptr, mag_ptr, even_ptr, xb, off, ok, u_ok, inst, j,
            o, i, sexp3, bound, tnan, 0, nsub, sub_cols, inner, rmode, negzero, IN_KIND, WANT_Y,
            WANT_CODES, LAST, SUBT, BT, NSUB, SUB, IB, K, LOG2K, NMAP, FORCE,
        )
    elif SUBT:
        q = 0
        while q < n_chunks:
            u_ok, inst, j, o, i, off, ok, xb = _cb_chunk(
                x_ptr, pid, q, n_inst, C, TC, inner, nC, IN_KIND, LAST, TENSOR, NSUB, SUB
            )
            _cb_units(
                y_ptr, code_ptr, meta_ptr, mag_ptr, even_ptr, xb, off, ok, u_ok, inst,
                j, o, i, sexp3, bound, tnan, q * NSUB, nsub, sub_cols, inner, rmode, negzero,
                IN_KIND, WANT_Y, WANT_CODES, LAST, SUBT, 1, NSUB, SUB, IB, K, LOG2K, NMAP, FORCE,
            )
            q += 1
    else:
        errs, same0 = _cb_long_errors(
            x_ptr, pid, n_chunks, n_inst, C, TC, inner, nC, sexp3, bound, mag_ptr, even_ptr,
            rmode, IN_KIND, LAST, TENSOR, NSUB, SUB, K, LOG2K, NMAP, NMAP_P,
        )
        chosen, amb = _cb_first_choice(errs, same0, delta, NMAP, NMAP_P, FORCE)
        if tl.max(amb.to(tl.int32)) > 0:
            errs = _cb_ordered_errors(
                x_ptr, pid, n_chunks, n_inst, C, TC, inner, nC, sexp3, bound, mag_ptr, even_ptr,
                rmode, IN_KIND, LAST, TENSOR, NSUB, SUB, K, LOG2K, NMAP, NMAP_P,
            )
            chosen = _cb_exact_choice(errs, NMAP, NMAP_P)
        _cb_long_write(
            x_ptr, y_ptr, code_ptr, mag_ptr, even_ptr, pid, n_chunks, n_inst, C, TC,
            inner, nC, chosen, sexp3, bound, tnan, rmode, negzero, IN_KIND, WANT_Y, WANT_CODES,
            LAST, TENSOR, NSUB, SUB, IB, K, LOG2K,
        )
        if WANT_CODES:
            tl.store(meta_ptr + inst, chosen.to(tl.uint8), mask=u_ok)
    # fmt: on


@triton.jit(do_not_specialize=(*_GEOMETRY_RUNTIME, "s_bias", "s_nan", "s_mask", "ib", "nmap"))
def _cb_dequant_kernel(
    code_ptr,
    y_ptr,
    scale_ptr,
    meta_ptr,
    tab_ptr,
    n_inst,
    C,
    TC,
    inner,
    nC,
    nsub,
    sub,
    sub_cols,
    n_chunks,
    s_bias,
    s_nan,
    s_mask,
    ib,
    nmap,
    OUT_KIND: tl.constexpr,
    LAST: tl.constexpr,
    TENSOR: tl.constexpr,
    SUBT: tl.constexpr,
    NSUB: tl.constexpr,
    SUB: tl.constexpr,
    BT: tl.constexpr,
    CHUNKED: tl.constexpr,
):
    # BT whole tiles per program, or (CHUNKED, BT = 1) chunk q of tile t per program
    pid = tl.program_id(0)
    if CHUNKED:
        t = pid // n_chunks
        q = pid - t * n_chunks
        u_ok, inst, j, o, i, off, ok = _cb_offsets(
            t, n_inst, C, TC, inner, nC, NSUB, SUB, q * NSUB * SUB, LAST, TENSOR, NSUB, SUB, BT
        )
        s0 = q * NSUB
        nsub_t = nsub
    else:
        u_ok, inst, j, o, i, off, ok = _cb_offsets(
            pid, n_inst, C, TC, inner, nC, nsub, sub, 0, LAST, TENSOR, NSUB, SUB, BT
        )
        s0 = 0
        nsub_t = nsub
    c = tl.load(code_ptr + off, mask=ok, other=0).to(tl.int32) & ((1 << ib) - 1)
    moff, mok = _cb_meta_offsets(u_ok, inst, j, o, i, nsub_t, s0, sub_cols, inner, LAST, SUBT, NSUB)
    mt = tl.load(meta_ptr + moff, mask=mok, other=0).to(tl.int32) & (nmap - 1)
    if not SUBT:
        mt = tl.max(mt, axis=1)[:, None]  # one meta per tile: broadcast over the tile
    qb = tl.load(tab_ptr + (mt[:, :, None] << ib) + c, mask=ok, other=0)
    sc = tl.load(scale_ptr + inst, mask=u_ok, other=0).to(tl.int32) & s_mask
    nan_t = sc == s_nan
    k3 = tl.where(nan_t, 0, sc - s_bias)[:, None, None]
    yb = _scaled_f32_bits(qb, k3)  # the float64 table entry times 2^k, rounded once
    nan = ok & nan_t[:, None, None]
    _store_values(y_ptr, off, ok, yb, nan, nan, OUT_KIND != 0, OUT_KIND == 2)
