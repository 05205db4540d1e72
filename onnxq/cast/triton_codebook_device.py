"""Device helpers of the codebook Triton kernels (`@triton.jit`, inlined where called).

Tile offsets, the element bound, the nearest codebook entry under each mapping, the choice of
a mapping per unit and the writes of values, codes and unit meta; the long-tile phases (one
tile over 1024 elements per program, in chunks) of `triton_codebook_kernels._cb_quant_kernel`.
"""

# Layout, mode and codebook-shape parameters are tl.constexpr and upper case (Triton's
# convention); the format's numbers are runtime arguments (fewer compiles).
# ruff: noqa: N803

import triton
import triton.language as tl

from onnxq.cast.triton_device import _load_bits, _pow2_f64, _store_values


@triton.jit
def _cb_offsets(
    pid,
    n_inst,
    C,
    TC,
    inner,
    nC,
    nsub,
    sub,
    p0,
    LAST: tl.constexpr,
    TENSOR: tl.constexpr,
    NSUB: tl.constexpr,
    SUB: tl.constexpr,
    BT: tl.constexpr,
):
    # BT tile instances per program, each (NSUB, SUB): subtile s, position k (tile position
    # p0 + s * sub + k); element offsets are int64 (tensors over 2^31 elements)
    inst = pid.to(tl.int64) * BT + tl.arange(0, BT).to(tl.int64)
    u_ok = inst < n_inst
    sk = tl.arange(0, NSUB)[:, None]
    kk = tl.arange(0, SUB)[None, :]
    pos = (p0 + sk * sub + kk).to(tl.int64)[None, :, :]
    in_tile = ((sk < nsub) & (kk < sub))[None, :, :] & (pos < TC)
    if TENSOR:
        # the whole tensor is one tile, in the reference's order: the axis moved last
        r = pos // C
        c = pos - r * C
        oo = r // inner
        ii = r - oo * inner
        off = oo * C * inner + c * inner + ii + inst[:, None, None] * 0
        ok = u_ok[:, None, None] & in_tile
        j = inst * 0
        o = inst * 0
        i = inst * 0
    else:
        if LAST:
            o = inst // nC
            j = inst - o * nC
            i = inst * 0
            base = o * C
        else:
            i = inst % inner
            t = inst // inner
            j = t % nC
            o = t // nC
            base = o * C * inner + i
        c = j[:, None, None] * TC + pos
        ok = u_ok[:, None, None] & in_tile & (c < C)
        if LAST:
            off = base[:, None, None] + c
        else:
            off = base[:, None, None] + c * inner
    return u_ok, inst, j, o, i, off, ok


@triton.jit
def _cb_meta_offsets(
    u_ok,
    inst,
    j,
    o,
    i,
    nsub,
    s0,
    sub_cols,
    inner,
    LAST: tl.constexpr,
    SUBT: tl.constexpr,
    NSUB: tl.constexpr,
):
    # meta grid offsets and mask, (BT, NSUB): per subtile (layout.py `sub_grid`; subtiles
    # s0 + s of the tile's nsub) or per tile
    s = tl.arange(0, NSUB)[None, :]
    if SUBT:
        sidx = j[:, None] * nsub + s0 + s
        if LAST:
            moff = o[:, None] * sub_cols + sidx
        else:
            moff = o[:, None] * sub_cols * inner + sidx * inner + i[:, None]
        mok = u_ok[:, None] & (s0 + s < nsub) & (sidx < sub_cols)
    else:
        moff = inst[:, None] + s * 0
        mok = u_ok[:, None] & (s < 1)
    return moff, mok


@triton.jit
def _cb_bound(sexp3, c_emin, c_mbits, c_maxf_bits, IN_KIND: tl.constexpr):
    # The largest compute-grid magnitude whose value times 2^sexp is at most the input type's
    # largest finite value (reference `finite_bound`), float64; Inf where none is needed.
    # The compute type's maxfloat comes as its float64 bits: a float argument is float32.
    c_maxf = c_maxf_bits.to(tl.int64).to(tl.float64, bitcast=True)
    if IN_KIND == 0:
        fmax = 3.4028234663852886e38
    elif IN_KIND == 1:
        fmax = 65504.0
    else:
        fmax = 3.3895313892515355e38
    p2 = ((1023 - sexp3).to(tl.int64) << 52).to(tl.float64, bitcast=True)
    reach = p2 * fmax
    fl = ((reach.to(tl.int64, bitcast=True) >> 52) - 1023).to(tl.int32)
    e = tl.maximum(fl, c_emin) - c_mbits
    grid = tl.floor(reach * ((1023 - e).to(tl.int64) << 52).to(tl.float64, bitcast=True))
    grid = grid * ((1023 + e).to(tl.int64) << 52).to(tl.float64, bitcast=True)
    return tl.where(reach >= c_maxf, float("inf"), grid)


@triton.jit
def _cb_nearest(a, bound, mag_ptr, even_ptr, base, K: tl.constexpr, LOG2K: tl.constexpr, rmode):
    # Nearest entry of one mapping (reference `_codebook_select`): hi = searchsorted(left)
    # clipped to [1, K-1], distances in float64, ties by the round mode; magnitudes above
    # the tile's bound are lowered to it first and no entry above it is picked.
    a_in = a
    a = tl.where(a > bound, bound, a)
    cnt = (a != a).to(tl.int32) * 0
    if K <= 8:
        for t in range(K):
            cnt += (tl.load(mag_ptr + base + t) < a).to(tl.int32)
    else:
        # branchless lower bound (K a power of two); it stops at K - 1, which clips alike
        for r in tl.static_range(LOG2K):
            probe = tl.load(mag_ptr + base + cnt + ((K >> (r + 1)) - 1))
            cnt = tl.where(probe < a, cnt + (K >> (r + 1)), cnt)
    hi = tl.minimum(tl.maximum(cnt, 1), K - 1)
    lo = hi - 1
    t_hi = tl.load(mag_ptr + base + hi)
    t_lo = tl.load(mag_ptr + base + lo)
    d_lo = a - t_lo
    d_hi = t_hi - a
    tie = hi < 0  # zero: ties to the smaller magnitude
    if rmode == 0:
        tie = tl.load(even_ptr + base + hi) != 0  # even: to the even compute code
    elif rmode == 1:
        tie = hi >= 0  # away: to the larger magnitude
    pick = (d_hi < d_lo) | ((d_hi == d_lo) & tie)
    pick = pick & ~(t_hi > bound)  # rounded up past the bound: the entry below
    # the reference's error term v - q is +-(a - t): a - t_lo or -(t_hi - a) (IEEE
    # subtraction is sign-symmetric), so its square is the same bits
    return (
        tl.where(pick, hi, lo),
        tl.where(pick, t_hi, t_lo),
        tl.where(pick, t_hi - a_in, a_in - t_lo),
    )


@triton.jit
def _times_pow2(q, k):
    # float64 q times 2^k for |k| up to 2044, rounded once: two power-of-two steps, each in
    # 2^k's range. The first is exact wherever the product is neither below float32's reach
    # nor past float64's (where the second step overflows to Inf, as the product would).
    h = k >> 1
    return (q * _pow2_f64(h)) * _pow2_f64(k - h)


@triton.jit
def _cb_scaled(xb, sexp3):
    # |x| * 2^-sexp in float64, exactly (mantissa times a power of two); NaN and Inf kept
    ab = xb & 0x7FFFFFFF
    E = ab >> 23
    F = ab & 0x7FFFFF
    Mi = tl.where(E > 0, F | 0x800000, F)
    # k reaches 127 - 23 + 1022 (a scale as small as 2^-1022), past one 2^k's range
    k = tl.where(E > 0, E - 127, -126) - 23 - sexp3
    a = _times_pow2(Mi.to(tl.float64), k)
    nan64 = (xb.to(tl.int64) * 0 + 0x7FF8000000000000).to(tl.float64, bitcast=True)
    inf64 = (xb.to(tl.int64) * 0 + 0x7FF0000000000000).to(tl.float64, bitcast=True)
    return tl.where(ab < 0x7F800000, a, tl.where(ab > 0x7F800000, nan64, inf64))


@triton.jit
def _cb_compare(err, best_err, same, delta):
    # Whether a mapping's error sum is surely below the best one's, and whether that is
    # undecided (the sums, both within ``delta`` relative of the exact ones, too close), given
    # whether the two mappings quantize the unit identically (``same``: a tie). A NaN or Inf
    # in a unit makes every mapping's sum NaN or Inf, in any order: a tie, never undecided.
    sure_better = err < best_err - best_err * delta
    sure_worse = best_err < err - err * delta
    err_finite = (err - err) == 0.0
    return (~same) & sure_better, err_finite & (~same) & (~sure_better) & (~sure_worse)


@triton.jit
def _cb_select(
    a,
    bound,
    mag_ptr,
    even_ptr,
    rmode,
    BT: tl.constexpr,
    NSUB: tl.constexpr,
    SUB: tl.constexpr,
    K: tl.constexpr,
    LOG2K: tl.constexpr,
    NMAP: tl.constexpr,
    FORCE: tl.constexpr,
):
    # The mapping of each unit (BT, NSUB) of SUB elements and each element's entry index.
    # Pass 1: every mapping, unit errors summed as a tree; decide where that is safe.
    best_idx = (a != a).to(tl.int32) * 0
    best_tq = tl.zeros([BT, NSUB, SUB], tl.float64)
    best_err = tl.zeros([BT, NSUB], tl.float64)
    best_map = tl.zeros([BT, NSUB], tl.int32)
    if FORCE:
        amb = best_map == 0
    else:
        amb = best_map != 0
    for m in range(NMAP):
        idx, tq, d = _cb_nearest(a, bound, mag_ptr, even_ptr, m * K, K, LOG2K, rmode)
        err = tl.sum(d * d, axis=2)
        first = m == 0
        later = m != 0
        # equal entries: equal terms, equal sums in any order (a tie: the earlier stays)
        same = tl.min((tq == best_tq).to(tl.int32), axis=2) > 0
        # tree and ordered sums are both within 2^-43 (relative) of the exact sum: 2^-36
        sure, unsure = _cb_compare(err, best_err, same, 1.4551915228366852e-11)
        better = first | sure
        amb = amb | (later & unsure)
        best_err = tl.where(better, err, best_err)
        best_map = tl.where(better, m, best_map)
        best_idx = tl.where(better[:, :, None], idx, best_idx)
        best_tq = tl.where(better[:, :, None], tq, best_tq)

    # Pass 2 (a near-tie in these units): every choice again, the reference's order.
    if tl.max(tl.max(amb.to(tl.int32), axis=1), axis=0) > 0:
        kpos = tl.arange(0, SUB)[None, None, :]
        for m in range(NMAP):
            idx, _tq, d = _cb_nearest(a, bound, mag_ptr, even_ptr, m * K, K, LOG2K, rmode)
            sq = d * d
            err = tl.zeros([BT, NSUB], tl.float64)
            for kk in range(SUB):
                err = err + tl.sum(tl.where(kpos == kk, sq, 0.0), axis=2)
            better = (m == 0) | (err < best_err)
            best_err = tl.where(better, err, best_err)
            best_map = tl.where(better, m, best_map)
            best_idx = tl.where(better[:, :, None], idx, best_idx)
    return best_idx, best_map


@triton.jit
def _scaled_f32_bits(q, k):
    # float32 bits of float64 q times 2^k, rounded once (the reference's float64 product,
    # then astype)
    return _times_pow2(q, k).to(tl.float32).to(tl.int32, bitcast=True)


@triton.jit
def _cb_write(
    y_ptr,
    code_ptr,
    mag_ptr,
    off,
    ok,
    xb,
    best_idx,
    map3,
    sexp3,
    tile_nan,
    negzero,
    IN_KIND: tl.constexpr,
    WANT_Y: tl.constexpr,
    WANT_CODES: tl.constexpr,
    IB: tl.constexpr,
    K: tl.constexpr,
):
    # values (q * 2^sexp, rounded once to float32, then to the input type) or index codes
    sgn = (xb < 0) & ((best_idx != 0) | (negzero != 0))
    if WANT_Y:
        mag = tl.load(mag_ptr + map3 * K + best_idx)
        yb = _scaled_f32_bits(mag, sexp3) | (sgn.to(tl.int32) << 31)
        _store_values(y_ptr, off, ok, yb, tile_nan, tile_nan, IN_KIND != 0, IN_KIND == 2)
    if WANT_CODES:
        code = (sgn.to(tl.int32) << (IB - 1)) | best_idx
        code = tl.where(tile_nan, 0, code)
        tl.store(code_ptr + off, code.to(code_ptr.dtype.element_ty), mask=ok)


@triton.jit
def _cb_tile_flags(xb):
    # per tile (BT,): finite absmax bits, any NaN/Inf, any NaN
    ab = xb & 0x7FFFFFFF
    finite = ab < 0x7F800000
    amax_b = tl.max(tl.max(tl.where(finite, ab, 0), axis=2), axis=1)
    any_nf = tl.max(tl.max((~finite).to(tl.int32), axis=2), axis=1)
    any_nan = tl.max(tl.max((ab > 0x7F800000).to(tl.int32), axis=2), axis=1)
    return amax_b, any_nf, any_nan


@triton.jit
def _cb_chunk(
    x_ptr,
    pid,
    q,
    n_inst,
    C,
    TC,
    inner,
    nC,
    IN_KIND: tl.constexpr,
    LAST: tl.constexpr,
    TENSOR: tl.constexpr,
    NSUB: tl.constexpr,
    SUB: tl.constexpr,
):
    # chunk q (NSUB * SUB elements) of the one tile of program pid: offsets and input bits
    u_ok, inst, j, o, i, off, ok = _cb_offsets(
        pid, n_inst, C, TC, inner, nC, NSUB, SUB, q * (NSUB * SUB), LAST, TENSOR, NSUB, SUB, 1
    )
    xb, _raw = _load_bits(x_ptr, off, ok, IN_KIND)
    return u_ok, inst, j, o, i, off, ok, xb


@triton.jit
def _cb_units(
    y_ptr,
    code_ptr,
    meta_ptr,
    mag_ptr,
    even_ptr,
    xb,
    off,
    ok,
    u_ok,
    inst,
    j,
    o,
    i,
    sexp3,
    bound,
    tnan,
    s0,
    nsub,
    sub_cols,
    inner,
    rmode,
    negzero,
    IN_KIND: tl.constexpr,
    WANT_Y: tl.constexpr,
    WANT_CODES: tl.constexpr,
    LAST: tl.constexpr,
    SUBT: tl.constexpr,
    BT: tl.constexpr,
    NSUB: tl.constexpr,
    SUB: tl.constexpr,
    IB: tl.constexpr,
    K: tl.constexpr,
    LOG2K: tl.constexpr,
    NMAP: tl.constexpr,
    FORCE: tl.constexpr,
):
    # BT whole tiles, or subtiles s0 .. s0 + NSUB of one tile (BT = 1), loaded as xb: each
    # unit's mapping chosen, the values or codes written, and (WANT_CODES) the unit meta
    a = _cb_scaled(xb, sexp3)
    best_idx, best_map = _cb_select(
        a, bound, mag_ptr, even_ptr, rmode, BT, NSUB, SUB, K, LOG2K, NMAP, FORCE
    )
    _cb_write(
        y_ptr,
        code_ptr,
        mag_ptr,
        off,
        ok,
        xb,
        best_idx,
        best_map[:, :, None],
        sexp3,
        ok & tnan[:, None, None],
        negzero,
        IN_KIND,
        WANT_Y,
        WANT_CODES,
        IB,
        K,
    )
    if WANT_CODES:
        moff, mok = _cb_meta_offsets(
            u_ok, inst, j, o, i, nsub, s0, sub_cols, inner, LAST, SUBT, NSUB
        )
        tl.store(meta_ptr + moff, best_map.to(tl.uint8), mask=mok)


@triton.jit
def _cb_error(errs, ar, m):
    # mapping m's entry of the per-mapping errors, as a (1,) tensor
    return tl.zeros([1], tl.float64) + tl.sum(tl.where(ar == m, errs, 0.0))


# -- the long-tile phases of the quantize kernel (one tile over 1024 elements per program) -------
@triton.jit
def _cb_long_stats(
    x_ptr,
    stat_ptr,
    pid,
    n_chunks,
    n_inst,
    C,
    TC,
    inner,
    nC,
    IN_KIND: tl.constexpr,
    LAST: tl.constexpr,
    TENSOR: tl.constexpr,
    NSUB: tl.constexpr,
    SUB: tl.constexpr,
    PRE: tl.constexpr,
):
    # the tile's finite absmax bits, any NaN/Inf and any NaN, over its chunks; PRE: read from
    # stat_ptr (absmax bits, 2 * any NaN/Inf + any NaN per tile: units of their own whose
    # scale is their tile's)
    amax_b = tl.zeros([1], tl.int32)
    any_nf = tl.zeros([1], tl.int32)
    any_nan = tl.zeros([1], tl.int32)
    if PRE:
        at = 2 * (amax_b + pid).to(tl.int64)
        flags = tl.load(stat_ptr + at + 1)
        return tl.load(stat_ptr + at), (flags >= 2).to(tl.int32), (flags == 3).to(tl.int32)
    q = 0
    while q < n_chunks:
        _u_ok, _inst, _j, _o, _i, _off, _ok, xb = _cb_chunk(
            x_ptr, pid, q, n_inst, C, TC, inner, nC, IN_KIND, LAST, TENSOR, NSUB, SUB
        )
        cmax, cnf, cnan = _cb_tile_flags(xb)
        amax_b = tl.maximum(amax_b, cmax)
        any_nf = tl.maximum(any_nf, cnf)
        any_nan = tl.maximum(any_nan, cnan)
        q += 1
    return amax_b, any_nf, any_nan


@triton.jit
def _cb_long_errors(
    x_ptr,
    pid,
    n_chunks,
    n_inst,
    C,
    TC,
    inner,
    nC,
    sexp3,
    bound,
    mag_ptr,
    even_ptr,
    rmode,
    IN_KIND: tl.constexpr,
    LAST: tl.constexpr,
    TENSOR: tl.constexpr,
    NSUB: tl.constexpr,
    SUB: tl.constexpr,
    K: tl.constexpr,
    LOG2K: tl.constexpr,
    NMAP: tl.constexpr,
    NMAP_P: tl.constexpr,
):
    # errors of every mapping over the whole tile (chunk trees added in order), and
    # whether each mapping's entries equal mapping 0's everywhere
    ar = tl.arange(0, NMAP_P)
    errs = tl.zeros([NMAP_P], tl.float64)
    same0 = tl.full([NMAP_P], 1, tl.int32)
    q = 0
    while q < n_chunks:
        _u_ok, _inst, _j, _o, _i, _off, _ok, xb = _cb_chunk(
            x_ptr, pid, q, n_inst, C, TC, inner, nC, IN_KIND, LAST, TENSOR, NSUB, SUB
        )
        a = _cb_scaled(xb, sexp3)
        _idx0, tq0, d0 = _cb_nearest(a, bound, mag_ptr, even_ptr, 0, K, LOG2K, rmode)
        errs = errs + tl.where(ar == 0, tl.sum(d0 * d0), 0.0)
        for m in range(1, NMAP):
            _idx, tq, d = _cb_nearest(a, bound, mag_ptr, even_ptr, m * K, K, LOG2K, rmode)
            errs = errs + tl.where(ar == m, tl.sum(d * d), 0.0)
            sm = tl.min((tq == tq0).to(tl.int32))
            same0 = tl.where(ar == m, tl.minimum(same0, sm), same0)
        q += 1
    return errs, same0


@triton.jit
def _cb_ordered_errors(
    x_ptr,
    pid,
    n_chunks,
    n_inst,
    C,
    TC,
    inner,
    nC,
    sexp3,
    bound,
    mag_ptr,
    even_ptr,
    rmode,
    IN_KIND: tl.constexpr,
    LAST: tl.constexpr,
    TENSOR: tl.constexpr,
    NSUB: tl.constexpr,
    SUB: tl.constexpr,
    K: tl.constexpr,
    LOG2K: tl.constexpr,
    NMAP: tl.constexpr,
    NMAP_P: tl.constexpr,
):
    # near-tie: the errors again, added in the reference's order
    ar = tl.arange(0, NMAP_P)
    kpos = tl.arange(0, SUB)[None, None, :]
    errs = tl.zeros([NMAP_P], tl.float64)
    q = 0
    while q < n_chunks:
        _u_ok, _inst, _j, _o, _i, _off, _ok, xb = _cb_chunk(
            x_ptr, pid, q, n_inst, C, TC, inner, nC, IN_KIND, LAST, TENSOR, NSUB, SUB
        )
        a = _cb_scaled(xb, sexp3)
        n_valid = tl.minimum(TC - q * (NSUB * SUB), NSUB * SUB)
        for m in range(NMAP):
            _idx, _tq, d = _cb_nearest(a, bound, mag_ptr, even_ptr, m * K, K, LOG2K, rmode)
            sq = d * d
            err = tl.sum(tl.where(ar == m, errs, 0.0))
            kk = 0
            while kk < n_valid:
                err = err + tl.sum(tl.where(kpos == kk, sq, 0.0))
                kk += 1
            errs = tl.where(ar == m, err, errs)
        q += 1
    return errs


@triton.jit
def _cb_long_write(
    x_ptr,
    y_ptr,
    code_ptr,
    mag_ptr,
    even_ptr,
    pid,
    n_chunks,
    n_inst,
    C,
    TC,
    inner,
    nC,
    chosen,
    sexp3,
    bound,
    tnan,
    rmode,
    negzero,
    IN_KIND: tl.constexpr,
    WANT_Y: tl.constexpr,
    WANT_CODES: tl.constexpr,
    LAST: tl.constexpr,
    TENSOR: tl.constexpr,
    NSUB: tl.constexpr,
    SUB: tl.constexpr,
    IB: tl.constexpr,
    K: tl.constexpr,
    LOG2K: tl.constexpr,
):
    # the tile's values or codes under the chosen mapping, chunk by chunk
    q = 0
    while q < n_chunks:
        _u_ok, _inst, _j, _o, _i, off, ok, xb = _cb_chunk(
            x_ptr, pid, q, n_inst, C, TC, inner, nC, IN_KIND, LAST, TENSOR, NSUB, SUB
        )
        a = _cb_scaled(xb, sexp3)
        map3 = chosen[:, None, None]
        best_idx, _tq, _d = _cb_nearest(a, bound, mag_ptr, even_ptr, map3 * K, K, LOG2K, rmode)
        _cb_write(
            y_ptr,
            code_ptr,
            mag_ptr,
            off,
            ok,
            xb,
            best_idx,
            map3,
            sexp3,
            ok & tnan[:, None, None],
            negzero,
            IN_KIND,
            WANT_Y,
            WANT_CODES,
            IB,
            K,
        )
        q += 1


@triton.jit
def _cb_first_choice(
    errs, same0, delta, NMAP: tl.constexpr, NMAP_P: tl.constexpr, FORCE: tl.constexpr
):
    # the mapping of least error (the first of equal ones), and whether any comparison was
    # too close to call in the order the errors were added (FORCE: always redo them)
    ar = tl.arange(0, NMAP_P)
    best_err = _cb_error(errs, ar, 0)
    chosen = tl.zeros([1], tl.int32)
    if FORCE:
        amb = chosen == 0
    else:
        amb = chosen != 0
    for m in range(1, NMAP):
        err = _cb_error(errs, ar, m)
        same = (chosen + tl.sum(tl.where(ar == m, same0, 0)) > 0) & (chosen == 0)
        same = same | ((err == 0.0) & (best_err == 0.0))  # all terms zero in both
        better, unsure = _cb_compare(err, best_err, same, delta)
        amb = amb | unsure
        best_err = tl.where(better, err, best_err)
        chosen = tl.where(better, m, chosen)
    return chosen, amb


@triton.jit
def _cb_exact_choice(errs, NMAP: tl.constexpr, NMAP_P: tl.constexpr):
    # the mapping of least error, from errors added in the reference's order
    ar = tl.arange(0, NMAP_P)
    best_err = _cb_error(errs, ar, 0)
    chosen = tl.zeros([1], tl.int32)
    for m in range(1, NMAP):
        err = _cb_error(errs, ar, m)
        better = err < best_err
        best_err = tl.where(better, err, best_err)
        chosen = tl.where(better, m, chosen)
    return chosen
