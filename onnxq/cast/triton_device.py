"""Device helpers shared by the Triton kernels (`@triton.jit`, inlined where called).

Element rounding is integer arithmetic on the float32 bits (never a float8 conversion, whose
rounding and saturation differ), with the reference's stochastic rule; tile offsets follow
layout.py's geometry; loads widen 16-bit data exactly and stores write the canonical NaN.
"""

# Kernel constexprs are upper case (Triton's convention), runtime format numbers lower case; tile
# geometry keeps layout.py's names (C, TC, nC).
# ruff: noqa: N803

import triton
import triton.language as tl


@triton.jit
def _ilog2(n):
    # floor(log2 n) for 1 <= n <= 2^24: the exponent of n's float32 value (exact conversion)
    f = n.to(tl.float32).to(tl.int32, bitcast=True)
    return ((f >> 23) & 0xFF) - 127


@triton.jit
def _mix32(x):
    x = x ^ (x >> 16)
    x = x * 0x7FEB352D
    x = x ^ (x >> 15)
    x = x * 0x846CA68B
    return x ^ (x >> 16)


@triton.jit
def _rand24(idx, key):
    # 24 random bits of (seed, flat index): elements.py `stochastic_bits`
    lo = (idx & 0xFFFFFFFF).to(tl.uint32)
    hi = (idx >> 32).to(tl.uint32)
    h = _mix32(lo ^ _mix32(hi ^ key.to(tl.uint32)))
    return (h >> 8).to(tl.int32)


@triton.jit
def _round_bits(M, sh, rand, rmode, STOCH: tl.constexpr):
    # round(M / 2^sh) for 0 <= M < 2^25 (sh <= 0: exact left shift); shifts clamped: no UB.
    # rmode (runtime) 0 even, 1 away, 2 zero; STOCH: the reference's stochastic rule.
    shr = tl.minimum(tl.maximum(sh, 0), 30)
    shl = tl.minimum(tl.maximum(-sh, 0), 30)
    fl = M >> shr
    rem = M - (fl << shr)
    half = 1 << tl.maximum(shr - 1, 0)
    if STOCH:
        # floor(frac * 2^24) with frac = rem / 2^sh, exactly
        thr = tl.where(
            sh <= 24,
            rem << tl.maximum(24 - shr, 0),
            rem >> tl.minimum(tl.maximum(sh - 24, 0), 30),
        )
        up = rand < thr
    else:
        tie_up = (((fl & 1) == 1) & (rmode == 0)) | (rmode == 1)
        up = (rem > half) | ((rem == half) & tie_up)
    return tl.where(sh > 0, fl + up.to(tl.int32), M << shl)


@triton.jit
def _quant_elem(
    xb,
    sexp,
    rand,
    IS_FLOAT: tl.constexpr,
    mbits,
    emin,
    emax,
    maxm,
    rmode,
    full_int,
    STOCH: tl.constexpr,
):
    # Round |xb| * 2^-sexp onto the element grid (elements.py `quantize_values`), saturating
    # (Inf lanes too; NaN lanes are the caller's). Returns (n, s): magnitude n * 2^s.
    ab = xb & 0x7FFFFFFF
    E = ab >> 23
    F = ab & 0x7FFFFF
    M = tl.where(E > 0, F | 0x800000, F)
    ex = tl.where(E > 0, E - 127, -126)
    flx = _ilog2(tl.maximum(M, 1)) + ex - 23
    if IS_FLOAT:
        s = tl.maximum(flx - sexp, emin) - mbits
    else:
        s = flx * 0 + sexp * 0
    n = _round_bits(M, s + sexp - ex + 23, rand, rmode, STOCH)
    if IS_FLOAT:
        top = emax - mbits
        # zeros never saturate (exponent scales over 8 bits can make flx - sexp huge)
        over = ((s > top) | ((s == top) & (n > maxm)) | (E == 255)) & (ab != 0)
        n = tl.where(over, maxm, n)
        s = tl.where(over, top, s)
    else:
        negfull = ((xb < 0) & (full_int != 0)).to(tl.int32)
        # int32's full range: 2^31 wraps to -2^31, which `_make_f32` reads unsigned
        lim = maxm + negfull
        # |v| >= 2^31 would overflow the shift: it saturates anyway (ints are <= 32 bits)
        big = (flx - sexp >= 31) & (ab != 0)
        n = tl.where((n - negfull > maxm) | (E == 255) | big, lim, n)
    return n, s


@triton.jit
def _finite_clamp(n, s, k, IS_FLOAT: tl.constexpr, mbits, emax, maxm, f_emax, f_mbits):
    # Lower magnitude n * 2^s (element units, decoded as n * 2^(s + k)) to the largest grid
    # value whose decoded value is at most the data type's largest finite value
    # (2^(f_mbits + 1) - 1) * 2^(f_emax - f_mbits): reference `finite_bound`.
    if IS_FLOAT:
        # the top of binade f_emax - k, on the element grid (its mantissa or the type's, the
        # coarser), not above maxfloat
        m2 = tl.minimum(mbits, f_mbits)
        sb = f_emax - mbits - k
        nb = ((2 << m2) - 1) << (mbits - m2)
        nb = tl.where(sb == emax - mbits, tl.minimum(nb, maxm), nb)
        over = ((s > sb) | ((s == sb) & (n > nb))) & (n != 0)
        return tl.where(over, nb, n), tl.where(over, sb, s)
    else:
        sh = f_emax - f_mbits - k
        big = sh + f_mbits + 1 > 31  # the bound exceeds every int element (<= 32 bits)
        up = ((2 << f_mbits) - 1) << tl.minimum(tl.maximum(sh, 0), 31)
        down = ((2 << f_mbits) - 1) >> tl.minimum(tl.maximum(-sh, 0), 31)
        nb = tl.where(sh >= 0, up, down)
        # n < 0: int32's saturated 2^31 (`_quant_elem`), above every bound under 2^31
        return tl.where(big, n, tl.where((n > nb) | (n < 0), nb, n)), s


@triton.jit
def _float_pred(n, s, IS_FLOAT: tl.constexpr, mbits, emin):
    # the grid value just below n * 2^s (n > 0)
    if IS_FLOAT:
        wrap = (n == (1 << mbits)) & (s > emin - mbits)
        return tl.where(wrap, (2 << mbits) - 1, n - 1), tl.where(wrap, s - 1, s)
    else:
        return n - 1, s


@triton.jit
def _make_f32(n, pe):
    # float32 bits of n * 2^pe for 0 <= n <= 2^31, read unsigned (int32's saturated 2^31 is
    # -2^31 here: `_quant_elem`), rounded once, half to even. n's float32 conversion is
    # correctly rounded (exact up to 2^24: every float grid value), and a normal result scales
    # it exactly; a subnormal one rounds n itself at 2^-149.
    nf = n.to(tl.uint32, bitcast=True).to(tl.float32).to(tl.int32, bitcast=True)
    field = (nf >> 23) + pe
    normal = nf + (pe << 23)
    wrapped = n < 0
    nn = tl.where(wrapped, 1 << 30, n)  # 2^31 as 2^30, one shift less
    k = -149 - pe - wrapped.to(tl.int32)
    half_up = (nn > (1 << 30)).to(tl.int32)  # k == 31: nn / 2^31 rounds to 1 above one half
    sub = tl.where(k > 31, 0, tl.where(k == 31, half_up, _round_bits(nn, k, 0, 0, False)))
    bits = tl.where(field >= 1, normal, sub)
    bits = tl.where(field >= 255, 0x7F800000, bits)
    return tl.where(n == 0, 0, bits)


@triton.jit
def _float_fields(c, d_bits, d_mbits, d_emin, d_inf, d_nan, d_uznan):
    # A float code of d_bits bits (<= 32, mantissa <= 30) as its magnitude n * 2^s, its sign
    # and, for Inf and NaN codes, their float32 bits (else 0): NumberSpec.decode. d_inf: the
    # magnitude code of Inf (-1: none); magnitudes from d_nan on are NaN (-1: none); d_uznan:
    # the negative-zero code is NaN (fnuz, inuz)
    sign_bit = 1 << (d_bits - 1)  # (-2^31 for 32 bits: the arithmetic wraps)
    mag = c & (sign_bit - 1)
    field = mag >> d_mbits
    mant = mag & ((1 << d_mbits) - 1)
    n = tl.where(field == 0, mant, mant | (1 << d_mbits))
    s = tl.maximum(field, 1) + d_emin - 1 - d_mbits
    neg = (c & sign_bit) != 0
    nan = ((d_nan >= 0) & (mag >= d_nan)) | ((d_uznan != 0) & (c == sign_bit))
    inf = 0x7F800000 | (neg.to(tl.int32) << 31)
    special = tl.where(nan, 0x7FC00000, tl.where(mag == d_inf, inf, 0))
    return n, s, neg, special


@triton.jit
def _pow2_f64(k):
    # 2^k as a float64, for -1022 <= k <= 1023
    return ((k + 1023).to(tl.int64) << 52).to(tl.float64, bitcast=True)


@triton.jit
def _overflow(f_emax, f_mbits):
    # elements.OVERFLOW (float64): 2^f_emax * (2 - 2^-(f_mbits+1)), where the type's rounding
    # reaches Inf (float32: 2^128 - 2^103)
    K = (4 << f_mbits) - 1
    return K.to(tl.float64) * _pow2_f64(f_emax - f_mbits - 1)


@triton.jit
def _product_limit(f_emax, f_mbits):
    # elements.PRODUCT_LIMIT (float64): 2^f_emax * (2 - 2^-(f_mbits+1)), less half a float32
    # ulp where the type is narrower than float32 (the product rounds to float32 first):
    # K * 2^(f_emax - 24)
    K = (1 << 25) - (1 << (23 - f_mbits)) - (f_mbits < 23).to(tl.int32)
    return K.to(tl.float64) * _pow2_f64(f_emax - 24)


@triton.jit
def _float_reach(sc, maxm, emax, mbits, emin, f_emax, f_mbits):
    # reference `_product_bound` for float grids, in float64 as it computes it: the largest
    # grid value b <= maxfloat (maxm * 2^(emax - mbits)) whose product with the scale sc
    # (float32, > 0; else no bound) is below the type's product limit, as (nb, sb): b = nb *
    # 2^sb in `_quant_elem`'s form. Bounds far below maxfloat (wide formats under small
    # scales) come out as directly as those one step below it.
    limit = _product_limit(f_emax, f_mbits)
    s64 = sc.to(tl.float64)
    top_s = emax - mbits
    top = maxm.to(tl.float64) * _pow2_f64(top_s)
    # (float64 `/` is IEEE division; div_rn is float32 only)
    t = tl.where(s64 > 0, tl.minimum(limit / tl.where(s64 > 0, s64, 1.0), 2.0 * top + 2.0), top)
    # the grid value at or below t (t >= 2^-112 as limit >= 65504 and sc < 2^128)
    fl = ((t.to(tl.int64, bitcast=True) >> 52) & 0x7FF).to(tl.int32) - 1023
    g = tl.maximum(fl, emin) - mbits
    low = t < top
    nb = tl.where(low, tl.floor(t * _pow2_f64(tl.where(low, -g, 0))), 0.0).to(tl.int32)
    nb = tl.where(low, nb, maxm)
    sb = tl.where(low, g, top_s)
    # t is rounded: the grid value it lands on may still reach the limit
    b = nb.to(tl.float64) * _pow2_f64(sb)
    pn, ps = _float_pred(nb, sb, True, mbits, emin)
    down = (s64 > 0) & (b * s64 >= limit)
    return tl.where(down, pn, nb), tl.where(down, ps, sb)


@triton.jit
def _int_reach(sc, top, f_emax, f_mbits):
    # reference `_product_bound` for int grids, in float64 as it computes it: the largest
    # integer b <= top (float64) whose float32 value times the scale sc (float64; none when
    # not > 0) is below the type's product limit (`_product_limit`)
    limit = _product_limit(f_emax, f_mbits)
    # (float64 `/` is IEEE division; div_rn is float32 only)
    t = tl.where(sc > 0, limit / tl.where(sc > 0, sc, 1.0), top)
    b = tl.where(t >= top, top, tl.floor(tl.minimum(t, 2.0 * top + 2.0)))
    b = tl.where((sc > 0) & (b * sc >= limit), tl.maximum(b - 1.0, 0.0), b)
    f = b.to(tl.float32).to(tl.float64)  # over 2^24, b's float32 value may round up
    return tl.where((sc > 0) & (f * sc >= limit), _int_below(f), b)


@triton.jit
def _int_below(f):
    # reference `_int_below`: the largest integer whose float32 value is below f (a float32
    # integer >= 1, as float64): f - 1 up to 2^24, else the midpoint of f and the float32 p
    # below it, less one when p's mantissa is odd
    pb = f.to(tl.float32).to(tl.int32, bitcast=True) - 1
    m = (pb.to(tl.float32, bitcast=True).to(tl.float64) + f) * 0.5
    return tl.where(f <= 16777216.0, f - 1.0, tl.where((pb & 1) == 0, m, m - 1.0))


@triton.jit
def _int_product_bound(n, eff3, maxm, full_int, f_emax, f_mbits):
    # Int elements under a float scale: n clamped to `_int_reach` of the largest magnitude
    # (maxm, +1 with the full range; 2^31 as int32 would wrap, hence float64)
    top = maxm.to(tl.float64) + (full_int != 0).to(tl.float64)
    b = _int_reach(eff3.to(tl.float64), top, f_emax, f_mbits).to(tl.int64)
    nu = n.to(tl.uint32, bitcast=True).to(tl.int64)
    return tl.where(nu > b, b, nu).to(tl.int32)  # 2^31 wraps back to -2^31


@triton.jit
def _float_code(n, s, mbits, emin):
    # magnitude code of n * 2^s on a float grid (n may be 2^(mbits+1): the carry is right)
    return tl.where(n == 0, 0, ((s - emin + mbits) << mbits) + n)


@triton.jit
def _scale_exp(
    amax_b,
    IS_FLOAT: tl.constexpr,
    MBITS: tl.constexpr,
    EMAX: tl.constexpr,
    SMODE: tl.constexpr,
    MID_T: tl.constexpr,
    TOP_T: tl.constexpr,
    LOW: tl.constexpr,
    HIGH: tl.constexpr,
):
    # E8M0 exponent of a tile from its absmax bits (reference `_scale_exponent`); constexpr
    # form (triton_fast.py), the same as `_scale_exp_t` with `_bump_threshold`
    E = amax_b >> 23
    F = amax_b & 0x7FFFFF
    M = tl.where(E > 0, F | 0x800000, F)
    lg = _ilog2(tl.maximum(M, 1))
    maxexp = lg + tl.where(E > 0, E - 127, -126) - 23
    sig = M << tl.maximum(23 - lg, 0)  # significand normalised to [2^23, 2^24)
    bump = maxexp * 0
    if IS_FLOAT:
        if SMODE == 1:
            bump = (sig > 0x800000).to(tl.int32)
        elif SMODE == 2:
            bump = (sig > MID_T).to(tl.int32)
        elif SMODE == 3:
            bump = (sig > TOP_T).to(tl.int32)
        elif SMODE == 4:
            if MBITS < 23:
                low = sig & ((1 << (23 - MBITS)) - 1)
                ones = (sig >> (23 - MBITS)) == (1 << (MBITS + 1)) - 1
                bump = (ones & (low >= (1 << (22 - MBITS)))).to(tl.int32)
    sexp = tl.minimum(tl.maximum(maxexp + bump - EMAX, LOW), HIGH)
    return tl.where(amax_b == 0, LOW, sexp), maxexp


@triton.jit
def _scale_exp_t(amax_b, bump_t, emax, low, high):
    # `_scale_exp` with runtime numbers: every scale mode bumps when the normalised
    # significand exceeds a threshold (`_bump_threshold`), so one compile serves them all
    E = amax_b >> 23
    F = amax_b & 0x7FFFFF
    M = tl.where(E > 0, F | 0x800000, F)
    lg = _ilog2(tl.maximum(M, 1))
    maxexp = lg + tl.where(E > 0, E - 127, -126) - 23
    sig = M << tl.maximum(23 - lg, 0)
    bump = (sig > bump_t).to(tl.int32)
    sexp = tl.minimum(tl.maximum(maxexp + bump - emax, low), high)
    return tl.where(amax_b == 0, low, sexp), maxexp


@triton.jit
def _unit_offsets(
    pid,
    n_units,
    n_chunks,
    C,
    TC,
    inner,
    nC,
    LAST: tl.constexpr,
    TILE: tl.constexpr,
    NSUB: tl.constexpr,
    SUB: tl.constexpr,
    BT: tl.constexpr,
):
    # Units are (tile instance, chunk of TILE elements); offsets are int64 (tensors over
    # 2^31). `intile`: lanes of the padded tile (zeros past the axis end count, as in the
    # reference's padding; lanes past the tile do not).
    u = pid.to(tl.int64) * BT + tl.arange(0, BT).to(tl.int64)
    u_ok = u < n_units
    inst = u // n_chunks
    q = u - inst * n_chunks
    if LAST:
        row = inst // nC
        j = inst - row * nC
        base = row * C
        i = row * 0
        o = row
    else:
        i = inst % inner
        t = inst // inner
        j = t % nC
        o = t // nC
        base = o * C * inner + i
    kk = tl.arange(0, NSUB)[:, None] * SUB + tl.arange(0, SUB)[None, :]
    pos = q[:, None, None] * TILE + kk[None, :, :]
    c = j[:, None, None] * TC + pos
    intile = u_ok[:, None, None] & (pos < TC)
    ok = intile & (c < C)
    if LAST:
        off = base[:, None, None] + c
    else:
        off = base[:, None, None] + c * inner
    return u_ok, inst, q, j, o, i, off, ok, intile


@triton.jit
def _meta_offsets(
    u_ok,
    q,
    j,
    o,
    i,
    TC,
    sub_cols,
    inner,
    LAST: tl.constexpr,
    TILE: tl.constexpr,
    NSUB: tl.constexpr,
    SUB: tl.constexpr,
):
    # grid offsets of a unit's NSUB subtiles (layout.py `sub_grid`); padding-only ones masked
    sidx = (j[:, None] * TC + q[:, None] * TILE) // SUB + tl.arange(0, NSUB)[None, :]
    if LAST:
        moff = o[:, None] * sub_cols + sidx
    else:
        moff = o[:, None] * sub_cols * inner + sidx * inner + i[:, None]
    return moff, u_ok[:, None] & (sidx < sub_cols)


@triton.jit
def _load_bits(x_ptr, off, ok, IN_KIND: tl.constexpr):
    # float32 bits of the input (exact widening of float16 / bfloat16) and the raw bits
    raw = tl.load(x_ptr + off, mask=ok, other=0)
    if IN_KIND == 0:
        xb = raw
    elif IN_KIND == 1:
        xb = raw.to(tl.float16, bitcast=True).to(tl.float32).to(tl.int32, bitcast=True)
    else:
        xb = raw.to(tl.int32) << 16
    return xb, raw


@triton.jit
def _load_any(x_ptr, off, ok, HALF: tl.constexpr, bf16):
    # float32 bits of the input (exact widening of float16 / bfloat16) and the raw bits;
    # 16-bit data picks its type at run time (one compile for both)
    raw = tl.load(x_ptr + off, mask=ok, other=0)
    if HALF:
        hf = raw.to(tl.float16, bitcast=True).to(tl.float32).to(tl.int32, bitcast=True)
        xb = tl.where(bf16 != 0, raw.to(tl.int32) << 16, hf)
    else:
        xb = raw
    return xb, raw


@triton.jit
def _store_values(y_ptr, off, ok, yb, elem_nan, tile_nan, HALF: tl.constexpr, bf16):
    # Convert float32 bits to the output type; every NaN is the canonical quiet NaN
    # (reference._canonical_nan), whatever the input's payload.
    nan = elem_nan | tile_nan | ((yb & 0x7FFFFFFF) > 0x7F800000)
    if HALF:
        h = yb.to(tl.float32, bitcast=True).to(tl.float16).to(tl.int16, bitcast=True)
        f16 = tl.where(nan, 0x7E00, h.to(tl.int32))
        mag = yb & 0x7FFFFFFF
        r = (mag + 0x7FFF + ((mag >> 16) & 1)) >> 16  # round-half-even to bfloat16
        b16 = tl.where(nan, 0x7FC0, r | ((yb >> 16) & 0x8000))
        out = tl.where(bf16 != 0, b16, f16).to(tl.int16)
    else:
        out = tl.where(nan, 0x7FC00000, yb)
    tl.store(y_ptr + off, out, mask=ok)


@triton.jit
def _okey(b):
    # float bits -> an int32 ordered like the floats (-0 just below +0); an involution
    return b ^ ((b >> 31) & 0x7FFFFFFF)


@triton.jit
def _tile_pos(q, TILE: tl.constexpr, NSUB: tl.constexpr, SUB: tl.constexpr):
    # each lane's position in its tile (chunk q of TILE elements, NSUB x SUB lanes a unit)
    kk = tl.arange(0, NSUB)[:, None] * SUB + tl.arange(0, SUB)[None, :]
    return q[:, None, None] * TILE + kk[None, :, :]


@triton.jit
def _lo_key(xb, pos, fin):
    # int64 keys whose minimum is numpy's minimum of a tile's finite values, where equal
    # values take the later one: +0 and -0 are equal, so a tile whose minimum is zero takes
    # the sign of its last zero (the reference's padding, +0, comes last). Zeros sit between
    # the negative and positive keys, the later position lower, with the sign in bit 0.
    zero = (xb & 0x7FFFFFFF) == 0
    zkey = (((1 << 30) - pos.to(tl.int64)) << 1) | (xb < 0).to(tl.int64)
    key = tl.where(zero, zkey, _okey(xb).to(tl.int64) << 32)
    return tl.where(fin, key, 0x7FFFFFFFFFFFFFFF)


@triton.jit
def _lo_bits(key):
    # float32 bits of a `_lo_key` minimum (0 when the tile has no finite value)
    zero = (key >= 0) & (key < (1 << 32))
    bits = tl.where(zero, (key & 1).to(tl.int32) << 31, _okey((key >> 32).to(tl.int32)))
    return tl.where(key == 0x7FFFFFFFFFFFFFFF, 0, bits)


@triton.jit
def _ldexp_bits(qb, k):
    # float32 bits of value(qb) * 2^k, rounded once (finite lanes; others pass through)
    ab = qb & 0x7FFFFFFF
    E = ab >> 23
    F = ab & 0x7FFFFF
    M = tl.where(E > 0, F | 0x800000, F)
    ex = tl.where(E > 0, E - 127, -126)
    out = _make_f32(M, ex - 23 + k) | (qb & -2147483648)
    return tl.where(E == 255, qb, out)
