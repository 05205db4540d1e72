"""The general Triton engine's statistics, dequantize and N:M prune kernels.

- `_stats_kernel`: per-chunk finite absmax, NaN/Inf flags and (zero points) min/max, for
  tiles too long for one program (over 1024 elements, tensor scales, NVFP4's tensor amax).
- `_dequant_kernel`: codes + scales (+ zero points, shift bits, tensor scale) -> values.
- `_prune_kernel`: N:M sparsity, a pruned copy of the input and the keep mask.

The quantize kernel is `triton_quant_kernel._quant_kernel`.
"""

# Kernel constexprs are upper case (Triton's convention), runtime format numbers lower case; tile
# geometry keeps layout.py's names (C, TC, nC).
# ruff: noqa: N803

import triton
import triton.language as tl

from onnxq.cast.triton_device import (
    _float_fields,
    _ldexp_bits,
    _lo_key,
    _load_any,
    _make_f32,
    _meta_offsets,
    _okey,
    _store_values,
    _tile_pos,
    _unit_offsets,
)


@triton.jit(do_not_specialize=["n_units", "n_chunks", "C", "TC", "inner", "nC", "bf16"])
def _stats_kernel(
    x_ptr,
    amax_ptr,
    flag_ptr,
    lo_ptr,
    hi_ptr,
    n_units,
    n_chunks,
    C,
    TC,
    inner,
    nC,
    bf16,
    HALF: tl.constexpr,
    LAST: tl.constexpr,
    TILE: tl.constexpr,
    BT: tl.constexpr,
    MINMAX: tl.constexpr,
):
    pid = tl.program_id(0)
    u_ok, _inst, _q, _j, _o, _i, off, ok, intile = _unit_offsets(
        pid, n_units, n_chunks, C, TC, inner, nC, LAST, TILE, 1, TILE, BT
    )
    xb, _raw = _load_any(x_ptr, off, ok, HALF, bf16)
    ab = xb & 0x7FFFFFFF
    finite = ab < 0x7F800000
    amax = tl.max(tl.max(tl.where(finite, ab, 0), axis=2), axis=1)
    # flags: 2 = some NaN/Inf, 3 = some NaN (NaN implies non-finite, so max() is an OR)
    nf = tl.max(tl.max((~finite & ok).to(tl.int32), axis=2), axis=1)
    isnan = tl.max(tl.max(((ab > 0x7F800000) & ok).to(tl.int32), axis=2), axis=1)
    u = pid.to(tl.int64) * BT + tl.arange(0, BT)
    tl.store(amax_ptr + u, amax, mask=u_ok)
    tl.store(flag_ptr + u, (2 * nf + isnan).to(tl.int8), mask=u_ok)
    if MINMAX:
        # keys of the finite min (`_lo_key`, int64) and max (ordered float bits); the host
        # reduces a tile's chunks with min / max
        fin = finite & intile
        pos = _tile_pos(_q, TILE, 1, TILE)
        lo = tl.min(tl.min(_lo_key(xb, pos, fin), axis=2), axis=1)
        hi = tl.max(tl.max(tl.where(fin, _okey(xb), -0x7FFFFFFF - 1), axis=2), axis=1)
        tl.store(lo_ptr + u, lo, mask=u_ok)
        tl.store(hi_ptr + u, hi, mask=u_ok)


@triton.jit(
    do_not_specialize=[
        "n_units",
        "n_chunks",
        "C",
        "TC",
        "inner",
        "nC",
        "sub_cols",
        "code_mask",
        "c_shift",
        "s_bias",
        "s_nan",
        "s_mask",
        "z_mask",
        "z_shift",
        "d_bits",
        "d_mbits",
        "d_emin",
        "d_inf",
        "d_nan",
        "d_uznan",
        "bf16",
    ]
)
def _dequant_kernel(
    code_ptr,
    y_ptr,
    scale_ptr,
    meta_ptr,
    zero_ptr,
    tab_ptr,
    stab_ptr,
    ztab_ptr,
    ts_ptr,
    n_units,
    n_chunks,
    C,
    TC,
    inner,
    nC,
    sub_cols,
    code_mask,
    c_shift,
    s_bias,
    s_nan,
    s_mask,
    z_mask,
    z_shift,
    d_bits,
    d_mbits,
    d_emin,
    d_inf,
    d_nan,
    d_uznan,
    bf16,
    HALF: tl.constexpr,
    LAST: tl.constexpr,
    TILE: tl.constexpr,
    NSUB: tl.constexpr,
    SUB: tl.constexpr,
    BT: tl.constexpr,
    SKIND: tl.constexpr,
    SHIFT: tl.constexpr,
    WIDE: tl.constexpr,  # no table: codes over 16 bits, or floats with values outside float32
    S_F32: tl.constexpr,
    TS: tl.constexpr,
):
    pid = tl.program_id(0)
    u_ok, inst, q, j, o, i, off, ok, _intile = _unit_offsets(
        pid, n_units, n_chunks, C, TC, inner, nC, LAST, TILE, NSUB, SUB, BT
    )
    c = tl.load(code_ptr + off, mask=ok, other=0).to(tl.int32) & code_mask
    if WIDE:
        # the exact value n * 2^s and its sign: float fields (c_shift -1), unsigned ints (-2)
        # or ints sign-extended from 32 - c_shift bits (|-2^31| wraps: `_make_f32` reads n
        # unsigned); rounded to float32 once, as numpy's decode then astype
        fn, fs, fneg, special = _float_fields(c, d_bits, d_mbits, d_emin, d_inf, d_nan, d_uznan)
        si = (c << tl.maximum(c_shift, 0)) >> tl.maximum(c_shift, 0)
        isf = c_shift == -1
        wn = tl.where(isf, fn, tl.where(c_shift == -2, c, tl.abs(si)))
        ws = tl.where(isf, fs, 0)
        wneg = tl.where(isf, fneg, (si < 0) & (c_shift >= 0)).to(tl.int32) << 31
        special = tl.where(isf, special, 0)
        qb = tl.where(special != 0, special, _make_f32(wn, ws) | wneg)
    else:
        qb = tl.load(tab_ptr + c, mask=ok, other=0)
    tile_nan = ok & False
    if SKIND == 0:
        yb = qb
    elif SKIND == 1:
        sc = tl.load(scale_ptr + inst, mask=u_ok, other=0).to(tl.int32) & s_mask
        nan_t = sc == s_nan
        k3 = tl.where(nan_t, 0, sc - s_bias)[:, None, None]
        if SHIFT:
            moff, mok = _meta_offsets(u_ok, q, j, o, i, TC, sub_cols, inner, LAST, TILE, NSUB, SUB)
            sh = tl.load(meta_ptr + moff, mask=mok, other=0)
            k3 = k3 - sh.to(tl.int32)[:, :, None]
        if WIDE:
            # q * 2^k rounded once from the exact q (float32(q) may have rounded already)
            yb = tl.where(special != 0, special, _make_f32(wn, ws + k3) | wneg)
        else:
            yb = _ldexp_bits(qb, k3)
        tile_nan = tile_nan | nan_t[:, None, None]
    else:
        sc = tl.load(scale_ptr + inst, mask=u_ok, other=0).to(tl.int32)
        if S_F32:
            scb = sc
        else:
            scb = tl.load(stab_ptr + (sc & s_mask), mask=u_ok, other=0)
        scf = scb.to(tl.float32, bitcast=True)
        if TS:
            eff = scf * tl.load(ts_ptr)
        else:
            eff = scf
        eff3 = eff[:, None, None]
        qf = qb.to(tl.float32, bitcast=True)
        if SKIND == 2:
            yb = (qf * eff3).to(tl.int32, bitcast=True)
            qinf = (qb & 0x7FFFFFFF) == 0x7F800000
            yb = tl.where(qinf & (eff3 == 0), 0x7FC00000, yb)  # Inf * 0: the canonical NaN
            yb = tl.where((qb & 0x7FFFFFFF) > 0x7F800000, 0x7FC00000, yb)
        else:
            zc = tl.load(zero_ptr + inst, mask=u_ok, other=0).to(tl.int32) & z_mask
            if SKIND == 3:
                # the exact difference of the (uint) code and the int zero point, rounded once
                # (the reference's float64 q - zp): either may be over 2^24
                if WIDE:
                    qi = c.to(tl.uint32, bitcast=True).to(tl.int64)
                else:
                    qi = qf.to(tl.int64)
                zi = _zero_int(zc, ztab_ptr, u_ok, z_shift)
                d = (qi - zi[:, None, None]).to(tl.float32)
                yb = (d * eff3).to(tl.int32, bitcast=True)
            else:
                zf = _zero_value(zc, ztab_ptr, u_ok, z_shift)
                yb = (qf * eff3 + zf[:, None, None]).to(tl.int32, bitcast=True)
        tile_nan = tile_nan | ((scb & 0x7FFFFFFF) > 0x7F800000)[:, None, None]
    _store_values(y_ptr, off, ok, yb, ok & False, tile_nan, HALF, bf16)


@triton.jit
def _zero_value(zc, ztab_ptr, u_ok, z_shift):
    # A zero-point code's float32 value: through the decode table (z_shift -2, codes up to 16
    # bits), as float32 bits (-1), an unsigned int (-3) or a signed int sign-extended from
    # 32 - z_shift bits (>= 0); ints are rounded to float32 as numpy's decode then astype
    tab = tl.load(ztab_ptr + zc, mask=u_ok & (z_shift == -2), other=0)
    sh = tl.maximum(z_shift, 0)
    signed = ((zc << sh) >> sh).to(tl.float32).to(tl.int32, bitcast=True)
    unsigned = zc.to(tl.uint32, bitcast=True).to(tl.float32).to(tl.int32, bitcast=True)
    zb = tl.where(z_shift >= 0, signed, tl.where(z_shift == -3, unsigned, zc))
    return tl.where(z_shift == -2, tab, zb).to(tl.float32, bitcast=True)


@triton.jit
def _zero_int(zc, ztab_ptr, u_ok, z_shift):
    # An int zero-point code's exact value (int64): `_zero_value`'s decodes without rounding
    tab = tl.load(ztab_ptr + zc, mask=u_ok & (z_shift == -2), other=0)
    tab = tab.to(tl.float32, bitcast=True).to(tl.int64)  # up to 16 bits: exact
    sh = tl.maximum(z_shift, 0)
    signed = ((zc << sh) >> sh).to(tl.int64)
    unsigned = zc.to(tl.uint32, bitcast=True).to(tl.int64)
    return tl.where(z_shift == -2, tab, tl.where(z_shift >= 0, signed, unsigned))


@triton.jit(do_not_specialize=["n_groups", "L", "inner", "ng_l", "n_keep", "bf16"])
def _prune_kernel(
    x_ptr,
    y_ptr,
    mask_ptr,
    n_groups,
    L,
    inner,
    ng_l,
    n_keep,
    bf16,
    HALF: tl.constexpr,
    M: tl.constexpr,
    BG: tl.constexpr,
):
    # N:M sparsity (reference `_prune`): keep the n_keep largest magnitudes of each group of M
    # along a dim of length L (stride inner); NaN counts as Inf, ties keep the lower index,
    # positions past the end count as -1. Writes the pruned input and the keep mask.
    g = tl.program_id(0).to(tl.int64) * BG + tl.arange(0, BG).to(tl.int64)
    g_ok = g < n_groups
    i = g % inner
    t = g // inner
    gl = t % ng_l
    o = t // ng_l
    k = tl.arange(0, M)
    pos = gl[:, None] * M + k[None, :]
    ok = g_ok[:, None] & (pos < L)
    off = o[:, None] * L * inner + pos * inner + i[:, None]
    xb, raw = _load_any(x_ptr, off, ok, HALF, bf16)
    ab = xb & 0x7FFFFFFF
    key = tl.where(ok, tl.minimum(ab, 0x7F800000), -1)
    kk = key[:, :, None]  # this element
    kj = key[:, None, :]  # the others of its group
    earlier = (k[None, :] < k[:, None])[None, :, :]
    beats = (kj > kk) | ((kj == kk) & earlier)
    keep = tl.sum(beats.to(tl.int32), axis=2) < n_keep
    tl.store(y_ptr + off, tl.where(keep, raw, 0).to(raw.dtype), mask=ok)
    tl.store(mask_ptr + off, keep.to(tl.uint8), mask=ok)
