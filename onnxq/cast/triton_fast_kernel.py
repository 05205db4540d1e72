"""The fast path's kernels: `_fast_kernel` (quantize in one pass) and `_amax_kernel` (tensor amax).

See `onnxq.cast.triton_fast` for the method (float arithmetic that gives the reference's bits)
and the host side. The kernel runs in named phases, each a `@triton.jit` helper that Triton
inlines: block offsets, tile statistics, the scale (exponent or float), element rounding, then
the stores of values, codes (packed or not), scales and MX shift bits.
"""

# Kernel parameters are tl.constexpr and upper case (Triton's convention).
# ruff: noqa: N803

import triton
import triton.language as tl

from onnxq.cast.triton_device import _load_bits, _scale_exp


# -- device helpers -------------------------------------------------------------------------------
@triton.jit
def _pow2(k):
    # 2.0^k as float32 for -149 <= k <= 127 (subnormal powers included)
    b = tl.where(k >= -126, (k + 127) << 23, 1 << tl.minimum(tl.maximum(k + 149, 0), 30))
    return b.to(tl.float32, bitcast=True)


@triton.jit
def _expand(
    t,
    BT: tl.constexpr,
    NSUB: tl.constexpr,
    SUB: tl.constexpr,
    TC: tl.constexpr,
    SHIFT: tl.constexpr,
    G3: tl.constexpr,
):
    # a value per unit -> a value per element of the block: (BT, TC), or (BT, TC // G3, G3)
    # when G3 > 1 (compress: groups of G3 codes that pack into whole bytes)
    if SHIFT:
        per_elem = tl.broadcast_to(t[:, :, None], (BT, NSUB, SUB))
        if G3 > 1:
            out = tl.reshape(per_elem, (BT, TC // G3, G3))
        else:
            out = tl.reshape(per_elem, (BT, TC))
    elif G3 > 1:
        out = tl.broadcast_to(t[:, None, None], (BT, TC // G3, G3))
    else:
        out = tl.broadcast_to(t[:, None], (BT, TC))
    return out


@triton.jit
def _round_float(a, MBITS: tl.constexpr, EMIN: tl.constexpr, MAXF: tl.constexpr):
    # a >= 0: round half-even onto the grid of a float format with MBITS mantissa bits and
    # smallest normal exponent EMIN, saturating at MAXF. Inf (and NaN, whose lanes are the
    # caller's) make a garbage magic and a NaN sum, which min() turns into MAXF.
    ea = a.to(tl.int32, bitcast=True) >> 23
    magic = ((tl.maximum(ea, EMIN + 127) << 23) + ((23 - MBITS) << 23)).to(tl.float32, bitcast=True)
    return tl.minimum((a + magic) - magic, MAXF)


@triton.jit
def _float_code_of(r, MBITS: tl.constexpr, EMIN: tl.constexpr):
    # magnitude code of a grid value r: its bits with EMIN moved onto float32's -126
    rc = r * _pow2(tl.full(r.shape, -126, tl.int32) - EMIN)
    return rc.to(tl.int32, bitcast=True) >> (23 - MBITS)


@triton.jit
def _pack_store(
    ptr,
    codes,
    pid,
    nbytes,
    ROWS: tl.constexpr,
    COLS: tl.constexpr,
    BITS: tl.constexpr,
    G: tl.constexpr,
    U: tl.constexpr,
    M: tl.constexpr,
    BLOCK3D: tl.constexpr,
):
    # Write this program's ROWS x COLS codes (C order) as packing.py's little-endian bit
    # stream; the program's stream starts on a whole group. Groups of G consecutive codes
    # (G * BITS bits, a whole number of bytes, at most 128) are summed in registers and
    # written as M integers of U bits (8, 16, 32 or 64: the largest power of two dividing
    # G * BITS): the smallest group of 6-bit codes is three byte stores, 16 of them three
    # 32-bit stores. BLOCK3D: the block is (ROWS, COLS // G, G) already, each group innermost
    # (NVFP4's measured layout); otherwise the (ROWS, COLS) block is flattened first, since
    # splitting its rows in place made 6-bit packing 3x slower on an H100 (0.6-0.8 -> 0.2-0.3
    # of a copy).
    NG: tl.constexpr = ROWS * COLS // G
    if BLOCK3D:
        c = codes
        gidx = tl.arange(0, ROWS)[:, None] * (COLS // G) + tl.arange(0, COLS // G)[None, :]
    else:
        c = tl.reshape(tl.reshape(codes, (ROWS * COLS,)), (NG, G))
        gidx = tl.arange(0, NG)
    pos = tl.arange(0, G)
    if BLOCK3D:
        pos = pos[None, None, :]
    else:
        pos = pos[None, :]
    if G * BITS <= 32:
        HB: tl.constexpr = G * BITS  # all of the group's bits in `lo`
        lo = tl.sum(c << (pos * BITS), axis=-1)
        hi = lo
    elif G * BITS <= 64:
        HB: tl.constexpr = G * BITS
        lo = tl.sum(c.to(tl.int64) << (pos * BITS).to(tl.int64), axis=-1)
        hi = lo
    else:
        HB: tl.constexpr = (G // 2) * BITS  # the first half's bits in `lo`, the rest in `hi`
        c = c.to(tl.int64)
        pos = pos.to(tl.int64)
        lo = tl.sum(tl.where(pos < G // 2, c << (pos * BITS), 0), axis=-1)
        hi = tl.sum(tl.where(pos >= G // 2, c << ((pos - G // 2) * BITS), 0), axis=-1)
    if U == 8:
        uptr = ptr
    elif U == 16:
        uptr = ptr.to(tl.pointer_type(tl.int16))
    elif U == 32:
        uptr = ptr.to(tl.pointer_type(tl.int32))
    else:
        uptr = ptr.to(tl.pointer_type(tl.int64))
    base = pid.to(tl.int64) * (NG * M)
    for j in tl.static_range(M):
        # unit j: bits [j * U, (j + 1) * U) of the group (constant shifts)
        if j * U >= HB:
            part = hi >> (j * U - HB)
        elif (j + 1) * U > HB:
            part = (lo >> (j * U)) | (hi << (HB - j * U))
        else:
            part = lo >> (j * U)
        if U == 8:
            unit = part.to(tl.uint8)
        elif U == 16:
            unit = part.to(tl.int16)
        elif U == 32:
            unit = part.to(tl.int32)
        else:
            unit = part.to(tl.int64)
        upos = base + gidx * M + j
        tl.store(uptr + upos, unit, mask=upos * (U // 8) < nbytes)


@triton.jit
def _tile_any(flag, G3: tl.constexpr):
    # per tile (axis 0): does any element of the block have the flag
    if G3 > 1:
        return tl.max(tl.max(flag.to(tl.int32), axis=2), axis=1) > 0
    else:
        return tl.max(flag.to(tl.int32), axis=1) > 0


@triton.jit
def _amax_kernel(
    x_ptr, top_ptr, numel, IN_KIND: tl.constexpr, BLOCK: tl.constexpr, ROUNDS: tl.constexpr
):
    # Finite absmax of the whole tensor (float32 bits: non-negative, so an integer max).
    # Each program takes ROUNDS blocks (a power of two, so few compiles), then one atomic:
    # thousands of atomics on one word would serialise.
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    acc = tl.zeros((BLOCK,), tl.int32)
    for i in range(ROUNDS):
        offs = (pid + i * nprog).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        xb, _raw = _load_bits(x_ptr, offs, offs < numel, IN_KIND)
        ab = xb & 0x7FFFFFFF
        acc = tl.maximum(acc, tl.where(ab < 0x7F800000, ab, 0))
    tl.atomic_max(top_ptr, tl.max(acc, axis=0))


# -- phases of the fast kernel (in the order it runs them) -----------------------------------------
@triton.jit
def _fast_offsets(
    pid, n_tiles, inner, BT: tl.constexpr, TC: tl.constexpr, G3: tl.constexpr, INNER: tl.constexpr
):
    # the program's first element, its tiles and the offsets of its block
    BLOCK: tl.constexpr = BT * TC
    if INNER:
        # Tiles along an axis with `inner` elements after it (NCHW channels): a program
        # takes BT tiles side by side, one per inner position, so each of the tile's TC rows
        # is BT consecutive elements (coalesced). Row r of tile (row, i) is at
        # (row * TC + r) * inner + i; the tile's index (scale grid) is row * inner + i.
        n_ib = (inner + BT - 1) // BT
        row = pid // n_ib
        i = (pid - row * n_ib) * BT + tl.arange(0, BT)
        start = row.to(tl.int64) * TC * inner + (pid - row * n_ib) * BT
        tile = row.to(tl.int64) * inner + i
        t_ok = i < inner
        offs = tl.arange(0, BT)[:, None] + tl.arange(0, TC)[None, :].to(tl.int64) * inner
        ok = t_ok[:, None] & (offs >= 0)
    else:
        start = pid.to(tl.int64) * BLOCK
        tile = pid * BT + tl.arange(0, BT)
        t_ok = tile < n_tiles
        if G3 > 1:
            # Compress with sub-byte codes: each packing group lies along the innermost axis,
            # so the bytes come out of an in-register sum, with no reshape of the block
            offs = (
                tl.arange(0, BT)[:, None, None] * TC
                + tl.arange(0, TC // G3)[None, :, None] * G3
                + tl.arange(0, G3)[None, None, :]
            )
            ok = t_ok[:, None, None] & (offs >= 0)
        else:
            offs = tl.arange(0, BT)[:, None] * TC + tl.arange(0, TC)[None, :]
            ok = t_ok[:, None] & (offs >= 0)
    return start, tile, t_ok, offs, ok


@triton.jit
def _fast_stats(
    xb,
    ok,
    t_ok,
    BT: tl.constexpr,
    NSUB: tl.constexpr,
    SUB: tl.constexpr,
    TC: tl.constexpr,
    SHIFT: tl.constexpr,
    G3: tl.constexpr,
    NAN_MODE: tl.constexpr,
    E_FLOAT: tl.constexpr,
):
    # The tiles' finite absmax bits (and their MX subtiles'), which tiles the NaN mode turns
    # to NaN (per tile and per element) and the NaN elements of the others (float elements
    # only: ints have no NaN code)
    ab = xb & 0x7FFFFFFF
    elem_nan = ab > 0x7F800000
    finite = ab < 0x7F800000
    absf = tl.where(finite, ab, 0)
    if SHIFT:
        sub_max = tl.max(tl.reshape(absf, (BT, NSUB, SUB)), axis=2)  # from 2-D or 3-D blocks
        amax_b = tl.max(sub_max, axis=1)
    elif G3 > 1:
        amax_b = tl.max(tl.max(absf, axis=2), axis=1)
        sub_max = amax_b  # no subtiles
    else:
        amax_b = tl.max(absf, axis=1)
        sub_max = amax_b  # no subtiles
    if NAN_MODE == 1:
        tnan = _tile_any(elem_nan, G3)
    elif NAN_MODE == 2:
        tnan = _tile_any(~finite, G3)
    else:
        tnan = t_ok & False
    tile_nan = _expand(tnan, BT, NSUB, SUB, TC, False, G3) & ok
    if E_FLOAT:
        elem_nan = elem_nan & ~tile_nan
    else:
        elem_nan = elem_nan & False
    return amax_b, sub_max, tnan, tile_nan, elem_nan


@triton.jit
def _shifted_units(sexp, maxexp, amax_b, sub_max, SHIFT: tl.constexpr):
    # Scale exponents per unit (a tile, or an MX subtile whose exponent is one lower), so each
    # element pays a multiply, not the power-of-two arithmetic; and the shifted subtiles
    if SHIFT:
        # MX: a subtile is shifted when all of it is below 2^floor(log2 amax)
        p2 = _pow2(tl.maximum(maxexp, -149)).to(tl.int32, bitcast=True)
        below = (sub_max < p2[:, None]) & (amax_b[:, None] != 0)
        eu = sexp[:, None] - below.to(tl.int32)
    else:
        below = amax_b < 0  # no subtile is shifted
        eu = sexp
    return eu, below


@triton.jit
def _exp_factors(
    a,
    eu,
    BT: tl.constexpr,
    NSUB: tl.constexpr,
    SUB: tl.constexpr,
    TC: tl.constexpr,
    SHIFT: tl.constexpr,
    G3: tl.constexpr,
    SPLIT: tl.constexpr,
):
    # v = |x| / 2^eu per element and the factor back; SPLIT: 2^-eu may exceed float32, so
    # scale by 2^-(eu + K) and round onto a grid 2^K finer (kk: K per element)
    if SPLIT:
        k = tl.maximum(-eu - 127, 0)
    else:
        k = eu * 0
    v = a * _expand(_pow2(-eu - k), BT, NSUB, SUB, TC, SHIFT, G3)
    eff = _expand(_pow2(eu + k), BT, NSUB, SUB, TC, SHIFT, G3)
    if SPLIT:
        kk = _expand(k, BT, NSUB, SUB, TC, SHIFT, G3)
    else:
        kk = 0
    return v, eff, kk


@triton.jit
def _exp_bound(
    eu,
    E_FLOAT: tl.constexpr,
    E_EMIN: tl.constexpr,
    E_MBITS: tl.constexpr,
    E_MAXF: tl.constexpr,
    E_LIM: tl.constexpr,
    OUT_KIND: tl.constexpr,
):
    # The element bound per unit: the grid floor of max / 2^eu, with max the output type's
    # largest finite value (reference `finite_bound`). Inf: none needed; so is every 2^-eu
    # beyond float32, where SPLIT scales in two steps.
    if OUT_KIND == 0:
        F_MAX: tl.constexpr = 3.4028234663852886e38
    elif OUT_KIND == 1:
        F_MAX: tl.constexpr = 65504.0
    else:
        F_MAX: tl.constexpr = 3.3895313892515355e38
    reach = F_MAX * _pow2(tl.minimum(tl.maximum(-eu, -149), 127))
    reach = tl.where(-eu > 127, float("inf"), reach)
    if E_FLOAT:
        rl = tl.maximum((reach.to(tl.int32, bitcast=True) >> 23) - 127, E_EMIN) - E_MBITS
        gl = tl.floor(reach * _pow2(-rl)) * _pow2(rl)
        bound = tl.where(reach >= E_MAXF, float("inf"), gl)
    else:
        bound = tl.where(reach >= E_LIM + 1.0, float("inf"), tl.floor(reach))
    return bound


@triton.jit
def _tensor_scale(
    top_ptr,
    ts_code_ptr,
    TS: tl.constexpr,
    TS_DENOM: tl.constexpr,
    T_ROUND: tl.constexpr,
    T_MBITS: tl.constexpr,
    T_EMIN: tl.constexpr,
    T_MAXF: tl.constexpr,
):
    # NVFP4's tensor scale from the tensor amax (program 0 stores its code); 1 without one
    if TS:
        top = tl.load(top_ptr).to(tl.float32, bitcast=True)
        tsr = tl.div_rn(top, tl.full(top.shape, TS_DENOM, tl.float32))
        if T_ROUND:
            ts = _round_float(tsr, T_MBITS, T_EMIN, T_MAXF)
        else:
            ts = tsr
        if T_ROUND:
            tcode = _float_code_of(ts, T_MBITS, T_EMIN)
        else:
            tcode = ts.to(tl.int32, bitcast=True)
        tl.store(ts_code_ptr, tcode, mask=tl.program_id(0) == 0)
    else:
        ts = 1.0
    return ts


@triton.jit
def _float_scale(
    amax_b,
    tnan,
    ts,
    EL_MAXF: tl.constexpr,
    S_MBITS: tl.constexpr,
    S_EMIN: tl.constexpr,
    S_MAXF: tl.constexpr,
    S_NAN: tl.constexpr,
    TS: tl.constexpr,
):
    # float scale: scale = cast(amax / maxfloat [/ tensor scale]); returns the effective scale
    # (times the tensor scale) per tile and the scale codes
    amax_f = amax_b.to(tl.float32, bitcast=True)
    raw_s = tl.div_rn(amax_f, tl.full(amax_f.shape, EL_MAXF, tl.float32))
    if TS:
        raw_s = tl.where(ts > 0, tl.div_rn(raw_s, tl.broadcast_to(ts, raw_s.shape)), 0.0)
    sc = _round_float(raw_s, S_MBITS, S_EMIN, S_MAXF)
    scode = tl.where(tnan, S_NAN, _float_code_of(sc, S_MBITS, S_EMIN))
    if TS:
        eff_t = sc * ts
    else:
        eff_t = sc
    return eff_t, scode


@triton.jit
def _round_elems(
    v,
    neg,
    kk,
    bound,
    E_FLOAT: tl.constexpr,
    E_MBITS: tl.constexpr,
    E_EMIN: tl.constexpr,
    E_MAXF: tl.constexpr,
    E_LIM: tl.constexpr,
    FULL_INT: tl.constexpr,
    SPLIT: tl.constexpr,
):
    # v rounded half-even onto the element grid, saturating, at most `bound`
    if E_FLOAT:
        r = _round_float(v, E_MBITS, E_EMIN, E_MAXF)
    elif SPLIT:
        # v < 2^(22 - K) rounds to a multiple of 2^-K; Inf's NaN sum meets min() below
        magic = ((150 - kk) << 23 | 0x400000).to(tl.float32, bitcast=True)
        r = (v + magic) - magic
        if FULL_INT:
            r = tl.minimum(r, (E_LIM + neg.to(tl.float32)) * _pow2(-kk))
        else:
            r = tl.minimum(r, E_LIM * _pow2(-kk))
    else:
        # v < 2^22 (the scale bounds it) rounds to an integer; Inf's NaN sum meets min()
        r = (v + 12582912.0) - 12582912.0
        if FULL_INT:
            r = tl.minimum(r, E_LIM + neg.to(tl.float32))
        else:
            r = tl.minimum(r, E_LIM)
    return tl.minimum(r, bound)


@triton.jit
def _step_down(r, eff, E_FLOAT: tl.constexpr, E_MBITS: tl.constexpr, OUT_KIND: tl.constexpr):
    # Float scales: products that round past the output type's range step down the grid
    # (reference `_product_bound`; two steps cover every rounding of the scale). F_OVER: the
    # float32 bits from which rounding to the output type gives Inf.
    if OUT_KIND == 0:
        F_OVER: tl.constexpr = 0x7F800000
    elif OUT_KIND == 1:
        F_OVER: tl.constexpr = 0x477FF000
    else:
        F_OVER: tl.constexpr = 0x7F7F8000
    for _step in tl.static_range(2):
        bad = ((r * eff).to(tl.int32, bitcast=True) & 0x7FFFFFFF) >= F_OVER
        if E_FLOAT:
            pred = (r.to(tl.int32, bitcast=True) - (1 << (23 - E_MBITS))).to(
                tl.float32, bitcast=True
            )
        else:
            pred = r - 1.0
        r = tl.where(bad & (r > 0), pred, r)
    return r


@triton.jit
def _fast_store_values(
    y_ptr,
    offs,
    ok,
    xb,
    r,
    eff,
    tile_nan,
    elem_nan,
    E_NEGZERO: tl.constexpr,
    OUT_KIND: tl.constexpr,
    HW_BF16: tl.constexpr,
):
    # r * eff is finite or Inf: NaN comes only from the input (elements) or the tile
    if E_NEGZERO:
        yb = (r * eff).to(tl.int32, bitcast=True) | (xb & -2147483648)
    else:
        yb = (r * eff).to(tl.int32, bitcast=True) | tl.where(r > 0, xb & -2147483648, 0)
    nan = tile_nan | elem_nan
    # every NaN is the canonical quiet NaN of the output type (reference._canonical_nan)
    if OUT_KIND == 0:
        out = tl.where(nan, 0x7FC00000, yb)
    elif OUT_KIND == 1:
        h = yb.to(tl.float32, bitcast=True).to(tl.float16).to(tl.int16, bitcast=True)
        out = tl.where(nan, 0x7E00, h).to(tl.int16)
    elif HW_BF16:  # cvt.rn.bf16.f32: one instruction, round half-even, subnormals kept
        h = yb.to(tl.float32, bitcast=True).to(tl.bfloat16).to(tl.int16, bitcast=True)
        out = tl.where(nan, 0x7FC0, h).to(tl.int16)
    else:  # the interpreter's conversion does not round half-even: do it on the bits
        mag = yb & 0x7FFFFFFF
        h = ((mag + 0x7FFF + ((mag >> 16) & 1)) >> 16) | ((yb >> 16) & 0x8000)
        out = tl.where(nan, 0x7FC0, h).to(tl.int16)
    tl.store(y_ptr + offs, out, mask=ok)


@triton.jit
def _fast_codes(
    r,
    neg,
    kk,
    elem_nan,
    E_FLOAT: tl.constexpr,
    E_MBITS: tl.constexpr,
    E_EMIN: tl.constexpr,
    E_BITS: tl.constexpr,
    E_NEGZERO: tl.constexpr,
    E_NANCODE: tl.constexpr,
    SPLIT: tl.constexpr,
):
    # the element codes of the rounded magnitudes r (NaN elements: the NaN code)
    if E_FLOAT:
        sgn = neg & ((r != 0) | E_NEGZERO)
        code = _float_code_of(r, E_MBITS, E_EMIN) | (sgn.to(tl.int32) << (E_BITS - 1))
        code = tl.where(elem_nan, E_NANCODE, code)
    else:
        if SPLIT:
            n = (r * _pow2(kk)).to(tl.int32)
        else:
            n = r.to(tl.int32)
        code = tl.where(neg, -n, n) & ((1 << E_BITS) - 1)
    return code


@triton.jit
def _store_codes(
    code_ptr,
    start,
    code,
    offs,
    ok,
    code_nbytes,
    BT: tl.constexpr,
    TC: tl.constexpr,
    E_BITS: tl.constexpr,
    E_G: tl.constexpr,
    G3: tl.constexpr,
    P_GROUP: tl.constexpr,
    P_UNIT: tl.constexpr,
    P_UNITS: tl.constexpr,
    PACKED: tl.constexpr,
):
    # one byte per code, or (PACKED, codes under 8 bits) packing.py's bit stream
    if PACKED:
        if E_G == 1:
            tl.store(code_ptr + start + offs, code.to(tl.uint8), mask=ok)
        else:
            pid = tl.program_id(0)
            _pack_store(
                code_ptr, code, pid, code_nbytes, BT, TC, E_BITS, P_GROUP, P_UNIT, P_UNITS, G3 > 1
            )
    else:
        tl.store(code_ptr + start + offs, code.to(tl.uint8), mask=ok)


@triton.jit
def _store_shift_bits(
    meta_ptr,
    below,
    tile,
    t_ok,
    pid,
    meta_nbytes,
    inner,
    BT: tl.constexpr,
    NSUB: tl.constexpr,
    PACKED: tl.constexpr,
    INNER: tl.constexpr,
):
    # MX shift bits: one byte per subtile, or (PACKED) one bit
    bits = below.to(tl.int32) & t_ok[:, None]
    if PACKED:
        _pack_store(meta_ptr, bits, pid, meta_nbytes, BT, NSUB, 1, 8, 8, 1, False)
    else:
        if INNER:  # the subtile grid: subtile s of tile (row, i) at (row * NSUB + s) * inner + i
            row = tile // inner
            i = tile - row * inner
            moffs = (row[:, None] * NSUB + tl.arange(0, NSUB)[None, :]) * inner + i[:, None]
        else:
            moffs = tile[:, None] * NSUB + tl.arange(0, NSUB)[None, :]
        tl.store(meta_ptr + moffs, bits.to(tl.uint8), mask=t_ok[:, None])


@triton.jit
def _float_scaled(a, xb, neg, eff, E_NEGZERO: tl.constexpr):
    # The magnitudes over a float scale. A zero scale (an all-zero tile, or one that
    # underflows the scale format) sends every element but NaN to +0, negative ones included
    # (reference `_float_scaled`); without a -0 code (NVFP4) r = 0 drops the sign already, so
    # no work per element.
    scaled = eff > 0
    v = tl.where(scaled, tl.div_rn(a, eff), 0.0)
    if E_NEGZERO:
        neg = neg & scaled
        xb = tl.where(scaled, xb, xb & 0x7FFFFFFF)
    return v, neg, xb


# -- the kernel ------------------------------------------------------------------------------------
@triton.jit
def _fast_kernel(
    x_ptr,
    y_ptr,
    code_ptr,
    scale_ptr,
    meta_ptr,
    top_ptr,
    ts_code_ptr,
    n_tiles,
    code_nbytes,
    meta_nbytes,
    inner,  # INNER: elements after the tiled axis
    TC: tl.constexpr,
    NSUB: tl.constexpr,
    SUB: tl.constexpr,
    BT: tl.constexpr,
    OUT_KIND: tl.constexpr,
    HW_BF16: tl.constexpr,
    WANT_Y: tl.constexpr,
    WANT_CODES: tl.constexpr,
    PACKED: tl.constexpr,
    G3: tl.constexpr,  # > 1: the block is (BT, TC // G3, G3), packing groups innermost
    P_GROUP: tl.constexpr,  # packed codes: groups of P_GROUP codes (G3 when G3 > 1) ...
    P_UNIT: tl.constexpr,  # ... written as P_UNITS integers of P_UNIT bits each
    P_UNITS: tl.constexpr,
    NAN_MODE: tl.constexpr,  # 0 element NaNs, 1 a NaN makes the tile NaN, 2 so does an Inf
    SKIND: tl.constexpr,  # 1 exponent scale, 2 float scale
    SHIFT: tl.constexpr,
    SPLIT: tl.constexpr,  # 2^-sexp may exceed float32: scale by two factors
    E_FLOAT: tl.constexpr,
    E_MBITS: tl.constexpr,
    E_EMIN: tl.constexpr,
    E_EMAX: tl.constexpr,
    E_MAXF: tl.constexpr,
    E_BITS: tl.constexpr,
    E_G: tl.constexpr,
    E_NEGZERO: tl.constexpr,
    E_NANCODE: tl.constexpr,
    E_LIM: tl.constexpr,
    FULL_INT: tl.constexpr,
    SMODE: tl.constexpr,
    MID_T: tl.constexpr,
    TOP_T: tl.constexpr,
    S_LOW: tl.constexpr,
    S_HIGH: tl.constexpr,
    S_BIAS: tl.constexpr,
    S_NAN: tl.constexpr,
    EL_MAXF: tl.constexpr,
    S_MBITS: tl.constexpr,
    S_EMIN: tl.constexpr,
    S_MAXF: tl.constexpr,
    TS: tl.constexpr,
    TS_DENOM: tl.constexpr,
    T_ROUND: tl.constexpr,
    T_MBITS: tl.constexpr,
    T_EMIN: tl.constexpr,
    T_MAXF: tl.constexpr,
    INNER: tl.constexpr = False,  # tiles along a non-last axis (whole tiles, not PACKED)
):
    pid = tl.program_id(0)
    start, tile, t_ok, offs, ok = _fast_offsets(pid, n_tiles, inner, BT, TC, G3, INNER)
    xb, _raw = _load_bits(x_ptr + start, offs, ok, OUT_KIND)
    a = (xb & 0x7FFFFFFF).to(tl.float32, bitcast=True)
    neg = xb < 0
    amax_b, sub_max, tnan, tile_nan, elem_nan = _fast_stats(
        xb, ok, t_ok, BT, NSUB, SUB, TC, SHIFT, G3, NAN_MODE, E_FLOAT
    )
    if SKIND == 1:
        sexp, maxexp = _scale_exp(
            amax_b, E_FLOAT, E_MBITS, E_EMAX, SMODE, MID_T, TOP_T, S_LOW, S_HIGH
        )
        scode = tl.where(tnan, S_NAN, sexp + S_BIAS)
        eu, below = _shifted_units(sexp, maxexp, amax_b, sub_max, SHIFT)
        v, eff, kk = _exp_factors(a, eu, BT, NSUB, SUB, TC, SHIFT, G3, SPLIT)
        bound = _exp_bound(eu, E_FLOAT, E_EMIN, E_MBITS, E_MAXF, E_LIM, OUT_KIND)
        bound = _expand(bound, BT, NSUB, SUB, TC, SHIFT, G3)
    else:
        ts = _tensor_scale(top_ptr, ts_code_ptr, TS, TS_DENOM, T_ROUND, T_MBITS, T_EMIN, T_MAXF)
        eff_t, scode = _float_scale(amax_b, tnan, ts, EL_MAXF, S_MBITS, S_EMIN, S_MAXF, S_NAN, TS)
        eff = _expand(eff_t, BT, NSUB, SUB, TC, False, G3)
        v, neg, xb = _float_scaled(a, xb, neg, eff, E_NEGZERO)
        kk = 0
        bound = float("inf")
    r = _round_elems(v, neg, kk, bound, E_FLOAT, E_MBITS, E_EMIN, E_MAXF, E_LIM, FULL_INT, SPLIT)
    if SKIND == 2:
        r = _step_down(r, eff, E_FLOAT, E_MBITS, OUT_KIND)
    if WANT_Y:
        _fast_store_values(
            y_ptr + start, offs, ok, xb, r, eff, tile_nan, elem_nan, E_NEGZERO, OUT_KIND, HW_BF16
        )
    if WANT_CODES:
        code = _fast_codes(
            r, neg, kk, elem_nan, E_FLOAT, E_MBITS, E_EMIN, E_BITS, E_NEGZERO, E_NANCODE, SPLIT
        )
        code = tl.where(tile_nan, 0, code)
        _store_codes(
            code_ptr,
            start,
            code,
            offs,
            ok,
            code_nbytes,
            BT,
            TC,
            E_BITS,
            E_G,
            G3,
            P_GROUP,
            P_UNIT,
            P_UNITS,
            PACKED,
        )
        tl.store(scale_ptr + tile, scode.to(tl.uint8), mask=t_ok)
        if SHIFT:
            _store_shift_bits(
                meta_ptr, below, tile, t_ok, pid, meta_nbytes, inner, BT, NSUB, PACKED, INNER
            )
