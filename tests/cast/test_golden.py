"""Golden casts: every expected value is derived by hand, in the comment beside it.

Sources: the codebook, scaling, modes, MX9/MX6/MX4 and BFP documents and
docs/architecture.md (decisions 1-11 and "Packing", cited below as "decision N"). Nothing
here was produced by running the code.

Rules used in the derivations:

* Element rounding (decision 1): e = max(floor(log2|v|), emin), step 2^(e - mbits), round
  (even / away / zero = nearest with ties toward zero), clamp to +-maxfloat. Ints: step 1,
  clamp +-(2^(N-1) - 1) (decision 6).
* Exponent scales (decision 2, 3): sexp = maxexp' - emax_elem, clamped to [-127, 127];
  E8M0 code = sexp + 127; all-zero tile -> code 0; NaN -> code 255. Ints always floor, with
  emax(intN) = floor(log2(2^(N-1) - 1)) = N - 2 (one integer bit).
  Elements are stored as v = x / 2^sexp; the virtual result is q(v) * 2^sexp.
* Element formats (code = sign | field << mbits | mant; field 0 = subnormal):
  e2m1fnuz bias 1: 0 .5 1 1.5 2 3 4 6, codes 0..7, emax 2, max 6, midmax 6 + 2^(2-1-1) = 7
  e2m3fnuz bias 1: max 7.5 (code 31), emax 2, midmax 7.5 + 2^(2-3-1) = 7.75
  e3m2fnuz bias 3: emin -2, max 28 (code 31), smallest 2^-4
  e4m3fn   bias 7: emin -6, max 448 (code 126), NaN 127, smallest 2^-9, emax 8,
           midmax 448 + 2^(8-3-1) = 464
  e4m3b8fnuz (torch float8_e4m3fnuz) bias 8: emin -7, max 240 (code 127), NaN 128
  e5m2     bias 15 ieee: emin -14, max 57344 (code 123), Inf 124, NaN 126, smallest 2^-16
  bfloat16: emin -126, 7 mantissa bits; float16: emin -14, 10 mantissa bits
  fnuz formats have no -0 (NaN is the -0 code); fn/ieee keep -0 (code with the sign bit).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from onnxq.cast import native
from onnxq.cast.api import QTensor, cast, upcast
from onnxq.deploy import bfp
from onnxq.formats.datatype import datatype

NAN = float("nan")
INF = float("inf")


def p2(e: int) -> float:
    """2^e as an exact Python float."""
    return 2.0**e


def tile(head: list[float], n: int = 32) -> list[float]:
    """``head`` followed by zeros up to ``n`` values."""
    return [*head, *([0.0] * (n - len(head)))]


def ctile(head: list[int], n: int = 32, fill: int = 0) -> list[int]:
    """Codes ``head`` followed by ``fill`` up to ``n`` codes."""
    return [*head, *([fill] * (n - len(head)))]


@dataclasses.dataclass(frozen=True, eq=False)
class Case:
    """One golden cast: input, keyword arguments, and what the architecture says comes out."""

    name: str
    dtype: str
    x: Any
    expected: Any  # the virtual (fake-quantized) result, float32
    kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    shape: tuple[int, ...] | None = None
    data: Any = None  # element codes (mode="actual"), input shape
    scale: Any = None  # scale codes, grid layout
    zero: Any = None
    tenscale: Any = None
    meta: Any = None
    packed_nbytes: int | None = None  # bytes of the packed data in compress mode


# -- the helper ---------------------------------------------------------------------------


def _bits_mismatch(label: str, got: Any, want: Any) -> list[str]:
    got = np.asarray(got)
    want = np.asarray(want, dtype=np.float32)
    if got.dtype != np.float32:
        return [f"{label}: dtype {got.dtype}, want float32"]
    if got.shape != want.shape:
        return [f"{label}: shape {got.shape}, want {want.shape}"]
    gn, wn = np.isnan(got), np.isnan(want)
    same = np.where(gn | wn, gn == wn, got.view(np.uint32) == want.view(np.uint32))
    return [
        f"{label}{tuple(int(i) for i in idx)}: got {float(got[idx])!r}, want {float(want[idx])!r}"
        for idx in zip(*np.nonzero(~same), strict=True)
    ]


def _codes_mismatch(label: str, got: Any, want: Any) -> list[str]:
    if got is None:
        return [f"{label}: missing"]
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        return [f"{label}: shape {got.shape}, want {want.shape}"]
    bad = got.astype(np.int64) != want.astype(np.int64)
    return [
        f"{label}{tuple(int(i) for i in idx)}: got {int(got[idx])}, want {int(want[idx])}"
        for idx in zip(*np.nonzero(bad), strict=True)
    ]


def check(c: Case) -> list[str]:
    """Every mismatch of one case, each prefixed by the case name."""
    x = np.asarray(c.x, dtype=np.float32)
    if c.shape is not None:
        x = x.reshape(c.shape)
    want = np.asarray(c.expected, dtype=np.float32).reshape(x.shape)
    errors: list[str] = []
    virtual = cast(x, c.dtype, **c.kwargs)
    errors += _bits_mismatch("virtual", virtual, want)
    actual = cast(x, c.dtype, mode="actual", **c.kwargs)
    assert isinstance(actual, QTensor)
    for field in ("data", "scale", "zero", "tenscale", "meta"):
        expected = getattr(c, field)
        if expected is None:
            continue
        expected = np.asarray(expected)
        if field == "data":
            expected = expected.reshape(x.shape)
        errors += _codes_mismatch(f"actual.{field}", getattr(actual, field), expected)
    errors += _bits_mismatch("upcast(actual)", upcast(actual, x.dtype), virtual)
    packed = cast(x, c.dtype, mode="compress", **c.kwargs)
    assert isinstance(packed, QTensor)
    errors += _bits_mismatch("upcast(compress)", upcast(packed, x.dtype), virtual)
    if c.packed_nbytes is not None and packed.data.nbytes != c.packed_nbytes:
        errors.append(f"compress: {packed.data.nbytes} data bytes, want {c.packed_nbytes}")
    return [f"{c.name}: {e}" for e in errors]


def params(table: list[Case], xfail: dict[str, str] | None = None) -> list[Any]:
    xfail = xfail or {}
    names = [c.name for c in table]
    assert len(set(names)) == len(names), "case names must be unique"
    return [
        pytest.param(
            c,
            id=c.name,
            marks=[pytest.mark.xfail(strict=True, reason=xfail[c.name])] if c.name in xfail else [],
        )
        for c in table
    ]


def run(case: Case) -> None:
    errors = check(case)
    assert not errors, "\n".join(errors)


# -- family 1: unscaled element formats ------------------------------------------------------
# Bare number codes: no scale; finite overflow saturates (decision 1); Inf stays Inf only where
# the format has Inf (e5m2, bfloat16, float16: decision 5), else saturates to maxfloat.

BF16_MAX = (2 - p2(-7)) * p2(127)  # 0x7F7F
F32_MAX = (2 - p2(-23)) * p2(127)

UNSCALED_SPECS: list[tuple[str, list[float], dict[str, list[float]], list[int]]] = [
    (
        "e2m1fnuz",
        # 2.5: e=1, step 1, tie 2|3; 0.25: e=max(-2,0)=0, step .5 -> 0.5 steps, tie 0|.5;
        # 0.75: 1.5 steps, tie .5|1 (even code is 1.0 = 2 steps); 5.0: e=2, step 2 -> 2.5,
        # tie 4|6; 7.0: 3.5 steps, tie 6|8 -> even 8 clamps to 6, zero gives 6;
        # 1e6 -> clamp 6; -0.25/-0.0 -> +0 (fnuz has no -0); +-Inf -> +-6 (no Inf);
        # 1.25: 2.5 steps of .5, tie 1|1.5; 3.5: step 1, tie 3|4.
        [2.5, 0.25, 0.75, 5.0, 7.0, 1e6, -2.5, -0.25, -0.0, INF, -INF, NAN, 1.25, 3.5],
        {
            "even": [2, 0, 1, 4, 6, 6, -2, 0, 0, 6, -6, NAN, 1, 4],
            "away": [3, 0.5, 1, 6, 6, 6, -3, -0.5, 0, 6, -6, NAN, 1.5, 4],
            "zero": [2, 0, 0.5, 4, 6, 6, -2, 0, 0, 6, -6, NAN, 1, 3],
        },
        # even codes: 2 -> f2 m0 = 4; 1 -> 2; 4 -> 6; 6 -> 7; -2 -> 8|4 = 12; -6 -> 15;
        # NaN (fnuz) -> the -0 code 8.
        [4, 0, 2, 6, 7, 7, 12, 0, 0, 7, 15, 8, 2, 6],
    ),
    (
        "e4m3fn",
        # 464 = 448 + 16: e=8, step 32 -> 14.5, tie 448|480, 480 clamps to 448 (decision 1);
        # 480, 1e9, Inf -> 448 (no Inf in fn); 2^-9 = smallest subnormal; 2^-10: tie 0|2^-9;
        # 3*2^-10: 1.5 steps, tie 2^-9|2^-8; -2^-10 -> -0 (fn keeps -0);
        # 17: e=4, step 2 -> 8.5, tie 16|18; 1.0625: step 1/8 -> 8.5, tie 1|1.125.
        [
            448,
            464,
            480,
            1e9,
            INF,
            -INF,
            NAN,
            p2(-9),
            p2(-10),
            3 * p2(-10),
            -p2(-10),
            -0.0,
            17,
            1.0625,
        ],
        {
            "even": [448, 448, 448, 448, 448, -448, NAN, p2(-9), 0, p2(-8), -0.0, -0.0, 16, 1.0],
            "away": [
                448,
                448,
                448,
                448,
                448,
                -448,
                NAN,
                p2(-9),
                p2(-9),
                p2(-8),
                -p2(-9),
                -0.0,
                18,
                1.125,
            ],
            "zero": [448, 448, 448, 448, 448, -448, NAN, p2(-9), 0, p2(-9), -0.0, -0.0, 16, 1.0],
        },
        # 448 -> 126; -448 -> 254; NaN -> 127; 2^-8 -> subnormal m=2 -> 2; -0 -> 128;
        # 16 = 2^4 -> field 11 -> 88; 1.0 -> field 7 -> 56.
        [126, 126, 126, 126, 126, 254, 127, 1, 0, 2, 128, 128, 88, 56],
    ),
    (
        "e5m2",
        # 61440 = 7.5 * 2^13: e=15, step 2^13, tie 57344|65536 -> even 65536 clamps to 57344;
        # 65536, 1e9 -> 57344 (finite overflow saturates); Inf stays Inf (unscaled, has Inf);
        # 2^-17: tie 0|2^-16; 3*2^-17: tie 2^-16|2^-15; 1.125: step .25 -> 4.5, tie 1|1.25;
        # 1.375: 5.5, tie 1.25|1.5; -2^-17 -> -0 / -2^-16.
        [
            57344,
            61440,
            65536,
            1e9,
            INF,
            -INF,
            NAN,
            p2(-16),
            p2(-17),
            3 * p2(-17),
            -0.0,
            1.125,
            1.375,
            -p2(-17),
        ],
        {
            "even": [
                57344,
                57344,
                57344,
                57344,
                INF,
                -INF,
                NAN,
                p2(-16),
                0,
                p2(-15),
                -0.0,
                1.0,
                1.5,
                -0.0,
            ],
            "away": [
                57344,
                57344,
                57344,
                57344,
                INF,
                -INF,
                NAN,
                p2(-16),
                p2(-16),
                p2(-15),
                -0.0,
                1.25,
                1.5,
                -p2(-16),
            ],
            "zero": [
                57344,
                57344,
                57344,
                57344,
                INF,
                -INF,
                NAN,
                p2(-16),
                0,
                p2(-16),
                -0.0,
                1.0,
                1.25,
                -0.0,
            ],
        },
        # 57344 = 1.75*2^15 -> field 30, m 3 -> 123; Inf -> 31<<2 = 124; -Inf 252;
        # NaN -> 124|2 = 126; 1.0 -> field 15 -> 60; 1.5 -> 62; -0 -> 128.
        [123, 123, 123, 123, 124, 252, 126, 1, 0, 2, 128, 60, 62, 128],
    ),
    (
        "e2m3fnuz",
        # 7.75: e=2, step .5 -> 15.5, tie 7.5|8 -> 8 clamps to 7.5; 8 -> 7.5; 1.0625: e=0,
        # step 1/8 -> 8.5, tie 1|1.125; 0.0625: tie 0|.125; 0.1875: 1.5 steps, tie .125|.25;
        # -0.03125: 0.25 steps -> +0; 2.125: e=1, step .25 -> 8.5, tie 2|2.25; Inf -> 7.5.
        [7.5, 7.75, 8.0, 1.0625, 0.0625, 0.1875, -0.0, -0.03125, 2.125, INF, NAN],
        {
            "even": [7.5, 7.5, 7.5, 1.0, 0, 0.25, 0, 0, 2.0, 7.5, NAN],
            "away": [7.5, 7.5, 7.5, 1.125, 0.125, 0.25, 0, 0, 2.25, 7.5, NAN],
            "zero": [7.5, 7.5, 7.5, 1.0, 0, 0.125, 0, 0, 2.0, 7.5, NAN],
        },
        # 7.5 -> f3 m7 = 31; 1.0 -> f1 -> 8; 0.25 -> subnormal m=2 -> 2; 2.0 -> f2 -> 16;
        # NaN -> 32.
        [31, 31, 31, 8, 0, 2, 0, 0, 16, 31, 32],
    ),
    (
        "e3m2fnuz",
        # 30: e=4, step 4 -> 7.5, tie 28|32 -> 32 clamps to 28; 0.0625 = smallest subnormal;
        # 0.03125: tie 0|2^-4; 0.09375: 1.5 steps, tie 2^-4|2^-3; 1.125: e=0, step .25 ->
        # 4.5, tie 1|1.25; +-Inf -> +-28.
        [28, 30, 32, 0.0625, 0.03125, 0.09375, -0.0, 1.125, INF, -INF, NAN],
        {
            "even": [28, 28, 28, 0.0625, 0, 0.125, 0, 1.0, 28, -28, NAN],
            "away": [28, 28, 28, 0.0625, 0.0625, 0.125, 0, 1.25, 28, -28, NAN],
            "zero": [28, 28, 28, 0.0625, 0, 0.0625, 0, 1.0, 28, -28, NAN],
        },
        # 28 -> f7 m3 = 31; 2^-4 -> 1; 2^-3 -> subnormal m=2 -> 2; 1.0 -> f3 -> 12;
        # -28 -> 32|31 = 63; NaN -> 32.
        [31, 31, 31, 1, 0, 2, 0, 12, 31, 63, 32],
    ),
    (
        "e4m3b8fnuz",
        # float8_e4m3fnuz (decision 9: bias 8, max 240). 248: e=7, step 16 -> 15.5, tie
        # 240|256 -> 256 clamps; 2^-10 = smallest subnormal; 2^-11: tie 0|2^-10; -0 -> +0;
        # -2^-11 -> +0 (even, zero) / -2^-10 (away); 1.0625: tie 1|1.125; Inf -> 240.
        [240, 248, 256, p2(-10), p2(-11), -0.0, -p2(-11), 1.0625, INF, NAN],
        {
            "even": [240, 240, 240, p2(-10), 0, 0, 0, 1.0, 240, NAN],
            "away": [240, 240, 240, p2(-10), p2(-10), 0, -p2(-10), 1.125, 240, NAN],
            "zero": [240, 240, 240, p2(-10), 0, 0, 0, 1.0, 240, NAN],
        },
        # 240 = 1.875*2^7 -> f15 m7 = 127; 1.0 -> f8 -> 64; NaN -> 128.
        [127, 127, 127, 1, 0, 0, 0, 64, 127, 128],
    ),
    (
        "bfloat16",
        # 1 + 2^-8: step 2^-7 -> 128.5, tie 1|1+2^-7; 1 + 3*2^-8: 129.5, tie 1+2^-7|1+2^-6;
        # float32 max: e=127, step 2^120 -> 255.99998 -> 256 -> 2^128 clamps to bf16 max
        # (saturation, not Inf: decision 1); Inf stays Inf; 2^-133 = smallest subnormal;
        # 2^-134: tie 0|2^-133; -2^-134 -> -0 (even, zero).
        [
            1 + p2(-8),
            1 + 3 * p2(-8),
            -(1 + p2(-8)),
            BF16_MAX,
            F32_MAX,
            INF,
            -INF,
            NAN,
            p2(-133),
            p2(-134),
            -0.0,
            -p2(-134),
        ],
        {
            "even": [
                1,
                1 + p2(-6),
                -1,
                BF16_MAX,
                BF16_MAX,
                INF,
                -INF,
                NAN,
                p2(-133),
                0,
                -0.0,
                -0.0,
            ],
            "away": [
                1 + p2(-7),
                1 + p2(-6),
                -(1 + p2(-7)),
                BF16_MAX,
                BF16_MAX,
                INF,
                -INF,
                NAN,
                p2(-133),
                p2(-133),
                -0.0,
                -p2(-133),
            ],
            "zero": [
                1,
                1 + p2(-7),
                -1,
                BF16_MAX,
                BF16_MAX,
                INF,
                -INF,
                NAN,
                p2(-133),
                0,
                -0.0,
                -0.0,
            ],
        },
        # bfloat16 = top half of float32: 1.0 0x3F80, 1+2^-6 0x3F82, -1 0xBF80, max 0x7F7F,
        # Inf 0x7F80, -Inf 0xFF80, NaN (quiet) 0x7FC0, 2^-133 0x0001, -0 0x8000.
        [0x3F80, 0x3F82, 0xBF80, 0x7F7F, 0x7F7F, 0x7F80, 0xFF80, 0x7FC0, 0x0001, 0, 0x8000, 0x8000],
    ),
    (
        "float16",
        # 65520: e=15, step 32 -> 2047.5, tie 65504|65536 -> 65536 clamps to 65504; 1e6 ->
        # 65504; 2049: e=11, step 2 -> 1024.5, tie 2048|2050; 2051: 1025.5, tie 2050|2052;
        # 2^-24 = smallest subnormal; 2^-25: tie 0|2^-24; 3*2^-25: tie 2^-24|2^-23.
        [65504, 65520, 1e6, 2049, 2051, p2(-24), p2(-25), 3 * p2(-25), -0.0, INF, NAN, -p2(-25)],
        {
            "even": [65504, 65504, 65504, 2048, 2052, p2(-24), 0, p2(-23), -0.0, INF, NAN, -0.0],
            "away": [
                65504,
                65504,
                65504,
                2050,
                2052,
                p2(-24),
                p2(-24),
                p2(-23),
                -0.0,
                INF,
                NAN,
                -p2(-24),
            ],
            "zero": [65504, 65504, 65504, 2048, 2050, p2(-24), 0, p2(-24), -0.0, INF, NAN, -0.0],
        },
        # 65504 0x7BFF; 2048 = 2^11 -> field 26 -> 0x6800; 2052 -> m=2 -> 0x6802;
        # 2^-24 -> 1; 2^-23 -> 2; -0 0x8000; Inf 0x7C00; NaN 0x7E00.
        [0x7BFF, 0x7BFF, 0x7BFF, 0x6800, 0x6802, 1, 0, 2, 0x8000, 0x7C00, 0x7E00, 0x8000],
    ),
]

UNSCALED: list[Case] = [
    Case(
        name=f"{code} {mode}",
        dtype=code,
        x=x,
        expected=outs[mode],
        kwargs={"round_mode": mode},
        data=codes if mode == "even" else None,
    )
    for code, x, outs, codes in UNSCALED_SPECS
    for mode in ("even", "away", "zero")
]


@pytest.mark.parametrize("case", params(UNSCALED))
def test_unscaled(case: Case) -> None:
    run(case)


# -- family 2: scale modes ------------------------------------------------------------------
MODES = ("floor", "ceil", "midmax", "option3", "topbinade", "rceil", "even")


def _modes(*codes: int) -> dict[str, int]:
    return dict(zip(MODES, codes, strict=True))


# mxfp4 (e2m1, emax 2, maxfloat 6, midmax 7, mbits 1), tile [A, 2.5, -1.5, 0.75, 0 x 28].
# floor(log2 A) = 2 for every A below, so floor -> sexp 0 (code 127); a bump -> code 128.
#   ceil: A > 2^2.  midmax: A > 7.  topbinade / rceil: A > 6 (rceil = ceil(log2(A/6))).
#   option3: A rounded half-even to 2 significant bits (A/2 to an integer) reaches 8.
#   even (torchao): same with ties away: A/2 + 0.5 floored reaches 4.
# A = 4.0: 4 > 4 no; A/2 = 2 -> nothing bumps.
# A = 5.0: ceil bumps; midmax 5 > 7 no; option3 2.5 -> 2 -> 4 no; topbinade no; even 3 -> no.
# A = 6.5: ceil; topbinade 6.5 > 6 and rceil ceil(log2 1.083) = 1; option3 3.25 -> 3 no;
#          even floor(3.75) = 3 no; midmax no.
# A = 7.0: midmax 7 > 7 is false; option3 3.5 -> even 4 -> 8 bumps; even floor(4.0) bumps;
#          topbinade, rceil, ceil bump.
# A = 7.5: midmax 7.5 > 7 bumps; all others bump too; only floor stays.
MXFP4_SCALE = {
    #          floor ceil midmax option3 topbinade rceil even
    4.0: _modes(127, 127, 127, 127, 127, 127, 127),
    5.0: _modes(127, 128, 127, 127, 127, 127, 127),
    6.5: _modes(127, 128, 127, 127, 128, 128, 127),
    7.0: _modes(127, 128, 127, 128, 128, 128, 128),
    7.5: _modes(127, 128, 128, 128, 128, 128, 128),
}
# Code 127 (scale 1): 2.5 -> 2 (tie even, code 4); -1.5 exact (8|3 = 11); 0.75 -> 1 (code 2).
#   A: 4 -> 4 (6); 5 -> step 2: 2.5 -> 2 -> 4 (6); 6.5 -> 3.25 -> 3 -> 6 (7);
#      7 -> 3.5 -> 4 -> 8 clamps to 6 (7); 7.5 -> 3.75 -> 4 -> 8 -> 6 (7).
# Code 128 (scale 2): 1.25 -> step .5: 2.5 -> 2 -> 1.0 (code 2) -> 2.0;
#   -0.75 -> 1.5 steps -> 2 -> -1.0 (10) -> -2.0; 0.375 -> .75 steps -> 1 -> .5 (1) -> 1.0.
#   A/2: 2 -> 2 (4) -> 4; 2.5 -> 2 (4) -> 4; 3.25 -> 3 (5) -> 6; 3.5 -> 4 (6) -> 8;
#        3.75 -> 4 (6) -> 8.
MXFP4_OUT = {
    127: {4.0: (4, 6), 5.0: (4, 6), 6.5: (6, 7), 7.0: (6, 7), 7.5: (6, 7)},
    128: {4.0: (4, 4), 5.0: (4, 4), 6.5: (6, 5), 7.0: (8, 6), 7.5: (8, 6)},
}
MXFP4_REST = {127: ([2.0, -1.5, 1.0], [4, 11, 2]), 128: ([2.0, -2.0, 1.0], [2, 10, 1])}

# mxfp8e4 (e4m3fn: emax 8, maxfloat 448, midmax 464, mbits 3), tile [A, 17, -9.5, .25, 0...].
# floor(log2 A) = 8; A/2^(8-3) = A/32 is what option3 / even round.
# A = 460: ceil, topbinade (460 > 448), rceil bump; midmax 460 <= 464; option3 14.375 -> 14;
#          even floor(14.875) = 14.
# A = 464: midmax 464 > 464 false; option3 14.5 -> 14 (even); even floor(15.0) = 15 < 16.
# A = 470: midmax 470 > 464 bumps; option3 14.6875 -> 15 -> 480 stays in binade 8;
#          even floor(15.1875) = 15.
# A = 500: option3 15.625 -> 16 -> 512 bumps; even 16 bumps; everything bumps but floor.
MXFP8_SCALE = {
    #          floor ceil midmax option3 topbinade rceil even
    460.0: _modes(127, 128, 127, 127, 128, 128, 127),
    464.0: _modes(127, 128, 127, 127, 128, 128, 127),
    470.0: _modes(127, 128, 128, 127, 128, 128, 127),
    500.0: _modes(127, 128, 128, 128, 128, 128, 128),
}
# Code 127: step 32 at A: 460 -> 14.375 -> 14 -> 448; 464 -> 14.5 -> 14 -> 448;
#   470 -> 14.6875 -> 15 -> 480 clamps to 448; 500 -> 15.625 -> 16 -> 512 -> 448 (code 126).
#   17: e=4, step 2 -> 8.5 -> 8 -> 16 (f11 -> 88); -9.5: e=3, step 1 -> tie -> -10
#   (1.25*2^3: f10 m2 = 82, |128 = 210); 0.25 (f5 -> 40).
# Code 128: A/2: 230 -> step 16: 14.375 -> 14 -> 224 (f14 m6 = 118) -> 448;
#   232 -> 14.5 -> 14 -> 224 (118) -> 448; 235 -> 14.6875 -> 15 -> 240 (119) -> 480;
#   250 -> 15.625 -> 16 -> 256 (f15 = 120) -> 512.
#   8.5: step 1 -> 8 (f10 = 80) -> 16; -4.75: step .5 -> 9.5 -> 10 -> -5 (f9 m2 = 74|128 = 202)
#   -> -10; 0.125 (f4 = 32) -> 0.25.
MXFP8_OUT = {
    127: {460.0: (448, 126), 464.0: (448, 126), 470.0: (448, 126), 500.0: (448, 126)},
    128: {460.0: (448, 118), 464.0: (448, 118), 470.0: (480, 119), 500.0: (512, 120)},
}
MXFP8_REST = {127: ([16.0, -10.0, 0.25], [88, 210, 40]), 128: ([16.0, -10.0, 0.25], [80, 202, 32])}

# mxfp6e2 (e2m3: emax 2, maxfloat 7.5, midmax 7.75, mbits 3), tile [7.75, 1.0625, -0.0625].
# floor(log2 7.75) = 2. midmax: 7.75 > 7.75 false. option3: 7.75/2^(2-3) = 15.5 -> 16 bumps;
# even 16 bumps; ceil, topbinade (7.75 > 7.5), rceil bump.
# Code 127: 7.75 -> step .5 -> 15.5 -> 16 -> 8 clamps to 7.5 (31); 1.0625 -> 8.5 -> 8 -> 1.0
#   (8); -0.0625 -> 0.5 steps of 1/8 -> +0 (0).
# Code 128: 3.875 -> step .25 -> 15.5 -> 16 -> 4 (f3 m0 = 24) -> 8; 0.53125 -> e=0, step 1/8
#   -> 4.25 -> 4 -> 0.5 (subnormal m=4 -> 4) -> 1.0; -0.03125 -> 0.25 steps -> +0.
MXFP6_SCALE = _modes(127, 128, 127, 128, 128, 128, 128)
MXFP6_OUT = {127: ([7.5, 1.0, 0.0], [31, 8, 0]), 128: ([8.0, 1.0, 0.0], [24, 4, 0])}


def _scale_mode_cases() -> list[Case]:
    cases = []
    for a, per_mode in MXFP4_SCALE.items():
        for mode, code in per_mode.items():
            val, vcode = MXFP4_OUT[code][a]
            rest, rcodes = MXFP4_REST[code]
            cases.append(
                Case(
                    name=f"mxfp4 absmax {a} {mode}",
                    dtype="mxfp4",
                    x=tile([a, 2.5, -1.5, 0.75]),
                    kwargs={"scale_mode": mode},
                    expected=tile([val, *rest]),
                    scale=[code],
                    data=ctile([vcode, *rcodes]),
                    packed_nbytes=16,  # 32 x 4 bits
                )
            )
    for a, per_mode in MXFP8_SCALE.items():
        for mode, code in per_mode.items():
            val, vcode = MXFP8_OUT[code][a]
            rest, rcodes = MXFP8_REST[code]
            cases.append(
                Case(
                    name=f"mxfp8e4 absmax {a} {mode}",
                    dtype="mxfp8e4",
                    x=tile([a, 17.0, -9.5, 0.25]),
                    kwargs={"scale_mode": mode},
                    expected=tile([val, *rest]),
                    scale=[code],
                    data=ctile([vcode, *rcodes]),
                )
            )
    for mode, code in MXFP6_SCALE.items():
        vals, codes = MXFP6_OUT[code]
        cases.append(
            Case(
                name=f"mxfp6e2 absmax 7.75 {mode}",
                dtype="mxfp6e2",
                x=tile([7.75, 1.0625, -0.0625]),
                kwargs={"scale_mode": mode},
                expected=tile(vals),
                scale=[code],
                data=ctile(codes),
                packed_nbytes=24,  # 32 x 6 bits as one bit stream (architecture "Packing")
            )
        )
    for mode in MODES:
        # mxint8: ints always floor (decision 3). absmax 1.5: floor(log2) = 0 -> E8M0 exponent 0
        # (code 127: int8 is fixed point 1.6, OCP MXINT8) whatever the mode; grid step 2^-6,
        # v = 64x: 96, -64, 32.5 -> even 32 -> 0.5.
        # codes: 96; -64 -> 192; 32.
        cases.append(
            Case(
                name=f"mxint8 ints floor {mode}",
                dtype="mxint8",
                x=tile([1.5, -1.0, 0.5078125]),
                kwargs={"scale_mode": mode},
                expected=tile([1.5, -1.0, 0.5]),
                scale=[127],
                data=ctile([96, 192, 32]),
            )
        )
    return cases


SCALE_MODES = _scale_mode_cases()


@pytest.mark.parametrize("case", params(SCALE_MODES))
def test_scale_modes(case: Case) -> None:
    run(case)


# -- family 3: integer elements, tensor / channel scales ------------------------------------
INTS: list[Case] = [
    # v = 64x (sexp -6): 0.5078125 * 64 = 32.5 -> away 33 -> 0.515625; zero 32 -> 0.5.
    Case(
        "mxint8 away",
        "mxint8",
        tile([1.5, -1.0, 0.5078125]),
        tile([1.5, -1.0, 0.515625]),
        {"round_mode": "away"},
        scale=[127],
        data=ctile([96, 192, 33]),
    ),
    Case(
        "mxint8 zero",
        "mxint8",
        tile([1.5, -1.0, 0.5078125]),
        tile([1.5, -1.0, 0.5]),
        {"round_mode": "zero"},
        scale=[127],
        data=ctile([96, 192, 32]),
    ),
    # absmax 2 - 2^-10: floor(log2) = 0 -> exponent 0 (code 127), step 2^-6;
    # v = 127.9375 -> 128 clamps to 127 -> 127/64 = 1.984375 (ints use floor even when the
    # top value clips).
    Case(
        "mxint8 clamp top",
        "mxint8",
        tile([1.9990234375, -1.0]),
        tile([1.984375, -1.0]),
        scale=[127],
        data=ctile([127, 192]),
    ),
    # symmetric: -127.9375 -> -128 clamps to -127 (code 129) -> -1.984375; 1.0 -> 64.
    Case(
        "mxint8 symmetric",
        "mxint8",
        tile([-1.9990234375, 1.0]),
        tile([-1.984375, 1.0]),
        scale=[127],
        data=ctile([129, 64]),
    ),
    # int_range=full (decision 6, Quark MXINT8): -128 allowed (code 128) -> -2.0.
    Case(
        "mxint8 full range",
        "mxint8",
        tile([-1.9990234375, 1.0]),
        tile([-2.0, 1.0]),
        {"int_range": "full"},
        scale=[127],
        data=ctile([128, 64]),
    ),
    # mxint4: fixed point 1.2; absmax 1.5 -> exponent 0 (code 127), step 2^-2; v = 4x:
    # 6, -4, 2.5 -> even 2 -> 0.5 / away 3 -> 0.75. int4 codes: 6; -4 -> 12; 2 / 3.
    Case(
        "mxint4 even",
        "mxint4",
        tile([1.5, -1.0, 0.625]),
        tile([1.5, -1.0, 0.5]),
        scale=[127],
        data=ctile([6, 12, 2]),
        packed_nbytes=16,
    ),
    Case(
        "mxint4 away",
        "mxint4",
        tile([1.5, -1.0, 0.625]),
        tile([1.5, -1.0, 0.75]),
        {"round_mode": "away"},
        scale=[127],
        data=ctile([6, 12, 3]),
    ),
    # int8_tensor: scale = 127/127 = 1.0 (float32 0x3F800000); -63.5 -> tie -> -64 (192);
    # 0.5 -> tie -> 0.
    Case(
        "int8_tensor",
        "int8_tensor",
        [127, -63.5, 0.5, 1.0],
        [127, -64, 0, 1],
        scale=[0x3F800000],
        data=[127, 192, 0, 1],
    ),
]

# int8_channel = int8_float32_t0: one float32 scale per row (axis -1): absmax / 127.
# Row 0: absmax 127 -> scale 1.0; v = x: 127, -63.5 (tie: even/away -64, zero -63),
#   0.5 (tie: even/zero 0, away 1), 1.
# Row 1: absmax 254 -> scale 2.0 (0x40000000); v = 127, -0.5 (tie: even/zero 0, away -1),
#   1.5 (tie: even/away 2, zero 1), 50 -> y = 2 q.
CHANNEL_X = [[127, -63.5, 0.5, 1.0], [254, -1, 3, 100]]
CHANNEL_SCALE = [[0x3F800000], [0x40000000]]  # grid (2, 1)
INTS += [
    Case(
        "int8_channel even",
        "int8_channel",
        CHANNEL_X,
        [[127, -64, 0, 1], [254, 0, 4, 100]],
        shape=(2, 4),
        scale=CHANNEL_SCALE,
        data=[[127, 192, 0, 1], [127, 0, 2, 50]],
    ),
    Case(
        "int8_channel away",
        "int8_channel",
        CHANNEL_X,
        [[127, -64, 1, 1], [254, -2, 4, 100]],
        {"round_mode": "away"},
        shape=(2, 4),
        scale=CHANNEL_SCALE,
        data=[[127, 192, 1, 1], [127, 255, 2, 50]],
    ),
    Case(
        "int8_channel zero",
        "int8_channel",
        CHANNEL_X,
        [[127, -63, 0, 1], [254, 0, 2, 100]],
        {"round_mode": "zero"},
        shape=(2, 4),
        scale=CHANNEL_SCALE,
        data=[[127, 193, 0, 1], [127, 0, 1, 50]],
    ),
    # axis 0: one scale per column. Column 0 absmax 127 -> 1.0: -1.5 -> tie -> -2 (254);
    # column 1 absmax 254 -> 2.0: 3/2 = 1.5 -> 2 -> 4; -254/2 = -127 (129). Grid (1, 2).
    Case(
        "int8_channel axis 0",
        "int8_channel",
        [[127, 3], [-1.5, -254]],
        [[127, 4], [-2, -254]],
        {"axis": 0},
        shape=(2, 2),
        scale=[[0x3F800000, 0x40000000]],
        data=[[127, 2], [254, 129]],
    ),
    # fp8e4_channel = e4m3fn_float32_t0: absmax / 448. Row 0: 448 -> 1.0: 17 -> 16 (88);
    #   -2^-9 exact (1|128 = 129); 2^-10 -> tie -> 0. Row 1: 896 -> 2.0: 448 (126);
    #   17 -> 16 -> 32 (88); 1 -> 0.5 (f6 -> 48) -> 1; -2^-10 -> -2^-11 = 0.25 steps -> -0 (128).
    Case(
        "fp8e4_channel",
        "fp8e4_channel",
        [[448, 17, -p2(-9), p2(-10)], [896, 34, 1, -p2(-10)]],
        [[448, 16, -p2(-9), 0], [896, 32, 1, -0.0]],
        shape=(2, 4),
        scale=[[0x3F800000], [0x40000000]],
        data=[[126, 88, 129, 0], [126, 88, 48, 128]],
    ),
]


@pytest.mark.parametrize("case", params(INTS))
def test_ints_and_float_scales(case: Case) -> None:
    run(case)


# -- family 4: zero points ------------------------------------------------------------------
# uint8_tensor = uint8_float32_uint8: lo = min(x, 0) = -10, hi = max(x, 0) = 117.5;
# scale = (hi - lo)/255 = 0.5 (0x3F000000); zero = round(10/0.5) = 20; q = round(x/s) + 20:
#   -20 + 20 = 0; 235 + 20 = 255; 0.25/0.5 = 0.5 tie (even 0, away 1, zero 0);
#   -1.5 tie (even -2, away -2, zero -1); 2 -> 22. y = (q - 20) * 0.5.
ZP_X = [-10, 117.5, 0.25, -0.75, 1.0]
# uint4_block32 = uint4_float16_uint8_t32, 40 values = one full tile + an 8-value tail.
# Tile 0 [-3, 4.5, 1.25, 0.75, 0 x 28]: (4.5 + 3)/15 = 0.5 (float16 0x3800); zero 3/0.5 = 6;
#   v = -6, 9, 2.5 (tie), 1.5 (tie), 0 -> q = v + 6: 0, 15, 8|9|8, 8|8|7, 6.
# Tile 1 [1.875, 0.0625, 0.1875, 1.0, 0 x 4] (+24 zeros of padding, which cannot move
#   min(x, 0) / max(x, 0)): 1.875/15 = 0.125 (0x3000); zero 0; v = 15, 0.5 (tie), 1.5 (tie), 8.
UB_X = [*tile([-3, 4.5, 1.25, 0.75]), 1.875, 0.0625, 0.1875, 1.0, 0, 0, 0, 0]
ZERO_POINTS: list[Case] = [
    Case(
        "uint8_tensor even",
        "uint8_tensor",
        ZP_X,
        [-10, 117.5, 0, -1, 1],
        scale=[0x3F000000],
        zero=[20],
        data=[0, 255, 20, 18, 22],
    ),
    Case(
        "uint8_tensor away",
        "uint8_tensor",
        ZP_X,
        [-10, 117.5, 0.5, -1, 1],
        {"round_mode": "away"},
        scale=[0x3F000000],
        zero=[20],
        data=[0, 255, 21, 18, 22],
    ),
    Case(
        "uint8_tensor zero",
        "uint8_tensor",
        ZP_X,
        [-10, 117.5, 0, -0.5, 1],
        {"round_mode": "zero"},
        scale=[0x3F000000],
        zero=[20],
        data=[0, 255, 20, 19, 22],
    ),
    Case(
        "uint4_block32 even",
        "uint4_block32",
        UB_X,
        [*tile([-3, 4.5, 1.0, 1.0]), 1.875, 0, 0.25, 1.0, 0, 0, 0, 0],
        scale=[0x3800, 0x3000],
        zero=[6, 0],
        data=[*ctile([0, 15, 8, 8], fill=6), 15, 0, 2, 8, 0, 0, 0, 0],
        packed_nbytes=20,
    ),
    Case(
        "uint4_block32 away",
        "uint4_block32",
        UB_X,
        [*tile([-3, 4.5, 1.5, 1.0]), 1.875, 0.125, 0.25, 1.0, 0, 0, 0, 0],
        {"round_mode": "away"},
        scale=[0x3800, 0x3000],
        zero=[6, 0],
        data=[*ctile([0, 15, 9, 8], fill=6), 15, 1, 2, 8, 0, 0, 0, 0],
    ),
    Case(
        "uint4_block32 zero",
        "uint4_block32",
        UB_X,
        [*tile([-3, 4.5, 1.0, 0.5]), 1.875, 0, 0.125, 1.0, 0, 0, 0, 0],
        {"round_mode": "zero"},
        scale=[0x3800, 0x3000],
        zero=[6, 0],
        data=[*ctile([0, 15, 8, 7], fill=6), 15, 0, 1, 8, 0, 0, 0, 0],
    ),
]


@pytest.mark.parametrize("case", params(ZERO_POINTS))
def test_zero_points(case: Case) -> None:
    run(case)


# uint elements over 24 bits: qmax = 2^26 - 1 is not a float32 number. The scale divides by
# float32(qmax) = 2^26 (spacing 4 in [2^25, 2^26)); codes clip at the exact 2^26 - 1.
# uint26_float32_uint26 (one tensor tile), x = [-4, 67108860 = 2^26 - 4, 33554430 = 2^25 - 2, 0]:
#   lo = -4, hi = 2^26 - 4: (hi - lo) / 2^26 = 1.0 (0x3F800000); zero = rint(4 / 1) = 4.
#   -4 -> -4 + 4 = 0 -> y = (0 - 4) * 1 = -4.
#   2^26 - 4 -> 2^26 -> clips to 2^26 - 1 = 67108863; y = float32(67108863 - 4 = 67108859),
#     which lies 1 from 67108860 (a multiple of 4) -> 67108860.
#   2^25 - 2 -> 2^25 + 2 = 33554434; y = float32(q - zp = 33554430) = 33554430, exact (spacing 2
#     below 2^25). Decoding float32(q) - zp instead gives 2^25 (the tie 33554434 rounds to even)
#     - 4 = 33554428: the difference is taken exactly, then rounded once.
#   0 -> 4 -> y = 0. Four 26-bit codes pack into 13 bytes.
# uint26_float32_float32 (a float zero point), x = [0, 2^26]: zero = cast(0) = 0;
#   (2^26 - 0) / 2^26 = 1.0; 2^26 -> clips to 67108863 -> y = float32(67108863) * 1 + 0 = 2^26.
WIDE_ZERO_POINTS: list[Case] = [
    Case(
        "uint26 int zero point",
        "uint26_float32_uint26",
        [-4, 67108860, 33554430, 0],
        [-4, 67108860, 33554430, 0],
        scale=[0x3F800000],
        zero=[4],
        data=[0, 67108863, 33554434, 4],
        packed_nbytes=13,
    ),
    Case(
        "uint26 float zero point",
        "uint26_float32_float32",
        [0, 67108864],
        [0, 67108864],
        scale=[0x3F800000],
        zero=[0],
        data=[0, 67108863],
    ),
]


@pytest.mark.parametrize("backend", ["reference", "native"])
@pytest.mark.parametrize("case", params(WIDE_ZERO_POINTS))
def test_wide_uint_zero_points(case: Case, backend: str) -> None:
    if backend == "native" and not native.available():
        pytest.skip("native library not built")
    run(dataclasses.replace(case, kwargs={**case.kwargs, "backend": backend}))
    if backend == "native":  # the C++ decoder (DequantizeMX's) of the golden codes, as a
        # tensor scale and as one tile of the same values (its tiled path)
        codes = np.asarray(case.data, np.uint32)
        scale, zero = np.asarray(case.scale, np.uint32), np.asarray(case.zero, np.uint32)
        for name in (case.dtype, f"{case.dtype}_t{codes.size}"):
            got = native.dequantize(datatype(name), codes.shape, -1, codes, scale, zero)
            assert not _bits_mismatch(name, got, case.expected)


# A float zero point is cast(min): when a tile's minimum is zero, its sign is the sign of the
# tile's last zero, since np.minimum takes the later of equal values (decision 42; np.min's
# reduction follows that only on short arrays). uint4_float16_e4m3fn_t0 along axis 1, rows of
# 9000 values of 2.0 with some zeros: E4M3 codes of the zero point, +0 -> 0x00, -0 -> 0x80.
#   row 0: +0 at 100, -0 at 5000, +0 at 8500, -0 at 8999 (the last)  -> -0 -> 128
#   row 1: the same with +0 at 8999                                  -> +0 -> 0
#   row 2: -0 at 5, +0 at 4100, -0 at 4200 (np.min of this row is +0) -> -0 -> 128
# The scale is (2 - z) / 15 = 0.1333 -> float16 0x3044 either way.
@pytest.mark.parametrize("backend", ["reference", "native"])
def test_float_zero_point_of_a_zero_minimum(backend: str) -> None:
    if backend == "native" and not native.available():
        pytest.skip("native library not built")
    x = np.full((3, 9000), 2.0, np.float32)
    x[0, [100, 5000, 8500, 8999]] = [0.0, -0.0, 0.0, -0.0]
    x[1, [100, 5000, 8500, 8999]] = [0.0, -0.0, 0.0, 0.0]
    x[2, [5, 4100, 4200]] = [-0.0, 0.0, -0.0]
    q = cast(x, "uint4_float16_e4m3fn_t0", mode="actual", axis=1, backend=backend)
    assert np.asarray(q.zero).ravel().tolist() == [128, 0, 128]
    assert np.asarray(q.scale).ravel().tolist() == [0x3044] * 3


# Inf saturates to a finite value in uint elements over 24 bits too, where float32(q) rounds.
# uint26_bfloat16_float32_t16 on float16 [0, 65504, Inf, 0...]: zero = cast(0) = 0 (code 0);
# scale 65504 / float32(2^26 - 1) = 65504 / 2^26 = 2^-10 - 2^-21 -> bfloat16 2^-10 (0x3A80);
# 65504 / 2^-10 = 67076096. Inf -> qmax, bounded (decision 30): floor((65520 - 0) / 2^-10) + 1
# = 67092481, whose float32 67092480 decodes to 65520, float16's overflow; the step goes to
# the largest integer below float32 67092480's rounding: the float32 below is 67092476
# (spacing 4, mantissa 16773119: odd), so the midpoint 67092478 rounds up and the answer is
# 67092477, float32 67092476 -> 65519.996 -> float16 65504. (A step of one code, 67092478,
# decoded to Inf.)
@pytest.mark.parametrize("backend", ["reference", "native"])
def test_wide_uint_inf_saturates_finite(backend: str) -> None:
    if backend == "native" and not native.available():
        pytest.skip("native library not built")
    x = np.zeros(16, np.float16)
    x[:3] = [0.0, 65504.0, np.inf]
    q = cast(x, "uint26_bfloat16_float32_t16", mode="actual", backend=backend)
    assert np.asarray(q.data)[:3].tolist() == [0, 67076096, 67092477]
    assert np.asarray(q.scale).ravel().tolist() == [0x3A80]
    y = cast(x, "uint26_bfloat16_float32_t16", backend=backend)
    assert y[:3].tolist() == [0.0, 65504.0, 65504.0]


# A tile without a finite value has min = max = 0 (decision 20's saturation has nothing to
# scale): +0, E4M3 code 0x00, whatever the sign of its last element (-Inf in row 0), since
# only a zero in the tile can lend its sign. Scale (0 - 0) / 15 = 0 (float16 code 0).
@pytest.mark.parametrize("backend", ["reference", "native"])
def test_float_zero_point_of_a_tile_without_finite_values(backend: str) -> None:
    if backend == "native" and not native.available():
        pytest.skip("native library not built")
    x = np.array([[np.inf, -np.inf, np.inf, -np.inf], [-np.inf, -np.inf, -np.inf, np.inf]])
    q = cast(x.astype(np.float32), "uint4_float16_e4m3fn_t4", mode="actual", backend=backend)
    assert np.asarray(q.zero).ravel().tolist() == [0, 0]
    assert np.asarray(q.scale).ravel().tolist() == [0, 0]


# Float scales and zero points are used as float32 numbers, so they saturate at the largest
# value of their format that float32 holds (decision 21), not at a maxfloat float32 rounds.
# (1) e4m3fn_e5m26_t32, x = [3e7, 1, -3e7, 0...] (3e7 is a float32 number: even, below 2^25):
#   raw = 3e7 / 448 = 66964.3 > e5m26's maxfloat 2^16 - 2^-11 (27 bits, float32 rounds it up
#   to 2^16); the largest e5m26 value float32 holds is 2^16 - 2^-8 = 2^15 * (2 - 2^-23):
#   field 15 + 15 = 30, mantissa (1 - 2^-23) * 2^26 = 2^26 - 8 -> code 30 * 2^26 + 2^26 - 8 =
#   2080374776 (the old code, 31 << 26 = 2080374784, is e5m26's Inf).
#   3e7 / (2^16 - 2^-8) = 457.76 -> e4m3fn step 32 in [256, 512): 448 (code 126); y = 448 *
#   (2^16 - 2^-8) = 29360126.25 -> float32 (step 2) 29360126. 1 / 65536 < 2^-10 (half of
#   e4m3fn's smallest 2^-9) -> 0. -3e7 -> code 0x80 | 126 = 254, -29360126.
# (2) int2_e9m14_t4, x = [float32 max, 1, 0, -3.4e38]: int2's maxfloat is 1, so raw = float32
#   max = (2 - 2^-23) * 2^127; e9m14 rounds it to 14 mantissa bits: up to 2^128, past float32
#   (Inf: the elements then divide by Inf and decode to NaN). It saturates at 2^128 - 2^113:
#   field 127 + 255 = 382, mantissa 2^14 - 1 -> code 382 * 2^14 + 16383 = 6275071.
#   max / (2^128 - 2^113) = 1.00006 -> 1; 1 / scale -> 0; float32(-3.4e38) / scale = -0.99918
#   -> -1 (int2 code 3); y = +-(2^128 - 2^113), a float32 number (15 bits).
WIDE_SCALES: list[Case] = [
    Case(
        "e5m26 scale saturates where float32 holds it",
        "e4m3fn_e5m26_t32",
        tile([3e7, 1.0, -3e7]),
        tile([29360126.0, 0.0, -29360126.0]),
        scale=[2080374776],
        data=ctile([126, 0, 254]),
    ),
    Case(
        "e9m14 scale saturates below 2^128",
        "int2_e9m14_t4",
        [float(np.finfo(np.float32).max), 1.0, 0.0, -3.4e38],
        [p2(128) - p2(113), 0.0, 0.0, -(p2(128) - p2(113))],
        scale=[6275071],
        data=[1, 0, 0, 3],
    ),
]


@pytest.mark.parametrize("backend", ["reference", "native"])
@pytest.mark.parametrize("case", params(WIDE_SCALES))
def test_wide_scales_saturate_where_float32_holds_them(case: Case, backend: str) -> None:
    if backend == "native" and not native.available():
        pytest.skip("native library not built")
    run(dataclasses.replace(case, kwargs={**case.kwargs, "backend": backend}))


# The float zero point's bound on float32 data (decision 30), where float32's Inf threshold
# is the real 2^128 - 2^103. uint8_float32_bfloat16_t4, x = [3.4e38, -3.4e38, 1, 0] (float32):
#   zero = bfloat16(-3.4e38): 3.4e38 / 2^127 = 1.998 rounds to 2 (step 2^-7), past bfloat16's
#   largest, so it saturates: -(2 - 2^-7) * 2^127 (code 0xFF7F).
#   raw = float32(hi - zero) / 255 = Inf (the sum overflows) -> the float32 scale saturates at
#   float32's largest, s = (2 - 2^-23) * 2^127 (0x7F7FFFFF).
#   bound: floor((2^128 - 2^103 - zero) / s) + 1 = floor(1.996) + 1 = 2; q = 2 decodes to
#   float32(2 s) = Inf, so one step down: q = 1 decodes to s + zero = (2^-7 - 2^-23) * 2^127
#   = 2^120 - 2^104 (16 bits: exact), finite. (With float32's threshold taken as Inf, the
#   bound started at qmax = 255 and three steps left 252: 3.4e38 decoded to Inf.)
#   3.4e38: (x - zero) overflows to Inf -> 255 -> bound 1 -> 2^120 - 2^104.
#   -3.4e38: (x - zero) / s = -0.003 -> -0 -> 0 -> zero. 1 and 0: (x - zero) / s = 0.996 -> 1.
@pytest.mark.parametrize("backend", ["reference", "native"])
def test_float_zero_point_bound_on_float32_data(backend: str) -> None:
    if backend == "native" and not native.available():
        pytest.skip("native library not built")
    top = p2(120) - p2(104)
    case = Case(
        "float zero point bound at float32's top",
        "uint8_float32_bfloat16_t4",
        [3.4e38, -3.4e38, 1.0, 0.0],
        [top, -(2 - p2(-7)) * p2(127), top, top],
        kwargs={"backend": backend},
        scale=[0x7F7FFFFF],
        zero=[0xFF7F],
        data=[1, 0, 1, 1],
    )
    run(case)


# Scaled elements whose grid reaches the limit of docs/formats.md: e3m28b995fn has emin
# 1 - 995 = -994, emax 7 - 995 = -988 (fn: field 7 holds numbers) and a smallest step
# 2^(-994 - 28) = 2^-1022, float64's smallest normal (b996 is refused). Scale e10m0b0 (codes
# 0..1022 = exponents). One tile of 8 (two zeros pad it): absmax 65504 = (2 - 2^-10) 2^15,
# floor: sexp = 15 - (-988) = 1003 (code 1003), v = x 2^-1003.
#   +-65504: v = (2 - 2^-10) 2^-988, field 7, mantissa (1 - 2^-10) 2^28 = 2^28 - 2^18: exact;
#     code 7 << 28 | (2^28 - 2^18) = 0x7FFC0000 (negative: | 2^31 = 0xFFFC0000).
#   1.0: v = 2^-1003 < 2^emin, subnormal, step 2^-1022: 2^19 steps, exact; code 0x00080000.
#   2^-18: v = 2^-1021 = 2 steps, code 2. 2^-20: v = 2^-1023 = half a step, tie 0|1, even:
#   0. 3 * 2^-21: v = 0.75 step -> 1 step = 2^-1022, decoded 2^-1022 * 2^1003 = 2^-19.
@pytest.mark.parametrize("backend", ["reference", "native"])
def test_scaled_element_steps_at_float64_normal_limit(backend: str) -> None:
    if backend == "native" and not native.available():
        pytest.skip("native library not built")
    case = Case(
        "element grid down to 2^-1022",
        "e3m28b995_e10m0b0_t8",
        [65504.0, 1.0, p2(-18), p2(-20), 3 * p2(-21), -65504.0],
        [65504.0, 1.0, p2(-18), 0.0, p2(-19), -65504.0],
        kwargs={"backend": backend},
        scale=[1003],
        data=[0x7FFC0000, 0x00080000, 2, 0, 1, 0xFFFC0000],
    )
    run(case)


# -- family 5: geometry and edge tiles ------------------------------------------------------
# e2m1fnuz_e8m0_t4 on a (4, 8) tensor whose only large value is x[0, 0] = 12, else 1.5.
# A tile holding 12: floor(log2 12) = 3 -> sexp 1 (code 128): 12/2 = 6 (code 7) -> 12;
#   1.5/2 = 0.75 -> tie -> 1.0 (code 2) -> 2.0.
# Every other tile: absmax 1.5 -> sexp -2 (code 125): 1.5*4 = 6 (code 7) -> 1.5 exact.
AXIS_X = np.full((4, 8), 1.5)
AXIS_X[0, 0] = 12.0
AXIS1_Y = np.full((4, 8), 1.5)
AXIS1_Y[0, :4] = [12, 2, 2, 2]  # the tile along axis 1 holding 12
AXIS1_D = np.full((4, 8), 7)
AXIS1_D[0, :4] = [7, 2, 2, 2]
AXIS0_Y = np.full((4, 8), 1.5)
AXIS0_Y[:, 0] = [12, 2, 2, 2]  # the tile along axis 0 holding 12
AXIS0_D = np.full((4, 8), 7)
AXIS0_D[:, 0] = [7, 2, 2, 2]

# 2-D tiles e4m3fn_e8m0_t2_t2 on 4x4 (four 2x2 tiles, scale grid (2, 2)):
#   (0,0) [[448, 1], [17, -9]]: absmax 448 -> floor 8 - emax 8 = 0 (127); 17 -> step 2 ->
#         8.5 -> 16 (88); -9 exact (1.125*2^3: f10 m1 = 81|128 = 209); 1 (56); 448 (126).
#   (0,1) zeros -> code 0.
#   (1,0) all 0.5: floor(log2 .5) = -1 -> sexp -9 (118); v = 256 (f15 -> 120) exact.
#   (1,1) [[1000, -1], [2, 0]]: floor(log2 1000) = 9 -> sexp 1 (128); 500 -> step 32 ->
#         15.625 -> 16 -> 512 clamps to 448 (126) -> 896; -0.5 (f6 = 48|128 = 176) -> -1;
#         1.0 (56) -> 2; 0.
TWO_D_X = [[448, 1, 0, 0], [17, -9, 0, 0], [0.5, 0.5, 1000, -1], [0.5, 0.5, 2, 0]]
TWO_D_Y = [[448, 1, 0, 0], [16, -9, 0, 0], [0.5, 0.5, 896, -1], [0.5, 0.5, 2, 0]]
TWO_D_D = [[126, 56, 0, 0], [88, 209, 0, 0], [120, 120, 126, 176], [120, 120, 56, 0]]

# 3-D (2, 4, 3), tiles of 4 along the middle axis: x[i, :, k] = c * w, c = 2^(3i + k - 2),
# w = [4, 2.5, -0.25, 5]. absmax 5c: floor(log2) = 2 + log2 c -> sexp = log2 c, so v = w:
# 4 (6); 2.5 -> 2 (4); -0.25 -> +0 (0); 5 -> step 2, 2.5 -> 2 -> 4 (6). y = c * [4, 2, 0, 4];
# scale codes 127 + 3i + k - 2, grid (2, 1, 3).
C3 = np.array([[p2(3 * i + k - 2) for k in range(3)] for i in range(2)])
W3 = np.array([4.0, 2.5, -0.25, 5.0])
THREE_D_X = C3[:, None, :] * W3[None, :, None]
THREE_D_Y = C3[:, None, :] * np.array([4.0, 2.0, 0.0, 4.0])[None, :, None]
THREE_D_D = np.broadcast_to(np.array([6, 4, 0, 6])[None, :, None], (2, 4, 3))

GEOMETRY: list[Case] = [
    Case(
        "t4 axis 1 of (4, 8)",
        "e2m1fnuz_e8m0_t4",
        AXIS_X,
        AXIS1_Y,
        shape=(4, 8),
        scale=[[128, 125], [125, 125], [125, 125], [125, 125]],
        data=AXIS1_D,
    ),
    Case(
        "t4 axis 0 of (4, 8)",
        "e2m1fnuz_e8m0_t4",
        AXIS_X,
        AXIS0_Y,
        {"axis": 0},
        shape=(4, 8),
        scale=[[128, 125, 125, 125, 125, 125, 125, 125]],
        data=AXIS0_D,
    ),
    # 40 values: tile 0 all 1.0 (floor 0 - 2 -> 125, v = 4, code 6); tail [3, -0.75, 1, 0,
    # 0, 0, 0, 0.125]: zero padding leaves absmax 3 -> sexp -1 (126); v = 2x: 6 (7),
    # -1.5 (11), 2 (4), 0.25 -> tie -> 0. 40 codes x 4 bits = 20 bytes (padding not stored).
    Case(
        "mxfp4 ragged 40",
        "mxfp4",
        [1.0] * 32 + [3, -0.75, 1, 0, 0, 0, 0, 0.125],
        [1.0] * 32 + [3, -0.75, 1, 0, 0, 0, 0, 0],
        scale=[125, 126],
        data=[6] * 32 + [7, 11, 4, 0, 0, 0, 0, 0],
        packed_nbytes=20,
    ),
    Case(
        "e4m3fn 2x2 tiles",
        "e4m3fn_e8m0_t2_t2",
        TWO_D_X,
        TWO_D_Y,
        shape=(4, 4),
        scale=[[127, 0], [118, 128]],
        data=TWO_D_D,
    ),
    Case(
        "3-D middle axis",
        "e2m1fnuz_e8m0_t4",
        THREE_D_X,
        THREE_D_Y,
        {"axis": 1},
        shape=(2, 4, 3),
        scale=[[[125, 126, 127]], [[128, 129, 130]]],
        data=THREE_D_D,
    ),
    # All-zero tile (with a -0) -> scale code 0, values +0 (fnuz); tile 1 [3, 0.5]:
    # floor(log2 3) = 1 -> sexp -1 (126); v = 6 (7), 1 (2).
    Case(
        "mxfp4 zero tile",
        "mxfp4",
        tile([0.0, -0.0]) + tile([3.0, 0.5]),
        [0.0] * 32 + tile([3.0, 0.5]),
        scale=[0, 126],
        data=[0] * 32 + ctile([7, 2]),
    ),
    # All -0 in e4m3fn: code 0 scale, -0 kept (code 128).
    Case(
        "mxfp8e4 negative zero tile",
        "mxfp8e4",
        [-0.0] * 32,
        [-0.0] * 32,
        scale=[0],
        data=[128] * 32,
    ),
    Case("mxint8 zero tile", "mxint8", [0.0] * 32, [0.0] * 32, scale=[0], data=[0] * 32),
    # Just below 1: floor(log2 0.99999994) = -1 -> sexp -9 (118); v = 512 - 2^-15 ->
    # step 32 -> 16 -> 512 clamps to 448 (126) -> 448 * 2^-9 = 0.875.
    Case(
        "mxfp8e4 absmax 1-2^-24",
        "mxfp8e4",
        tile([1 - p2(-24)]),
        tile([0.875]),
        scale=[118],
        data=ctile([126]),
    ),
    # 256 - 2^-16: exponent bits give 7 (a float32 log2 rounds to 8.0: decision 1) ->
    # sexp -1 (126); v = 512 - 2^-15 -> 16 steps of 32 -> clamps to 448 -> 224.
    Case(
        "mxfp8e4 absmax 256-2^-16 floor",
        "mxfp8e4",
        tile([256 - p2(-16)]),
        tile([224.0]),
        scale=[126],
        data=ctile([126]),
    ),
    # midmax: 1.99999 > 464/256 -> sexp 0 (127); v -> step 16 -> 16 -> 256 (f15 = 120).
    Case(
        "mxfp8e4 absmax 256-2^-16 midmax",
        "mxfp8e4",
        tile([256 - p2(-16)]),
        tile([256.0]),
        {"scale_mode": "midmax"},
        scale=[127],
        data=ctile([120]),
    ),
    # float32 subnormals: absmax 2^-130 -> sexp -138 clamps to -127 (code 0); v = 2^127 x:
    #   2^-3 (f4 -> 32) exact; -2^-6 (f1 = 8|128 = 136); 2^-9 (1); 2^-10 -> tie -> 0;
    #   2^-22 -> 0; 17*2^-8 = 1.0625*2^-4 -> step 2^-7 -> 8.5 -> 8 -> 2^-4 (f3 -> 24) -> 2^-131.
    Case(
        "mxfp8e4 float32 subnormals",
        "mxfp8e4",
        tile([p2(-130), -p2(-133), p2(-136), p2(-137), p2(-149), 17 * p2(-135)]),
        tile([p2(-130), -p2(-133), p2(-136), 0, 0, p2(-131)]),
        scale=[0],
        data=ctile([32, 136, 1, 0, 0, 24]),
    ),
    # mxfp4 of subnormals: sexp clamps to -127; 2^-140 * 2^127 = 2^-13 -> step .5 -> 0;
    # -2^-149 -> +0 (fnuz). Scale code 0 although the tile is not all zero.
    Case(
        "mxfp4 float32 subnormals",
        "mxfp4",
        tile([p2(-140), p2(-141), -p2(-149)]),
        [0.0] * 32,
        scale=[0],
        data=[0] * 32,
    ),
    # float32 max: floor(log2) = 127 -> sexp 125 (252); v = 8 - 2^-21 -> step 2 -> 4 -> 8
    # clamps to 6 (7) -> 6 * 2^125 = 1.5 * 2^127.
    Case(
        "mxfp4 float32 max",
        "mxfp4",
        tile([F32_MAX]),
        tile([1.5 * p2(127)]),
        scale=[252],
        data=ctile([7]),
    ),
    # bfp16 preset = int8_e8m0_t16 (the BFP document's example): absmax 3.5 -> floor 1 (code 128),
    # step 2^(1-6); v = 32x: 112, 38.4 -> 38, -89.6 -> -90 (166), 16.
    Case(
        "bfp16 preset",
        "bfp16",
        tile([3.5, 1.2, -2.8, 0.5], 16),
        tile([3.5, 1.1875, -2.8125, 0.5], 16),
        scale=[128],
        data=ctile([112, 38, 166, 16], 16),
    ),
]


@pytest.mark.parametrize("case", params(GEOMETRY))
def test_geometry_and_edge_tiles(case: Case) -> None:
    run(case)


# -- family 6: NaN and Inf (decision 5) ---------------------------------------------------------
NONFINITE: list[Case] = [
    # element: absmax over finite = 3 -> floor 1 - 8 = -7 (120); NaN stays (code 127);
    # +-Inf -> +-448 * 2^-7 = +-3.5 (126, 254); 3 -> 384 (f15 m4 = 124); 0.5 -> 64 (f13 -> 104).
    Case(
        "mxfp8e4 element",
        "mxfp8e4",
        tile([NAN, INF, -INF, 3.0, 0.5]),
        tile([NAN, 3.5, -3.5, 3.0, 0.5]),
        scale=[120],
        data=ctile([127, 126, 254, 124, 104]),
    ),
    # block: tile 0 holds Inf -> scale NaN (255), the whole tile NaN (codes 0); tile 1
    # [2, -0.375]: floor 1 -> 120; v = 256 (120), -48 (1.5*2^5: f12 m4 = 100|128 = 228).
    Case(
        "mxfp8e4 block",
        "mxfp8e4",
        tile([INF, 1.0]) + tile([2.0, -0.375]),
        [NAN] * 32 + tile([2.0, -0.375]),
        {"nan_policy": "block"},
        scale=[255, 120],
        data=[0] * 32 + ctile([120, 228]),
    ),
    # element: absmax 3 -> floor 1 - 2 = -1 (126); NaN (fnuz code 8); Inf -> 6 * 0.5 = 3 (7);
    # -Inf -> -3 (15); 3 -> 6 (7); 0.75 -> 1.5 (3).
    Case(
        "mxfp4 element",
        "mxfp4",
        tile([NAN, INF, 3.0, -INF, 0.75]),
        tile([NAN, 3.0, 3.0, -3.0, 0.75]),
        scale=[126],
        data=ctile([8, 7, 7, 15, 3]),
    ),
    Case(
        "mxfp4 block NaN",
        "mxfp4",
        tile([NAN, 1.0]),
        [NAN] * 32,
        {"nan_policy": "block"},
        scale=[255],
        data=[0] * 32,
    ),
    # Scaled e5m2: Inf saturates (only unscaled casts keep Inf). absmax 1 -> 0 - 15 = -15
    # (112); Inf -> 57344 * 2^-15 = 1.75 (123); 1 -> 2^15 (f30 -> 120).
    Case(
        "mxfp8e5 element Inf",
        "mxfp8e5",
        tile([INF, 1.0]),
        tile([1.75, 1.0]),
        scale=[112],
        data=ctile([123, 120]),
    ),
    # mxint8 has no NaN code: a NaN makes its tile NaN (scale 255, codes 0); tile 1 with Inf
    # saturates: absmax 1 -> exponent 0 (127), step 2^-6; Inf -> 127/64 = 1.984375; 1 -> 64;
    # -0.5 -> -32 (224).
    Case(
        "mxint8 element NaN",
        "mxint8",
        tile([NAN, 1.0]) + tile([INF, 1.0, -0.5]),
        [NAN] * 32 + tile([1.984375, 1.0, -0.5]),
        scale=[255, 127],
        data=[0] * 32 + ctile([127, 64, 224]),
    ),
    Case(
        "mxint8 block Inf",
        "mxint8",
        tile([INF, 1.0]),
        [NAN] * 32,
        {"nan_policy": "block"},
        scale=[255],
        data=[0] * 32,
    ),
    # uint8_tensor (zero point, no NaN code): the one tile holding NaN is NaN.
    Case("uint8_tensor NaN", "uint8_tensor", [NAN, 1.0, -2.0], [NAN, NAN, NAN]),
    # Codebook (no NaN code): tile 0 NaN (scale 255); tile 1 as "cb41fi f and i tiles" tile A.
    Case(
        "cb41fi NaN tile",
        "cb41fi_e2m2fnuz_e8m0_t8",
        tile([NAN, 1.0], 8) + tile([6, 0.375, -1.375, 4], 8),
        [NAN] * 8 + tile([6, 0.5, -1.5, 4], 8),
        scale=[255, 127],
    ),
    # int8_channel (float scale, no NaN code): the NaN row is NaN; row 1: 127 -> scale 1.
    Case(
        "int8_channel NaN row",
        "int8_channel",
        [[NAN, 1.0], [127, -1.0]],
        [[NAN, NAN], [127, -1.0]],
        shape=(2, 2),
    ),
]


@pytest.mark.parametrize("case", params(NONFINITE))
def test_nan_and_inf(case: Case) -> None:
    run(case)


# -- family 7: MX9 / MX6 / MX4 (MX9/MX6/MX4 document, decision 10) -----------------------------
# Block 16, s_b = 2^(e_bmax - (m - 1)); a pair whose two exponents are both < e_bmax is
# shifted (meta 1): its step is s_b / 2. |q| <= 2^m - 1. mx9 = int8 (m 7, emax 6),
# mx6 = int5 (m 4, emax 3), mx4 = int3 (m 2, emax 1).
#
# MX9 block, absmax 3.984375: e_bmax = 1 (E8M0 code 128: the block exponent itself, ints being
# fixed point) -> s_b = 2^(1-6) = 2^-5; unshifted v = 32x,
# shifted v = 64x.
#   p0 [3.984375, -2]       unshifted: 127.5 -> 128 clamps to 127 -> 3.96875; -64 (192).
#   p1 [1.015625, -0.75]    exps 0, -1 -> shifted: 65 -> 1.015625 (unshifted would give
#                           32.5 -> 1.0); -48 (208).
#   p2 [2.0390625, 1.015625] exp 1 = e_bmax -> unshifted: 65.25 -> 65 -> 2.03125;
#                           32.5 -> even 32 -> 1.0 (away 33 -> 1.03125).
#   p3 [2^-7, -3*2^-8]      shifted: 0.5 -> even 0 (away 1 -> 2^-6); -0.75 -> -1 (255)
#                           -> -2^-6.
#   p4..p7 [0.5, 0.25]      shifted: 32, 16 exact.
MX9_X = [3.984375, -2.0, 1.015625, -0.75, 2.0390625, 1.015625, p2(-7), -3 * p2(-8)]
MX9_X = MX9_X + [0.5, 0.25] * 4
MX9_META = [0, 1, 0, 1, 1, 1, 1, 1]
# MX6 block, absmax 3.875: e_bmax 1 (code 128) -> s_b = 2^(1-3) = 0.25; shifted step 0.125.
#   p0 [3.875, -1.125]  unshifted: 15.5 -> 16 clamps to 15 (any mode) -> 3.75;
#                       -4.5 -> even -4 / away -5 / zero -4 (int5 codes 28 / 27 / 28).
#   p1 [1.5625, 0.6875] shifted: 12.5 -> 12 / 13 / 12; 5.5 -> 6 / 6 / 5.
#   p2 [1.9375, -1.9375] shifted: +-15.5 -> +-16 clamps to +-15 (zero: 15) -> +-1.875 (15, 17).
#   p3 [2, 0.0625]      unshifted (2 has exponent 1): 8; 0.25 -> 0.
#   p4..p7 [0.5, -0.25] shifted: 4, -2 (30).
MX6_X = [3.875, -1.125, 1.5625, 0.6875, 1.9375, -1.9375, 2.0, 0.0625] + [0.5, -0.25] * 4
MX6_META = [0, 1, 1, 0, 1, 1, 1, 1]
MX6_TAIL_Y, MX6_TAIL_D = [0.5, -0.25] * 4, [4, 30] * 4
# MX4 block, absmax 1.5: e_bmax 0 (code 127) -> s_b = 2^(0-1) = 0.5; shifted step 0.25.
#   p0 [1.5, -0.75]     unshifted: 3; -1.5 -> even -2 (6) -> -1.0.
#   p1 [0.875, 0.3125]  shifted: 3.5 -> 4 clamps to 3 -> 0.75; 1.25 -> 1 -> 0.25.
#   p2 [1.25, 0.125]    unshifted: 2.5 -> 2 -> 1.0; 0.25 -> 0.
#   p3..p7 [0.5, 0.25]  shifted: 2, 1.
MX4_X = [1.5, -0.75, 0.875, 0.3125, 1.25, 0.125] + [0.5, 0.25] * 5
MX: list[Case] = [
    Case(
        "mx9 even",
        "mx9",
        MX9_X,
        [3.96875, -2.0, 1.015625, -0.75, 2.03125, 1.0, 0.0, -p2(-6)] + [0.5, 0.25] * 4,
        scale=[128],
        meta=MX9_META,
        data=[127, 192, 65, 208, 65, 32, 0, 255] + [32, 16] * 4,
        packed_nbytes=16,
    ),
    Case(
        "mx9 away",
        "mx9",
        MX9_X,
        [3.96875, -2.0, 1.015625, -0.75, 2.03125, 1.03125, p2(-6), -p2(-6)] + [0.5, 0.25] * 4,
        {"round_mode": "away"},
        scale=[128],
        meta=MX9_META,
        data=[127, 192, 65, 208, 65, 33, 1, 255] + [32, 16] * 4,
    ),
    Case(
        "mx6 even",
        "mx6",
        MX6_X,
        [3.75, -1.0, 1.5, 0.75, 1.875, -1.875, 2.0, 0.0, *MX6_TAIL_Y],
        scale=[128],
        meta=MX6_META,
        data=[15, 28, 12, 6, 15, 17, 8, 0, *MX6_TAIL_D],
        packed_nbytes=10,
    ),  # 16 x 5 bits
    Case(
        "mx6 away",
        "mx6",
        MX6_X,
        [3.75, -1.25, 1.625, 0.75, 1.875, -1.875, 2.0, 0.0, *MX6_TAIL_Y],
        {"round_mode": "away"},
        scale=[128],
        meta=MX6_META,
        data=[15, 27, 13, 6, 15, 17, 8, 0, *MX6_TAIL_D],
    ),
    Case(
        "mx6 zero",
        "mx6",
        MX6_X,
        [3.75, -1.0, 1.5, 0.625, 1.875, -1.875, 2.0, 0.0, *MX6_TAIL_Y],
        {"round_mode": "zero"},
        scale=[128],
        meta=MX6_META,
        data=[15, 28, 12, 5, 15, 17, 8, 0, *MX6_TAIL_D],
    ),
    # 18 values: block 1 is [1, 0.5] + 14 zeros of padding: e_bmax 0 (code 127) -> s_b 2^-6;
    # the pair holds exponent 0 = e_bmax -> unshifted (meta 0): 64, 32 exact. The meta grid
    # keeps only the 9 pairs that hold data (padding is never stored: decision 7).
    Case(
        "mx9 ragged 18",
        "mx9",
        [*MX9_X, 1.0, 0.5],
        [3.96875, -2.0, 1.015625, -0.75, 2.03125, 1.0, 0.0, -p2(-6)] + [0.5, 0.25] * 4 + [1.0, 0.5],
        scale=[128, 127],
        meta=[*MX9_META, 0],
        data=[127, 192, 65, 208, 65, 32, 0, 255] + [32, 16] * 4 + [64, 32],
        packed_nbytes=18,
    ),
    Case(
        "mx4 even",
        "mx4",
        MX4_X,
        [1.5, -1.0, 0.75, 0.25, 1.0, 0.0] + [0.5, 0.25] * 5,
        scale=[127],
        meta=[0, 1, 0, 1, 1, 1, 1, 1],
        data=[3, 6, 3, 1, 2, 0] + [2, 1] * 5,
        packed_nbytes=6,
    ),  # 16 x 3 bits
]


@pytest.mark.parametrize("case", params(MX))
def test_mx_shared_microexponents(case: Case) -> None:
    run(case)


# -- family 8: NVFP4 and a codebook --------------------------------------------------------------
# nvfp4 = e2m1fnuz_e4m3fn_float32_t16. Case 1: tensor amax 168 -> ts = 168/(6*448) = 2^-4
# (float32 0x3D800000).
#   block 0 [168, 84, 70, -14, 6.25]: 168/6/ts = 448 -> bs 448 (126), eff = 28;
#     v = 6 (7), 3 (5), 2.5 -> even 2 (4) -> 56, -0.5 (9), 0.223 -> 0.
#   block 1 [0.5625, 0.28125, 0.234375, -0.046875, 0.0234375]: 0.5625/6 = 0.09375, /ts = 1.5
#     -> bs 1.5 (f7 m4 = 60), eff 0.09375; v = 6, 3, 2.5 -> 2 -> 0.1875, -0.5, 0.25 -> 0.
# Case 2: tensor amax 2688 -> ts = 1.0; block 0 [2688, -1344] -> bs 448: v 6, -3 (13).
#   block 1 [10, 5]: 10/6 = 1.6667 -> e4m3 step 1/8: 13.33 -> 13 -> 1.625 (f7 m5 = 61);
#   10/1.625 = 6.15 -> step 2: 3.08 -> 3 -> 6 -> 9.75; 5/1.625 = 3.08 -> step 1 -> 3 -> 4.875.
NVFP4_X1 = tile([168, 84, 70, -14, 6.25], 16) + tile(
    [0.5625, 0.28125, 0.234375, -0.046875, 0.0234375], 16
)
NVFP4_Y1 = tile([168, 84, 56, -14, 0], 16) + tile([0.5625, 0.28125, 0.1875, -0.046875, 0], 16)
# Codebook cb41fi_e2m2fnuz_e8m0_t8 (codebook document): compute e2m2fnuz (bias 1, max 7, emax 2).
#   f mapping: fp4 = e2m1 values 0.5 1 1.5 2 3 4 6 (the spec's (-2, 2) row times 4), e2m2
#     indices 16 + code = 18 20 22 24 26 28 30; the default offset leaves them natural:
#     magnitudes (0, .5, 1, 1.5, 2, 3, 4, 6).
#   i mapping: int4 values 1..7 (0.25..1.75 times 4), indices 20 24 26 28 29 30 31 (already
#     at the top): magnitudes (0, 1, 2, 3, 4, 5, 6, 7).
# Tile A [6, .375, -1.375, 4, 0 x 4]: floor(log2 6) = 2 - 2 -> 127; v = x.
#   f: .375 -> .5, 1.375 -> 1.5: L2 = 2 * 0.125^2 = 0.03125; i: -> 0, 1: 2 * .375^2 = .28125
#   -> f (meta 0). Index codes: 6 -> 7, .5 -> 1, -1.5 -> 8|3 = 11, 4 -> 6.
# Tile B [14, 10, -6, 2, 0 x 4]: floor(log2 14) = 3 - 2 = 1 -> 128; v = [7, 5, -3, 1]:
#   i exact (L2 0); f: 7 -> 6 (1), 5 -> 4 or 6 (1 either way), -3, 1 exact: L2 2 -> i (meta 1).
#   Index codes: 7, 5, 8|3 = 11, 1.
OTHER: list[Case] = [
    Case(
        "nvfp4 ts 2^-4",
        "nvfp4",
        NVFP4_X1,
        NVFP4_Y1,
        scale=[126, 60],
        tenscale=[0x3D800000],
        data=ctile([7, 5, 4, 9], 16) + ctile([7, 5, 4, 9], 16),
        packed_nbytes=16,
    ),
    Case(
        "nvfp4 inexact block scale",
        "nvfp4",
        tile([2688, -1344], 16) + tile([10, 5], 16),
        tile([2688, -1344], 16) + tile([9.75, 4.875], 16),
        scale=[126, 61],
        tenscale=[0x3F800000],
        data=ctile([7, 13], 16) + ctile([7, 5], 16),
    ),
    Case(
        "cb41fi f and i tiles",
        "cb41fi_e2m2fnuz_e8m0_t8",
        tile([6, 0.375, -1.375, 4], 8) + tile([14, 10, -6, 2], 8),
        tile([6, 0.5, -1.5, 4], 8) + tile([14, 10, -6, 2], 8),
        scale=[127, 128],
        meta=[0, 1],
        data=ctile([7, 1, 11, 6], 8) + ctile([7, 5, 11, 1], 8),
        packed_nbytes=8,
    ),
]


@pytest.mark.parametrize("case", params(OTHER))
def test_nvfp4_and_codebook(case: Case) -> None:
    run(case)


# -- family 9: BFP API (the BFP document) -------------------------------------------------
# shared_exp = floor(log2 max) + 1; mantissa = round(x * 2^(m - 1 - shared)), +-(2^(m-1) - 1).
# Block 0 (the worked example) [3.5, 1.2, -2.8, 0.5]: floor(log2 3.5) = 1 -> shared 2; x*32:
#   112, 38.4 -> 38, -89.6 -> -90, 16; restored /32: 3.5, 1.1875, -2.8125, 0.5.
# Block 1 (the diagram's second block) [0.1, 0.3, -0.2, 0.4]: floor(log2 0.4) = -2 -> shared
#   -1 (the diagram's 0 contradicts its own formula); x*256: 25.6 -> 26, 76.8 -> 77,
#   -51.2 -> -51, 102.4 -> 102; restored /256.
BFP_X = [3.5, 1.2, -2.8, 0.5, 0.1, 0.3, -0.2, 0.4]
BFP_MANT = [112, 38, -90, 16, 26, 77, -51, 102]
BFP_Y = [3.5, 1.1875, -2.8125, 0.5, 0.1015625, 0.30078125, -0.19921875, 0.3984375]


@dataclasses.dataclass(frozen=True, eq=False)
class BfpCase:
    """fp32_to_bfp / bfp_to_fp32 with explicit block size and mantissa bits."""

    name: str
    x: list[float]
    block_size: int
    mantissa_bits: int
    mantissas: list[int]
    exps: list[int]
    restored: list[float]


BFP_CASES = [
    BfpCase("doc example", BFP_X[:4], 4, 8, BFP_MANT[:4], [2], BFP_Y[:4]),
    BfpCase("two blocks", BFP_X, 4, 8, BFP_MANT, [2, -1], BFP_Y),
    # m = 4: shared 2 -> x * 2^(3-2) = 2x: 3.75 -> 7.5 -> 8 clamps to 7 -> 3.5; 2.4 -> 2 -> 1;
    # -5.6 -> -6 -> -3; 1 -> 0.5.
    BfpCase(
        "bfp8 clamp",
        tile([3.75, 1.2, -2.8, 0.5]),
        32,
        4,
        ctile([7, 2, -6, 1]),
        [2],
        tile([3.5, 1.0, -3.0, 0.5]),
    ),
    # An all-zero block: E8M0 code 0 (decision 2): block exponent -127 = shared - 1 -> -126.
    BfpCase("zero block", [0.0] * 4, 4, 8, [0] * 4, [-126], [0.0] * 4),
]


@pytest.mark.parametrize("case", [pytest.param(c, id=c.name) for c in BFP_CASES])
def test_bfp_golden(case: BfpCase) -> None:
    x = np.array(case.x, dtype=np.float32)
    mant, exps, meta = bfp.fp32_to_bfp(
        x, block_size=case.block_size, mantissa_bits=case.mantissa_bits
    )
    errors = _codes_mismatch("mantissas", mant, np.array(case.mantissas))
    errors += _codes_mismatch("shared_exps", exps, np.array(case.exps))
    if mant.dtype != np.int8 or exps.dtype != np.int8:
        errors.append(f"dtypes {mant.dtype}, {exps.dtype}: want int8")
    restored = bfp.bfp_to_fp32(
        mant,
        exps,
        block_size=case.block_size,
        mantissa_bits=case.mantissa_bits,
        original_shape=x.shape,
    )
    errors += _bits_mismatch("restored", restored, case.restored)
    assert meta["block_size"] == case.block_size
    assert not errors, "\n".join(f"{case.name}: {e}" for e in errors)


def test_bfp_packed_layout() -> None:
    # [exponents..., mantissas...] as int8: blocks of 4 -> [2, -1, then the 8 mantissas].
    packed, meta = bfp.quantize(np.array(BFP_X, dtype=np.float32), "bfp16", block_size=4)
    assert packed.dtype == np.int8
    assert packed.tolist() == [2, -1, *BFP_MANT]
    assert meta["num_blocks"] == 2 and meta["mantissa_bits"] == 8
    assert not _bits_mismatch("dequantize", bfp.dequantize(packed, meta), BFP_Y)


def test_bfp_presets_default_blocks() -> None:
    # bfp16: block 16, 8 bits -> one exponent (2) for 16 values, then the mantissas.
    packed, meta = bfp.quantize(np.array(tile([3.5, 1.2, -2.8, 0.5], 16), np.float32), "bfp16")
    assert packed.tolist() == [2, 112, 38, -90, 16, *([0] * 12)]
    assert meta["block_size"] == 16
    # bfp8: block 32, 4 bits -> [2, 7, 2, -6, 1, 0 x 28] (see "bfp8 clamp").
    x = np.array(tile([3.75, 1.2, -2.8, 0.5]), np.float32)
    packed, meta = bfp.quantize(x, "bfp8")
    assert packed.tolist() == [2, 7, 2, -6, 1, *([0] * 28)]
    assert meta["block_size"] == 32
    assert not _bits_mismatch("bfp8", bfp.dequantize(packed, meta), tile([3.5, 1.0, -3.0, 0.5]))


# -- family 10: stochastic rounding (decision 4) ---------------------------------------------------


def _stochastic(dtype: str, x: np.ndarray, seed: int) -> np.ndarray:
    out = cast(x, dtype, round_mode="stochastic", seed=seed)
    assert isinstance(out, np.ndarray)
    return out


@pytest.mark.parametrize(
    ("dtype", "head", "lower", "upper"),
    [
        # unscaled e2m1: 2.5 and 2.25 lie between 2 and 3 (step 1); 3.0 is on the grid.
        ("e2m1fnuz", [], 2.0, 3.0),
        # mxfp4 tile led by 6.0: floor(log2 6) = 2 -> scale 2^0; the same neighbours.
        ("mxfp4", [6.0], 2.0, 3.0),
        # mxint8 led by 1.5: scale 2^-6; 0.5078125 -> v 32.5 between 32 and 33 (/64).
        ("mxint8", [1.5], 0.5, 0.515625),
    ],
)
def test_stochastic_rounding(dtype: str, head: list[float], lower: float, upper: float) -> None:
    mid = (lower + upper) / 2  # exactly halfway, so both neighbours are reachable
    quarter = lower + (upper - lower) / 4
    x = np.array(head + [mid] * 15 + [quarter] * 16, dtype=np.float32)
    n = len(head)
    a = _stochastic(dtype, x, 7)
    b = _stochastic(dtype, x, 7)
    assert np.array_equal(a.view(np.uint32), b.view(np.uint32)), "same seed, different bits"
    assert np.array_equal(a[:n], np.array(head, np.float32)), "on-grid values must not move"
    assert np.isin(a[n:], np.array([lower, upper], np.float32)).all(), a
    assert (a[n:] == lower).any() and (a[n:] == upper).any(), a
    others = [_stochastic(dtype, x, seed) for seed in (8, 9, 12345)]
    assert any(not np.array_equal(a, o) for o in others), "every seed gives the same bits"
    packed = cast(x, dtype, mode="compress", round_mode="stochastic", seed=7)
    assert isinstance(packed, QTensor)
    assert not _bits_mismatch("upcast(compress)", upcast(packed, np.float32), a)


# -- torch names as cast dtypes (decision 9) ---------------------------------------------------


@pytest.mark.parametrize(
    ("code", "x", "expected"),
    [
        # float8_e4m3fnuz = e4m3b8fnuz: 248 -> 240 (see the unscaled table); -0 -> +0.
        ("float8_e4m3fnuz", [248.0, p2(-10), -0.0], [240.0, p2(-10), 0.0]),
        # float8_e5m2fnuz = e5m2b16fnuz: max 1.75 * 2^(31-16) = 57344, smallest 2^(1-16-2).
        ("float8_e5m2fnuz", [1e9, p2(-17), -0.0], [57344.0, p2(-17), 0.0]),
    ],
)
def test_torch_names_as_cast_dtype(code: str, x: list[float], expected: list[float]) -> None:
    got = cast(np.array(x, dtype=np.float32), code)
    assert not _bits_mismatch(code, got, expected)
