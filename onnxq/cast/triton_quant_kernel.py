"""The general Triton engine's quantize kernel, in named phases.

`_quant_kernel`: tile statistics (or precomputed ones), the scale (exponent, float, float
with a tensor scale, float with an int or float zero point), element rounding, values
(virtual), element codes, scale and zero-point codes, MX shift bits, the tensor-scale code.
Each phase is a `@triton.jit` helper (Triton inlines it): the arithmetic and its order are the
ones of the reference, floating-point operations only where it computes in float32.
"""

# Kernel constexprs are upper case (Triton's convention), runtime format numbers lower case; tile
# geometry keeps layout.py's names (C, TC, nC).
# ruff: noqa: N803

import triton
import triton.language as tl

from onnxq.cast.triton_device import (
    _finite_clamp,
    _float_code,
    _float_reach,
    _int_below,
    _int_product_bound,
    _int_reach,
    _lo_bits,
    _lo_key,
    _load_any,
    _make_f32,
    _meta_offsets,
    _okey,
    _overflow,
    _quant_elem,
    _rand24,
    _scale_exp_t,
    _store_values,
    _tile_pos,
    _unit_offsets,
)


# -- phases of the quantize kernel (in the order the kernel runs them) ---------------------------
@triton.jit
def _rand_bits(off, ok, idx_ptr, key, STOCH: tl.constexpr, IDX: tl.constexpr):
    # 24 stochastic-rounding bits per element, from its flat index in the input
    rand = off.to(tl.int32) * 0
    if STOCH:
        if IDX:
            rand = _rand24(tl.load(idx_ptr + off, mask=ok, other=0), key)
        else:
            rand = _rand24(off, key)
    return rand


@triton.jit
def _tile_stats(
    xb,
    ok,
    u_ok,
    inst,
    amax_ptr,
    flag_ptr,
    nan_nf,
    nan_nan,
    PRE: tl.constexpr,
    SKIND: tl.constexpr,
    E_FLOAT: tl.constexpr,
):
    # The tiles' finite absmax bits, their subtiles' (MX shift bits), whether the NaN policy
    # turns a whole tile to NaN (per tile and per lane) and the NaN lanes of the other tiles.
    # PRE: absmax and flags from `_stats_kernel`. Unscaled formats have no statistics.
    tnan = u_ok & False
    if SKIND == 0:
        amax_b = tnan
        sub_max = tnan
    else:
        ab = xb & 0x7FFFFFFF
        finite = ab < 0x7F800000
        sub_max = tl.max(tl.where(finite, ab, 0), axis=2)
        if PRE:
            amax_b = tl.load(amax_ptr + inst, mask=u_ok, other=0)
            flags = tl.load(flag_ptr + inst, mask=u_ok, other=0).to(tl.int32)
            any_nf = flags >= 2
            any_nan = flags == 3
        else:
            amax_b = tl.max(sub_max, axis=1)
            nf3 = (~finite).to(tl.int32)
            any_nf = tl.max(tl.max(nf3, axis=2), axis=1) > 0
            any_nan = tl.max(tl.max((ab > 0x7F800000).to(tl.int32), axis=2), axis=1) > 0
        tnan = tnan | (any_nf & (nan_nf != 0)) | (any_nan & (nan_nan != 0))
    tile_nan = ok & tnan[:, None, None]
    return amax_b, sub_max, tnan, tile_nan, _elem_nan(xb, tile_nan, E_FLOAT)


@triton.jit
def _elem_nan(xb, tile_nan, E_FLOAT: tl.constexpr):
    # NaN elements of a tile that is not NaN as a whole (only float elements encode NaN)
    elem_nan = (xb & 0x7FFFFFFF) > 0x7F800000
    if E_FLOAT:
        elem_nan = elem_nan & ~tile_nan
    else:
        elem_nan = elem_nan & False
    return elem_nan


@triton.jit
def _zero_range(xb, intile, pos, inst, u_ok, lo_ptr, hi_ptr, PRE: tl.constexpr):
    # float32 bits of the tiles' finite minimum and maximum (0 when there is none); PRE: the
    # statistics pass's keys (`_lo_key` minima and ordered-key maxima)
    if PRE:
        lo_k = tl.load(lo_ptr + inst, mask=u_ok, other=0x7FFFFFFFFFFFFFFF)
        hi_k = tl.load(hi_ptr + inst, mask=u_ok, other=0)
    else:
        fin = ((xb & 0x7FFFFFFF) < 0x7F800000) & intile
        lo_k = tl.min(tl.min(_lo_key(xb, pos, fin), axis=2), axis=1)
        hi_k = tl.max(tl.max(tl.where(fin, _okey(xb), -0x7FFFFFFF - 1), axis=2), axis=1)
    lo_b = _lo_bits(lo_k)
    hi_b = tl.where(hi_k == -0x7FFFFFFF - 1, 0, _okey(hi_k))
    return lo_b, hi_b


@triton.jit
def _raw_scale(
    xb,
    intile,
    pos,
    inst,
    u_ok,
    amax_b,
    lo_ptr,
    hi_ptr,
    el_maxf,
    zfmt,
    PRE: tl.constexpr,
    SKIND: tl.constexpr,
):
    # The float scale before rounding (reference `_float_scaled` / `_zero_point_scaled`): amax /
    # maxfloat, or the span of a zero-point tile; and the zero point: (lo,) for ints (SKIND 3),
    # (zn, zs, zsgn, zf) for floats (SKIND 4)
    if SKIND == 2:
        amax_f = amax_b.to(tl.float32, bitcast=True)
        raw_s = tl.div_rn(amax_f, tl.zeros_like(amax_f) + el_maxf)
        zpt = ()
    else:
        # zero point: the scale spans [min, max] of the finite values (with 0 for ints)
        lo_b, hi_b = _zero_range(xb, intile, pos, inst, u_ok, lo_ptr, hi_ptr, PRE)
        lo = lo_b.to(tl.float32, bitcast=True)
        hi = hi_b.to(tl.float32, bitcast=True)
        if SKIND == 3:
            # np.minimum(lo, 0) / np.maximum(hi, 0): ties (+-0) take the later 0, which a
            # GPU's min / max need not do
            lo = tl.where(lo < 0.0, lo, 0.0)
            hi = tl.where(hi > 0.0, hi, 0.0)
            raw_s = tl.div_rn(hi - lo, tl.zeros_like(hi) + el_maxf)
            zpt = (lo,)
        else:
            z_mbits, z_emin, z_emax, z_maxm, _z_bits, z_negzero = zfmt
            zn, zs = _quant_elem(lo_b, 0, 0, True, z_mbits, z_emin, z_emax, z_maxm, 0, 0, False)
            zsgn = (lo_b < 0) & ((zn != 0) | (z_negzero != 0))
            zf = (_make_f32(zn, zs) | (zsgn.to(tl.int32) << 31)).to(tl.float32, bitcast=True)
            d = tl.div_rn(hi - zf, tl.zeros_like(hi) + el_maxf)
            raw_s = tl.where(d > 0, d, 0.0)
            zpt = (zn, zs, zsgn, zf)
    return raw_s, zpt


@triton.jit
def _scale_code(
    raw_s,
    tnan,
    inst,
    first,
    scale_ptr,
    top_ptr,
    ts_code_ptr,
    ts_denom,
    sfmt,
    tfmt,
    TS: tl.constexpr,
):
    # Round the float scale to its format (after dividing by the tensor scale, TS), step it
    # by ``s_step`` codes (scale search's candidates), and store its code (NaN tiles: the NaN
    # code) and the tensor scale's; returns the scale and the effective one each element is
    # divided by
    s_mbits, s_emin, s_emax, s_maxm, s_nan, s_step = sfmt
    if TS:
        t_mbits, t_emin, t_emax, t_maxm = tfmt
        top = tl.load(top_ptr)
        tsr = tl.div_rn(top, tl.zeros_like(top) + ts_denom)
        tsr = tsr.to(tl.int32, bitcast=True)
        tn, tsx = _quant_elem(tsr, 0, 0, True, t_mbits, t_emin, t_emax, t_maxm, 0, 0, False)
        ts = _make_f32(tn, tsx).to(tl.float32, bitcast=True)
        raw_s = tl.where(ts > 0, tl.div_rn(raw_s, tl.broadcast_to(ts, raw_s.shape)), 0.0)
        tl.store(ts_code_ptr, _float_code(tn, tsx, t_mbits, t_emin), mask=tl.program_id(0) == 0)
    rb = raw_s.to(tl.int32, bitcast=True)
    sn, ssx = _quant_elem(rb, 0, 0, True, s_mbits, s_emin, s_emax, s_maxm, 0, 0, False)
    if s_step != 0:
        sn, ssx = _scale_step(sn, ssx, s_step, s_mbits, s_emin, s_emax, s_maxm)
    sc = _make_f32(sn, ssx).to(tl.float32, bitcast=True)
    scode = tl.where(tnan, s_nan, _float_code(sn, ssx, s_mbits, s_emin))
    if TS:
        eff = sc * ts
    else:
        eff = sc
    tl.store(scale_ptr + inst, scode.to(scale_ptr.dtype.element_ty), mask=first)
    return sc, eff[:, None, None]


@triton.jit
def _scale_step(sn, ssx, s_step, s_mbits, s_emin, s_emax, s_maxm):
    # scale_search.float_step: the grid's neighbour (positive float codes are in value order:
    # one code) or float32's, the farther (where the grid is finer than float32's, the next
    # float32 number is on it); from 0 up to the largest value float32 holds (s_maxm at
    # s_emax: the final `_quant_elem` saturates there). Positive float32 bits order as
    # their values.
    top_code = _float_code(s_maxm, s_emax - s_mbits, s_mbits, s_emin)
    c = tl.minimum(tl.maximum(_float_code(sn, ssx, s_mbits, s_emin) + s_step, 0), top_code)
    E = c >> s_mbits
    m = c & ((1 << s_mbits) - 1)
    gn = tl.where(E == 0, m, m + (1 << s_mbits))
    grid = _make_f32(gn, tl.where(E == 0, s_emin, s_emin + E - 1) - s_mbits)
    near = tl.maximum(_make_f32(sn, ssx) + s_step, 0)
    bits = tl.where(s_step > 0, tl.maximum(grid, near), tl.minimum(grid, near))
    # back to the grid (exact: the value is on it)
    return _quant_elem(bits, 0, 0, True, s_mbits, s_emin, s_emax, s_maxm, 0, 0, False)


@triton.jit
def _elem_code(xb, n, s, sgn, vneg, elem_nan, efmt, keep_inf, E_FLOAT: tl.constexpr):
    # the element code of magnitude n * 2^s (sign: sgn for floats, vneg for ints); NaN and
    # (unscaled formats that have one) Inf inputs keep their codes
    e_mbits, e_emin, _e_emax, _e_maxm, e_bits, _e_negzero, e_nancode, e_infcode = efmt
    if E_FLOAT:
        code = _float_code(n, s, e_mbits, e_emin) | (sgn.to(tl.int32) << (e_bits - 1))
        infc = e_infcode | (vneg.to(tl.int32) << (e_bits - 1))
        code = tl.where(((xb & 0x7FFFFFFF) == 0x7F800000) & (keep_inf != 0), infc, code)
        code = tl.where(elem_nan, e_nancode, code)
    else:
        code = tl.where(vneg, -n, n) & ((2 << (e_bits - 1)) - 1)  # (no shift by 32)
    return code


@triton.jit
def _float_elems(
    xb, eff3, rand, elem_nan, efmt, mode, fin, E_FLOAT: tl.constexpr, STOCH: tl.constexpr
):
    # Float scale, no zero point: v = x / scale rounded onto the element grid (a zero scale
    # zeroes v, but NaN stays NaN: reference._float_scaled); returns the values' bits and codes
    e_mbits, e_emin, e_emax, e_maxm, _e_bits, e_negzero, _e_nancode, _e_infcode = efmt
    rmode, full_int, keep_inf = mode
    _f_over, _f_max, f_emax, f_mbits = fin
    xf = xb.to(tl.float32, bitcast=True)
    v = tl.where(eff3 > 0, tl.div_rn(xf, tl.broadcast_to(eff3, xf.shape)), 0.0)
    vb = v.to(tl.int32, bitcast=True)
    n, s = _quant_elem(
        vb, 0, rand, E_FLOAT, e_mbits, e_emin, e_emax, e_maxm, rmode, full_int, STOCH
    )
    vneg = vb < 0
    # products that round past the data type's range step down (reference `_product_bound`)
    if E_FLOAT:
        nb, sb = _float_reach(eff3, e_maxm, e_emax, e_mbits, e_emin, f_emax, f_mbits)
        over = ((s > sb) | ((s == sb) & (n > nb))) & (n != 0)
        n = tl.where(over, nb, n)
        s = tl.where(over, sb, s)
    else:  # ints up to 32 bits: float32(n) may round, so no step of one would do
        n = _int_product_bound(n, eff3, e_maxm, full_int, f_emax, f_mbits)
    sgn = vneg & ((n != 0) | (e_negzero != 0))
    qb = _make_f32(n, s) | (sgn.to(tl.int32) << 31)
    yb = (qb.to(tl.float32, bitcast=True) * eff3).to(tl.int32, bitcast=True)
    return yb, _elem_code(xb, n, s, sgn, vneg, elem_nan, efmt, keep_inf, E_FLOAT)


@triton.jit
def _int_zero_bound(n, zp, sc, e_maxm, f_emax, f_mbits):
    # Int zero point: decoded values past the data type's range move toward the zero point
    # (reference `_product_bound`): |q - zp| <= `_int_reach` of the tile's scale
    top = e_maxm.to(tl.float64)
    reach = _int_reach(sc.to(tl.float64), top, f_emax, f_mbits)
    zpf = zp.to(tl.float64)
    q_lo = tl.maximum(zpf - reach, 0.0).to(tl.int64)[:, None, None]
    q_hi = tl.minimum(zpf + reach, top).to(tl.int64)[:, None, None]
    return tl.minimum(tl.maximum(n, q_lo), q_hi)


@triton.jit
def _float_zero_top(n, sc, zf, e_maxm, f_over, f_emax, f_mbits):
    # Float zero point (reference `_zero_float_top`): q <= floor((over - z) / sc) + 1, in
    # float64 (`_overflow`), then up to three steps down to the float32 number below
    # float32(q), each checked with the decoder's float32 arithmetic (f_over: the float32
    # values from which the type overflows; Inf for float32)
    top = e_maxm.to(tl.float64)
    s64 = sc.to(tl.float64)
    room = _overflow(f_emax, f_mbits) - zf.to(tl.float64)
    t = tl.floor(room / tl.where(s64 > 0, s64, 1.0)) + 1.0
    q = tl.where(s64 > 0, tl.minimum(tl.maximum(t, 0.0), top), top)
    for _step in tl.static_range(3):
        qf = q.to(tl.float32)
        below = _int_below(tl.maximum(qf, 1.0).to(tl.float64))
        q = tl.where((tl.abs(qf * sc + zf) >= f_over) & (q > 0), below, q)
    return tl.minimum(n, q.to(tl.int64)[:, None, None])


@triton.jit
def _round_cap(vb, rand, rmode, maxm, STOCH: tl.constexpr):
    # |round(v)| of the float32 bits vb as int64, capped at maxm (up to uint32's 2^32 - 1):
    # the int rounding below 2^24; above, v is an integer already (NaN lanes: overwritten)
    small, _s = _quant_elem(vb, 0, rand, False, 0, 0, 0, 1 << 24, rmode, 0, STOCH)
    av = (vb & 0x7FFFFFFF).to(tl.float32, bitcast=True)
    big = tl.minimum(av, 4294967296.0).to(tl.int64)
    return tl.minimum(tl.where(av >= 16777216.0, big, small.to(tl.int64)), maxm)


@triton.jit
def _zero_elems(
    xb,
    sc,
    eff3,
    rand,
    zpt,
    zfmt,
    efmt,
    mode,
    fin,
    zero_ptr,
    inst,
    first,
    STOCH: tl.constexpr,
    SKIND: tl.constexpr,
):
    # Zero point (uint elements): q = clip(round(v) [+ zp], 0, qmax) (reference
    # `_zero_point_scaled`); stores the zero-point code, returns the values' bits and the codes
    z_mbits, z_emin, _z_emax, _z_maxm, z_bits, _z_negzero = zfmt
    e_maxm = efmt[3].to(tl.int64)  # (uint32's 2^32 - 1 arrives as a uint32)
    rmode, _full_int, _keep_inf = mode
    f_over, _f_max, f_emax, f_mbits = fin
    xf = xb.to(tl.float32, bitcast=True)
    if SKIND == 3:
        (lo,) = zpt
        z = tl.where(sc > 0, tl.div_rn(-lo, sc), 0.0).to(tl.int32, bitcast=True)
        zp = _round_cap(z, 0, 0, e_maxm, False)
        zcode = zp
        num = xf
    else:
        zn, zs, zsgn, zf = zpt
        zcode = _float_code(zn, zs, z_mbits, z_emin) | (zsgn.to(tl.int32) << (z_bits - 1))
        zp = zn.to(tl.int64) * 0
        num = xf - zf[:, None, None]
    v = tl.where(eff3 > 0, tl.div_rn(num, tl.broadcast_to(eff3, xf.shape)), 0.0)
    vb = v.to(tl.int32, bitcast=True)
    # |round(v)|, capped at qmax (beyond, the clip gives the same either way); int64 from
    # here, as uint32's codes reach 2^32 - 1
    rn = _round_cap(vb, rand, rmode, e_maxm, STOCH)
    zp3 = zp[:, None, None]
    n = tl.minimum(tl.maximum(tl.where(vb < 0, -rn, rn) + zp3, 0), e_maxm)
    # decoded values past the data type's range move toward the zero point
    if SKIND == 3:
        n = _int_zero_bound(n, zp, sc, e_maxm, f_emax, f_mbits)
    else:
        n = _float_zero_top(n, sc, zf, e_maxm, f_over, f_emax, f_mbits)
    qf = (n - zp3).to(tl.float32)
    if SKIND == 3:
        yb = (qf * eff3).to(tl.int32, bitcast=True)
    else:
        # a negative v that rounds to 0 is -0 in the reference (its clip keeps it), so a -0
        # zero point decodes it to -0, not +0
        negz = ((vb < 0) & (rn == 0)).to(tl.int32) << 31
        qf = (qf.to(tl.int32, bitcast=True) | negz).to(tl.float32, bitcast=True)
        yb = (qf * eff3 + zf[:, None, None]).to(tl.int32, bitcast=True)
    tl.store(zero_ptr + inst, zcode.to(zero_ptr.dtype.element_ty), mask=first)
    return yb, n


@triton.jit
def _exp_scale(
    off,
    amax_b,
    sub_max,
    tnan,
    expo,
    scale_ptr,
    inst,
    first,
    SHIFT: tl.constexpr,
    SKIND: tl.constexpr,
):
    # Exponent scale (SKIND 1): the tile's E8M0 exponent, lowered by one in MX subtiles that are
    # shifted (`below`); stores the scale code (NaN tiles: the NaN code). Unscaled: 2^0.
    bump_t, e_emax, s_low, s_high, s_bias, s_nan = expo
    below = tnan & False  # no subtile is shifted
    if SKIND == 1:
        sexp, maxexp = _scale_exp_t(amax_b, bump_t, e_emax, s_low, s_high)
        sexp3 = sexp[:, None, None]
        if SHIFT:
            # MX: a subtile is shifted when all of it is below 2^floor(log2 amax)
            p2 = tl.where(
                maxexp >= -126,
                (maxexp + 127) << 23,
                1 << tl.minimum(tl.maximum(maxexp + 149, 0), 30),
            )
            below = (sub_max < p2[:, None]) & (amax_b[:, None] != 0)
            sexp3 = sexp3 - below[:, :, None].to(tl.int32)
        scode = tl.where(tnan, s_nan, sexp + s_bias)
        tl.store(scale_ptr + inst, scode.to(scale_ptr.dtype.element_ty), mask=first)
    else:
        sexp3 = off.to(tl.int32) * 0
    return sexp3, below


@triton.jit
def _exp_elems(
    xb,
    sexp3,
    rand,
    elem_nan,
    efmt,
    mode,
    f_emax,
    f_mbits,
    E_FLOAT: tl.constexpr,
    STOCH: tl.constexpr,
):
    # Exponent scale or none: round x * 2^-sexp onto the element grid, bounded by the data
    # type's largest finite value; unscaled formats with Inf keep it. Values' bits and codes.
    e_mbits, e_emin, e_emax, e_maxm, _e_bits, e_negzero, _e_nancode, _e_infcode = efmt
    rmode, full_int, keep_inf = mode
    n, s = _quant_elem(
        xb, sexp3, rand, E_FLOAT, e_mbits, e_emin, e_emax, e_maxm, rmode, full_int, STOCH
    )
    n, s = _finite_clamp(n, s, sexp3, E_FLOAT, e_mbits, e_emax, e_maxm, f_emax, f_mbits)
    neg = xb < 0
    sgn = neg & ((n != 0) | (e_negzero != 0))
    yb = _make_f32(n, s + sexp3) | (sgn.to(tl.int32) << 31)
    yb = tl.where(((xb & 0x7FFFFFFF) == 0x7F800000) & (keep_inf != 0), xb, yb)
    return yb, _elem_code(xb, n, s, sgn, neg, elem_nan, efmt, keep_inf, E_FLOAT)


# -- the kernel ----------------------------------------------------------------------------------
# Format numbers are runtime arguments (one compile serves every format of a kind);
# Triton would still specialise ints equal to 1 or divisible by 16, hence do_not_specialize.
_QUANT_RUNTIME = [
    "n_units",
    "n_chunks",
    "C",
    "TC",
    "inner",
    "nC",
    "sub_cols",
    "key",
    "bf16",
    "want_y",
    "want_codes",
    "rmode",
    "nan_nf",
    "nan_nan",
    "full_int",
    "keep_inf",
    "e_mbits",
    "e_emin",
    "e_emax",
    "e_maxm",
    "e_bits",
    "e_negzero",
    "e_nancode",
    "e_infcode",
    "bump_t",
    "s_low",
    "s_high",
    "s_bias",
    "s_nan",
    "s_step",
    "s_mbits",
    "s_emin",
    "s_emax",
    "s_maxm",
    "t_mbits",
    "t_emin",
    "t_emax",
    "t_maxm",
    "z_mbits",
    "z_emin",
    "z_emax",
    "z_maxm",
    "z_bits",
    "z_negzero",
    "f_emax",
    "f_mbits",
]


# One program casts BT tile instances (or chunks of long ones): its phases above, in order.
# Values and codes share one compile (virtual and actual casts): unwanted stores are masked.
@triton.jit(do_not_specialize=_QUANT_RUNTIME)
def _quant_kernel(
    x_ptr,
    y_ptr,
    code_ptr,
    scale_ptr,
    meta_ptr,
    zero_ptr,
    amax_ptr,
    flag_ptr,
    lo_ptr,
    hi_ptr,
    top_ptr,
    ts_code_ptr,
    idx_ptr,
    n_units,
    n_chunks,
    C,
    TC,
    inner,
    nC,
    sub_cols,
    key,
    bf16,
    want_y,
    want_codes,
    rmode,
    nan_nf,
    nan_nan,
    full_int,
    keep_inf,
    e_mbits,
    e_emin,
    e_emax,
    e_maxm,
    e_bits,
    e_negzero,
    e_nancode,
    e_infcode,
    bump_t,
    s_low,
    s_high,
    s_bias,
    s_nan,
    s_step,
    el_maxf,
    s_mbits,
    s_emin,
    s_emax,
    s_maxm,
    ts_denom,
    t_mbits,
    t_emin,
    t_emax,
    t_maxm,
    z_mbits,
    z_emin,
    z_emax,
    z_maxm,
    z_bits,
    z_negzero,
    f_emax,
    f_mbits,
    f_over,
    f_max,
    HALF: tl.constexpr,
    PRE: tl.constexpr,
    LAST: tl.constexpr,
    TILE: tl.constexpr,
    NSUB: tl.constexpr,
    SUB: tl.constexpr,
    BT: tl.constexpr,
    SKIND: tl.constexpr,  # 0 none, 1 exponent, 2 float (TS: tensor scale), 3/4 int/float zero
    SHIFT: tl.constexpr,
    STOCH: tl.constexpr,
    E_FLOAT: tl.constexpr,
    TS: tl.constexpr,
    IDX: tl.constexpr,  # stochastic index from idx_ptr (2-D tiles: rows of a copy)
):
    u_ok, inst, q, j, o, i, off, ok, intile = _unit_offsets(
        tl.program_id(0), n_units, n_chunks, C, TC, inner, nC, LAST, TILE, NSUB, SUB, BT
    )
    xb, _raw = _load_any(x_ptr, off, ok, HALF, bf16)
    rand = _rand_bits(off, ok, idx_ptr, key, STOCH, IDX)
    efmt = (e_mbits, e_emin, e_emax, e_maxm, e_bits, e_negzero, e_nancode, e_infcode)
    mode, tfmt = (rmode, full_int, keep_inf), (t_mbits, t_emin, t_emax, t_maxm)
    first = u_ok & (q == 0) & (want_codes != 0)  # the lanes that store a tile's scale
    amax_b, sub_max, tnan, tile_nan, elem_nan = _tile_stats(
        xb, ok, u_ok, inst, amax_ptr, flag_ptr, nan_nf, nan_nan, PRE, SKIND, E_FLOAT
    )
    if SKIND >= 2:
        zfmt = (z_mbits, z_emin, z_emax, z_maxm, z_bits, z_negzero)
        pos = _tile_pos(q, TILE, NSUB, SUB)
        raw_s, zpt = _raw_scale(
            xb, intile, pos, inst, u_ok, amax_b, lo_ptr, hi_ptr, el_maxf, zfmt, PRE, SKIND
        )
        sfmt = (s_mbits, s_emin, s_emax, s_maxm, s_nan, s_step)
        sc, eff3 = _scale_code(
            raw_s, tnan, inst, first, scale_ptr, top_ptr, ts_code_ptr, ts_denom, sfmt, tfmt, TS
        )
        fin = (f_over, f_max, f_emax, f_mbits)
        if SKIND == 2:
            yb, code = _float_elems(xb, eff3, rand, elem_nan, efmt, mode, fin, E_FLOAT, STOCH)
        else:
            yb, code = _zero_elems(
                xb, sc, eff3, rand, zpt, zfmt, efmt, mode, fin, zero_ptr, inst, first, STOCH, SKIND
            )
    else:
        expo = (bump_t, e_emax - s_step, s_low, s_high, s_bias, s_nan)  # search: s_step up
        sexp3, below = _exp_scale(
            off, amax_b, sub_max, tnan, expo, scale_ptr, inst, first, SHIFT, SKIND
        )
        yb, code = _exp_elems(
            xb, sexp3, rand, elem_nan, efmt, mode, f_emax, f_mbits, E_FLOAT, STOCH
        )
    _store_values(y_ptr, off, ok & (want_y != 0), yb, elem_nan, tile_nan, HALF, bf16)
    code = tl.where(tile_nan, 0, code)
    tl.store(code_ptr + off, code.to(code_ptr.dtype.element_ty), mask=ok & (want_codes != 0))
    if SHIFT:
        moff, mok = _meta_offsets(u_ok, q, j, o, i, TC, sub_cols, inner, LAST, TILE, NSUB, SUB)
        tl.store(meta_ptr + moff, below.to(tl.uint8), mask=mok & (want_codes != 0))
