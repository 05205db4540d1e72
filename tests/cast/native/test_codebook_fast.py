"""The native codebook fast path (ops/src/codebook_fast.h) against the numpy reference, bit for bit.

The fast path covers float32 tensors tiled along their last axis (1-D tiles, optional subtiles);
everything else takes the general per-tile path. Each check runs on every instruction set the
CPU has (ONNXQ_SIMD caps it; "none" is the general path), so both paths are compared with the
reference, never with each other.
"""

from __future__ import annotations

import numpy as np
import pytest

from onnxq.cast import native, reference
from onnxq.formats.codebook import Codebook
from onnxq.formats.datatype import DataType, datatype, datatypes
from onnxq.formats.modes import NanPolicy, RoundMode, ScaleMode
from onnxq.formats.scale import scale as scale_spec

pytestmark = pytest.mark.needs_native

SIMD = ["", "avx2", "base", "none"]

CODES = [
    "cb41fi_e2m2fnuz_e8m0_t32",
    "cb41fi_e2m2fnuz_e8m0_t8",
    "cb41fi_e2m2fnuz_e8m0_t8s4",
    "cb42fi012_e2m2fnuz_e8m0_t16s4",
    "cb42f1346_e2m3fnuz_e8m0_t32",
    "cb51ie_e2m3_mx6_e8m0_t16s2",
    "cb40f_e2m3fnuz_e8m0_t64",
    "cb43f1234e_e4m3fnuz_e8m0_t32s8",
    "cb31f0e_e3m2_e8m0_t16",
    "cb41p1s2_e3m2fnuz_e8m0_t32s16",
    "cb20s1_e2m1_e8m0_t8",
    "cb41fi_e2m2fnuz_e5m0_t32",
    "cb41fi_e2m2fnuz_e8m0_t128",
]


def _generic() -> DataType:
    """A generic codebook filled by hand: uneven gaps, a tiny entry, two mappings."""
    book = Codebook.parse("cb41_e4m3_mine")
    book = book.add_mappings([
        (0.0, 0.015625, 0.25, 0.5, 1.0, 3.0, 3.5, 448.0),
        (0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0),
    ])  # fmt: skip
    return DataType(nspec=book, sspec=scale_spec("e8m0_t32"))


def _types() -> list[DataType]:
    presets = [datatype(n) for n in datatypes() if isinstance(datatype(n).nspec, Codebook)]
    return presets + [datatype(c) for c in CODES] + [_generic()]


def _check(x: np.ndarray, dt: DataType, monkeypatch: pytest.MonkeyPatch, **kw) -> None:
    ref = reference.quantize(x.astype(np.float32), dt, **kw)
    for simd in SIMD:
        monkeypatch.setenv("ONNXQ_SIMD", simd)
        got = native.quantize(x, dt, **kw)
        where = f"{dt.name} shape {x.shape} {kw} ONNXQ_SIMD={simd!r}"
        assert np.array_equal(got.values.view(np.uint32), ref.values.view(np.uint32)), where
        for name in ("codes", "scale", "meta"):
            a, b = getattr(got, name), getattr(ref, name)
            assert a.shape == b.shape and np.array_equal(a, b), f"{name}: {where}"
        virtual = native.quantize(x, dt, want_codes=False, **kw)
        assert np.array_equal(virtual.values.view(np.uint32), ref.values.view(np.uint32)), where


def _data(shape: tuple[int, ...], seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape) * np.exp(rng.standard_normal(shape) * 3)
    return x.astype(np.float32)


@pytest.mark.parametrize("dt", _types(), ids=lambda d: d.name)
@pytest.mark.parametrize("shape", [(3, 37), (1, 1), (5, 64 + 7), (2, 3, 128), (33, 16)])
def test_random_data_every_mode(dt: DataType, shape, monkeypatch) -> None:
    x = _data(shape, sum(shape))
    for rm in (RoundMode.EVEN, RoundMode.AWAY, RoundMode.ZERO):
        _check(x, dt, monkeypatch, round_mode=rm)


@pytest.mark.parametrize("sm", list(ScaleMode), ids=lambda m: m.name)
@pytest.mark.parametrize("dt", ["cb41fi_e2m2fnuz_e8m0_t32", "cb42fi012_e2m2fnuz_e8m0_t16s4"])
def test_scale_modes(dt: str, sm: ScaleMode, monkeypatch) -> None:
    _check(_data((9, 48), 7), datatype(dt), monkeypatch, scale_mode=sm)


def _specials(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    f = np.float32
    pool = np.array(
        [
            0.0,
            -0.0,
            1.0,
            -1.0,
            2.0,
            4.0,
            0.5,
            0.25,
            6.0,
            7.0,
            3.0,
            1.5,
            np.nextafter(f(1), f(0)),
            np.nextafter(f(2), f(0)),
            np.nextafter(f(4), f(0)),
            np.nextafter(f(8), f(0)),
            np.nextafter(f(0.25), f(1)),
            0.75,
            1.25,
            1.75,
            2.5,
            3.5,
            5.0,
            6.5,
            1e-45,
            -1e-45,
            1e-40,
            1.17549435e-38,
            1.1754942e-38,
            2.0**-127,
            2.0**-130,
            3.4028235e38,
            -3.4028235e38,
            2.0**127,
            1.7e38,
            1e30,
            1e-30,
            65504.0,
            448.0,
        ],
        dtype=np.float32,
    )
    with np.errstate(over="ignore"):
        x = rng.choice(pool, n) * rng.choice(np.array([1, -1, 2.0**-20, 2.0**40], np.float32), n)
    return x.astype(np.float32)


@pytest.mark.parametrize("dt", _types(), ids=lambda d: d.name)
def test_zeros_subnormals_powers_of_two_and_extremes(dt: DataType, monkeypatch) -> None:
    x = _specials(7 * 130, 11).reshape(7, 130)
    x[0] = 0.0  # all-zero rows
    x[1, :64] = -0.0
    x[2] = np.float32(1e-45) * np.arange(130, dtype=np.float32)  # subnormal tiles
    for rm in (RoundMode.EVEN, RoundMode.AWAY, RoundMode.ZERO):
        _check(x, dt, monkeypatch, round_mode=rm)


@pytest.mark.parametrize("dt", _types(), ids=lambda d: d.name)
def test_tiles_scaled_at_the_bottom_keep_subnormal_values(dt: DataType, monkeypatch) -> None:
    # Tiles whose absmax lies near 2^-126: the scale clamps at its lowest power, 2^s is then
    # a float32 subnormal (E8M0: s = -127 minus the element's fraction bits), and the values
    # tv * 2^s are nonzero subnormals, so a wrong 2^s shows in the values.
    rng = np.random.default_rng(5)
    x = rng.standard_normal((6, 96)).astype(np.float32)
    for i, e in enumerate((-118, -122, -125, -127, -129, -133)):
        x[i] *= np.float32(2.0**e)
    _check(x, dt, monkeypatch)


@pytest.mark.parametrize("policy", list(NanPolicy), ids=lambda p: p.name)
@pytest.mark.parametrize("dt", _types()[:6], ids=lambda d: d.name)
def test_nan_and_inf_tiles(dt: DataType, policy: NanPolicy, monkeypatch) -> None:
    x = _data((6, 100), 3)
    x[0, 3] = np.nan
    x[1, 40] = np.inf
    x[2, 70] = -np.inf
    x[3, 99] = np.float32(np.nan) * -1
    x[4, :] = np.inf
    _check(x, dt, monkeypatch, nan_policy=policy)


@pytest.mark.parametrize("rm", [RoundMode.EVEN, RoundMode.AWAY, RoundMode.ZERO])
@pytest.mark.parametrize("dt", _types(), ids=lambda d: d.name)
def test_exact_ties_between_entries(dt: DataType, rm: RoundMode, monkeypatch) -> None:
    # Every midpoint of every mapping, and its float32 neighbours, in tiles whose absmax makes
    # the scale 1 (the compute type's largest value is in every tile).
    book = dt.nspec
    assert isinstance(book, Codebook)
    mids = []
    for mags in book.magnitudes():
        m = np.asarray(mags, np.float64)
        mids.append((m[:-1] + m[1:]) / 2)
    mid = np.concatenate(mids).astype(np.float32)
    vals = np.concatenate([mid, np.nextafter(mid, np.inf), np.nextafter(mid, -np.inf)])
    vals = np.concatenate([vals, -vals])
    tile = dt.sspec.tiles[0].size or 32
    top = np.float32(book.compute.maxfloat)
    n = -(-len(vals) // (tile - 1))
    x = np.zeros((n, tile), np.float32)
    flat = np.resize(vals, n * (tile - 1)).reshape(n, tile - 1)
    x[:, 1:] = flat
    x[:, 0] = top
    _check(x, dt, monkeypatch, round_mode=rm)


def test_ties_between_mappings_take_the_first(monkeypatch) -> None:
    dt = datatype("cb41fi_e2m2fnuz_e8m0_t32")
    # Mapping 0 = fp4 {0, .5, 1, 1.5, 2, 3, 4, 6}, mapping 1 = int {0, ..., 7}; scale 1.
    x = np.zeros((3, 32), np.float32)
    x[0, :6] = [6, 4, 3, 2, 1, 0]  # exact in both: error 0 == 0, mapping 0
    x[1, :3] = [6, 2.5, 5.5]  # both 0.25 + 0.25 (2.5 -> 2|3 and 5.5 -> 6 | 5|6): equal
    x[2, :4] = [6, 0.75, 1.25, 5.0]  # fp4: 0 + 0 + 1; int: 4 * 1/16 + 0: mapping 1
    ref = reference.quantize(x, dt)
    assert ref.meta.reshape(-1).tolist() == [0, 0, 1]
    _check(x, dt, monkeypatch)


# Tiles (float32 bits) where the two mappings' errors are equal in exact arithmetic and the
# float64 sums decide (found by search: 6 plus 5 + d and 0.5 + e with 2d - e = 0.75, 29 small
# values). The reference adds a unit's squared errors left to right: mappings 0, 1, 0, 0. In
# another order the choice flips: numpy's einsum order (two lanes, blocks of 8 as pairs 6-7,
# 4-5, 2-3, 0-1) for the first two tiles, eight lanes for the third, four for the fourth.
SUM_ORDER_TILES = [
    [
        1023600204, 3136481049, 3179065890, 1011424401, 1086324736, 3158439472, 1009030435,
        3164107291, 1029703803, 1059777536, 1034006981, 3170722056, 1085189824, 3139306606,
        979856026, 978550996, 3182708953, 3172384660, 993788758, 1001892956, 3131318362,
        3120971185, 3154569011, 3130050202, 3151014786, 3113421916, 967021313, 3177646677,
        990235539, 3182498363, 3145721088, 3170902341,
    ],
    [
        1085169536, 1006728602, 3166814125, 992575044, 3146639401, 1003724504, 1022850217,
        1086324736, 3114037490, 3184970676, 3119043138, 1005250363, 1059452928, 3173970873,
        3144265297, 1023729050, 3140902367, 1033458403, 1018520730, 993666611, 969332670,
        1020405614, 970983782, 3174801373, 3143572486, 3130591169, 3172185663, 980449521,
        1029343567, 3142543562, 992242114, 3127332166,
    ],
    [
        1086324736, 1001651021, 3186212760, 1085129472, 3187209231, 1009153066, 3121000566,
        1058811904, 3139142976, 3153785965, 1000600320, 3175984572, 968739086, 981060015,
        1023473853, 3158286237, 1014215563, 1019800718, 1022110565, 3154236250, 3141810799,
        990634682, 3123565259, 972022209, 3136044316, 1018397968, 3120292298, 3156126216,
        974182601, 3184917606, 3129761996, 3184837491,
    ],
    [
        1001109929, 994088201, 3153254374, 1011876640, 1025548177, 3151467317, 1010643963,
        1086324736, 3123104196, 3127248478, 3154582440, 1085261696, 1060927488, 3139857369,
        3170937992, 3181618035, 1002169674, 3187591010, 1005572249, 977271043, 3184133500,
        980734166, 3155219212, 1027143746, 1004279711, 1034190099, 3177400747, 3164394390,
        1030403347, 965688860, 971538926, 3177782787,
    ],
]  # fmt: skip


def _sum_in_lanes(sq: np.ndarray, lanes: int, descending: bool = True) -> float:
    """numpy einsum's float64 sum of products with `lanes` lanes (its SIMD width)."""
    acc = np.zeros(lanes)
    i, n = 0, len(sq)
    while n - i >= 4 * lanes:
        for k in (3, 2, 1, 0) if descending else (0, 1, 2, 3):
            acc = acc + sq[i + k * lanes : i + (k + 1) * lanes]
        i += 4 * lanes
    while i < n:
        block = np.zeros(lanes)
        part = sq[i : i + lanes]
        block[: len(part)] = part
        acc = acc + block
        i += lanes
    while len(acc) > 1:
        acc = acc[: len(acc) // 2] + acc[len(acc) // 2 :]
    return float(acc[0])


def _left_to_right(sq: np.ndarray) -> float:
    err = 0.0
    for term in sq:
        err += term
    return err


def test_errors_are_summed_left_to_right(monkeypatch) -> None:
    dt = datatype("cb41fi_e2m2fnuz_e8m0_t32")
    book = dt.nspec
    assert isinstance(book, Codebook)
    x = np.array(SUM_ORDER_TILES, np.uint32).view(np.float32)
    ref = reference.quantize(x, dt)
    want = [0, 1, 0, 0]
    assert ref.meta.reshape(-1).tolist() == want
    # Each tile discriminates: another summation order picks the other mapping.
    others = [
        lambda sq: _sum_in_lanes(sq, 2),
        lambda sq: _sum_in_lanes(sq, 2),
        lambda sq: _sum_in_lanes(sq, 8),
        lambda sq: _sum_in_lanes(sq, 4),
    ]
    for row, other, choice in zip(x, others, want, strict=True):
        a = np.abs(row.astype(np.float64))
        sums = []
        for mags in book.magnitudes():
            t = np.asarray(mags)
            q = t[np.argmin(np.abs(a[:, None] - t[None, :]), axis=1)]
            sums.append((_left_to_right((a - q) ** 2), other((a - q) ** 2)))
        assert int(sums[1][0] < sums[0][0]) == choice  # left to right
        assert int(sums[1][1] < sums[0][1]) != choice  # the other order
    _check(x, dt, monkeypatch)
    # The same tiles inside bigger tensors: several tiles per row, lanes of a SIMD group.
    big = np.tile(x, (5, 3))
    big[1::2] *= np.float32(-0.5)
    _check(big, dt, monkeypatch)
    _check(big, datatype("cb41fi_e2m2fnuz_e8m0_t64s32"), monkeypatch)


@pytest.mark.parametrize("dtype", [np.float16], ids=["float16"])
def test_half_inputs_take_the_general_path(dtype, monkeypatch) -> None:
    x = _data((4, 70), 5).astype(dtype)
    _check(x, datatype("cb41fi_e2m2fnuz_e8m0_t32"), monkeypatch)


def test_other_axes_and_2d_tiles(monkeypatch) -> None:
    x = _data((6, 40, 3), 9)
    dt = datatype("cb41fi_e2m2fnuz_e8m0_t32")
    for axis in (0, 1, 2):
        _check(x, dt, monkeypatch, axis=axis)
    _check(_data((20, 24), 4), datatype("cb41fi_e2m2fnuz_e8m0_t4_t8"), monkeypatch)


def test_many_tiles_and_rows(monkeypatch) -> None:
    # Several chunks of the parallel loop, rows that are not a multiple of the lane count.
    _check(_data((517, 96), 2), datatype("cb41fi_e2m2fnuz_e8m0_t32"), monkeypatch)
    _check(_data((300, 33), 2), datatype("cb42fi012_e2m2fnuz_e8m0_t16s4"), monkeypatch)


@pytest.mark.parametrize("simd", SIMD[:3])
@pytest.mark.parametrize("offset", range(0, 16, 3))
def test_streamed_values_at_every_output_offset(simd: str, offset: int, monkeypatch) -> None:
    # ONNXQ_DQ_STREAM=1 forces the streaming stores that large outputs take: whole groups of
    # tiles are copied out with aligned streaming stores in the middle and plain copies at the
    # ends, wherever the output starts relative to a cache line; nothing outside it is touched.
    monkeypatch.setenv("ONNXQ_DQ_STREAM", "1")
    monkeypatch.setenv("ONNXQ_SIMD", simd)
    dt = datatype("cb41fi_e2m2fnuz_e8m0_t32")
    x = _data((5, 32 * 40 + 7), 17)
    ref = reference.quantize(x, dt)
    buf = np.full(x.size + 32, np.float32(7.0))
    start = (-buf.ctypes.data // 4) % 16 + offset  # `offset` floats past a 64-byte line
    out = buf[start : start + x.size].reshape(x.shape)
    native.quantize(x, dt, want_codes=False, values_out=out)
    assert np.array_equal(out.view(np.uint32), ref.values.view(np.uint32)), (simd, offset)
    assert np.all(buf[:start] == 7.0) and np.all(buf[start + x.size :] == 7.0)
