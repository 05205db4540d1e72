"""Scale mode ``search`` on the Triton engine against the numpy reference, bit for bit (issue 16).

`onnxq.cast.triton_search` runs the general (or codebook) kernel once per candidate scale and
picks per tile; these cast through `onnxq.cast(..., backend="triton")` (what users run) in every
mode and compare values, codes, scales, meta and masks with the reference, and the upcasts too.
Without a GPU the kernels run in Triton's interpreter.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.cast.test_scale_search import FAMILIES, FINE_SCALES
from tests.cast.triton.support import compare, to_torch, torch
from tests.cast.triton.test_codebook import generic_book, sample, with_specials

# isort: split
from onnxq.cast import triton_search as tsearch
from onnxq.cast.api import cast
from onnxq.cast.torch_bridge import upcast_triton

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def weights(seed: int) -> np.ndarray:
    """Data where every candidate wins some tiles (counted in `test_every_candidate_wins`)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((16, 64)) * np.exp2(rng.integers(-8, 8, size=(16, 1)))
    x[:4, 1:] = 0.0  # one value per tile, as a depthwise conv's weights
    x[4:6] = 0.0625  # mxfp4's floor - 1 tile (tests/cast/test_scale_search.py's golden)
    x[4:6, ::32] = 1.0
    x[6:8] *= 1.99  # mantissas near 2: floor clips them
    x[8, 3], x[9, 5], x[10, 7], x[11, :] = np.nan, np.inf, -np.inf, 0.0
    return x.astype(np.float32)


def check(x: np.ndarray, name: object, dtype: str = "float32", **kw: object) -> None:
    compare(
        x,
        dtype,
        ("virtual", "actual", "compress"),
        lambda xn, mode: cast(xn, name, mode=mode, scale_mode="search", backend="reference", **kw),
        lambda xt, mode: cast(xt, name, mode=mode, scale_mode="search", backend="triton", **kw),
        upcast_triton,
        ("float32", dtype),
        lambda mode: f"{name} {dtype} {x.shape} {mode} {kw}",
    )


# the CPU search tests' families: every scale kind, MX shift bits, 2-D, N:M, a codebook, a
# zero point
@pytest.mark.parametrize("name", FAMILIES)
def test_families(name: str) -> None:
    check(weights(1), name)
    check(weights(2).reshape(4, 4, 64), name, "bfloat16", axis=1)


# scale grids finer than float32's: a candidate is the next float32 number (float_step);
# e9m14 elements under a float scale: a tiny candidate scale bounds them far below maxfloat
@pytest.mark.parametrize("name", [*FINE_SCALES, "e9m14_e5m26_t8", "e9m14_float32_t8"])
def test_scales_finer_than_float32(name: str) -> None:
    check(weights(4), name)
    check(weights(5) * np.float32(2.0**-125), name, axis=0)
    check(weights(6) * np.float32(2.0**30), name)  # e5m26 scales saturate: no step up


def test_codebook_subtiles_over_1024_elements() -> None:
    # subtiles of 2048 in tiles of 4096 (random data: few near-ties, each an ordered pass
    # over 2048 elements, slow in the interpreter)
    x = with_specials(sample((1, 4200), seed=16))
    check(x.T.copy(), "cb42fi012_e2m2fnuz_e8m0_t4096s2048", "bfloat16", axis=0)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_inputs_and_policies(dtype: str) -> None:
    x = weights(3)
    check(x, "mxfp4", dtype, nan_policy="block")
    check(x.T.copy(), "nvfp4", dtype, axis=0, round_mode="away")
    check(x, "mxint8", dtype, round_mode="stochastic", seed=5)


def test_golden_floor_minus_one_mxfp4() -> None:
    # tests/cast/test_scale_search.py's worked tile: 1.0 and 31 x 0.0625 picks floor - 1
    # (scale code 124, error 0.00390625 against 0.12109375 for floor and floor + 1)
    x = np.full((1, 32), 0.0625, np.float32)
    x[0, 0] = 1.0
    q = cast(to_torch(x, "float32"), "mxfp4", mode="actual", scale_mode="search", backend="triton")
    assert q.scale.tolist() == [[124]]
    y = cast(to_torch(x, "float32"), "mxfp4", scale_mode="search", backend="triton")
    assert y[0, 0] == 0.75 and bool(torch.all(y[0, 1:] == 0.0625))


def test_every_candidate_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    # the data is worth its name: floor, floor + 1 and floor - 1 each win tiles, codebooks too
    seen = []
    choose = tsearch._choose

    def spy(*args: object) -> torch.Tensor:
        c = choose(*args)
        seen.append(torch.bincount(c, minlength=3).tolist())
        return c

    monkeypatch.setattr(tsearch, "_choose", spy)
    books = ("cb41fi_e2m2fnuz_e8m0_t32", "cb42fi012_e2m2fnuz_e8m0_t16s4")
    for name in ("mxfp4", "nvfp4", "int8_float32_t0", *books):
        cast(to_torch(weights(1), "float32"), name, scale_mode="search", backend="triton")
    assert all(min(counts) > 0 for counts in seen), seen


def test_exact_scoring_matches(monkeypatch: pytest.MonkeyPatch) -> None:
    # every tile scored again with the reference's ordered sums (the near-tie path)
    monkeypatch.setattr(tsearch, "_FORCE_EXACT", True)
    check(weights(4), "mxfp4")
    check(weights(5), "e2m1_e4m3_t16", "bfloat16")


def edge_weights() -> np.ndarray:
    """`weights` with tiles at the top (3e38) and the bottom (1e-45) of the scales' range."""
    x = weights(6)
    x[12] = np.float32(3e38)
    x[13] = np.float32(1e-45)
    return x


def trial_scales(engine: object, x: np.ndarray, name: str, step: int, **extra: object):
    """The scale codes (int64, grid layout) of one candidate pass of ``engine.quantize``."""
    from onnxq.formats.datatype import datatype
    from onnxq.formats.modes import NanPolicy, RoundMode, ScaleMode

    got = engine.quantize(
        to_torch(x, "float32"),
        datatype(name),
        axis=-1,
        round_mode=RoundMode.EVEN,
        scale_mode=ScaleMode.FLOOR,
        nan_policy=NanPolicy.ELEMENT,
        seed=0,
        full_int_range=False,
        want_values=False,
        want_codes=True,
        scale_step=step,
        **extra,
    )["scale"]
    return got.cpu().numpy().astype(np.int64)


def exponent_trial_codes(x: np.ndarray, name: str, step: int, nan_marked: bool) -> np.ndarray:
    """The reference's arithmetic for an exponent scale's candidate: the floor exponent of the
    element (a codebook: its compute type) + step, clamped to the scale's range, zero tiles the
    lowest code; with ``nan_marked``, tiles holding NaN the NaN code (elements without one)."""
    from onnxq.cast.layout import Tiling
    from onnxq.cast.reference import _scale_exponent
    from onnxq.formats.datatype import datatype
    from onnxq.formats.modes import ScaleMode

    dt = datatype(name)
    s = dt.sspec
    elem = dt.nspec.compute if dt.nspec.is_codebook else dt.nspec
    t = Tiling.build(x.shape, -1, s)
    xt = t.to_tiles(x)
    amax = np.where(np.isfinite(xt), np.abs(xt), 0).max(axis=-1)
    frac = elem.int_fraction_bits
    stored = _scale_exponent(amax, elem, ScaleMode.FLOOR) + frac + step
    low, high = -s.scale.bias, (1 << s.scale.ebits) - 2 - s.scale.bias
    want = np.where(amax > 0, np.clip(stored, low, high), low) + s.scale.bias
    if nan_marked:
        want = np.where(np.isnan(xt).any(axis=-1), (1 << s.scale.ebits) - 1, want)
    return t.tile_grid(want)


@pytest.mark.parametrize("name", ["mxfp4", "int8_e8m0_t8", "e2m1_e4m3_t16", "int8_float32_t0"])
def test_candidate_scales(name: str) -> None:
    # each candidate pass stores the floor scale moved by its step: exponent codes +-1 within
    # the scale's range (zero tiles keep the lowest code), float scales one grid value up or
    # down (scale_search.float_step: 0 stays 0 going down, the largest value going up)
    from onnxq.cast import triton as tk
    from onnxq.cast.elements import decode_codes, encode_values
    from onnxq.cast.scale_search import float_step
    from onnxq.formats.datatype import datatype

    dt = datatype(name)
    s = dt.sspec
    x = edge_weights()
    floor = cast(x, name, mode="actual", backend="reference").scale.astype(np.int64)
    for step in (1, -1):
        got = trial_scales(tk, x, name, step)
        if s.scale.is_exponent:  # no NaN code in ints: a NaN poisons its tile's scale
            want = exponent_trial_codes(x, name, step, nan_marked=not dt.nspec.is_float)
        else:
            sc = decode_codes(floor, s.scale).astype(np.float32)
            want = encode_values(float_step(sc, s.scale, step).astype(np.float64), s.scale)
            want = np.where(np.isnan(sc), floor, want)  # NaN tiles keep the NaN code
        np.testing.assert_array_equal(got, want, err_msg=f"{name} step {step}")


# -- codebooks: the codebook kernel once per candidate, each unit's mapping from its tile's winner
def nan_tile_weights() -> np.ndarray:
    """Tiles of 32 whose search winner is not the floor scale, some holding NaN or Inf.

    Row 0: 1.0 and 31 x 0.0625 (the mxfp4 worked tile: floor - 1 wins there). Rows 1-3: the
    same with a NaN, an Inf, both: the trials score their finite values (the reference scores
    them before marking the tile), so the winner's mapping is the meta the tile keeps.
    """
    x = np.full((8, 32), 0.0625, np.float32)
    x[:, 0] = 1.0
    x[1, 5], x[2, 6], x[3, 7], x[3, 9] = np.nan, np.inf, np.nan, -np.inf
    x[4:] = sample((4, 32), seed=21, spread=2)
    x[5, 2] = np.nan
    return x


@pytest.mark.parametrize(
    ("name", "shape", "axis"),
    [
        ("cb41fi_e2m2fnuz_e8m0_t32", (8, 64), -1),  # a mapping per tile
        ("cb42fi012_e2m2fnuz_e8m0_t16s4", (6, 48), 0),  # per subtile of 4, along the rows
        ("cb51ie_e2m3_mx6_e8m0_t16s2", (3, 4, 40), 1),  # per pair, the axis in the middle
        ("cb41fi_e2m2fnuz_e5m0_t32", (5, 70), -1),  # a 5-bit scale: steps clamp at its ends
        ("cb41fi_e2m2fnuz_e10m0_t32", (5, 70), -1),  # 16-bit scale codes
        ("cb41fi_e2m2fnuz_e8m0", (5, 7), 0),  # one scale for the tensor
        ("cb41fi_e2m2fnuz_e8m0_t4s2_t8s4", (9, 30), -1),  # 2-D tiles, a mapping per 2x4
        ("cb41fi_e2m2fnuz_e8m0_t4_t8n2m4", (6, 20), -1),  # N:M sparsity in 2-D tiles
        ("cb41fi_e2m2fnuz_e8m0_t16s4n1m4", (6, 40), 0),
    ],
)
def test_codebooks(name: str, shape: tuple[int, ...], axis: int) -> None:
    x = with_specials(sample(shape, seed=sum(shape), spread=3), seed=len(name))
    check(x, name, axis=axis)
    check(x, name, "bfloat16", axis=axis, nan_policy="block", round_mode="away")


def test_codebook_nan_tiles_keep_the_winners_mapping() -> None:
    x = nan_tile_weights()
    for policy in ("element", "block"):
        check(x, "cb42fi012_e2m2fnuz_e8m0_t32", nan_policy=policy)
        check(x, "cb42fi012_e2m2fnuz_e8m0_t32s8", "float16", nan_policy=policy)


def test_codebook_generic_and_long_tiles() -> None:
    check(with_specials(sample((4, 64), seed=22)), generic_book())
    # tiles over 1024 elements: the chunked kernel
    check(with_specials(sample((2, 1100), seed=23, spread=3)), "cb41fi_e2m2fnuz_e8m0_t0")


def test_codebook_exact_scoring(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tsearch, "_FORCE_EXACT", True)
    check(nan_tile_weights(), "cb42fi012_e2m2fnuz_e8m0_t32s8")


@pytest.mark.parametrize("name", ["cb41fi_e2m2fnuz_e8m0_t32", "cb41fi_e2m2fnuz_e5m0_t32"])
def test_codebook_candidate_scales(name: str) -> None:
    # each trial stores the floor exponent of the compute type + step, clamped; its NaN tiles
    # are left unmarked (mark_nan_tiles=False: the search scores them, then marks them)
    from onnxq.cast import triton_codebook as tcb

    x = edge_weights()
    assert np.isnan(x).any(axis=-1).any()  # a NaN tile among them
    for step in (1, -1):
        got = trial_scales(tcb, x, name, step, mark_nan_tiles=False)
        want = exponent_trial_codes(x, name, step, nan_marked=False)
        np.testing.assert_array_equal(got, want, err_msg=f"{name} step {step}")
